"""The CPU study (studies/cpu): its grid is every arm of every experiment on five paired seeds, with flags the local
engine accepts; a small real study plays, skips finished runs, completes an interrupted one, packs and reports; the
page's blocks are what the committed runs give, and every claim was committed before the runs it scores."""

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch
import tyro
from test_notebooks import assert_clean, execute, images, outputs, printed

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.run.safe_io import read_jsonl
from dppo_oat.trust_region import PRESETS, TrustRegion
from studies.cpu import pack as pack_study
from studies.cpu import run as cpu_study
from studies.cpu.claims import (
    CONTRASTS,
    FRONTIER_ARMS,
    FRONTIER_CONTRASTS,
    FRONTIER_MORE_ARMS,
    FRONTIER_MORE_CONTRASTS,
    FRONTIER_STALE_ARMS,
    FRONTIER_STALE_CONTRASTS,
    MATCHED_ARMS,
    MATCHED_MORE_ARMS,
    SWEEP_ARMS,
    THRESHOLD,
)
from studies.cpu.figures import FIGURES
from studies.cpu.packed import packed_configs, read_task, task_files
from studies.cpu.page import (
    FIGURES_MARKER,
    MATCHED_PG_IS_FAMILY,
    SUMMARY_MARKER,
    block,
    page_blocks,
    scale_block,
    summary_block,
)
from studies.cpu.placebo import PLACEBO_PRESETS, PLACEBO_RATES, STUDY_PRESETS, placebo_keep
from studies.cpu.report import (
    arm_flag_table,
    condition_of,
    contrast_table,
    load_study,
    pooled_holm,
    run_outcomes,
    sign_shares_by_stretch,
    study_variant,
)

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "cpu"
COMMITTED = STUDY / "data"
REPORT = STUDY / "cpu_study.ipynb"
README = ROOT / "docs" / "cpu-study.md"  # the page with the summary
TINY = ("--warm-start.demo-episodes", "150", "--warm-start.max-steps", "20", "--warm-start.check-every", "20",
        "--warm-start.check-episodes", "8", "--warm-start.vocab-size", "300")


def study_arms():
    """Every (task, method, condition) of the study's experiments."""
    return {(t, m, c) for e in cpu_study.EXPERIMENTS.values() for t in e.tasks for c in e.conditions for m in e.methods}


def test_the_default_grid_is_every_arm_of_every_experiment_on_five_paired_seeds(tmp_path):
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    runs = cpu_study.plan(config)
    arms = study_arms()
    assert {(r.task, r.method, r.condition) for r in runs} == arms
    assert len(runs) == len(arms) * 5 and len({(r.task, r.name) for r in runs}) == len(runs)
    assert {r.seed for r in runs} == {0, 1, 2, 3, 4} and {r.task for r in runs} == set(cpu_study.TASKS)
    for task in cpu_study.TASKS:  # seed-major within a task: a partial study has whole seeds
        task_runs = [r for r in runs if r.task == task]
        assert task_runs[: len(task_runs) // 5] == [r for r in task_runs if r.seed == 0]
    for run in runs[:: 3]:  # the flags parse and validate as the trainer's (no model is built)
        if run.method in STUDY_PRESETS:  # registered in their own training process only (test_a_placebo_run...)
            continue
        train_config = tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False))
        spec, resume_step = validate_config(train_config)
        condition = cpu_study.CONDITIONS[run.condition]
        assert spec.trust_region.name == run.method.partition("@")[0] and resume_step is None
        assert train_config.minibatches_per_rollout == condition.minibatches and train_config.lr == condition.lr
        assert train_config.rollout_dtype == condition.precision and train_config.warm_start.seed == 0
        assert train_config.max_staleness == condition.max_staleness and train_config.dtype == condition.dtype
        assert train_config.rollout_redraw == condition.redraw and train_config.num_epochs == condition.epochs
        assert train_config.probe_every == (0 if condition.max_staleness else config.probe_every)
        assert train_config.lr_schedule == "constant"  # as the committed runs: the default run's decay is its own
        assert train_config.warm_start.target_success == 0.25 and train_config.warm_start.check_every == 40
        assert condition_of(run.name) == run.condition


def test_a_method_variant_is_its_preset_with_overrides(tmp_path):
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    run = cpu_study.StudyRun("sudoku", "mask_negative@delta=0.8", "mb4-fp32", 0)
    spec, _ = validate_config(tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False)))
    assert spec.trust_region.rule == TrustRegion.preset("mask_negative").rule and spec.trust_region.delta == 0.8
    assert condition_of(run.name) == "mb4-fp32"


