"""``python -m dppo_oat.train --engine oat ... --dry_run`` refuses what the launch would: one ``error:`` line on stderr
and exit status 2, before any model loads, for numbers oat, DeepSpeed, vLLM, torch or NumPy would refuse after the
models loaded (or divide by), a ``--pretrain`` or ``--save_path`` the learner could not open, LoRA targets the model
lacks (matched as peft matches them: checked against peft itself here), vLLM contexts the model or the turns do not
fit, a damaged resume record, and a resume whose settings (the trust region resolved as the run recorded it) differ
from the run's. The checks themselves, without oat: ``tests/test_oat_preflight.py``."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder
peft = pytest.importorskip("peft")

from dppo_oat.engines.oat import launch  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.args import DPPOOatArgs, logged_config, spec_of, validate_args  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.plan import plan_of  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.preflight import (  # noqa: E402  (after pytest.importorskip)
    NUMBER_RULES,
    architecture_modules,
    check_lora_targets,
)
from dppo_oat.engines.oat.price import read_config  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.resume import (  # noqa: E402  (after pytest.importorskip)
    RESUME_RECORD,
    checkpoint_tag,
    commit_checkpoint,
    learner_file,
    partial_path,
    write_resume_record,
)
from dppo_oat.engines.oat.run_dir import RunDirectoryLogger  # noqa: E402  (after pytest.importorskip)
from dppo_oat.run.directory import CHECKPOINTS_DIR  # noqa: E402  (after pytest.importorskip)

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--pretrain", "some/model", "--gpus", "2", "--rollout_batch_size", "16",
         "--rollout_batch_size_per_device", "8", "--pi_buffer_maxlen_per_device", "16", "--train_batch_size", "8",
         "--num_samples", "4"]
"""A consistent plan on 2 GPUs (a hub id for --pretrain: not checked offline)."""


def dry_run_error(capsys, monkeypatch, *flags: str) -> str:
    """The one ``error:`` line of ``launch.main(SMALL + flags + --dry_run)``, which exits with status 2 and prints
    no plan."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(SystemExit) as stopped:
        launch.main([*SMALL, *flags, "--dry_run"])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert stopped.value.code == 2 and len(errors) == 1, err[-2000:]
    assert "Traceback" not in err and "node:" not in out
    return errors[0].removeprefix("error: ")


def dry_run_plans(capsys, monkeypatch, *flags: str) -> str:
    """The plan ``launch.main(SMALL + flags + --dry_run)`` prints (it returns: exit status 0)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launch.main([*SMALL, *flags, "--dry_run"])
    out = capsys.readouterr().out
    assert "node: 2 GPU(s)" in out
    return out


def test_every_number_rule_is_a_flag_of_the_engine():
    names = set(DPPOOatArgs.__dataclass_fields__)
    assert set(NUMBER_RULES) <= names, set(NUMBER_RULES) - names


def just_below(name: str) -> str:
    """A command-line value of ``name`` outside what its rule admits."""
    accepts = NUMBER_RULES[name]
    value = accepts.low - 1 if accepts.low_in else accepts.low
    return str(int(value)) if accepts.integer else str(float(value))


@pytest.mark.parametrize("name", sorted(NUMBER_RULES))
def test_the_dry_run_refuses_each_number_the_launch_would(name, capsys, monkeypatch):
    message = dry_run_error(capsys, monkeypatch, f"--{name}", just_below(name))
    assert message.startswith(f"--{name} must be {NUMBER_RULES[name].requirement()}")


@pytest.mark.parametrize("flag", ["--learning_rate", "--lam", "--vf_coef", "--temperature", "--adam_beta_2",
                                  "--tr_delta"])
def test_the_dry_run_refuses_nan_in_any_number(flag, capsys, monkeypatch):
    assert dry_run_error(capsys, monkeypatch, flag, "nan") == f"{flag} is NaN: give a number"


@pytest.mark.parametrize("flags, message", [
    (["--sync_params_every", "0"], "--sync_params_every must be an integer >= 1"),  # was a ZeroDivisionError
    (["--pretrain", "/nonexistent/model"], "--pretrain /nonexistent/model: no such folder here"),
    (["--pretrain", "./missing-copy"], "--pretrain ./missing-copy: no such folder here"),
    (["--pretrain", "dppo_oat/missing-model"], "--pretrain dppo_oat/missing-model: no such folder here"),
    (["--pretrain", "a/b/c"], "--pretrain 'a/b/c' is neither a folder here nor a hub id"),
    (["--tokenizer", "./missing-tokenizer"], "--tokenizer ./missing-tokenizer: no such folder here"),
    (["--save_path", "README.md"], "--save_path README.md is a file: give a folder"),
    (["--save_path", "README.md/runs"], "--save_path README.md/runs cannot be made"),
    (["--resume_tag", "round_000002"], "--resume_tag round_000002 names a checkpoint of the run --resume_dir names"),
    (["--max_model_len", "1000"], "--max_model_len 1000 is shorter than the longest turn, --prompt_max_length 1024 "
                                  "+ --generate_max_length 512 = 1536 tokens"),
])
def test_the_dry_run_refuses_what_the_learner_or_vllm_could_not_open(flags, message, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert dry_run_error(capsys, monkeypatch, *flags).startswith(message)


def test_the_models_own_context_bounds_max_model_len(tiny_policy_dir, capsys, monkeypatch):
    """The tiny policy's config.json says 2048 positions: vLLM refuses a longer --max_model_len at actor start."""
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    model = ["--pretrain", tiny_policy_dir]
    message = dry_run_error(capsys, monkeypatch, *model, "--max_model_len", "4096")
    assert message.startswith(f"--max_model_len 4096 is longer than {tiny_policy_dir}'s context (2048 tokens")
    message = dry_run_error(capsys, monkeypatch, *model, "--prompt_max_length", "2000")  # no --max_model_len
    assert message.startswith(f"{tiny_policy_dir}'s context (2048 tokens) is shorter than the longest turn")
    dry_run_plans(capsys, monkeypatch, *model, "--max_model_len", "2048", "--prompt_max_length", "1536")


