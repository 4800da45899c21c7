"""The CPU study's tables (studies/cpu/report.py) on a hand-made study whose outcomes are known: a collapsing
PG-IS, a steady DPPO, on paired seeds, scored by the pre-registered contrasts."""

import gzip
import json
from dataclasses import asdict, replace

import numpy as np
import pandas as pd
import pytest

from dppo_oat.run.safe_io import to_jsonable
from dppo_oat.trust_region import TrustRegion
from studies.cpu import pack as pack_study
from studies.cpu.claims import CONTRASTS, FRONTIER_ARMS, FRONTIER_CONTRASTS, SIGN_CONTRASTS, THRESHOLD, Contrast
from studies.cpu.packed import run_config
from studies.cpu.page import (
    DISPLAY_SOURCES,
    FRONTIER_PG_IS_FAMILY,
    frontier_line,
    provenance_line,
    scale_lines,
    summary_lines,
    written_after_runs,
)
from studies.cpu.report import (
    arm_flag_table,
    bad_update_drops,
    blocked_per_run,
    blocked_ratio_range,
    blocked_share,
    condition_of,
    contrast_table,
    load_study,
    pooled_holm,
    probe_table,
    run_outcomes,
    sign_shares_by_stretch,
    strength_table,
    study_table,
)

STEPS = 40
RISE = np.linspace(0.3, 0.9, STEPS)
COLLAPSE = np.concatenate([np.linspace(0.3, 0.8, 20), np.zeros(20)])


def write_run(directory, algo, seed, success, mismatch, rollout_dtype="bfloat16", masked=None):
    """A study run of ``algo`` whose rule blocks ``masked`` of the tokens at every step (default: none for PG-IS,
    1% for the others)."""
    masked = (0.0 if algo == "pg_is" else 0.01) if masked is None else masked
    directory.mkdir(parents=True)
    config = {"run_name": directory.name, "algo": algo, "env_ids": ["game:Sudoku-v0-easy-compact"], "seed": seed,
              "rollout_dtype": rollout_dtype, "logprob_noise": 0.0,
              "trust_region": to_jsonable(asdict(TrustRegion.preset(algo)))}
    (directory / "config.json").write_text(json.dumps(config))
    rows = []
    for step in range(1, STEPS + 1):
        rows.append({"step": step, "success": success[step - 1], "mismatch/abs_diff_mean": mismatch[step - 1],
                     "mismatch/first_abs_diff_mean": mismatch[step - 1] / 2,
                     "bad_update/fraction": 0.01 if algo == "pg_is" else 0.0, "mask/fraction": masked,
                     "is/truncated_fraction": 0.0, "shadow/ppo/mask_fraction_mu_lt_0.1": 0.2,
                     "shadow/ppo/mask_fraction_mu_ge_0.5": 0.01, "probe/binary_tv_mean": 0.01,
                     "probe/topk_tv_mean": 0.02, "probe/exact_tv_mean": 0.03})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"step": 0, "eval/success": 0.3}, {"step": STEPS, "eval/success": success[-1]}]
    (directory / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))


@pytest.fixture
def study(tmp_path):
    for seed in range(5):
        shift = 0.01 * seed  # seeds differ; within a seed DPPO is always ahead
        write_run(tmp_path / "sudoku" / f"dppo_binary_tv-mb1-bf16-s{seed}", "dppo_binary_tv", seed, RISE - shift,
                  np.full(STEPS, 0.01))
        write_run(tmp_path / "sudoku" / f"pg_is-mb1-bf16-s{seed}", "pg_is", seed, COLLAPSE - shift,
                  np.linspace(0.01, 0.1, STEPS))
    write_run(tmp_path / "sudoku" / "pg_is-mb1-fp32-s0", "pg_is", 0, RISE, np.full(STEPS, 0.001), "float32")
    return tmp_path


def test_run_names_carry_the_condition():
    assert condition_of("dppo_binary_tv-mb4-fp32-lr1e-4-s3") == "mb4-fp32-lr1e-4"
    assert condition_of("pg_is-mb1-int8-s0") == "mb1-int8" and condition_of("my-run") == "default"