@pytest.mark.parametrize("condition", ["mech-int4", "field-mb4"])
def test_a_matched_arm_calibrates_its_band_like_dppo_binary_kl(tmp_path, condition):
    """Every rule of the matched experiments calibrates per run to DPPO-Binary-KL's blocked share on step 1 (the
    flags validate as the trainer's, before any model); TRM, DeepSeek-V3.2's mask and VACO move both their bands."""
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    for method, _ in MATCHED_ARMS + MATCHED_MORE_ARMS:
        run = cpu_study.StudyRun("sudoku", method, condition, 0)
        spec, _ = validate_config(tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False)))
        preset = method.partition("@")[0]
        assert spec.trust_region.name == preset and spec.calibration.like == "dppo_binary_kl"
        assert spec.calibration.band == ("both" if preset in ("trm_max", "trm_avg", "opsm", "vaco") else None)
        assert study_variant(method).endswith("(as strong as DPPO-Binary-KL)") and condition_of(run.name) == condition
        assert cpu_study.trainer_module(method) == "dppo_oat.train"
    assert [cpu_study.trainer_module(m) for m in PLACEBO_PRESETS] == ["studies.cpu.placebo"] * 2


def test_a_swept_arm_is_one_variant_named_by_its_target(tmp_path):
    """The band sweep's arms calibrate per run to a fixed share of step 1's tokens: one variant per arm, named by
    the share (each run's config records its own band, which would split the arm by seed)."""
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    names = []
    for method, _ in SWEEP_ARMS:
        run = cpu_study.StudyRun("sudoku", method, "mech-int4", 0)
        spec, _ = validate_config(tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False)))
        assert spec.calibration.target == float(method.split("calibrate=")[1].split(",")[0])
        names.append(study_variant(method))
    assert names == [f"{rule} (calibrated to block {share})" for rule in ("GSPO", "VACO", "TRM-Avg")
                     for share in ("2%", "8%")]


def test_the_placebo_rates_are_what_int4s_mask_blocked(committed_study):
    """PLACEBO_RATES are the shares of the A ≠ 0 tokens DPPO-Binary-KL's mask blocked in each half and μ bucket of
    its mech-int4 runs (means over steps and seeds), to the digits written."""
    df = committed_study[0]
    rows = df[(df["condition"] == "mech-int4") & (df["arm_method"] == "dppo_binary_kl")]
    assert rows["seed"].nunique() == 8
    for side, cell in (("negative", "neg_adv_mu_above"), ("positive", "pos_adv_mu_below")):
        for bucket, rate in PLACEBO_RATES[side].items():
            measured = rows[rows["metric"] == f"mask_cell/{cell}_{bucket}"]["value"].mean()
            assert measured == pytest.approx(rate, rel=2e-3, abs=1e-7), (side, bucket)


def placebo_inputs(seed: int, rows: int = 64, tokens: int = 12):
    """A loss call's mask inputs: μ spread over the three μ buckets, mixed-sign Â per row, some padding."""
    from dppo_oat.trust_region import MaskInputs

    gen = torch.Generator().manual_seed(seed)
    behavior = torch.rand(rows, tokens, generator=gen).clamp(min=1e-3).log()
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, tokens).clone()
    advantages[:4] = 0.0
    response = torch.rand(rows, tokens, generator=gen) > 0.1
    return MaskInputs(behavior, behavior, behavior, advantages, response, torch.zeros(rows, tokens))


def test_the_placebo_blocks_its_half_at_its_rates_and_draws_from_the_call(monkeypatch):
    """In every μ bucket the placebo blocks tokens of its half's sign of Â only, as many as the rate × the call's
    A ≠ 0 tokens on average; the same call gives the same tokens (a resume repeats it), another call others."""
    import types

    from dppo_oat.trust_region.metrics import MU_BUCKETS
    from studies.cpu import placebo

    monkeypatch.setitem(placebo.PLACEBO_RATES, "negative", {"mu_lt_0.1": 0.002, "mu_0.1_0.5": 0.01,
                                                            "mu_ge_0.5": 0.03})
    tr = types.SimpleNamespace(mask_side="negative")
    counts = {bucket: [] for _, _, bucket in MU_BUCKETS}
    for seed in range(200):
        x = placebo_inputs(seed)
        keep = placebo_keep(x, tr)
        assert torch.equal(keep, placebo_keep(x, tr))
        blocked = ~keep
        assert not (blocked & ~(x.response & (x.advantages < 0))).any()
        active = int((x.response & (x.advantages != 0)).sum())
        mu = x.behavior_logp.exp()
        for low, high, bucket in MU_BUCKETS:
            counts[bucket].append(int((blocked & (mu >= low) & (mu < high)).sum()) / active)
    for bucket, shares in counts.items():
        assert sum(shares) / len(shares) == pytest.approx(placebo.PLACEBO_RATES["negative"][bucket], rel=0.15)
    first, second = placebo_inputs(0), placebo_inputs(1)
    assert placebo.call_seed(first) != placebo.call_seed(second)
    with pytest.raises(ValueError, match="mask_side negative or positive"):
        placebo_keep(first, types.SimpleNamespace(mask_side="both"))


