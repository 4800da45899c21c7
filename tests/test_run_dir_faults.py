"""The run directory is never lost: a new run never overwrites one (``--overwrite`` moves its files aside), a killed
save leaves no temporary file past the next start, a resume refuses what it cannot continue truthfully (a metrics log
that ends before the checkpoint, a ``config.json`` that is not an object), and its messages say what is intact.

The runs here start from the tiny policy shipped with the package (no warm start), on real Sudoku.
"""

from pathlib import Path

import pytest
from cli_runs import one_error, run

from dppo_oat.engines.local.trainer import LocalTrainer
from dppo_oat.run.safe_io import read_jsonl
from dppo_oat.train import main

TINY = ["--groups-per-step", "2", "--group-size", "4", "--minibatch-size", "32", "--eval-episodes", "4",
        "--eval-every", "5", "--token-samples", "4"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("policy-cache"))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache_dir):
    """A 2-step run to resume, damage or overwrite."""
    runs = tmp_path_factory.mktemp("runs")
    main(["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--steps", "2", *TINY])
    return runs / "one"


@pytest.fixture
def run_copy(finished_run, tmp_path):
    """A copy of the finished run in ``tmp_path / "one"``; its argv (without --resume) as ``run_copy.argv``."""
    import shutil

    shutil.copytree(finished_run, tmp_path / "one")
    return tmp_path / "one"


def argv_of(run_dir, cache_dir, *flags):
    return ["--runs-dir", str(run_dir.parent), "--run-name", run_dir.name, "--cache-dir", cache_dir, *TINY, *flags]


def files_of(directory):
    return {path.name: path.read_bytes() for path in directory.iterdir() if path.is_file() and path.name != ".lock"}


# ---------------------------------------------------------------- a new run never overwrites one


@pytest.mark.fault("a new run under the `--run-name` of an existing run, without `--resume`, whatever file of it is "
                   "left (`config.json`, `metrics.jsonl`, `eval.jsonl`, `tokens.jsonl` or `checkpoint.pt`, even "
                   "empty)",
                   "refused in one line before any model: `--resume` continues it, another `--run-name` starts "
                   "beside it, `--overwrite` starts over; nothing of it is changed")
@pytest.mark.parametrize("kept", ["config.json", "metrics.jsonl", "eval.jsonl", "tokens.jsonl", "checkpoint.pt",
                                  "empty metrics.jsonl"])
def test_a_new_run_never_overwrites_any_file_of_an_existing_one(kept, run_copy, cache_dir, capsys, no_model):
    """The data loss of the earlier check, which looked at the checkpoint and the metrics together: a run that lost
    one of them lost the rest to the next run of its name."""
    if kept == "empty metrics.jsonl":
        (run_copy / "metrics.jsonl").write_text("")
        kept = "metrics.jsonl"
    for path in run_copy.iterdir():
        if path.name not in (kept, ".lock"):
            path.unlink()
    before = files_of(run_copy)
    one_error(capsys, argv_of(run_copy, cache_dir, "--steps", "1"), 2, str(run_copy), kept, "--overwrite",
              "--run-name")
    assert files_of(run_copy) == before


@pytest.mark.fault("`--overwrite` on an existing run",
                   "its files are moved aside into `<run>/overwritten-<UTC time>/` (said in one line), never deleted; "
                   "the new run starts in their place")
def test_overwrite_moves_the_old_files_aside(run_copy, cache_dir, capsys):
    before = files_of(run_copy)
    code, errors, text = run(argv_of(run_copy, cache_dir, "--steps", "1", "--overwrite"), capsys)
    assert code == 0 and not errors, text
    [aside] = [path for path in run_copy.iterdir() if path.name.startswith("overwritten-")]
    assert files_of(aside) == before and str(aside) in " ".join(text.split())
    assert [row["step"] for row in read_jsonl(run_copy / "metrics.jsonl")] == [1]


@pytest.mark.parametrize("flags, fragments", [
    (["--overwrite", "--resume"], ["--overwrite", "--resume"]),
    (["--run-name", ""], ["--run-name ''"]),
    (["--run-name", "a\nb"], ["--run-name", "line break"]),
])
def test_contradictory_or_unprintable_run_flags_are_one_line(flags, fragments, tmp_path, capsys, no_model):
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), *flags], 2, *fragments)
    assert not (tmp_path / "runs").exists()