def test_outcomes_of_known_runs(study):
    df = load_study(study)
    assert set(df["condition"]) == {"mb1-bf16", "mb1-fp32"} and set(df["mismatch"]) == {"bf16", "fp32"}
    outcomes = run_outcomes(df, threshold=0.6).set_index("run")
    dppo, pg_is = outcomes.loc["sudoku/dppo_binary_tv-mb1-bf16-s0"], outcomes.loc["sudoku/pg_is-mb1-bf16-s0"]
    assert not dppo["collapsed"] and pg_is["collapsed"]
    assert dppo["final"] == pytest.approx(RISE[-4:].mean()) and dppo["auc"] == pytest.approx(RISE.mean())
    assert 20 <= dppo["steps_to_threshold"] <= 22 and dppo["last_step"] == STEPS  # crosses 0.6 half way
    assert pg_is["eval_before"] == 0.3 and pg_is["eval_after"] == 0.0
    assert pg_is["mismatch_growth"] > 5 and pg_is["engine_mismatch_end"] == pytest.approx(pg_is["mismatch_end"] / 2)

    table = study_table(run_outcomes(df, threshold=0.95))
    row = table.loc[("sudoku", "DPPO-Binary-TV", "mb1-bf16")]
    assert row["seeds"] == 5 and row["reached"] == 0 and np.isnan(row["KM median steps"])  # nobody reaches 0.95
    assert row["mean steps (restricted)"] == STEPS  # all censored at the last step
    assert row["AUC ± std"] == pytest.approx(np.std(0.01 * np.arange(5), ddof=1))  # the sample std
    assert table.loc[("sudoku", "PG-IS", "mb1-bf16"), "collapses"] == 5


def test_contrasts_are_paired_by_seed_and_scored_against_their_margin(study):
    outcomes = run_outcomes(load_study(study), threshold=0.6)
    ahead = Contrast("DPPO beats PG-IS", "test", ("dppo_binary_tv", "mb1-bf16"), ("pg_is", "mb1-bf16"))
    behind = Contrast("PG-IS beats DPPO", "test", ("pg_is", "mb1-bf16"), ("dppo_binary_tv", "mb1-bf16"))
    huge_margin = Contrast("DPPO beats PG-IS by 0.5", "test", ahead.left, ahead.right, margin=0.5)
    one_pair = Contrast("fp32 vs bf16", "test", ("pg_is", "mb1-fp32"), ("pg_is", "mb1-bf16"))
    itself = Contrast("DPPO beats itself", "test", ahead.left, ahead.left)
    table = contrast_table(outcomes, (ahead, behind, huge_margin, one_pair, itself)).set_index("claim")
    gap = RISE.mean() - COLLAPSE.mean()
    assert table.loc["DPPO beats PG-IS", "difference"] == pytest.approx(gap)  # the seed shifts cancel in pairs
    assert table.loc["DPPO beats PG-IS", "pairs"] == 5
    assert list(table["verdict"]) == ["holds", "refuted", "equivalent", "not run", "identical runs"]  # 0.325 < 0.5
    lines = summary_lines(table.reset_index())
    assert lines[4] == "- DPPO beats itself (test; exploratory): **identical runs** — both arms gave auc " \
        f"{table.loc['DPPO beats itself', 'left']:.3g} on each of 5 seeds; no verdict"
    assert lines[0].startswith("- DPPO beats PG-IS (test; exploratory): **holds** — auc")
    assert "5 paired seeds" in lines[0]
    assert "95% t-interval" in lines[0] and "Holm" not in lines[0]
    assert lines[3] == "- fp32 vs bf16 (test; exploratory): not run yet"


