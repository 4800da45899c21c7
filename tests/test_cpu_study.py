"""The CPU study script: its grid is every method × mismatch × seed with flags the local engine accepts, and a small
real study plays, skips finished runs and completes an interrupted one."""

import json
import sys
from pathlib import Path

import pytest
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import cpu_study  # noqa: E402

from dppo_oat.engines.local.config import TrainConfig  # noqa: E402
from dppo_oat.engines.local.validation import validate_config  # noqa: E402
from dppo_oat.runlog import read_jsonl  # noqa: E402
from test_notebooks import assert_clean, execute, images, outputs, printed  # noqa: E402

TINY = ("--warm-start.demo-episodes", "150", "--warm-start.max-steps", "20", "--warm-start.check-every", "20",
        "--warm-start.check-episodes", "8", "--warm-start.vocab-size", "300")


def test_the_default_grid_is_every_method_mismatch_and_seed_on_two_tasks(tmp_path):
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    runs = cpu_study.plan(config)
    assert len(runs) == 2 * 8 * 2 * 3 and len({(r.task, r.name) for r in runs}) == len(runs)
    assert {r.method for r in runs} == set(cpu_study.METHODS) and {r.seed for r in runs} == {0, 1, 2}
    for run in runs[:: 7]:  # the flags parse and validate as the trainer's (no model is built)
        train_config = tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False))
        spec, resume_step = validate_config(train_config)
        assert spec.trust_region.name == run.method and resume_step is None
        assert train_config.minibatches_per_rollout == 4 and train_config.warm_start.seed == 0
        assert (train_config.rollout_dtype == "bfloat16") == (run.mismatch == "bf16")


def test_bad_study_settings_fail_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cpu_study.main(["--out-dir", str(tmp_path), "--steps", "0"])
    assert exit_info.value.code == 2 and "--steps must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "study.json").exists()


def test_a_small_study_plays_skips_resumes_and_reports(tmp_path, monkeypatch):
    out = tmp_path / "study"
    args = ["--out-dir", str(out), "--tasks", "sudoku", "--methods", "dppo_binary_tv", "pg_is", "--mismatch", "bf16",
            "--seeds", "0", "--steps", "2", "--groups-per-step", "2", "--group-size", "2", "--probe-every", "1",
            "--eval-episodes", "4", "--extra-args=" + " ".join([*TINY, "--cache-dir", str(tmp_path / "cache")])]
    cpu_study.main(args)
    manifest = json.loads((out / "study.json").read_text())
    assert [r["state"] for r in manifest["runs"]] == ["done", "done"]
    run = out / "sudoku" / "pg_is-bf16-s0"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all("probe/exact_tv_mean" in r for r in rows)
    assert all(r["optimizer_steps"] >= 2 for r in rows)  # several gradient steps per rollout
    config = json.loads((run / "config.json").read_text())
    assert config["rollout_dtype"] == "bfloat16" and config["train_pool"] == 64

    finished = (out / "sudoku" / "dppo_binary_tv-bf16-s0" / "metrics.jsonl").stat().st_mtime_ns
    evals = (run / "eval.jsonl").read_text().splitlines()
    (run / "eval.jsonl").write_text(evals[0] + "\n")  # killed after its last checkpoint, before the final eval
    cpu_study.main(args)
    assert (out / "sudoku" / "dppo_binary_tv-bf16-s0" / "metrics.jsonl").stat().st_mtime_ns == finished
    assert [e["step"] for e in read_jsonl(run / "eval.jsonl")] == [0, 2]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]

    monkeypatch.setenv("DPPO_STUDY", str(out))  # the report notebook renders from these runs
    notebook = execute("cpu_study.ipynb", out, monkeypatch, tmp_path)
    assert_clean(notebook)
    assert "2 runs with data" in printed(notebook) and images(notebook) == 1
    html = "".join(str(o.get("data", {}).get("text/html", "")) for o in outputs(notebook))
    assert "binary ≤ top-K ≤ exact divergence" in html and "PG-IS" in html

    stale = out / "sudoku" / "pg_is-bf16-s1"  # killed during its first step: metrics but no checkpoint
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text('{"step": 1}\n')
    only_stale = [*args]
    only_stale[only_stale.index("--methods"):only_stale.index("--mismatch")] = ["--methods", "pg_is"]
    only_stale[only_stale.index("--seeds") + 1] = "1"
    cpu_study.main(only_stale)
    assert [r["step"] for r in read_jsonl(stale / "metrics.jsonl")] == [1, 2]