def name_limit(folder) -> int:
    import os

    return os.pathconf(folder, "PC_NAME_MAX")


@pytest.mark.fault("a `--run-name` (or a folder of `--runs-dir`) longer than the file system takes (255 bytes: "
                   "`PC_NAME_MAX`), in ASCII or in multi-byte characters",
                   "one line before anything is written (exit 2): the name's length, the limit and to shorten it; "
                   "no folder is created")
@pytest.mark.parametrize("where, name, flag", [
    ("run name", "x" * 256, "--run-name"),
    ("run name", "é" * 128, "--run-name"),  # 128 characters, 256 bytes
    ("run name", "r" * 1000, "--run-name"),
    ("runs dir", "d" * 300, "--runs-dir"),
])
def test_a_name_past_the_file_systems_limit_is_one_line_before_anything_is_written(where, name, flag, tmp_path,
                                                                                   capsys, no_model):
    limit = name_limit(tmp_path)
    runs = tmp_path / "runs"
    argv = (["--runs-dir", str(runs), "--run-name", name] if where == "run name" else
            ["--runs-dir", str(runs / name), "--run-name", "r"])
    one_error(capsys, argv, 2, flag, f"{len(name.encode())} bytes", f"at most {limit} bytes", "shorter")
    assert list(tmp_path.iterdir()) == []


def test_a_name_at_the_file_systems_limit_is_accepted(tmp_path):
    from dppo_oat.engines.local.config import TrainConfig
    from dppo_oat.engines.local.validation import validate_config

    validate_config(TrainConfig(runs_dir=str(tmp_path / "runs"), run_name="x" * name_limit(tmp_path)))


@pytest.mark.fault("a `--runs-dir` (or a folder on its way, or the run's own folder) that is a symbolic link to a "
                   "missing target, or a loop of links",
                   "one line before any model (exit 2) naming the link and what it is (a link to a missing target / "
                   "a link loop) and what to do; nothing is created")
@pytest.mark.parametrize("kind", ["dangling", "loop"])
@pytest.mark.parametrize("where", ["runs dir", "inside the runs dir", "run folder"])
def test_a_broken_link_on_the_run_path_is_named_for_what_it_is(kind, where, tmp_path, capsys, no_model):
    link = tmp_path / "link"
    if kind == "dangling":
        link.symlink_to(tmp_path / "missing")
    else:
        (tmp_path / "other").symlink_to(link)
        link.symlink_to(tmp_path / "other")
    before = sorted(tmp_path.iterdir())
    argv = {"runs dir": ["--runs-dir", str(link), "--run-name", "r"],
            "inside the runs dir": ["--runs-dir", str(link / "runs"), "--run-name", "r"],
            "run folder": ["--runs-dir", str(tmp_path), "--run-name", "link"]}[where]
    what = f"a symbolic link to {tmp_path / 'missing'}, which does not exist" if kind == "dangling" else \
        "a loop of symbolic links"
    flag = "--run-name" if where == "run folder" else "--runs-dir"
    error = one_error(capsys, argv, 2, str(link), what, f"or give another {flag}")
    assert "File exists" not in error
    assert sorted(tmp_path.iterdir()) == before and not (tmp_path / "missing").exists()


@pytest.mark.fault("a `--runs-dir` that climbs out of folders that do not exist (`runs/../x/..//y`, `new/..`, "
                   "`a/b/../../c`)",
                   "the run is written where the path leads (`y`, `.`, `c`) and no empty folder is left on the way")
@pytest.mark.parametrize("runs_dir, lands_in", [
    ("new1/../x/..//y", "y"), ("new2/..", "."), ("a/b/../../c", "c"), ("runs/../z/..", "."),
    ("missing/../existing/../existing", "existing")])
def test_a_runs_dir_through_missing_folders_leaves_no_empty_folder(runs_dir, lands_in, tmp_path, monkeypatch):
    from dppo_oat.engines.local.config import TrainConfig
    from dppo_oat.engines.local.validation import validate_config
    from dppo_oat.run.directory import RunLock

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "existing").mkdir()
    config = TrainConfig(runs_dir=runs_dir, run_name="r")
    validate_config(config)
    RunLock(config.run_directory()).release()
    assert config.run_directory().path.resolve() == (tmp_path / lands_in / "r").resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"runs", "existing", *Path(lands_in, "r").parts[:1]}
                                                                 - {"."})