def test_primary_claims_are_holm_adjusted_and_need_eight_seeds(tmp_path):
    """Eight seeds each of two arms a fixed gap apart (plus seed noise): as the only primary claim Holm changes
    nothing; beside a second primary claim its p doubles (the larger of two: ×1 after the smaller's ×2 is
    compared); with five seeds the same claim is scored as exploratory, and a primary claim not run yet still
    prints as primary (as written down)."""
    rng = np.random.default_rng(0)
    for seed in range(8):
        base = rng.uniform(0.2, 0.3)
        for method, shift in (("dppo_binary_tv", 0.06), ("pg_is", 0.0), ("cispo", 0.055)):
            curve = np.full(STEPS, base + shift) + rng.normal(0, 0.02, STEPS)
            write_run(tmp_path / "sudoku" / f"{method}-mb1-bf16-s{seed}", method, seed, curve, np.full(STEPS, 0.01))
    outcomes = run_outcomes(load_study(tmp_path), threshold=0.9)
    first = Contrast("DPPO beats PG-IS", "test", ("dppo_binary_tv", "mb1-bf16"), ("pg_is", "mb1-bf16"),
                     family="primary")
    second = Contrast("CISPO beats PG-IS", "test", ("cispo", "mb1-bf16"), ("pg_is", "mb1-bf16"), family="primary")
    alone = contrast_table(outcomes, (first,)).iloc[0]
    both = contrast_table(outcomes, (first, second)).set_index("claim")
    assert alone["p_above_adjusted"] == alone["p_above"]
    smaller, larger = sorted(both["p_above"])
    assert sorted(both["p_above_adjusted"]) == pytest.approx([2 * smaller, max(2 * smaller, larger)])
    assert "Holm-adjusted over 2 distinct primary comparisons" in summary_lines(both.reset_index())[0]
    few = outcomes[outcomes["seed"] < 5]
    assert contrast_table(few, (first,)).iloc[0]["family"] == "exploratory"
    unplayed = contrast_table(outcomes[outcomes["arm_method"] != "cispo"], (second,))  # written down, not run yet
    assert unplayed.iloc[0]["family"] == "primary"
    assert summary_lines(unplayed) == ["- CISPO beats PG-IS (test; primary): not run yet"]
    apart = contrast_table(outcomes, (replace(first, experiment="a"), replace(second, experiment="b")))
    assert list(apart["p_above_adjusted"]) == list(apart["p_above"])  # each experiment is its own family
    assert all("Holm-adjusted over 1 distinct primary comparison:" in line for line in summary_lines(apart))
    copy = replace(first, claim="the same comparison under another name")  # one comparison counted once
    twice = contrast_table(outcomes, (first, copy, second)).set_index("claim")
    assert list(twice["holm_size"]) == [2, 2, 2] and twice["same_as"].iloc[1] == "DPPO beats PG-IS"
    assert twice["p_above_adjusted"].iloc[0] == twice["p_above_adjusted"].iloc[1] == both.loc[
        "DPPO beats PG-IS", "p_above_adjusted"]


def test_claims_scored_on_the_same_runs_share_one_line(study):
    outcomes = run_outcomes(load_study(study), threshold=0.6)
    once = Contrast("DPPO beats PG-IS", "test", ("dppo_binary_tv", "mb1-bf16"), ("pg_is", "mb1-bf16"))
    again = Contrast("the anchor matters", "other", once.left, once.right)
    table = contrast_table(outcomes, (once, again))
    assert list(table["same_as"]) == ["", "DPPO beats PG-IS"]
    lines = summary_lines(table)
    assert len(lines) == 1 and "; same runs: the anchor matters (other)" in lines[0]


def test_the_study_contrasts_all_score_on_a_partial_study(study):
    table = contrast_table(run_outcomes(load_study(study), threshold=0.6))
    assert len(table) == len(CONTRASTS)
    growth = table.set_index("claim").loc[CONTRASTS[4].claim]
    assert CONTRASTS[4].metric == "engine_mismatch_growth" and growth["verdict"] == "holds"
    assert set(table["verdict"]) <= {"holds", "refuted", "equivalent", "inconclusive", "identical runs", "not run"}


def test_probe_table(study):
    table = probe_table(load_study(study))
    assert table.loc[("sudoku", "mb1-bf16"), "binary TV"] == pytest.approx(0.01)
    assert table.loc[("sudoku", "mb1-bf16"), "binary/exact TV"] == pytest.approx(1 / 3)
    assert table.loc[("sudoku", "mb1-bf16"), "topk/exact TV"] == pytest.approx(2 / 3)  # from the means


def manifest(study) -> None:
    """Write ``study.json`` for the run folders of ``study``, each finished (what ``python -m studies.cpu.pack``
    packs)."""
    runs = [{"task": path.parent.name, "name": path.name, "state": "done"} for path in sorted(study.glob("*/*"))]
    (study / "study.json").write_text(json.dumps({"config": {"experiments": []}, "runs": runs}))