PLACEBO_CHOICES = """
import json, sys, typing
from studies.cpu import placebo
if sys.argv[1] == "late":
    import dppo_oat.settings.spec  # reads the presets into --trust-region's choices
else:
    import dppo_oat.trust_region  # the package's rules, as placebo.main imports them first
try:
    placebo.register()
    refused = None
except RuntimeError as error:
    refused = str(error)
from dppo_oat.settings.spec import PresetName
print(json.dumps({"refused": refused, "choices": list(typing.get_args(PresetName))}))
"""


@pytest.mark.parametrize("when", ["in_time", "late"])
def test_the_placebo_is_refused_once_the_trust_region_choices_are_fixed(when):
    """In a fresh process: registered before :mod:`dppo_oat.settings.spec` is imported, the placebo presets are
    ``--trust-region`` choices; registered after, they could never be one, and :func:`register` refuses."""
    done = subprocess.run([sys.executable, "-c", PLACEBO_CHOICES, when], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    if when == "in_time":
        assert result["refused"] is None and {"placebo_neg", "placebo_pos"} <= set(result["choices"])
    else:
        assert "before dppo_oat.settings.spec is imported" in (result["refused"] or ""), result
        assert "placebo_neg" not in result["choices"]


def test_a_placebo_run_trains_with_the_study_rule_registered_in_its_own_process(tmp_path):
    """``python -m studies.cpu.placebo`` is the trainer with the placebo presets registered: a real run of
    ``placebo_neg`` records its rule and never blocks a token with Â > 0, and this process's presets stay the
    package's."""
    config = cpu_study.StudyConfig(out_dir=str(tmp_path / "study"), steps=2, groups_per_step=2, group_size=2,
                                   probe_every=1, eval_episodes=4,
                                   extra_args=" ".join([*TINY, "--cache-dir", str(tmp_path / "cache")]))
    result = cpu_study.play(cpu_study.StudyRun("sudoku", "placebo_neg", "v5-fp32", 0), config)
    assert result["returncode"] == 0 and result["state"] == "done", Path(result["log"]).read_text()[-2000:]
    run = tmp_path / "study" / "sudoku" / "placebo_neg-v5-fp32-s0"
    trust_region = json.loads((run / "config.json").read_text())["trust_region"]
    assert (trust_region["rule"], trust_region["mask_side"], trust_region["name"]) == ("placebo_cell", "negative",
                                                                                       "placebo_neg")
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["mask/fraction_pos_adv"] == 0 for r in rows)
    assert "placebo_neg" not in PRESETS and load_study(tmp_path / "study")["variant"].unique().tolist() == [
        "Placebo A<0 (random, int4's rate)"]


def test_the_sign_gap_by_run_is_the_stretch_tables_difference(committed_study):
    """``sign_gap_early`` and ``sign_gap_late`` (the sign claim over time, per run) average to the differences the
    stretch table prints for steps 1–10 and 26–50."""
    df, outcomes = committed_study
    table = sign_shares_by_stretch(df, "mech-int4", "pg_is")
    runs = outcomes[(outcomes["condition"] == "mech-int4") & (outcomes["arm_method"] == "pg_is")]
    assert runs["sign_gap_early"].mean() == pytest.approx(table.loc["1-10", "difference"])
    assert runs["sign_gap_late"].mean() == pytest.approx(table.loc["26-50", "difference"])


def test_every_preregistered_contrast_compares_arms_of_the_study():
    arms = study_arms()
    for contrast in CONTRASTS:
        left, right = (contrast.task, *contrast.left), (contrast.task, *contrast.right)
        assert left in arms and right in arms, contrast.claim
        # within one arm: two numbers
        assert left != right or contrast.right_metric not in ("", contrast.metric), contrast.claim


def test_a_task_overrides_the_study_settings_it_needs(tmp_path):
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    guess = tyro.cli(TrainConfig, args=cpu_study.train_args(cpu_study.StudyRun("guess", "pg_is", "mb4-fp32", 0),
                                                            config, resume=False))
    sudoku = tyro.cli(TrainConfig, args=cpu_study.train_args(cpu_study.StudyRun("sudoku", "pg_is", "mb4-fp32", 0),
                                                             config, resume=False))
    assert guess.env_ids == ("game:GuessTheNumber-v0-easy-compact",) and guess.gamma == 1.0
    assert guess.groups_per_step == 32 and sudoku.groups_per_step == config.groups_per_step == 8
    assert sudoku.gamma == 0.0 and guess.train_pool == sudoku.train_pool == config.train_pool


def test_bad_study_settings_fail_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cpu_study.main(["--out-dir", str(tmp_path), "--steps", "0"])
    assert exit_info.value.code == 2 and "--steps must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "study.json").exists()


