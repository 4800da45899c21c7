"""``RunDir``: one value owns every path of a run, and the rules its files keep, for both engines and the readers."""

import json
import os
from pathlib import Path

import pytest

from dppo_oat.run.directory import RunDir, RunLock


def write_log(path: Path, steps) -> None:
    path.write_text("".join(json.dumps({"step": step, "x": float(step)}) + "\n" for step in steps))


def test_every_path_of_a_run_is_named_once(tmp_path):
    run = RunDir(tmp_path / "run")
    assert RunDir(run) == run and RunDir(str(run)) == run  # a RunDir is a path too
    assert os.fspath(run) == str(tmp_path / "run") and Path(run) == run.path
    named = {"config": "config.json", "metrics": "metrics.jsonl", "eval": "eval.jsonl", "tokens": "tokens.jsonl",
             "checkpoint": "checkpoint.pt", "token_exports": "token_exports", "lock": ".lock",
             "round_checkpoints": "checkpoints"}
    assert {name: getattr(run, name).relative_to(run.path).as_posix() for name in named} == named
    assert run.export(7) == run.path / "token_exports" / "step_000007.jsonl"


def test_a_resume_cuts_the_logs_and_the_exports_back_to_its_step(tmp_path):
    run = RunDir(tmp_path)
    for log in (run.metrics, run.eval, run.tokens):
        write_log(log, [1, 2, 3, 4])
    run.token_exports.mkdir()
    for step in (1, 2, 3, 4):
        run.export(step).write_text("{}\n")
    run.cut_logs_back(2)
    assert [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()] == [1, 2]
    assert run.eval.read_text() == run.metrics.read_text()
    assert run.exported_steps() == [1, 2]
    assert run.steps_missing_from_metrics(4) == [3, 4] and run.steps_missing_from_exports(3) == [3]
    run.cut_logs_back(None)  # a new run: its logs start empty
    assert run.metrics.read_text() == "" and run.steps_missing_from_metrics(2) == [1, 2]


def test_overwrite_moves_the_run_files_aside_and_keeps_the_rest(tmp_path):
    run = RunDir(tmp_path)
    write_log(run.metrics, [1])
    run.config.write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    aside = run.move_aside()
    assert aside.parent == tmp_path and aside.name.startswith("overwritten-")
    assert sorted(p.name for p in aside.iterdir()) == ["config.json", "metrics.jsonl"]
    assert run.run_files() == [] and (tmp_path / "notes.txt").exists()
    assert run.move_aside() is None


def test_the_lock_holder_removes_the_temporaries_of_killed_saves(tmp_path):
    run = RunDir(tmp_path)
    killed = [tmp_path / ".checkpoint.pt.abc123", tmp_path / "token_exports" / ".step_000002.jsonl.x1"]
    killed[1].parent.mkdir()
    for path in killed:
        path.write_text("half")
    (tmp_path / ".elsewhere.txt.abc").write_text("not a run file's")
    assert run.temporaries() == sorted(killed)
    lock = RunLock(run)
    try:
        assert lock.removed == sorted(killed) and run.temporaries() == []
        assert (tmp_path / ".elsewhere.txt.abc").exists() and run.lock.read_text().strip() == str(os.getpid())
        with pytest.raises(ValueError, match="in use by another run"):
            RunLock(run.path)
    finally:
        lock.release()


@pytest.mark.parametrize("content, message", [("[1]", "not a JSON object"), ("{", "is damaged")])
def test_a_damaged_config_is_one_line(tmp_path, content, message):
    run = RunDir(tmp_path)
    assert run.read_config() == {}
    run.config.write_text(content)
    with pytest.raises(ValueError, match=message):
        run.read_config()