def test_a_packed_study_reads_as_the_study_it_was_packed_from(study, tmp_path, capsys):
    """``python -m studies.cpu.pack``'s Parquet files read back as the study's folders: the same long table, row for
    row (each run's path names the folder it was packed from), the same outcomes, each run's config; from
    gzip-compressed logs too. A log with a repeated step, a metric written as ``"nan"`` throughout, ``Infinity``, a
    bool, a metric some steps lack, a run without evaluations and a rule without a trust region in its config but
    not in its preset included."""
    odd = study / "sudoku" / "dppo_binary_tv-mb1-bf16-s0"
    rows = [json.loads(line) for line in (odd / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.update({"nan_metric": "nan", "flag": row["step"] % 2 == 0, "grad_norm": float("inf")})
        if row["step"] % 3:
            row["sometimes"] = row["step"] / 10
    rows.append({**rows[-1], "success": 0.5})  # the last step logged twice: the second line stands
    (odd / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (study / "sudoku" / "pg_is-mb1-fp32-s0" / "eval.jsonl").unlink()
    tv = study / "sudoku" / "dppo_binary_tv-mb1-bf16-s1" / "config.json"
    config = json.loads(tv.read_text())
    tv.write_text(json.dumps({**config, "trust_region": {**config["trust_region"], "rule": "none"}}))
    manifest(study)
    with pytest.warns(UserWarning, match="step 40 is logged more than once"):
        plain = load_study(study)
    for log in study.glob("*/*/*.jsonl"):
        log.with_name(log.name + ".gz").write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    with pytest.warns(UserWarning, match="step 40 is logged more than once"):
        pack_study.main(["--study", str(study), "--out", str(tmp_path / "packed")])
    assert "packed 11 finished runs" in capsys.readouterr().out
    packed = load_study(tmp_path / "packed")
    assert packed["path"].tolist() == [p.replace(str(study), str(tmp_path / "packed")) for p in plain["path"]]
    pd.testing.assert_frame_equal(packed.drop(columns="path"), plain.drop(columns="path"), check_exact=True)
    assert packed.attrs["nonfinite"] == plain.attrs["nonfinite"] == {"nan_metric": [odd.name], "grad_norm": [odd.name]}
    outcomes = run_outcomes(packed, 0.6)
    pd.testing.assert_frame_equal(outcomes, run_outcomes(plain, 0.6), check_exact=True)
    assert outcomes.set_index("run").loc["sudoku/dppo_binary_tv-mb1-bf16-s1", "by_design"]  # read from its config
    assert run_config(tmp_path / "packed" / "sudoku" / tv.parent.name) == json.loads(tv.read_text())


def test_a_value_that_is_not_a_number_is_not_packed(study, tmp_path):
    run = study / "sudoku" / "pg_is-mb1-bf16-s2"
    (run / "eval.jsonl").write_text(json.dumps({"step": 0, "eval/success": "high"}) + "\n")
    manifest(study)
    with pytest.raises(SystemExit, match=r"^error: pg_is-mb1-bf16-s2: its eval log's 'eval/success': 'high' is not a "
                                         r"number \(a packed run keeps numbers\): nothing packed$"):
        pack_study.main(["--study", str(study), "--out", str(tmp_path / "packed")])
    assert not (tmp_path / "packed").exists()


def test_an_empty_folder_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m studies.cpu.run first"):
        load_study(tmp_path)


def test_noise_at_low_success_is_not_a_collapse(tmp_path):
    """Halving a success of a few % is within one rollout's noise: a collapse also needs an absolute drop of 0.1."""
    low = np.concatenate([np.linspace(0.05, 0.15, 20), np.linspace(0.15, 0.05, 20)])
    high = np.concatenate([np.linspace(0.3, 0.6, 20), np.linspace(0.6, 0.1, 20)])
    write_run(tmp_path / "sudoku" / "cispo-mb4-fp32-s0", "cispo", 0, low, np.full(STEPS, 0.01))
    write_run(tmp_path / "sudoku" / "cispo-mb4-fp32-s1", "cispo", 1, high, np.full(STEPS, 0.01))
    outcomes = run_outcomes(load_study(tmp_path), threshold=0.5).set_index("run")
    assert outcomes.loc["sudoku/cispo-mb4-fp32-s0", "final"] < 0.5 * outcomes.loc["sudoku/cispo-mb4-fp32-s0", "peak"]
    assert not outcomes.loc["sudoku/cispo-mb4-fp32-s0", "collapsed"]
    assert outcomes.loc["sudoku/cispo-mb4-fp32-s1", "collapsed"]


def test_bad_updates_before_drops_correlate_negatively(tmp_path):
    rng = np.random.default_rng(0)
    bad = rng.uniform(0, 0.01, STEPS)
    success = 0.5 + np.cumsum(np.r_[0.0, -5 * bad[:-1]])  # each bad step lowers success on the next
    write_run(tmp_path / "sudoku" / "pg_is-mb4-fp32-s0", "pg_is", 0, success, np.full(STEPS, 0.01))
    path = tmp_path / "sudoku" / "pg_is-mb4-fp32-s0" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "bad_update/fraction": b}) + "\n" for r, b in zip(rows, bad, strict=True)))
    result = bad_update_drops(load_study(tmp_path), horizon=1).set_index("run").loc["sudoku/pg_is-mb4-fp32-s0"]
    assert result["rho"] < -0.9 and result["p"] < 1e-6 and result["steps"] == STEPS - 1