def test_lora_targets_the_model_lacks_are_refused(tiny_policy_dir, capsys, monkeypatch):
    lora = ["--pretrain", tiny_policy_dir, "--lora_rank", "8"]
    dry_run_plans(capsys, monkeypatch, *lora)  # oat's default targets: every attention and MLP projection
    message = dry_run_error(capsys, monkeypatch, *lora, "--target_modules", "q_proj", "qkv_proj")
    assert message.startswith(f"--target_modules qkv_proj: {tiny_policy_dir} has no module of that name")
    message = dry_run_error(capsys, monkeypatch, *lora, "--target_modules", "mlp")
    assert "a Qwen3MLP, which LoRA cannot adapt" in message
    dry_run_plans(capsys, monkeypatch, "--target_modules", "no_such_module")  # no LoRA: the targets are not read


@pytest.fixture(scope="module")
def tiny_lora_base(tiny_policy_dir):
    """The tiny policy's modules as the dry run builds them from its config.json (meta device), and the policy
    itself on the CPU, for peft to adapt."""
    from transformers import AutoModelForCausalLM

    config = read_config(tiny_policy_dir)
    return architecture_modules(config), AutoModelForCausalLM.from_pretrained(tiny_policy_dir)


def peft_refuses(model, targets: list[str]) -> bool:
    try:
        peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    except ValueError:
        return True
    return False


TARGET_NAMES = st.one_of(
    st.sampled_from(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head",
                     "embed_tokens", "mlp", "self_attn", "input_layernorm", "norm", "layers", "model", "rotary_emb",
                     "self_attn.q_proj", "layers.1.mlp.up_proj", "model.layers.0.self_attn.o_proj", "proj",
                     "all-linear", "act_fn", "q_norm"]),
    st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=TARGET_NAMES)
def test_one_target_is_refused_exactly_where_peft_refuses_it(name, tiny_lora_base):
    """peft's own matching and layer classes decide: one name the dry run passes, peft adapts; one it refuses, peft
    refuses (not found, or not a layer LoRA can adapt)."""
    modules, model = tiny_lora_base
    try:
        check_lora_targets([name], modules, "tiny")
        refused = False
    except ValueError:
        refused = True
    assert refused == peft_refuses(model, [name])


# ------------------------------------------------------------------------------------------------------- resuming