@pytest.mark.fault("`--resume` of a run killed before its first checkpoint (its `config.json` and logs are there, "
                   "no `checkpoint.pt`)",
                   "one line: nothing was checkpointed, `--overwrite` in place of `--resume` starts it over (its files "
                   "moved aside)")
def test_resume_without_a_checkpoint_says_how_to_start_over(run_copy, cache_dir, capsys, no_model):
    (run_copy / "checkpoint.pt").unlink()
    one_error(capsys, argv_of(run_copy, cache_dir, "--resume"), 2, "no checkpoint", "--overwrite")


# ---------------------------------------------------------------- temporaries of killed saves


@pytest.mark.fault("a kill while `checkpoint.pt` (or a log being truncated) is written",
                   "its temporary file (`.checkpoint.pt.XXXXXXXX`) is removed by the next start or `--resume` of that "
                   "run, under its lock, never by another process")
@pytest.mark.parametrize("resume", [True, False])
def test_temporaries_of_a_killed_save_go_at_the_next_start(resume, run_copy, cache_dir, capsys):
    litter = [run_copy / ".checkpoint.pt.k1ll3d00", run_copy / ".metrics.jsonl.k1ll3d01"]
    for path in litter:
        path.write_bytes(b"half a checkpoint")
    keep = run_copy / ".checkpoint.pt-notes"  # not a temporary of this package: left alone
    keep.write_text("mine")
    flags = ["--resume", "--steps", "3"] if resume else ["--overwrite", "--steps", "1"]
    code, errors, text = run(argv_of(run_copy, cache_dir, *flags), capsys)
    assert code == 0, text
    assert not any(path.exists() for path in litter) and keep.exists()


@pytest.mark.fault("a start (new, or `--resume`) of a run killed during its first checkpoint save (its `config.json` "
                   "and logs are there, a `.checkpoint.pt.XXXXXXXX`, no `checkpoint.pt`)",
                   "one line: nothing of it was checkpointed and the temporary file is removed (under the run's "
                   "lock); `--overwrite` starts it over (its files moved aside, never deleted), another `--run-name` "
                   "beside it")
@pytest.mark.parametrize("resume", [False, True])
def test_a_run_killed_in_its_first_save_is_refused_with_its_litter_removed(resume, run_copy, cache_dir, capsys,
                                                                           no_model):
    (run_copy / "checkpoint.pt").rename(run_copy / ".checkpoint.pt.k1ll3d00")  # the kill came before the rename
    kept = files_of(run_copy)
    flags = ["--resume", "--steps", "3"] if resume else ["--steps", "3"]
    error = one_error(capsys, argv_of(run_copy, cache_dir, *flags), 2, "--overwrite", "checkpoint save was killed",
                      "1 temporary file(s) removed")
    assert "no checkpoint" in error
    assert files_of(run_copy) == {name: data for name, data in kept.items() if not name.startswith(".checkpoint")}


def test_a_live_runs_temporaries_are_not_touched_by_a_refused_start(run_copy, cache_dir, capsys, no_model):
    """Only the lock's holder may remove them: a second start that is refused (the run is in use) leaves them."""
    from dppo_oat.run.directory import RunLock

    temporary = run_copy / ".checkpoint.pt.l1ve0000"
    lock = RunLock(run_copy)
    try:
        temporary.write_bytes(b"being written")
        one_error(capsys, argv_of(run_copy, cache_dir, "--resume", "--steps", "3"), 2, "in use")
        assert temporary.exists()
    finally:
        lock.release()


# ---------------------------------------------------------------- resumes that cannot continue truthfully


@pytest.mark.fault("`--resume` of a run whose `metrics.jsonl` lost steps the checkpoint has (its last lines, or all)",
                   "refused in one line naming the first missing step: restore `metrics.jsonl`, or "
                   "`--allow-metrics-gap` to continue with those steps missing from its curves")