def test_a_contrast_compares_runs_of_its_own_task_only(study):
    outcomes = run_outcomes(load_study(study), threshold=0.6)
    on_sudoku = Contrast("DPPO beats PG-IS", "test", ("dppo_binary_tv", "mb1-bf16"), ("pg_is", "mb1-bf16"))
    on_guess = Contrast("DPPO beats PG-IS on guess", "test", on_sudoku.left, on_sudoku.right, task="guess")
    table = contrast_table(outcomes, (on_sudoku, on_guess)).set_index("claim")
    assert list(table["pairs"]) == [5, 0] and list(table["verdict"]) == ["holds", "not run"]


def test_runs_of_two_tasks_keep_their_own_names(study):
    write_run(study / "guess" / "pg_is-mb1-bf16-s0", "pg_is", 0, RISE, np.full(STEPS, 0.01))
    outcomes = run_outcomes(load_study(study), threshold=0.6).set_index("run")
    assert outcomes.loc["guess/pg_is-mb1-bf16-s0", "task"] == "guess"
    assert outcomes.loc["sudoku/pg_is-mb1-bf16-s0", "collapsed"]
    assert not outcomes.loc["guess/pg_is-mb1-bf16-s0", "collapsed"]


def test_a_claim_within_one_arm_compares_two_of_its_numbers_seed_by_seed(study):
    """``right_metric``: held-out success at the start against the end of the same runs (PG-IS collapses: 0.3 → 0)."""
    outcomes = run_outcomes(load_study(study), threshold=0.6)
    falls = Contrast("PG-IS loses held-out success", "test", ("pg_is", "mb1-bf16"), ("pg_is", "mb1-bf16"),
                     "eval_before", 0.05, right_metric="eval_after")
    row = contrast_table(outcomes, (falls,)).iloc[0]
    assert row["pairs"] == 5 and row["verdict"] == "holds"
    assert row["difference"] == pytest.approx(0.3 - (COLLAPSE[-1] - 0.02))
    assert "eval_before 0.3 vs eval_after -0.02, difference" in summary_lines(contrast_table(outcomes, (falls,)))[0]


DEAD_AT_ONCE = np.r_[0.4, 0.1, np.zeros(STEPS - 2)]


def test_a_flagged_arm_gets_its_flag_and_no_verdict_in_the_opening_section(tmp_path):
    """The ``frontier`` experiment's arms on five seeds: SAPO blocks nothing and learns best, GSPO blocks 60% of
    the tokens and is dead from its second step, the symmetric band blocks 2%. The opening section prints SAPO's
    and GSPO's flags where their verdicts would be, and the band's verdict; the summary keeps each verdict as
    scored, with the flag beside it."""
    rng = np.random.default_rng(0)
    arms = {"dppo_binary_kl": (0.5 * RISE, 0.015), "pg_is": (0.8 * RISE, 0.0), "sapo": (RISE, 0.0),
            "gspo": (DEAD_AT_ONCE, 0.6), "ipo": (0.9 * RISE, 0.02)}
    for seed in range(5):
        for method, (curve, masked) in arms.items():
            write_run(tmp_path / "sudoku" / f"{method}-mech-int4-s{seed}", method, seed,
                      np.clip(curve + rng.normal(0, 0.01), 0, 1), np.full(STEPS, 0.01), "int4", masked)
    outcomes = run_outcomes(load_study(tmp_path), THRESHOLD)
    flags = arm_flag_table(outcomes)
    assert flags.loc[("sudoku", "mech-int4", "sapo"), "flag"] == "no trust region in effect (blocked 0.00%)"
    assert flags.loc[("sudoku", "mech-int4", "pg_is"), "flag"] == ""  # no trust region by design
    table = contrast_table(outcomes)
    line = frontier_line(table, FRONTIER_ARMS, FRONTIER_CONTRASTS, pg_is_family=FRONTIER_PG_IS_FAMILY)
    assert "SAPO: no trust region in effect (blocked 0.00%): **no verdict**" in line
    assert ("GSPO: blocks most tokens (blocked 60.00%); collapsed within 5 steps in 5 of 5 runs (blocked 60.00% in "
            "steps 1–5): **no verdict**") in line
    assert "SAPO **" not in line and "GSPO **" not in line
    assert "the symmetric band (prime-rl's IPO) **holds**" in line
    assert line in scale_lines(table)  # the opening section's line (the other experiments' arms have not run)
    sapo = next(summary for summary in summary_lines(table) if ": SAPO beats DPPO-Binary-KL" in summary)
    assert "**holds**" in sapo and sapo.endswith("; flagged: SAPO at `mech-int4`: no trust region in effect "
                                                 "(blocked 0.00%)")