def test_a_small_study_plays_skips_resumes_packs_and_reports(tmp_path, monkeypatch):
    out = tmp_path / "study"
    args = ["--out-dir", str(out), "--experiments", "int8", "--seeds", "0", "--steps", "2", "--groups-per-step", "2",
            "--group-size", "2", "--probe-every", "1", "--eval-episodes", "4",
            "--extra-args=" + " ".join([*TINY, "--cache-dir", str(tmp_path / "cache")])]
    cpu_study.main(args)
    manifest = json.loads((out / "study.json").read_text())
    assert [r["state"] for r in manifest["runs"]] == ["done", "done"]
    run = out / "sudoku" / "pg_is-mb1-int8-s0"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all("probe/exact_tv_mean" in r for r in rows)
    assert all(r["optimizer_steps"] == 1 for r in rows)  # one gradient step per rollout: no staleness
    assert all(r["mismatch/first_abs_diff_mean"] > 1e-5 for r in rows)  # the int8 copy's mismatch is real
    config = json.loads((run / "config.json").read_text())
    assert config["rollout_dtype"] == "int8" and config["train_pool"] == 64
    assert all(0 <= e["eval/learner_success"] <= 1 for e in read_jsonl(run / "eval.jsonl"))  # the fp32 learner too
    assert all("over_delta/neg_adv_mu_above" in r and "mask_cell/pos_adv_mu_below_mu_ge_0.5" in r for r in rows)

    finished = (out / "sudoku" / "dppo_binary_tv-mb1-int8-s0" / "metrics.jsonl").stat().st_mtime_ns
    evals = (run / "eval.jsonl").read_text().splitlines()
    (run / "eval.jsonl").write_text(evals[0] + "\n")  # killed after its last checkpoint, before the final eval
    cpu_study.main(args)
    assert (out / "sudoku" / "dppo_binary_tv-mb1-int8-s0" / "metrics.jsonl").stat().st_mtime_ns == finished
    assert [e["step"] for e in read_jsonl(run / "eval.jsonl")] == [0, 2]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]

    packed = tmp_path / "packed"  # the committed form: one Parquet file per task, read like the study itself
    pack_study.main(["--study", str(out), "--out", str(packed)])
    assert sorted(p.name for p in packed.iterdir()) == ["study.json", "sudoku.parquet"]
    assert sorted(packed_configs(packed / "sudoku.parquet")) == ["dppo_binary_tv-mb1-int8-s0", "pg_is-mb1-int8-s0"]
    first = (packed / "sudoku.parquet").read_bytes()
    pack_study.main(["--study", str(out), "--out", str(packed)])
    assert (packed / "sudoku.parquet").read_bytes() == first  # reproducible
    assert '"log"' not in (packed / "study.json").read_text()

    monkeypatch.setenv("DPPO_STUDY", str(packed))  # the report notebook renders from the packed runs
    notebook = execute(REPORT, out, monkeypatch, tmp_path)
    assert_clean(notebook)
    assert "2 runs with data" in printed(notebook) and images(notebook) == 1
    assert "not run yet" in printed(notebook)  # the contrasts whose arms are missing say so
    html = "".join(str(o.get("data", {}).get("text/html", "")) for o in outputs(notebook))
    assert "DPPO-Binary-TV" in html and "PG-IS" in html

    stale = out / "sudoku" / "pg_is-mb1-int8-s1"  # killed during its first step: metrics but no checkpoint
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text('{"step": 1}\n')
    cpu_study.main([*args[: args.index("--seeds") + 1], "1", *args[args.index("--seeds") + 2:]])
    assert [r["step"] for r in read_jsonl(stale / "metrics.jsonl")] == [1, 2]
    manifest = json.loads((out / "study.json").read_text())  # one manifest for a study played in parts
    assert sorted((r["seed"], r["state"]) for r in manifest["runs"]) == [(0, "done"), (0, "done"), (1, "done"),
                                                                         (1, "done")]
    cpu_study.write_manifest(cpu_study.StudyConfig(out_dir=str(out), experiments=("steps",)), [], {})
    assert json.loads((out / "study.json").read_text())["config"]["experiments"] == ["int8", "steps"]
    pack_study.main(["--study", str(out), "--out", str(packed)])
    assert len(packed_configs(packed / "sudoku.parquet")) == 4

    no_markers = tmp_path / "NOTES.md"
    no_markers.write_text("# notes\n")
    with pytest.raises(SystemExit, match="expected exactly two .* lines, found 0"):
        pack_study.main(["--study", str(out), "--out", str(packed), "--readme", str(no_markers)])
    assert no_markers.read_text() == "# notes\n"


@pytest.fixture(scope="module")
def committed_study():
    """The committed study's long table and its runs' outcomes, read once."""
    df = load_study(COMMITTED)
    return df, run_outcomes(df, THRESHOLD)


def test_the_readme_summary_is_written_from_the_committed_study(committed_study):
    """One reading: every number of docs/cpu-study.md's generated blocks (the claims, CIs and verdicts, and its
    opening section on what this scale can and cannot say) and its list of figures are those the committed runs
    give, read from their Parquet files (``python -m studies.cpu.pack --readme`` writes them by
    :func:`~studies.cpu.page.readme_blocks`, the same function on the study's folder)."""
    summary, scale, figures = page_blocks(*committed_study)
    page = README.read_text()
    assert summary_block(page) == summary
    assert scale_block(page) == scale
    assert block(page, FIGURES_MARKER) == figures


