"""The study tables on a hand-made study whose outcomes are known: a collapsing PG-IS, a steady DPPO."""

import json
import math
from dataclasses import asdict

import numpy as np
import pytest

from dppo_oat.analysis.study import load_study, paper_claims, probe_table, run_outcomes, study_table
from dppo_oat.runlog import to_jsonable
from dppo_oat.trust_region import TrustRegion

STEPS = 40


def write_run(directory, algo, seed, success, mismatch, rollout_dtype="bfloat16"):
    directory.mkdir(parents=True)
    config = {"run_name": directory.name, "algo": algo, "env_ids": ["game:Sudoku-v0-easy-compact"], "seed": seed,
              "rollout_dtype": rollout_dtype, "logprob_noise": 0.0,
              "trust_region": to_jsonable(asdict(TrustRegion.preset(algo)))}
    (directory / "config.json").write_text(json.dumps(config))
    rows = []
    for step in range(1, STEPS + 1):
        rows.append({"step": step, "success": success[step - 1], "mismatch/abs_diff_mean": mismatch[step - 1],
                     "bad_update/fraction": 0.01 if algo == "pg_is" else 0.0, "mask/fraction": 0.0,
                     "is/truncated_fraction": 0.0, "shadow/ppo/mask_fraction_mu_lt_0.1": 0.2,
                     "shadow/ppo/mask_fraction_mu_ge_0.5": 0.01, "probe/binary_tv_mean": 0.01,
                     "probe/topk_tv_mean": 0.02, "probe/exact_tv_mean": 0.03})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"step": 0, "eval/success": 0.3}, {"step": STEPS, "eval/success": success[-1]}]
    (directory / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))


@pytest.fixture
def study(tmp_path):
    rise = np.linspace(0.3, 0.9, STEPS)
    collapse = np.concatenate([np.linspace(0.3, 0.8, 20), np.zeros(20)])
    for seed in (0, 1):
        write_run(tmp_path / "sudoku" / f"dppo_binary_tv-bf16-s{seed}", "dppo_binary_tv", seed, rise,
                  np.full(STEPS, 0.01))
        write_run(tmp_path / "sudoku" / f"pg_is-bf16-s{seed}", "pg_is", seed, collapse, np.linspace(0.01, 0.1, STEPS))
    write_run(tmp_path / "sudoku" / "pg_is-none-s0", "pg_is", 0, rise, np.full(STEPS, 0.001), "float32")
    return tmp_path


def test_outcomes_of_known_runs(study):
    df = load_study(study)
    assert set(df["mismatch"]) == {"bf16", "none"} and set(df["task"]) == {"sudoku"}
    outcomes = run_outcomes(df, threshold=0.6).set_index("run")
    dppo, pg_is = outcomes.loc["dppo_binary_tv-bf16-s0"], outcomes.loc["pg_is-bf16-s0"]
    assert not dppo["collapsed"] and pg_is["collapsed"]
    assert not outcomes.loc["dppo_binary_tv-bf16-s1", "collapsed"]
    assert dppo["final"] == pytest.approx(np.linspace(0.3, 0.9, STEPS)[-4:].mean())
    assert 20 <= dppo["steps_to_threshold"] <= 22  # the smoothed line crosses 0.6 half way
    assert pg_is["eval_before"] == 0.3 and pg_is["eval_after"] == 0.0
    assert pg_is["mismatch_end"] / pg_is["mismatch_start"] > 5
    assert outcomes.loc["pg_is-none-s0", "steps_to_threshold"] > 0  # the fp32 PG-IS run rises too

    table = study_table(run_outcomes(df, threshold=0.95))
    assert table.loc[("sudoku", "DPPO-Binary-TV", "bf16"), "seeds"] == 2
    assert table.loc[("sudoku", "DPPO-Binary-TV", "bf16"), "reached"] == 0  # nobody reaches 0.95
    assert table.loc[("sudoku", "PG-IS", "bf16"), "collapses"] == 2


def test_claims_on_known_runs(study):
    df = load_study(study)
    claims = paper_claims(run_outcomes(df, threshold=0.6), df).set_index("claim")["holds"]
    assert claims["no trust region → mismatch grows (Takeaway 1)"] is True
    assert claims["no trust region → collapse, DPPO stable (Takeaway 1)"] is True
    assert claims["DPPO ends higher than PG-IS/CISPO (fig:sanity_test)"] is True
    assert claims["ratio clipping hits low-probability tokens"] is True
    assert claims["binary ≤ top-K ≤ exact divergence"] is True
    assert claims["recompute anchor (MiniRL) → more mismatch (Takeaway 2)"] is None  # no MiniRL run here


def test_probe_table(study):
    table = probe_table(load_study(study))
    assert table.loc[("sudoku", "bf16"), "binary TV"] == pytest.approx(0.01)
    assert table.loc[("sudoku", "bf16"), "binary/exact TV"] == pytest.approx(1 / 3)
    assert table.loc[("sudoku", "bf16"), "topk/exact TV"] == pytest.approx(2 / 3)  # from the means


def test_an_empty_folder_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="cpu_study.py"):
        load_study(tmp_path)


def test_noise_at_low_success_is_not_a_collapse(tmp_path):
    """Halving a success of a few % is within one rollout's noise: a collapse also needs an absolute drop of 0.1."""
    low = np.concatenate([np.linspace(0.05, 0.15, 20), np.linspace(0.15, 0.05, 20)])
    high = np.concatenate([np.linspace(0.3, 0.6, 20), np.linspace(0.6, 0.1, 20)])
    write_run(tmp_path / "countdown" / "cispo-bf16-s0", "cispo", 0, low, np.full(STEPS, 0.01))
    write_run(tmp_path / "countdown" / "cispo-bf16-s1", "cispo", 1, high, np.full(STEPS, 0.01))
    outcomes = run_outcomes(load_study(tmp_path), threshold=0.5).set_index("run")
    assert outcomes.loc["cispo-bf16-s0", "final"] < 0.5 * outcomes.loc["cispo-bf16-s0", "peak"]
    assert not outcomes.loc["cispo-bf16-s0", "collapsed"] and outcomes.loc["cispo-bf16-s1", "collapsed"]