def test_the_sign_claim_is_scored_by_stretch_of_the_run(tmp_path):
    """Over-δ tokens of PG-IS runs: Â < 0 as common on both sides of μ − π in the first ten steps, and more common
    where μ > π after: the stretches say where the pooled difference comes from."""
    rng = np.random.default_rng(1)
    for seed in range(4):
        run = tmp_path / "sudoku" / f"pg_is-mech-int4-s{seed}"
        write_run(run, "pg_is", seed, RISE, np.full(STEPS, 0.01), "int4")
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            above = 0.5 if row["step"] <= 10 else 0.7
            row.update({"over_delta/neg_adv_mu_above": above + rng.normal(0, 0.01),
                        "over_delta/pos_adv_mu_above": 1 - above, "over_delta/neg_adv_mu_below": 0.5,
                        "over_delta/pos_adv_mu_below": 0.5})
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    shares = sign_shares_by_stretch(load_study(tmp_path), "mech-int4", "pg_is", ((1, 10), (11, 40)))
    assert shares.loc["1-10", "difference"] == pytest.approx(0.0, abs=0.02)
    assert shares.loc["11-40", "difference"] == pytest.approx(0.2, abs=0.02) and shares.loc["11-40", "higher_in"] == 4


def test_a_relabelled_claim_keeps_its_preregistered_record():
    """The page prints a display label for the sign claim; the claims file keeps the label it was written with."""
    for source, shown in DISPLAY_SOURCES.items():
        assert any(contrast.source == source for contrast in CONTRASTS) and shown != source


def test_strength_against_outcome_is_each_arms_blocked_share_beside_its_auc(tmp_path):
    """Two strengths of one rule on three seeds, the stronger blocking 8% and learning about half as well: the table
    gives each its blocked share, its AUC's mean with the t-interval's half-width over seeds, and leaves out a
    strength without runs."""
    from scipy.stats import t as student_t

    for seed in range(3):
        write_run(tmp_path / "sudoku" / f"gspo-mech-int4-s{seed}", "gspo", seed, RISE - 0.01 * seed,
                  np.full(STEPS, 0.01), "int4", masked=0.02)
        write_run(tmp_path / "sudoku" / f"ipo-mech-int4-s{seed}", "ipo", seed, 0.5 * RISE - 0.02 * seed,
                  np.full(STEPS, 0.01), "int4", masked=0.08)
    outcomes = run_outcomes(load_study(tmp_path), THRESHOLD)
    table = strength_table(outcomes, "mech-int4", {"GSPO": {"2%": "gspo", "8%": "ipo", "1%": "sapo"}})
    assert list(table.index) == [("GSPO", "2%"), ("GSPO", "8%")]
    weak, strong = table.loc[("GSPO", "2%")], table.loc[("GSPO", "8%")]
    assert (weak["blocked %"], strong["blocked %"]) == (pytest.approx(2.0), pytest.approx(8.0))
    aucs = outcomes[outcomes["arm_method"] == "gspo"]["auc"]
    assert weak["auc"] == pytest.approx(aucs.mean()) and strong["auc"] < weak["auc"]
    assert weak["auc ± 95%"] == pytest.approx(student_t.ppf(0.975, 2) * aucs.std(ddof=1) / np.sqrt(3))
    assert strong["auc ± 95%"] == pytest.approx(2 * weak["auc ± 95%"])  # seeds twice as far apart
    assert (weak["runs"], weak["collapsed"]) == (3, 0)
    assert strength_table(outcomes, "mb1-fp32", {"GSPO": {"2%": "gspo"}}).empty