def test_the_committed_study_is_its_manifest_and_one_parquet_file_per_task():
    """studies/cpu/data holds the manifest and one packed file per task, each with the task's finished runs, under
    the packed study's budget; docs/figures/cpu-study holds the page's figures and nothing else."""
    manifest = json.loads((COMMITTED / "study.json").read_text())
    tasks = sorted({run["task"] for run in manifest["runs"]})
    assert sorted(path.name for path in COMMITTED.iterdir()) == sorted(["study.json", *(f"{t}.parquet" for t in tasks)])
    for task in tasks:
        done = {run["name"] for run in manifest["runs"] if run["task"] == task and run["state"] == "done"}
        assert set(packed_configs(COMMITTED / f"{task}.parquet")) == done
    assert pack_study.packed_bytes(COMMITTED) <= pack_study.MAX_BYTES
    linked = {link.rsplit("/", 1)[1].rstrip(")") for link in block(README.read_text(), FIGURES_MARKER) if link}
    assert {path.name for path in FIGURES.iterdir()} == linked


def test_the_opening_section_prints_no_verdict_for_a_flagged_arm(committed_study):
    """The field presets that blocked no token (SAPO, VACO, MinPRO under int4; SAPO, MinPRO under staleness) or
    whose runs collapsed within five steps (GSPO under int4) get their flag in the page's opening section, never a
    verdict."""
    flags = arm_flag_table(committed_study[1])["flag"]
    opening = scale_block(README.read_text())
    flagged = set()
    for arms, contrasts in ((FRONTIER_ARMS, FRONTIER_CONTRASTS), (FRONTIER_MORE_ARMS, FRONTIER_MORE_CONTRASTS),
                            (FRONTIER_STALE_ARMS, FRONTIER_STALE_CONTRASTS)):
        experiment = contrasts[0].experiment
        line = next(line for line in opening if f"(`{experiment}`," in line)
        for (method, label), contrast in zip(arms, contrasts, strict=False):
            flag = flags.get((contrast.task, contrast.left[1], method), "")
            if flag:
                flagged.add((experiment, method))
                assert line.count(f"{label}: {flag}: **no verdict**") == 2, (experiment, label)  # against both
                assert f"{label} **" not in line, (experiment, label)
    assert flagged == {("frontier", "sapo"), ("frontier", "gspo"), ("frontier_more", "vaco"),
                       ("frontier_more", "minpro"), ("frontier_stale", "sapo"), ("frontier_stale", "minpro")}


def test_the_matched_lines_print_their_claims_against_pg_is_holm_corrected_together(committed_study):
    """The eight claims against PG-IS of ``matched`` and ``matched_more`` ask one question of the same PG-IS runs:
    the opening prints each with its verdict Holm-corrected over the eight, and where that differs from the verdict
    as scored (uncorrected), that one beside it. On the committed runs, five refuted as scored are inconclusive once
    corrected."""
    table = contrast_table(committed_study[1])
    claims = tuple(c.claim for c in MATCHED_PG_IS_FAMILY.claims)
    pooled = pooled_holm(table, claims)
    scored = table.set_index("claim").loc[list(claims), "verdict"]
    assert (pooled["holm_size"] == 8).all() and (pooled["verdict"] == "inconclusive").all()
    assert (scored == "refuted").sum() == 5
    opening = "\n".join(line for line in scale_block(README.read_text())
                        if any(f"(`{e}`," in line for e in MATCHED_PG_IS_FAMILY.experiments))
    assert opening.count("Holm over the 8 claims against PG-IS of `matched` and `matched_more`") == 2
    assert opening.count("**inconclusive** (") >= 8 and opening.count(": **refuted** as scored)") == 5


def test_the_report_reexecutes_from_the_committed_study_and_prints_the_readme_summary(tmp_path, monkeypatch):
    """The report re-executes from the committed runs, prints the page's blocks and draws the page's figures (into
    ``DPPO_FIGURES`` here; into docs/figures/cpu-study, linked, when committed)."""
    monkeypatch.delenv("DPPO_STUDY", raising=False)
    monkeypatch.setenv("DPPO_FIGURES", str(tmp_path / "figures"))
    notebook = execute(REPORT, tmp_path, monkeypatch, tmp_path)
    assert_clean(notebook)
    text = printed(notebook)
    assert "runs with data in studies/cpu/data" in text
    blocks = summary_block(README.read_text()) + scale_block(README.read_text())
    for line in blocks:
        assert line in text
    linked = [line.rsplit("/", 1)[1].rstrip(")") for line in block(README.read_text(), FIGURES_MARKER) if line]
    assert sorted(path.name for path in (tmp_path / "figures").iterdir()) == sorted(linked)
    assert images(notebook) == len(linked)  # a study's figures outside the checkout are shown inline
    committed = nbformat.read(REPORT, as_version=4)
    assert all(line in printed(committed) for line in blocks)  # the committed outputs too
    assert images(committed) == 0 and all(f'src="../../docs/figures/cpu-study/{name}"' in notebook_text(committed)
                                           for name in linked)