@pytest.fixture
def run_to_resume(tmp_path, monkeypatch):
    """A run of SMALL (DPPO-Binary-TV at its preset's δ) as its learner leaves it: config.json from its validated
    arguments (``logged_config``, after oat's ``get_program`` set its learner fields) and a whole checkpoint of
    round 2 of every learner."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = validate_args(launch.parse_args([*SMALL, "--save_path", str(tmp_path)]), check_gpus=False)
    learners = plan_of(args).learners
    args.learner_gpus_per_group, args.local_rank = learners, 0
    run = tmp_path / "debug_1206T09:00:00"
    RunDirectoryLogger(run, logged_config(args, spec_of(args))).finish()
    root = run / CHECKPOINTS_DIR
    partial = partial_path(root, checkpoint_tag(2))
    partial.mkdir(parents=True)
    for rank in range(learners):
        (partial / learner_file(rank)).write_bytes(b"state")
    write_resume_record(partial, {"learning_round": 2, "actor_steps": 2, "learners": learners,
                                  "pi_beta_version": 2, "code_commit": "test"})
    commit_checkpoint(root, checkpoint_tag(2))
    return run


def resume_with(run: Path, *flags: str):
    return validate_args(launch.parse_args([*SMALL, "--resume_dir", str(run), *flags, "--dry_run"]), check_gpus=False)


@pytest.mark.parametrize("flags", [[], ["--tr_delta", "0.15"], ["--trust_region", "dppo_binary_tv"],
                                   ["--wb_run_name", "again", "--token_samples", "0", "--checkpoint_every", "5"],
                                   ["--use_wb", "--save_path", "elsewhere", "--logging_steps", "5"]])
def test_a_resume_may_restate_its_trust_region_and_change_how_it_logs_and_saves(flags, run_to_resume, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = resume_with(run_to_resume, *flags)
    assert args.resume_dir == str(run_to_resume)


@pytest.mark.parametrize("flags, difference", [
    (["--trust_region", "ppo"], "trust_region.name: 'dppo_binary_tv' → 'ppo'"),
    (["--trust_region", "dppo_binary_kl"], "trust_region.name: 'dppo_binary_tv' → 'dppo_binary_kl'"),
    (["--tr_delta", "0.2"], "trust_region.delta: 0.15 → 0.2"),
    (["--learning_rate", "1e-6"], "learning_rate: 5e-07 → 1e-06"),
    (["--num_ppo_epochs", "2"], "num_ppo_epochs: 1 → 2"),
])
def test_a_resume_that_trains_otherwise_is_refused_in_one_line(flags, difference, run_to_resume, capsys,
                                                               monkeypatch):
    message = dry_run_error(capsys, monkeypatch, "--resume_dir", str(run_to_resume), *flags)
    assert message.startswith("--resume_dir: ") and difference in message
    assert "a resume may change only where and how the run logs and saves" in message


def test_a_damaged_resume_record_is_refused_in_one_line(run_to_resume, capsys, monkeypatch):
    record = run_to_resume / CHECKPOINTS_DIR / checkpoint_tag(2) / RESUME_RECORD
    record.write_text('{"learning_round": 2, "actor_steps": 2, "learners": null}')
    message = dry_run_error(capsys, monkeypatch, "--resume_dir", str(run_to_resume))
    assert message == (f"{record} is damaged (it has null for learners, a whole number >= 1): resume from an older "
                       "checkpoint with --resume_tag, or start a new run")


def test_a_damaged_resume_record_fails_the_dry_run_of_a_fresh_interpreter(run_to_resume):
    """As a user runs it: ``python -m dppo_oat.train --engine oat ... --dry_run``, launchpad not importable."""
    record = run_to_resume / CHECKPOINTS_DIR / checkpoint_tag(2) / RESUME_RECORD
    record.write_text('{"learning_round": "2", "actor_steps": 2, "learners": 1}')
    env = {name: value for name, value in os.environ.items() if name != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-m", "dppo_oat.train", "--engine", "oat", *SMALL, "--resume_dir",
                           str(run_to_resume), "--dry_run"], env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert errors[0] == (f'error: {record} is damaged (it has "2" for learning_round, a whole number >= 1): resume '
                         "from an older checkpoint with --resume_tag, or start a new run")
    assert "Traceback" not in done.stderr and "node:" not in done.stdout
