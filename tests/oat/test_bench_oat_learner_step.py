"""Smoke test of ``scripts/bench/oat_learner_step.py``: tiny sizes, one pair, in a subprocess; no timing asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "oat_learner_step.py"
TINY = ["--vocab", "1000", "--hidden", "128", "--layers", "1", "--sequences", "4", "--group-size", "2",
        "--minibatch", "2", "--micro-batch", "1", "--prompt-tokens", "4", "--response-tokens", "8", "--reps", "1",
        "--threads", "1"]


def test_benchmark_prints_one_json_line_and_appends_it(tmp_path):
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout[-2000:]
    row = json.loads(lines[0])
    assert out.read_text().splitlines() == lines

    for key in ("dppo_vs_ppo_step_time", "ppo_step_seconds", "dppo_step_seconds", "ppo_peak_mem_gib",
                "dppo_peak_mem_gib", "config", "per_step", "commit", "machine", "torch", "deepspeed", "timestamp"):
        assert key in row, key
    assert row["ppo_step_seconds"] > 0 and row["dppo_step_seconds"] > 0
    config = row["config"]
    assert (config["vocab"], config["micro_batch"], config["grad_accumulation"], config["epochs"]) == (1000, 1, 2, 2)
    assert config["dppo"]["trust_region"] == "dppo_binary_tv" and config["dppo"]["lm_head"] == "fused"

    # Same work on both sides: 2 epochs x 2 minibatches of 2 sequences; oat's PPO also forwards the whole batch
    # once without grad (π_θ'), DPPO only its check of the first 4 rows after the update.
    ppo, dppo = row["per_step"]["ppo"], row["per_step"]["dppo"]
    assert ppo["optimizer_steps"] == dppo["optimizer_steps"] == 4
    assert ppo["sequences_grad"] == dppo["sequences_grad"] == 8
    assert ppo["decoder_tokens_no_grad"] == 4 * 12
    assert ppo["lm_head_rows"] == (4 + 8) * 12  # every position of every forward
    assert dppo["lm_head_rows"] == (8 + 4) * 8  # the response tokens only
    assert row["weights_after_step_spread"] == {"ppo": 0.0, "dppo": 0.0}  # every repetition starts from one state


def test_benchmark_under_lora_records_the_rank_and_trainable_parameters(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--device", "cpu", "--lora-rank", "4"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.splitlines()[-1])
    config = row["config"]
    assert config["lora_rank"] == 4 and 0 < config["trainable_parameters"] < config["parameters"] / 10
    # A peak above the step's start: under LoRA at this size it can be under the kernel's resolution (0), never below.
    assert row["ppo_peak_mem_gib"] >= 0 and row["dppo_peak_mem_gib"] >= 0
    assert all(total > 0 for total in row["peak_mem_total_gib"].values())
    assert row["per_step"]["dppo"]["optimizer_steps"] == 4