NUMBER = re.compile(r"[−+-]?\d+\.\d+(?:e[−+-]?\d+)?")
"""A decimal number as prose and notebooks write it (integers, the counts of seeds and runs, are not compared)."""


def shown_values(text: str) -> list[float]:
    return [float(n.replace("−", "-")) for n in NUMBER.findall(text)]


def unprinted_numbers(prose: str, shown: list[float]) -> list[str]:
    """The decimal numbers of ``prose`` that no number in ``shown`` rounds to, at the prose's own precision (its
    decimals, or its significant digits in e-notation)."""
    def written_as(value: float, number: str) -> bool:
        mantissa = number.replace("−", "-").split("e")[0]
        places = len(mantissa.split(".")[1])
        if "e" in number:
            return float(f"{value:.{places}e}") == float(number.replace("−", "-"))
        return round(abs(value), places) == round(abs(float(mantissa)), places)
    return [n for n in NUMBER.findall(prose) if not any(written_as(value, n) for value in shown)]


def study_prose(page: str) -> str:
    """docs/cpu-study.md's reading of the study: the text after the summary, before the pilot's section (whose
    numbers come from docs/bench, not from the notebook)."""
    return page.split(SUMMARY_MARKER)[2].split("## An engine mismatch that binds")[0]


def notebook_text(notebook) -> str:
    """Everything the notebook shows: printed lines and the plain-text and HTML forms of its tables."""
    shown = [printed(notebook)]
    for output in outputs(notebook):
        data = output.get("data", {})
        shown += [data.get("text/plain", ""), data.get("text/html", "")]
    return "\n".join(shown)


def test_the_study_page_carries_no_number_the_notebook_does_not_show():
    """One reading: every decimal number of the page's reading of the study is one the committed notebook shows."""
    notebook = nbformat.read(REPORT, as_version=4)
    missing = unprinted_numbers(study_prose(README.read_text()), shown_values(notebook_text(notebook)))
    assert not missing, f"numbers of docs/cpu-study.md the notebook does not show: {missing}"


def test_the_one_reading_check_sees_a_number_nobody_printed():
    assert unprinted_numbers("AUC 0.275, CI [−0.143, +0.05], 1.3e-3 and 0.7", [0.2745, -0.1431, 0.05, 0.00131, 0.88]) \
        == ["0.7"]  # 0.88 is 0.9 at one decimal, not 0.7


def test_a_study_whose_experiments_run_on_none_of_its_tasks_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cpu_study.main(["--out-dir", str(tmp_path), "--tasks", "guess", "--experiments", "staleness"])
    assert exit_info.value.code == 2 and "none of the experiments ['staleness']" in capsys.readouterr().err
    assert not (tmp_path / "study.json").exists()


def test_an_asynchronous_condition_samples_two_updates_stale_without_the_probe(tmp_path):
    config = cpu_study.StudyConfig(out_dir=str(tmp_path), experiments=("later_async",), tasks=("sudoku",))
    runs = cpu_study.plan(config)
    assert {run.method for run in runs} == {"dppo_binary_tv", "drpo", "cppo", "m2po"} and len(runs) == 20
    for run in runs[:4]:
        train_config = tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False))
        spec, _ = validate_config(train_config)  # the engine refuses --max-staleness with the probe
        assert (train_config.max_staleness, train_config.probe_every) == (2, 0)
        assert train_config.minibatches_per_rollout == 1 and spec.trust_region.name == run.method


def fake_study(folder: Path, experiments: list[str], names: list[str], sitting: int = 1) -> Path:
    """A study folder with finished runs of ``names`` (sudoku), each with a config and one metrics row (its
    ``sitting``) and eval row."""
    runs = []
    for name in names:
        run = folder / "sudoku" / name
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"run_name": name}))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "sitting": sitting}) + "\n")
        (run / "eval.jsonl").write_text(json.dumps({"step": 1}) + "\n")
        runs.append({"task": "sudoku", "name": name, "state": "done", "seconds": 1.0, "log": "x.log"})
    (folder / "study.json").write_text(json.dumps({"config": {"experiments": experiments, "out_dir": "x"},
                                                   "runs": runs}))
    return folder


