"""The CPU study's v6 design (studies/cpu): held arms run with the band set at every step, the cells' placebo blocks
random tokens of int4's own cells (its control the other two) at int4's rates, and every v6 claim is primary in a
family that asks one question."""

import json
from pathlib import Path

import pytest
import torch
import tyro

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.run.safe_io import read_jsonl
from dppo_oat.trust_region import PRESETS, MaskInputs
from dppo_oat.trust_region.metrics import MU_BUCKETS
from studies.cpu import placebo
from studies.cpu import run as cpu_study
from studies.cpu.claims import (
    HALVES_CONTRASTS,
    HELD_ARMS,
    HELD_CONTRASTS,
    HELD_STALE_CONTRASTS,
    PLACEBO_CELLS_CONTRASTS,
)
from studies.cpu.report import condition_of, load_study, study_variant

TINY = ("--warm-start.demo-episodes", "150", "--warm-start.max-steps", "20", "--warm-start.check-every", "20",
        "--warm-start.check-episodes", "8", "--warm-start.vocab-size", "300")


@pytest.mark.parametrize("condition", ["mech-int4", "field-mb4"])
def test_a_held_arm_sets_its_band_like_dppo_binary_kl_at_every_step(tmp_path, condition):
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    for method, _ in HELD_ARMS:
        run = cpu_study.StudyRun("sudoku", method, condition, 0)
        spec, _ = validate_config(tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False)))
        preset = method.partition("@")[0]
        assert spec.trust_region.name == preset and spec.calibration.like == "dppo_binary_kl"
        assert spec.calibration.every == 1
        assert spec.calibration.band == ("both" if preset in ("trm_max", "trm_avg", "opsm", "vaco") else None)
        assert study_variant(method).endswith("(held as strong as DPPO-Binary-KL)")
        assert condition_of(run.name) == condition


def cell_inputs(seed: int, rows: int = 64, tokens: int = 12) -> MaskInputs:
    """A loss call's mask inputs under a mismatched μ: μ spread over the μ buckets, π on either side of it, mixed-sign
    Â per row, some padding."""
    gen = torch.Generator().manual_seed(seed)
    behavior = torch.rand(rows, tokens, generator=gen).clamp(min=1e-3).log()
    logp = (behavior + 0.05 * torch.randn(rows, tokens, generator=gen)).clamp(max=0.0)
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, tokens).clone()
    advantages[:4] = 0.0
    response = torch.rand(rows, tokens, generator=gen) > 0.1
    return MaskInputs(logp, behavior, behavior, advantages, response, torch.zeros(rows, tokens))


RATES = {"negative": {"mu_lt_0.1": 0.002, "mu_0.1_0.5": 0.01, "mu_ge_0.5": 0.03},
         "positive": {"mu_lt_0.1": 0.001, "mu_0.1_0.5": 0.004, "mu_ge_0.5": 0.02}}


@pytest.mark.parametrize("own", [True, False])
def test_the_cells_placebo_blocks_its_cells_at_their_rates(monkeypatch, own):
    """``placebo_cells`` blocks only Â < 0 where μ > π and Â > 0 where μ < π (its control only the other two), in each
    cell and μ bucket as many as the rate × the call's A ≠ 0 tokens on average; the same call gives the same tokens."""
    monkeypatch.setattr(placebo, "PLACEBO_RATES", RATES)
    keep_of = placebo.int4_cells_keep if own else placebo.other_cells_keep
    shares = {(half, bucket): [] for half in RATES for _, _, bucket in MU_BUCKETS}
    for seed in range(200):
        x = cell_inputs(seed)
        blocked = ~keep_of(x, None)
        assert torch.equal(blocked, ~keep_of(x, None))
        above, below = x.behavior_logp > x.logp, x.behavior_logp < x.logp
        cells = {"negative": (x.advantages < 0) & (above if own else below),
                 "positive": (x.advantages > 0) & (below if own else above)}
        assert not (blocked & ~(x.response & (cells["negative"] | cells["positive"]))).any()
        active = int((x.response & (x.advantages != 0)).sum())
        mu = x.behavior_logp.exp()
        for half, cell in cells.items():
            for low, high, bucket in MU_BUCKETS:
                shares[half, bucket].append(int((blocked & cell & (mu >= low) & (mu < high)).sum()) / active)
    for (half, bucket), values in shares.items():
        assert sum(values) / len(values) == pytest.approx(RATES[half][bucket], rel=0.15), (half, bucket)


def test_a_cells_placebo_run_trains_under_int4_with_its_rule_registered_in_its_own_process(tmp_path):
    """``python -m studies.cpu.placebo`` plays ``placebo_cells`` under the int4 copy: its config records the study's
    rule, it blocks tokens, and this process's presets stay the package's."""
    config = cpu_study.StudyConfig(out_dir=str(tmp_path / "study"), steps=2, groups_per_step=2, group_size=2,
                                   probe_every=1, eval_episodes=4,
                                   extra_args=" ".join([*TINY, "--cache-dir", str(tmp_path / "cache")]))
    assert cpu_study.trainer_module("placebo_cells") == "studies.cpu.placebo"
    result = cpu_study.play(cpu_study.StudyRun("sudoku", "placebo_cells", "mech-int4", 0), config)
    assert result["returncode"] == 0 and result["state"] == "done", Path(result["log"]).read_text()[-2000:]
    run = tmp_path / "study" / "sudoku" / "placebo_cells-mech-int4-s0"
    trust_region = json.loads((run / "config.json").read_text())["trust_region"]
    assert (trust_region["rule"], trust_region["name"]) == ("placebo_int4_cells", "placebo_cells")
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert "placebo_cells" not in PRESETS
    assert load_study(tmp_path / "study")["variant"].unique().tolist() == [placebo.PLACEBO_LABELS["placebo_cells"]]


def test_every_v6_claim_is_primary_in_a_family_asking_one_question():
    """The held rules against each reference are a family of eight (Holm over them); the cells' placebo and the
    halves three primary claims each; every reference reused from an earlier experiment is declared played before."""
    families = {}
    for contrast in HELD_CONTRASTS + HELD_STALE_CONTRASTS + PLACEBO_CELLS_CONTRASTS + HALVES_CONTRASTS:
        if contrast.family == "primary":
            families.setdefault(contrast.experiment, set()).add(contrast.right if contrast.experiment.startswith(
                "held") else contrast.claim)
    assert {name: len(claims) for name, claims in families.items()} == {
        "held": 1, "held_pg_is": 1, "held_stale": 1, "held_stale_pg_is": 1, "placebo_cells": 3, "halves": 3}
    assert sum(c.experiment == "held" for c in HELD_CONTRASTS) == 8
    new = {"placebo_cells", "placebo_cells_other", "dppo_binary_kl_neg", "dppo_binary_kl_pos",
           *(method for method, _ in HELD_ARMS)}
    for contrast in HELD_CONTRASTS + HELD_STALE_CONTRASTS + PLACEBO_CELLS_CONTRASTS + HALVES_CONTRASTS:
        for arm in (contrast.left, contrast.right):
            assert arm[0] in new or arm in contrast.played_before, (contrast.claim, arm)


def test_the_v6_experiments_play_only_new_arms():
    for name in ("held", "held_stale", "placebo_cells", "halves"):
        methods = cpu_study.EXPERIMENTS[name].methods
        assert not {"pg_is", "dppo_binary_kl"} & set(methods), name

