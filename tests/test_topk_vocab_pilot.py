"""studies/cpu/topk_vocab_pilot.py: the study's Sudoku run on the tiny-8k policy, its probe rows read back, and the
largest gaps of top-K and of binary against the exact divergence."""

import pytest

from studies.cpu import topk_vocab_pilot


def probe(step, **values):
    row = {"step": step, "success": 0.5}
    for estimator in ("binary", "topk", "exact"):
        for kind in topk_vocab_pilot.ESTIMATES:
            row[f"probe/{estimator}_{kind}"] = values.get(f"{estimator}_{kind}", 0.1)
    return row


def test_the_gaps_are_the_largest_differences_from_the_exact_divergence():
    metrics = [{"step": 1, "success": 0.4}, probe(5, topk_tv_mean=0.1001, binary_kl_above_delta=0.03),
               probe(10, topk_kl_mean=0.0999, binary_tv_mean=0.09)]
    probes = topk_vocab_pilot.probe_rows(metrics)
    assert [row["step"] for row in probes] == [5, 10] and "success" not in probes[0]
    assert topk_vocab_pilot.largest_gap(probes, "topk") == pytest.approx(1e-4)
    assert topk_vocab_pilot.largest_gap(probes, "binary") == pytest.approx(0.07)


def test_the_pilot_runs_the_studys_sudoku_flags_on_the_8k_policy(tmp_path):
    args = topk_vocab_pilot.pilot_args(900, 20, 5, tmp_path, "run")
    assert args[args.index("--warm-start.shape") + 1] == "tiny-8k"
    assert args[args.index("--trust-region") + 1] == "dppo_topk_tv"
    assert args[args.index("--minibatches-per-rollout") + 1] == "4"
    assert args[args.index("--probe-every") + 1] == "5" and args[args.index("--seed") + 1] == "900"
    assert "--warm-start.target-success" in args  # the study's warm start