def test_packing_with_merge_adds_a_sitting_played_elsewhere_and_keeps_the_rest(tmp_path):
    packed = tmp_path / "packed"
    pack_study.main(["--study", str(fake_study(tmp_path / "one", ["int8"], ["a-s0", "b-s0"])), "--out", str(packed)])
    second = fake_study(tmp_path / "two", ["later_async"], ["b-s0", "c-s0"], sitting=2)
    pack_study.main(["--study", str(second), "--out", str(packed), "--merge"])
    manifest = json.loads((packed / "study.json").read_text())
    assert [run["name"] for run in manifest["runs"]] == ["a-s0", "b-s0", "c-s0"]
    assert manifest["config"]["experiments"] == ["int8", "later_async"] and "out_dir" not in manifest["config"]
    assert sittings(packed) == {"a-s0": 1, "b-s0": 2, "c-s0": 2}  # b-s0 replaced, a-s0 kept
    pack_study.main(["--study", str(second), "--out", str(packed)])  # without --merge: replaced as a whole
    assert sittings(packed) == {"b-s0": 2, "c-s0": 2}


def sittings(packed: Path) -> dict[str, float]:
    """The ``sitting`` each packed run of :func:`fake_study` logged, by run name."""
    return {name: rows.loc[rows["metric"] == "sitting", "value"].item()
            for name, rows in read_task(packed / "sudoku.parquet").items()}


def test_packing_with_merge_keeps_a_packed_run_the_new_sitting_did_not_finish(tmp_path):
    packed = tmp_path / "packed"
    pack_study.main(["--study", str(fake_study(tmp_path / "one", ["int8"], ["a-s0"])), "--out", str(packed)])
    second = fake_study(tmp_path / "two", ["int8"], ["a-s0"])
    manifest = json.loads((second / "study.json").read_text())
    manifest["runs"][0]["state"] = "new"  # listed in the new sitting's plan, not played there
    (second / "study.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="no finished run"):
        pack_study.main(["--study", str(second), "--out", str(packed), "--merge"])
    assert [run["state"] for run in json.loads((packed / "study.json").read_text())["runs"]] == ["done"]


def test_the_committed_manifest_names_an_experiment_for_every_run():
    manifest = json.loads((COMMITTED / "study.json").read_text())
    arms = {(run["task"], run["method"], run["condition"]) for run in manifest["runs"]}
    listed = {(t, m, c) for name in manifest["config"]["experiments"] for e in [cpu_study.EXPERIMENTS[name]]
              for t in e.tasks for c in e.conditions for m in e.methods}
    assert arms <= listed


def test_merging_into_a_damaged_manifest_is_one_line_and_leaves_it(tmp_path):
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "study.json").write_text("{not json")
    with pytest.raises(SystemExit, match="is not a packed study's manifest .* pack without --merge"):
        pack_study.main(["--study", str(fake_study(tmp_path / "one", ["int8"], ["a-s0"])), "--out", str(packed),
                         "--merge"])
    assert (packed / "study.json").read_text() == "{not json"


CLAIMS_FILES = ("studies/cpu/claims.py", "dppo_oat/analysis/study.py")
"""Where the claims lie at a commit: the study's own folder, or, at commits from before the study had one, the
package's analysis module."""


def claims_source(commit: str) -> tuple[str, str]:
    """The file that held the claims at ``commit`` (the first of :data:`CLAIMS_FILES` it has) and its text."""
    for path in CLAIMS_FILES:
        shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            return path, shown.stdout
    raise AssertionError(f"commit {commit[:7]} has none of {CLAIMS_FILES}")


