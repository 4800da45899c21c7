"""``--token-export all``: every trained token of a step in ``token_exports/step_<step>.jsonl``, written by a
background thread, its records' fields named as prime-rl's token export names them; nothing when off."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from dppo_oat.token_export import (
    BOOL_COLUMNS,
    FLOAT_COLUMNS,
    TokenExporter,
    TokenObservers,
    export_path,
    read_token_export,
)
from dppo_oat.trust_region import TrustRegion, policy_loss

FIELDS = {"schema_version", "step", "row", "turn", "env_name", "token_ids", *BOOL_COLUMNS, *FLOAT_COLUMNS}


def micro_batch():
    """Two rows of a prompt token then responses: row 0 three response tokens, row 1 one then padding. Row 0's
    first token moves up under A > 0 far enough for DPPO (δ 0.15) to block it; row 1's moves down under A < 0."""
    mu = torch.tensor([[0.5, 0.2, 0.4, 0.5], [0.5, 0.6, 0.5, 0.5]]).log()
    pi = torch.tensor([[0.5, 0.5, 0.45, 0.5], [0.5, 0.3, 0.5, 0.5]]).log()
    mask = torch.tensor([[False, True, True, True], [False, True, False, False]])
    adv = torch.tensor([[1.0], [-1.0]])
    micro = SimpleNamespace(input_ids=torch.arange(10).reshape(2, 5), behavior_logp=mu, advantages=adv,
                            response_mask=mask)
    result = policy_loss(pi, mu, adv, mask, TrustRegion.preset("dppo_binary_tv"))
    return micro, pi, result


def test_records_by_hand(tmp_path):
    micro, pi, result = micro_batch()
    exporter = TokenExporter(tmp_path)
    exporter.observe(torch.tensor([3, 7]), micro, pi, None, result)
    exporter.write(2, turns=[0] * 8, envs=[f"env{i}" for i in range(8)])
    exporter.close()
    records = [json.loads(line) for line in export_path(tmp_path, 2).read_text().splitlines()]
    assert [r["row"] for r in records] == [3, 7] and all(set(r) == FIELDS for r in records)
    first, second = records
    assert first["token_ids"] == [2, 3, 4] and second["token_ids"] == [7]  # targets: input_ids shifted by one
    assert first["env_name"] == "env3" and first["step"] == 2 and first["schema_version"] == 1
    assert first["inference_logprobs"] == pytest.approx([math.log(0.2), math.log(0.4), math.log(0.5)])
    assert first["importance_ratio"] == pytest.approx([2.5, 1.125, 1.0])
    assert first["is_masked"] == [True, False, False] and first["is_masked_high"] == [True, False, False]
    assert second["is_masked"] == [True] and second["is_masked_low"] == [True] and second["is_masked_high"] == [False]
    assert first["entropy"] == [None, None, None]  # no entropy: null, never NaN
    frame = read_token_export(tmp_path, 2)
    assert len(frame) == 4 and list(frame["position"]) == [0, 1, 2, 0]


def test_every_observer_sees_every_micro_batch(tmp_path):
    micro, pi, result = micro_batch()
    seen = []
    probe = SimpleNamespace(observe=lambda *args: seen.append(args[0]))
    exporter = TokenExporter(tmp_path)
    TokenObservers(probe, None, exporter).observe(torch.tensor([0, 1]), micro, pi, None, result)
    exporter.write(1)
    exporter.close()
    assert len(seen) == 1 and export_path(tmp_path, 1).exists()


def test_a_failed_write_is_raised_at_the_next_step(tmp_path):
    micro, pi, result = micro_batch()
    (tmp_path / "token_exports").write_text("a file where the folder goes")
    exporter = TokenExporter(tmp_path)
    exporter.observe(torch.tensor([0, 1]), micro, pi, None, result)
    exporter.write(1)
    with pytest.raises(OSError):
        exporter.write(2)
    exporter.close()