def test_claims_asking_one_question_are_holm_corrected_together():
    """Three exploratory claims against one reference, each refuted alone at p 0.01: corrected together, each
    becomes 0.03 and inconclusive; a claim on the same numbers as one of them counts once, and one with identical
    runs is no comparison of the family."""
    rows = [{"claim": name, "pairs": 8, "identical": False, "same_as": "", "p_above": 1.0, "p_below": 0.01,
             "p_equivalent": 1.0} for name in ("a", "b", "c")]
    rows += [{"claim": "a again", "pairs": 8, "identical": False, "same_as": "a", "p_above": 1.0, "p_below": 0.01,
              "p_equivalent": 1.0},
             {"claim": "twins", "pairs": 8, "identical": True, "same_as": "", "p_above": 1.0, "p_below": 1.0,
              "p_equivalent": 0.0}]
    pooled = pooled_holm(pd.DataFrame(rows), ("a", "b", "c", "a again", "twins"))
    assert list(pooled["holm_size"]) == [3] * 5
    assert list(pooled["p_below_adjusted"][:4]) == pytest.approx([0.03] * 4)
    assert list(pooled["verdict"]) == ["inconclusive"] * 4 + ["identical runs"]
    alone = pooled_holm(pd.DataFrame(rows), ("a",))
    assert alone.loc["a", "p_below_adjusted"] == pytest.approx(0.01) and alone.loc["a", "verdict"] == "refuted"


def test_a_calibrated_arms_blocked_share_from_step_2_leaves_out_its_first_step(tmp_path):
    """A calibrated arm blocks 40% on step 1 (its preset's own band) and 2% after; the reference 1% throughout but
    on one seed 2%: over the run the arm's share carries step 1, from step 2 on it does not, and its ratio to the
    reference's share on the same seed ranges 1× to 2×."""
    for seed in range(2):
        for method, first, later in (("gspo", 0.4, 0.02), ("dppo_binary_kl", 0.01, 0.01 * (1 + (seed == 1)))):
            run = tmp_path / "sudoku" / f"{method}-mech-int4-s{seed}"
            write_run(run, method, seed, RISE - 0.01 * seed, np.full(STEPS, 0.01), "int4")
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for row in rows:
                row["mask/fraction"] = first if row["step"] == 1 else later
            (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    df = load_study(tmp_path)
    whole, later = blocked_share(df, ("mech-int4",)), blocked_share(df, ("mech-int4",), (2, None))
    assert whole[("mech-int4", "gspo")] == pytest.approx((0.4 + (STEPS - 1) * 0.02) / STEPS)
    assert later[("mech-int4", "gspo")] == pytest.approx(0.02)
    assert whole[("mech-int4", "gspo")] == pytest.approx(
        run_outcomes(df, THRESHOLD).groupby(["condition", "arm_method"])["masked"].mean()[("mech-int4", "gspo")])
    per_run = blocked_per_run(df, ("mech-int4",), (2, None))
    assert blocked_ratio_range(per_run, "mech-int4", ("gspo",)) == pytest.approx((1.0, 2.0))
    assert all(np.isnan(blocked_ratio_range(per_run, "mech-int4", ("gspo",), reference="pg_is")))
    assert all(np.isnan(blocked_ratio_range(per_run, "field-mb4", ("gspo",))))


def test_the_opening_names_the_claim_written_after_its_runs():
    """One claim scores only runs played before it was written (the sign claim over time on seeds 0–7): the
    opening's first line says so, and says no claim but it was written after all of its runs."""
    assert written_after_runs(CONTRASTS) == [SIGN_CONTRASTS[0]]
    line = provenance_line()
    assert "every claim written before its runs but one: the sign claim over time on the `mechanism` experiment's " \
           "seeds 0–7, written after those runs were read by stretch (exploratory)" in line
    assert "with every claim written before its runs." in provenance_line(CONTRASTS[:1])