@pytest.mark.parametrize("damage", ["last line", "all"])
def test_resume_refuses_metrics_that_end_before_the_checkpoint(damage, run_copy, cache_dir, capsys):
    metrics = run_copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    if damage == "all":
        metrics.unlink()
    else:
        metrics.write_text("".join(lines[:-1]))
    missing = "1" if damage == "all" else "2"
    one_error(capsys, argv_of(run_copy, cache_dir, "--resume", "--steps", "3"), 2, "metrics.jsonl",
              f"step {missing}", "--allow-metrics-gap")
    code, errors, text = run(argv_of(run_copy, cache_dir, "--resume", "--steps", "3", "--allow-metrics-gap"), capsys)
    assert code == 0, text
    assert "warning:" in text and f"step {missing}" in " ".join(text.split())
    assert [row["step"] for row in read_jsonl(metrics)] == ([3] if damage == "all" else [1, 3])


@pytest.mark.fault("`--resume` with a `config.json` that is JSON but not an object (`[1, 2]`)",
                   "one line naming the file: restore it")
def test_resume_with_a_config_that_is_not_an_object_is_one_line(run_copy, cache_dir, capsys, no_model):
    (run_copy / "config.json").write_text("[1, 2]")
    one_error(capsys, argv_of(run_copy, cache_dir, "--resume", "--steps", "3"), 2, "config.json", "not a JSON object")


@pytest.mark.fault("a `--resume` that fails or is stopped while the run is being built (a run file it cannot write, "
                   "Ctrl-C, SIGTERM)",
                   "one line that says the run's checkpoint is intact and that the same command with `--resume` "
                   "continues (never \"nothing was checkpointed\")")
@pytest.mark.parametrize("failure", [KeyboardInterrupt, PermissionError])
def test_a_resume_that_fails_while_building_says_the_checkpoint_is_intact(failure, run_copy, cache_dir, capsys,
                                                                         monkeypatch):
    def fail(self):
        if failure is PermissionError:
            raise PermissionError(13, "Permission denied", str(run_copy / "config.json"))
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalTrainer, "_open_log", fail)
    before = (run_copy / "checkpoint.pt").read_bytes()
    error = one_error(capsys, argv_of(run_copy, cache_dir, "--resume", "--steps", "3"),
                      130 if failure is KeyboardInterrupt else 1, "checkpoint", "--resume")
    assert "nothing was checkpointed" not in error and "step 2" in error
    assert (run_copy / "checkpoint.pt").read_bytes() == before


@pytest.mark.fault("`python -m dppo_oat.train --threads 0 >/dev/null` (any `error:` line of the local engine)",
                   "the `error:` line is on stderr, as those of `dppo_oat.plot`, the oat engine and the verl CLI")