def claims_at(commit: str) -> set[str]:
    """The claims of ``CONTRASTS`` as the claims file held them at ``commit`` (:func:`claims_source`): the module of
    that commit executed beside today's code (claims built from f-strings or loops included); where it no longer
    runs, the literal first arguments of its ``Contrast(...)`` calls (Python's parser joins their string pieces)."""
    path, source = claims_source(commit)
    module = types.ModuleType(f"claims_at_{commit[:7]}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(source, f"{path} at {commit[:7]}", "exec"), module.__dict__)
        return {contrast.claim for contrast in module.CONTRASTS}
    except Exception:  # an old module whose imports are gone: its literal claims
        return {node.args[0].value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "Contrast" and node.args
                and isinstance(node.args[0], ast.Constant)}
    finally:
        sys.modules.pop(module.__name__, None)


def full_history() -> bool:
    """Whether this checkout has its whole git history (not a copy without .git, nor a shallow clone)."""
    done = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "false"


def committed_runs_by_commit() -> dict[str, set[tuple[str, str]]]:
    """The committed runs that record their code commit, as ``(task, run name)``, by that commit (for a run of an
    uncommitted tree, ``<commit>-dirty``, the commit it started from)."""
    runs: dict[str, set[tuple[str, str]]] = {}
    for path in task_files(COMMITTED):
        for name, config in packed_configs(path).items():
            commit = config.get("code_commit")
            if commit:
                runs.setdefault(commit.removesuffix("-dirty"), set()).add((path.stem, name))
    return runs


@pytest.mark.skipif(not full_history(), reason="needs the repository's whole git history")
def test_every_claim_was_committed_before_the_runs_it_scores():
    """Provenance: a committed run that records its code commit ran code whose claims file already held every claim
    scored on its arm, but for the reference arms a claim declares as played before it (``Contrast.played_before``).
    Runs packed before runs recorded their commit are not checked; the test fails if none is left to check."""
    runs_by_commit = committed_runs_by_commit()
    assert runs_by_commit, "no committed run records its code commit"
    late = []
    for commit, runs in runs_by_commit.items():
        written = claims_at(commit)
        for contrast in CONTRASTS:
            arms = {f"{method}-{condition}" for method, condition in (contrast.left, contrast.right)
                    if (method, condition) not in contrast.played_before}  # declared with the claim
            if contrast.claim not in written and any(task == contrast.task and name.rsplit("-s", 1)[0] in arms
                                                     for task, name in runs):
                path = claims_source(commit)[0]
                late.append(f"{contrast.claim!r} is not in {path} at {commit[:7]}, whose runs it scores")
    assert not late, "\n".join(late)


@pytest.mark.skipif(not full_history(), reason="needs the repository's whole git history")
def test_claims_are_read_where_each_commit_kept_them_and_only_ever_added():
    """The provenance check reads each commit's own claims file: ``studies/cpu/claims.py`` from the commit that
    added it on (which kept every claim of the package's module it replaced, word for word), the package's module
    before; and claims are only ever added: every claim held at a committed run's commit, or at this checkout's
    commit, is a claim today."""
    log = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", CLAIMS_FILES[0]], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    assert log, f"no commit added {CLAIMS_FILES[0]}"
    added = log[-1]
    assert claims_source(added)[0] == CLAIMS_FILES[0] and claims_source(f"{added}^")[0] == CLAIMS_FILES[1]
    assert claims_at(added) == claims_at(f"{added}^")
    today = {contrast.claim for contrast in CONTRASTS}
    for commit in ["HEAD", *committed_runs_by_commit()]:
        held = claims_at(commit)
        assert held and held <= today, f"claims at {commit[:7]} that are not claims today: {sorted(held - today)}"


def test_the_gpu_node_experiment_of_takeaway2_runs_each_twin_on_every_seed():
    """scripts/gpu/takeaway2.sh (read with PYTHON=echo): the sanity test's flags, each μ-anchored mask and its
    recomputed twin, MiniRL and PG-IS on seeds 1-3 by default, 4 gradient steps per rollout, methods and seeds as
    asked."""
    def commands(*args, **env):
        environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        out = subprocess.run(["bash", str(ROOT / "scripts/gpu/takeaway2.sh"), *args], check=True, text=True,
                             capture_output=True, env={**environ, "PYTHON": "echo", "DPPO_MATH_DATA": "/data", **env})
        return [shlex.split(line) for line in out.stdout.splitlines()]

    def flag(argv, name):
        return [argv[i + 1] for i, value in enumerate(argv) if value == name][-1]

    runs = commands()
    planned = {(flag(argv, "--trust_region"), flag(argv, "--seed")) for argv in runs}
    methods = {"dppo_binary_kl", "dppo_binary_kl_recompute", "dppo_binary_tv", "dppo_binary_tv_recompute", "minirl",
               "pg_is"}
    assert len(runs) == 18 and planned == {(m, s) for m in methods for s in ("1", "2", "3")}
    assert all(m in PRESETS for m in methods)
    for argv in runs:  # 512 samples per rollout in minibatches of 128: four gradient steps per rollout
        assert (flag(argv, "--rollout_batch_size"), flag(argv, "--train_batch_size")) == ("512", "128")
        assert flag(argv, "--learning_rate") == "0.000001" and flag(argv, "--num_ppo_epochs") == "1"
    halves = commands("dppo_binary_kl_neg", "dppo_binary_kl_pos", "--gpus", "4", SEEDS="7")
    assert [(flag(a, "--trust_region"), flag(a, "--seed"), flag(a, "--gpus")) for a in halves] == [
        ("dppo_binary_kl_neg", "7", "4"), ("dppo_binary_kl_pos", "7", "4")]


def test_the_study_lies_beside_the_package_and_its_wheel_leaves_it_out():
    """studies/ is not installed with dppo_oat (pyproject's package list) and nothing the wheel installs imports it:
    the library keeps the general statistics, the study its claims, scripts, data and report."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    installed = find_packages(where=str(ROOT), include=include)
    assert "dppo_oat.analysis" in installed and "envs" in installed
    assert not [name for name in installed if name.split(".")[0] == "studies"]
    importing = [str(path.relative_to(ROOT))
                 for folder in ("dppo_oat", "envs") for path in (ROOT / folder).rglob("*.py")
                 if re.search(r"^\s*(from|import) studies\b", path.read_text(), re.M)]
    assert not importing, f"the package imports the studies: {importing}"
    assert not (ROOT / "dppo_oat" / "analysis" / "study.py").exists()