def test_error_lines_go_to_stderr(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--runs-dir", str(tmp_path), "--threads", "0"])
    out = capsys.readouterr()
    assert "error:" not in out.out and out.err.startswith("error: --threads must be >= 1"), out


# ---------------------------------------------------------------- signals from the first instruction


SIGNAL_ON_IMPORT = """
import importlib.abc, os, runpy, sys

MODULE, SIGNAL = sys.argv[1], int(sys.argv[2])


class SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIGNAL)  # handled on the next bytecode: inside this very import
        return None


sys.meta_path.insert(0, SignalOnImport())
sys.argv = ["dppo_oat.train"] + sys.argv[3:]
runpy.run_module("dppo_oat.train", run_name="__main__", alter_sys=True)
"""


def signalled_while_importing(module: str, sig, tmp_path):
    """``python -m dppo_oat.train`` sends itself ``sig`` the moment it starts importing ``module`` (a finder at the
    head of ``sys.meta_path``; a signal from outside would race the imports): (exit status, stderr lines)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SIGNAL_ON_IMPORT, module, str(int(sig)), "--runs-dir",
                           str(tmp_path / "runs"), "--steps", "1"], capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr.splitlines()


@pytest.mark.fault("Ctrl-C or SIGTERM in the first seconds of `python -m dppo_oat.train` (its imports, parsing, "
                   "validation)",
                   "`error: interrupted before the run started: nothing was written; run the same command again` "
                   "(exit 130; SIGTERM: `terminated (SIGTERM) …`, exit 143), never a `KeyboardInterrupt` traceback")
@pytest.mark.parametrize("module, sig, code, said", [
    ("tyro", "SIGINT", 130, "before the run started"),
    ("dppo_oat.engines.local.trainer", "SIGTERM", 143, "before the run started"),
    ("torch", "SIGINT", 130, "before the run started"),
    ("torch.distributed.rpc", "SIGINT", 130, "before the run started"),  # inside torch's own import
    ("transformers.models.qwen3.modeling_qwen3", "SIGTERM", 143, "before the run started"),
    ("peft", "SIGINT", 130, "before the first checkpoint"),  # transformers imports it while the policy loads
])
def test_a_signal_while_the_command_imports_is_one_line(module, sig, code, said, tmp_path):
    import signal

    status, err = signalled_while_importing(module, getattr(signal, sig), tmp_path)
    errors = [line for line in err if line.startswith("error:")]
    assert status == code and len(errors) == 1 and not any("Traceback" in line for line in err), err
    assert said in errors[0] and not (tmp_path / "runs").exists(), err


# ---------------------------------------------------------------- what a resume may change


@pytest.mark.fault("`--resume --token-export all` of a run started without it (or the other way round)",
                   "accepted, as `--token-samples` is (what a run logs and exports may change on resume, never what "
                   "it trains): one warning line names the checkpointed steps that have no export")
def test_a_resume_may_start_exporting_tokens(run_copy, cache_dir, capsys):
    from dppo_oat.run.token_export import read_token_export

    code, errors, text = run(argv_of(run_copy, cache_dir, "--resume", "--steps", "3", "--token-export", "all"), capsys)
    assert code == 0 and not errors, text
    assert "lacks 2 of the 2 checkpointed steps (step 1 first" in " ".join(text.split()), text
    assert set(read_token_export(run_copy)["step"]) == {3}


def test_a_checkpoint_that_hashed_the_token_export_still_resumes(run_copy, cache_dir, capsys):
    """A checkpoint written before ``token_export`` could change on resume hashed it as a setting of the run."""
    import json

    import torch

    from dppo_oat.engines.local.config import TrainConfig, run_spec
    from dppo_oat.engines.local.validation import settings_free_on_resume
    from dppo_oat.run.log import settings_hash

    state = torch.load(run_copy / "checkpoint.pt", weights_only=True)
    config = json.loads((run_copy / "config.json").read_text())
    earlier_free = [name for name in settings_free_on_resume(run_spec(TrainConfig())) if name != "token_export"]
    state["settings_hash"] = settings_hash(config, earlier_free)
    torch.save(state, run_copy / "checkpoint.pt")
    code, errors, text = run(argv_of(run_copy, cache_dir, "--resume", "--steps", "3", "--token-export", "all"), capsys)
    assert code == 0 and not errors, text


@pytest.mark.fault("`--resume` with a setting of the experiment changed (`--lr`, `--group-size`, …)",
                   "refused in one line that names each changed setting and states the rule: a resume may change how "
                   "long the run goes, where it runs and what it logs (`--steps`, `--device`, `--eval-every`, "
                   "`--token-samples`, `--token-export`, …)")
def test_a_refused_resume_states_what_may_change(run_copy, cache_dir, capsys, no_model):
    one_error(capsys, argv_of(run_copy, cache_dir, "--resume", "--steps", "3", "--lr", "1e-3"), 2, "lr: ",
              "may change only how long the run goes", "--token-export")


@pytest.mark.fault("`--allow-metrics-gap` on a new run (it applies to `--resume`)",
                   "one line before any model: a new run has no metrics gap; leave it out")
def test_allow_metrics_gap_on_a_new_run_is_one_line(tmp_path, cache_dir, capsys, no_model):
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), "--cache-dir", cache_dir, *TINY, "--allow-metrics-gap"],
              2, "--allow-metrics-gap", "leave it out")
    assert not (tmp_path / "runs").exists()


def test_an_error_raised_from_an_interrupt_is_the_interrupt():
    """A library that imports lazily reports an interrupt of its import as its own error (transformers: "Could not
    import module 'Qwen3ForCausalLM'", raised from the KeyboardInterrupt): the command reads the interrupt behind it."""
    from dppo_oat.train import Terminated, interrupt_behind

    try:
        try:
            raise Terminated()
        except KeyboardInterrupt as interrupt:
            raise ModuleNotFoundError("Could not import module 'Qwen3ForCausalLM'") from interrupt
    except ModuleNotFoundError as error:
        assert isinstance(interrupt_behind(error), Terminated)
    assert interrupt_behind(ValueError("no interrupt here")) is None
