"""``python -m dppo_oat.train --engine oat``: oat's arguments, validation, the dry run, and the program handed to
oat's builder.

The GPU-node scripts (``scripts/gpu``) are run with ``PYTHON=echo`` and the commands they would launch are parsed
and validated as written, so the paper's settings cannot drift from the code; they are also run for real with
``--dry-run`` in a fresh interpreter where launchpad is not importable. oat's ``get_program`` runs for real;
launchpad is the recorder in ``launchpad_stub`` (see conftest).
"""

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder

import launchpad  # noqa: E402  (after pytest.importorskip)
from oat.algorithms.ppo import PPOArgs  # noqa: E402  (after pytest.importorskip)
from oat.types import RLAlgo  # noqa: E402  (after pytest.importorskip)
from oat.utils.ipc import PlasmaShmServer  # noqa: E402  (after pytest.importorskip)
from program_nodes import program_nodes  # noqa: E402  (after pytest.importorskip)
from shared_data import MATH_DATA, needs_math_data  # noqa: E402  (after pytest.importorskip)

from dppo_oat.engines.oat import args as oat_args  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat import launch, preflight  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.actor import DPPOGemActor  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.args import REPLACED_OAT_FLAGS, DPPOOatArgs, spec_of, validate_args  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.learner import DPPOLearner  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.plan import plan_of  # noqa: E402  (after pytest.importorskip)
from dppo_oat.trust_region import PRESETS, TrustRegion  # noqa: E402  (after pytest.importorskip)

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "gpu"
PREFIX = "-m dppo_oat.train --engine oat"
SMALL = ["--pretrain", "some/model", "--gpus", "2", "--rollout_batch_size", "16",
         "--rollout_batch_size_per_device", "8", "--pi_buffer_maxlen_per_device", "16", "--train_batch_size", "8",
         "--num_samples", "4"]
def without_visible_gpus(environ) -> dict:
    return {name: value for name, value in environ.items() if name != "CUDA_VISIBLE_DEVICES"}


GEM_TASKS = {"sudoku": "game:Sudoku-v0-easy", "arc1d": "rg:arc_1d", "acre": "rg:acre"}
SANITY_METHODS = ["pg_is", "cispo", "grpo_clip_higher", "minirl", "minirl_tis", "dppo_binary_tv", "dppo_binary_kl"]

GEM_RECIPE = {  # Gem's examples/train_oat/README.md, per task family (flags of oat's PPOArgs and Gem's Args)
    "common": dict(num_samples=1, rollout_batch_size=128, learning_rate=1e-6, lr_scheduler="constant",
                   lr_warmup_ratio=0.0, num_ppo_epochs=2, train_batch_size=128, train_batch_size_per_device=1,
                   beta=0.0, max_model_len=12800, generate_max_length=4096, temperature=1.0, top_p=1.0,
                   eval_temperature=0.6, eval_top_p=0.95, eval_generate_max_length=4096, max_train=65000,
                   collocate=True, vllm_sleep=True, vllm_gpu_ratio=0.45, enable_prefix_caching=True,
                   gradient_checkpointing=True, max_save_num=30, pretrain="Qwen/Qwen3-1.7B-Base"),
    "sudoku": dict(prompt_template="qwen3_game", wrappers=("concat",), gamma=0.9, groups_per_step=2),
    "rg": dict(prompt_template="qwen3_general", wrappers=(), gamma=1.0, zero_stage=2),
}
"""Gem's values. `--norm_return` is --advantage_mode rebn, `--num_envs 2` is --groups_per_step 2 (Sudoku; the
single-turn tasks deviate, see below); the deviations (docs/engines/oat.md) are checked separately."""


def script_commands(*script_args: str, **environ: str) -> list[list[str]]:
    """The ``dppo_oat.train`` arguments a GPU-node script runs, read by running it with ``PYTHON=echo`` (on a node
    that exports no CUDA_VISIBLE_DEVICES, unless ``environ`` sets it)."""
    env = {**without_visible_gpus(os.environ), "PYTHON": "echo", "DPPO_MATH_DATA": str(MATH_DATA), **environ}
    out = subprocess.run(["bash", str(SCRIPTS / script_args[0]), *script_args[1:]], env=env, check=True,
                         capture_output=True, text=True).stdout
    return [shlex.split(line)[len(PREFIX.split()):] for line in out.splitlines() if line.startswith(PREFIX)]


@pytest.mark.parametrize("task", sorted(GEM_TASKS))
@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("gpus", [1, 8])
def test_gem_scripts_are_gems_recipe_with_only_the_trust_region_changed(task, baseline, gpus, gpu_node):
    [argv] = script_commands("gem.sh", task, *(["ppo"] if baseline else []), "--gpus", str(gpus))
    with gpu_node(gpus):
        args = validate_args(launch.parse_args(argv))
    assert isinstance(args, PPOArgs) and args.algo == RLAlgo.PPO
    recipe = {**GEM_RECIPE["common"], **GEM_RECIPE["sudoku" if task == "sudoku" else "rg"]}
    assert {name: getattr(args, name) for name in recipe} == recipe
    assert args.env_ids == (GEM_TASKS[task],) and args.advantage_mode == "rebn"
    assert args.rollout_batch_size_per_device == args.pi_buffer_maxlen_per_device == 128 // gpus  # Gem: 128 / N_GPU
    # Gem plays 2 episodes at a time; a single-turn task's whole step goes to vLLM at once (throughput only)
    assert oat_args.groups_per_step(args) == (2 if task == "sudoku" else 128 // gpus)
    tr = spec_of(args).trust_region
    assert (tr.name, tr.rule, tr.anchor) == (("ppo", "ratio", "behavior") if baseline else
                                             ("dppo_binary_tv", "binary_tv", "behavior"))
    assert (tr.eps_low, tr.eps_high) == (0.2, 0.2) if baseline else tr.delta == 0.2
    plan = plan_of(args)
    assert (plan.actor_steps_per_round, plan.optimizer_steps_per_round, plan.learners) == (1, 2, gpus)
    assert plan.save_every_rounds and plan.eval_every_rounds  # deviations: Gem saves and evaluates nothing
    assert args.wb_run_name == f"{task}-{'ppo' if baseline else 'dppo-binary-tv'}"


def test_the_grpo_groups_variant_plays_groups_with_a_per_turn_baseline(gpu_node):
    [argv] = script_commands("gem.sh", "sudoku", "--grpo-groups", "--gpus", "1")
    with gpu_node(1):
        args = validate_args(launch.parse_args(argv))
    spec = spec_of(args)
    assert (args.num_samples, spec.advantages.mode, spec.advantages.per_turn_baseline) == (8, "drgrpo", True)
    assert args.wb_run_name == "sudoku-dppo-binary-tv-grpo-groups"


def test_script_flags_can_be_overridden(gpu_node):
    [argv] = script_commands("gem.sh", "sudoku", "--gpus", "4", "--learning_rate", "2e-6", "--tr_delta", "0.15")
    with gpu_node(4):
        args = validate_args(launch.parse_args(argv))
    assert (args.gpus, args.rollout_batch_size_per_device, args.learning_rate) == (4, 32, 2e-6)
    assert spec_of(args).trust_region.delta == 0.15


@pytest.fixture
def math_ids():
    """The shared math sets as local-math ids, as DPPO_MATH_DATA registers them on a node, and the training set of
    math.sh, local-math:math_lvl3to5_8k:train: oat's folder has a train split, the shared copy only eval, which
    stands in for it here."""
    import envs

    env_ids = envs.register_math_folder(MATH_DATA)
    train_id = "local-math:math_lvl3to5_8k:train"
    if train_id not in env_ids:
        folder = MATH_DATA / "train" / "math_lvl3to5_8k"
        env_ids.append(envs.register_math_dataset(train_id, folder, split="eval", overwrite=True))
    return env_ids


@needs_math_data
def test_math_script_is_oats_math_recipe_with_avg32_on_every_problem(gpu_node, math_ids):
    for baseline in (False, True):
        [argv] = script_commands("math.sh", *(["ppo"] if baseline else []), "--gpus", "8")
        with gpu_node(8):
            args = validate_args(launch.parse_args(argv))
        plan = plan_of(args)
        assert (args.num_samples, plan.samples_per_round, plan.optimizer_steps_per_round) == (8, 128, 8)
        assert args.num_eval_seeds == 0 and args.eval_n == 32
        assert args.eval_env_ids == ("local-math:evaluation_suite:aime", "local-math:evaluation_suite:amc")


@needs_math_data
def test_sanity_test_script_runs_every_method_of_the_figure_and_takes_oat_flags(gpu_node, math_ids):
    """64 prompts × 8 samples per rollout, 4 gradient steps per rollout, each method with the paper's defaults."""
    commands = script_commands("sanity_test.sh")
    assert len(commands) == len(SANITY_METHODS)
    for method, argv in zip(SANITY_METHODS, commands, strict=True):
        with gpu_node(8):
            args = validate_args(launch.parse_args(argv))
        assert spec_of(args).trust_region == TrustRegion.preset(method)
        groups = oat_args.groups_per_step(args) * args.gpus
        assert (groups, args.num_samples) == (64, 8)
        assert plan_of(args).optimizer_steps_per_round == 4
        assert args.learning_rate == 1e-6 and args.generate_max_length == 8000
    two = script_commands("sanity_test.sh", "pg_is", "dppo_binary_kl", "--gpus", "4")
    assert len(two) == 2 and all(launch.parse_args(argv).gpus == 4 for argv in two)
    assert all(launch.parse_args(argv).rollout_batch_size_per_device == 128 for argv in two)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_is_available(preset, gpu_node):
    with gpu_node(2):
        args = validate_args(launch.parse_args(SMALL + ["--trust_region", preset]))
    spec = spec_of(args)
    assert spec.trust_region == TrustRegion.preset(preset)
    assert spec.sampling.top_k_logprobs == (spec.trust_region.k if spec.trust_region.uses_topk else 0)


def test_mismatch_overrides_reach_the_run_spec(gpu_node):
    with gpu_node(2):
        icepop = validate_args(launch.parse_args(SMALL + ["--trust_region", "icepop", "--tr_mismatch_low", "0.4",
                                                          "--tr_mismatch_high", "4"]))
        prime = validate_args(launch.parse_args(SMALL + ["--trust_region", "dppo_binary_tv_kl", "--tr_kl_tau", "0.01"]))
    tr = spec_of(icepop).trust_region
    assert (tr.mismatch_mask, tr.mismatch_low, tr.mismatch_high, tr.needs_recompute) == ("token", 0.4, 4.0, True)
    assert spec_of(prime).trust_region == TrustRegion.preset("dppo_binary_tv_kl", kl_tau=0.01)


def test_later_overrides_reach_the_run_spec(gpu_node):
    with gpu_node(2):
        cppo = validate_args(launch.parse_args(SMALL + ["--trust_region", "cppo", "--tr_w_min", "0.5",
                                                        "--tr_delta_b", "0.01"]))
        m2po = validate_args(launch.parse_args(SMALL + ["--trust_region", "m2po", "--tr_tau_m2", "0.1"]))
    assert spec_of(cppo).trust_region == TrustRegion.preset("cppo", w_min=0.5, delta_b=0.01)
    assert spec_of(cppo).sampling.top_k_logprobs == 20
    assert spec_of(m2po).trust_region == TrustRegion.preset("m2po", tau_m2=0.1)


def test_greedy_evaluation_is_allowed_and_greedy_training_is_not(gpu_node):
    with gpu_node(2):
        args = validate_args(launch.parse_args(SMALL + ["--eval_temperature", "0"]))
    assert spec_of(args).eval_sampling.temperature == 0


def test_dppo_flags_reach_the_run_spec(gpu_node):
    flags = ["--trust_region", "dppo_topk_kl", "--tr_delta", "0.1", "--tr_k", "8", "--tr_is_cap", "5",
             "--wrappers", "concat", "--turn_baseline", "--eval_top_k", "20", "--env_ids", "game:Sudoku-v0-easy"]
    with gpu_node(2):
        args = validate_args(launch.parse_args(SMALL + flags))
    spec = spec_of(args)
    assert (spec.trust_region.rule, spec.trust_region.delta, spec.trust_region.k) == ("topk_kl", 0.1, 8)
    assert spec.trust_region.is_cap == 5.0 and spec.sampling.top_k_logprobs == 8
    assert spec.rollout.wrappers == ("concat",) and spec.advantages.per_turn_baseline
    assert (spec.eval_sampling.temperature, spec.eval_sampling.top_p, spec.eval_sampling.top_k) == (0.6, 0.95, 20)


@pytest.mark.fault("oat engine: `--wb_run_name ../x` or `a/b`",
                   "one line: a run name is one folder inside `--save_path`")
@pytest.mark.fault("oat engine: `--checkpoint_every` not a multiple of `--sync_params_every`, LoRA under ZeRO-3, "
                   "`--load_in_4bit`, `--save_ckpt`",
                   "one line each, before any model loads: why it cannot work and what to use")
@pytest.mark.fault("oat engine: `--asynchronous`",
                   "refused in one line: oat 0.2.4's asynchronous collector fails at its first actor step (its "
                   "prefill scatters no samples); train synchronously")
@pytest.mark.parametrize(
    "flags,message",
    [
        (["--temperature", "0.7"], "raw log-probs"),
        (["--top_p", "0.9"], "top-p/top-k"),
        (["--top_k", "50"], "top-p/top-k"),
        (["--learning_rate", "inf"], "--learning_rate must be a finite number"),
        (["--token_samples", "-1"], "--token-samples must be >= 0"),
        (["--critic_type", "ppo"], "learned critic"),
        (["--trust_region", "dppo"], None),
        (["--trust_region", "dppo_binary_tv", "--tr_delta", "0"], "delta"),
        (["--rollout_batch_size", "12"], "not a multiple"),
        (["--num_samples", "1"], "needs groups"),
        (["--prompt_template", "llama"], "prompt template"),
        (["--wrappers", "concatenate"], "unknown Gem wrapper"),
        (["--eval_temperature", "-1"], "--eval_temperature"),
        (["--num_eval_seeds", "0"], "not one: give a number of seeds"),
        (["--num_gpus_per_actor", "3"], "1, 2, 4 or 8"),
        (["--env_ids", "game:Sudoku-v9"], "unknown env id"),
        (["--pi_buffer_maxlen_per_device", "8"], "keeps only the last"),
        (["--resume_dir", "oat-output/missing-run"], "--resume_dir oat-output/missing-run: no such run directory"),
        (["--checkpoint_every", "3", "--sync_params_every", "2"], "must be a multiple of --sync_params_every 2"),
        (["--keep_checkpoints", "0"], "--keep_checkpoints >= 1"),
        (["--lora_rank", "8", "--zero_stage", "3"], "--lora_rank with --zero_stage 3"),
        (["--lora_rank", "-1"], "--lora_rank must be >= 0"),
        (["--load_in_4bit"], "re-quantizes them"),
        (["--save_ckpt"], "use --checkpoint_every"),
        (["--dump_replay_every", "5"], "does not dump oat's replay buffer"),
        (["--trust_region", "ppo", "--tr_delta", "0.2"], "not read by the trust region ppo"),
        (["--wb_run_name", "../elsewhere"], "--wb_run_name '../elsewhere' must be one folder name inside --save_path"),
        (["--wb_run_name", "sweep/arm"], "must be one folder name"),
        (["--fp16"], r"--fp16 replaces oat's default --bf16: pass --fp16 --no-bf16"),
        (["--fp16", "--no-bf16", "--zero_stage", "0"], "--fp16 needs --zero_stage 1, 2 or 3"),
        (["--asynchronous"], r"--asynchronous: oat 0.2.4's asynchronous collector fails at its first actor step.*"
                             r"use --max_staleness 1"),
        (["--max_staleness", "-1"], "--max_staleness must be >= 0"),
        (["--max_staleness", "1", "--checkpoint_every", "0", "--collocate"], "--max_staleness 1 with --collocate"),
        (["--max_staleness", "1", "--checkpoint_every", "0", "--vllm_sleep"], "--max_staleness 1 with --vllm_sleep"),
        (["--max_staleness", "1", "--checkpoint_every", "0", "--trust_region", "minirl_tis"],
         "--max_staleness 1 with --trust_region minirl_tis: it recomputes"),
        (["--max_staleness", "1", "--checkpoint_every", "0", "--sync_params_every", "2"],
         "give --sync_params_every 1"),
    ],
)
def test_invalid_arguments_are_refused(flags, message, gpu_node):
    if message is None:  # tyro refuses a name outside the presets' choices itself
        with pytest.raises(SystemExit):
            launch.parse_args(SMALL + flags)
        return
    with gpu_node(2), pytest.raises(ValueError, match=message):
        validate_args(launch.parse_args(SMALL + flags))


OTHER_VALUES = {"cliprange": "0.3", "tis_c": "2.0", "beta": "0.1", "kl_penalty_coef": "0.1", "reward_scale": "2",
                "non_stop_penalty": "-1", "non_stop_fixed_reward": "0", "dump_replay_every": "5"}


@pytest.mark.fault("oat engine: an oat flag whose job DPPO does differently (`--cliprange 0.3`, `--beta 0.1`, …)",
                   "refused in one line naming what to use instead ([the list](engines/oat.md#flags))")
@pytest.mark.parametrize("name", sorted(REPLACED_OAT_FLAGS))
def test_oat_loss_flags_are_refused_not_ignored(name, gpu_node):
    flag = [f"--{name}", OTHER_VALUES[name]] if name in OTHER_VALUES else [f"--{name}"]
    with gpu_node(2), pytest.raises(ValueError, match=f"--{name}=.*not used by DPPO"):
        validate_args(launch.parse_args(SMALL + flag))
    oat_page = REPO / "docs" / "engines" / "oat.md"
    assert f"`--{name}`" in oat_page.read_text(), "docs/engines/oat.md lists every refused oat flag"


@pytest.mark.fault("oat engine: `--tr_calibrate`, `--tr_calibrate_like`, `--tr_calibrate_unit`, "
                   "`--tr_calibrate_band` or `--tr_calibrate_every`",
                   "refused in one line: calibrate offline from the run's token export "
                   "(`python -m dppo_oat.calibrate`) and pass the band it prints")
@pytest.mark.parametrize("flags", [["--tr_calibrate", "0.05"], ["--tr_calibrate_like", "dppo_binary_kl"],
                                   ["--tr_calibrate_unit", "sequence"], ["--tr_calibrate_band", "both"],
                                   ["--tr_calibrate_every", "1"], ["--tr-calibrate=0.05"]])
def test_band_calibration_is_refused_with_the_offline_route(flags, gpu_node):
    flag = flags[0].split("=")[0]
    with gpu_node(2), pytest.raises(ValueError, match=f"{flag}: the oat engine does not calibrate") as error:
        validate_args(launch.parse_args(SMALL + flags))
    assert "python -m dppo_oat.calibrate" in str(error.value) and "\n" not in str(error.value)


def test_the_oat_engine_declares_no_flag_it_refuses_for_calibration():
    """Its ``--help`` lists what it honours: the local engine's calibration flags are not its fields."""
    import dataclasses

    from dppo_oat.engines.oat.args import DPPOOatArgs
    from dppo_oat.settings.spec import CALIBRATION_FLAGS

    assert not set(CALIBRATION_FLAGS) & {field.name for field in dataclasses.fields(DPPOOatArgs)}


def load_docs_tables():
    """scripts/docs_tables.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "scripts" / "docs_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    return tables


def test_the_flags_tables_read_from_the_source_are_the_classes_themselves():
    """scripts/docs_tables.py reads DPPOOatArgs from its source, without oat: every flag it lists has that default in
    the class, and a field declared without a docstring is one of oat's own flags, whose default it changes."""
    import dataclasses

    tables = load_docs_tables()
    ours = {field.name: field.default for field in dataclasses.fields(DPPOOatArgs)}
    oats = {field.name: field.default for field in dataclasses.fields(PPOArgs)}
    for name, (default, _) in tables.oat_engine_flags().items():
        assert repr(ours[name]) == default, name
    changed = tables.oat_default_changes()
    assert changed
    for name, default in changed.items():
        assert name in oats and repr(ours[name]) == default and oats[name] != ours[name], name


def test_every_flag_dppo_adds_is_in_one_help_section_that_the_docs_read_too():
    """``HELP_GROUPS`` holds each flag DPPO adds to oat's once, and scripts/docs_tables.py (which reads it from the
    source, without oat) sees the same sections."""
    tables = load_docs_tables()
    names = [name for group in oat_args.HELP_GROUPS for name in group.fields]
    assert sorted(names) == sorted(tables.oat_engine_flags())
    assert tables.oat_help_groups() == [(group.title, group.about, group.fields) for group in oat_args.HELP_GROUPS]


def test_the_command_line_parses_as_the_flat_arguments():
    """The sections change where ``--help`` shows DPPO's flags, not what they parse into: the same flat
    ``DPPOOatArgs`` (``vars(args)``, which config.json records and a resume compares), in either spelling."""
    import warnings

    import tyro

    args = SMALL + ["--trust_region", "icepop", "--tr_mismatch_low", "0.4", "--tr-mismatch-high", "3", "--env_ids",
                    "game:Sudoku-v0-easy", "--eval-env-ids", "rg:acre", "--turn_baseline", "--lm_head", "logits",
                    "--token_samples", "4", "--checkpoint_every", "0", "--price_gpu", "h100", "--env_module", "a",
                    "--env_module", "b", "--gamma", "0.9", "--dry_run"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # tyro on oat's own ``str = None`` fields
        flat = tyro.cli(DPPOOatArgs, args=args)
        flat_defaults = tyro.cli(DPPOOatArgs, args=SMALL)
    grouped = launch.parse_args(args)
    assert type(grouped) is DPPOOatArgs and grouped == flat and vars(grouped) == vars(flat)
    assert (grouped.tr_mismatch_high, grouped.env_module, grouped.gamma) == (3.0, ("a", "b"), 0.9)
    assert launch.parse_args(SMALL) == flat_defaults


def test_help_lists_oats_flags_then_dppos_in_sections_without_launchpad():
    """``--engine oat --help`` works where launchpad is not installed (as ``--dry_run`` does): oat's own flags
    first, as oat shows them, then DPPO's in ``HELP_GROUPS``' sections; into a reader that has stopped, it ends
    with status 0 (DeepSpeed, which oat imports, logs to stdout as it is imported: the logging module reports
    each of those lines that found the reader gone, and nothing else fails)."""
    env = {**without_visible_gpus(os.environ), "PYTHONPATH": str(REPO), "COLUMNS": "80"}
    command = [sys.executable, "-m", "dppo_oat.train", "--engine", "oat", "--help"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    boxes = {part.split(" ─")[0]: part for part in done.stdout.split("╭─ ")[1:]}
    assert list(boxes) == ["options", *(f"{group.title} options" for group in oat_args.HELP_GROUPS)]
    assert "--rollout-batch-size" in boxes["options"] and "--tr-delta" not in boxes["options"]
    assert "--tr-delta" in boxes["dppo trust-region options"] and "--lm-head" in boxes["dppo learner options"]
    reader_gone = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reader_gone.stdout.close()  # the reader stops before the first line
    _, errors = reader_gone.communicate(timeout=600)
    assert reader_gone.returncode == 0, errors[-2000:]
    raised = set(re.findall(rb"^[\w.]+(?:Error|Exception)\b.*$", errors, re.M))
    # a log line vLLM 0.8's CPU build writes while it handles its own probe for a distribution named "vllm" reports
    # that exception as the context of the broken pipe
    assert raised <= {b"BrokenPipeError: [Errno 32] Broken pipe", b"importlib.metadata.PackageNotFoundError: No "
                      b"package metadata was found for vllm"}, errors[-2000:]
    assert errors.count(b"BrokenPipeError") == errors.count(b"--- Logging error ---"), errors[-2000:]


def test_the_price_flags_default_to_the_prices_own():
    from dppo_oat.engines.oat.price import ASSUMED_DECODE_EFFICIENCY

    defaults = {field.name: field.default for field in dataclasses.fields(DPPOOatArgs)}
    assert defaults["price_decode_efficiency"] == ASSUMED_DECODE_EFFICIENCY
    assert defaults["price_gpu"] is None and defaults["price_model"] is None


@pytest.mark.fault("oat engine: `--use_wb` (`WANDB=1`) without a wandb login",
                   "one line before anything launches (oat would otherwise ask for a key inside a learner, after the "
                   "models loaded)")
def test_wandb_is_off_unless_asked_and_refused_without_a_login(gpu_node, monkeypatch, tmp_path):
    """oat calls ``wandb.login(key=True)`` in the learner when no key is configured, after the models loaded."""
    assert "--use_wb" not in script_commands("gem.sh", "sudoku", "--gpus", "1")[0]
    [argv] = script_commands("gem.sh", "sudoku", "--gpus", "1", WANDB="1")
    assert "--use_wb" in argv
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with gpu_node(1), pytest.raises(ValueError, match="--use_wb: wandb has no API key here: run `wandb login`"):
        validate_args(launch.parse_args(argv))


def test_oat_still_counts_gpus_unless_it_is_a_dry_run(gpu_node):
    with gpu_node(1), pytest.raises(AssertionError, match="GPUs available"):
        validate_args(launch.parse_args(SMALL))
    with gpu_node(0):
        args = validate_args(launch.parse_args(SMALL + ["--dry_run"]), check_gpus=False)
    assert args.gpus == 2


def run_dry(*script_args: str, **environ: str) -> subprocess.CompletedProcess:
    """A GPU-node script with --dry-run in a fresh interpreter, which has no launchpad (no stub on its path), on a
    node that exports no CUDA_VISIBLE_DEVICES unless ``environ`` sets it."""
    env = {**without_visible_gpus(os.environ), "PYTHON": sys.executable, "DPPO_MATH_DATA": str(MATH_DATA),
           "PYTHONPATH": str(REPO), **environ}
    return subprocess.run(["bash", str(SCRIPTS / script_args[0]), *script_args[1:], "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("gpus,per_learner", [(1, 128), (8, 16)])
def test_dry_run_prints_the_plan_without_gpus_or_launchpad(gpus, per_learner):
    done = run_dry("gem.sh", "sudoku", "--gpus", str(gpus))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"node: {gpus} GPU(s)" in done.stdout and f"{per_learner} samples per learner" in done.stdout
    assert "2 optimizer step(s) per round" in done.stdout and "LM head: fused" in done.stdout
    for priced in ("  actors per round: at most", "  learner per round: at most", "  run: at most",
                   "  learner memory per GPU: about"):
        assert priced in done.stdout
    assert "commit 318a79e" in done.stdout and "unknown" not in done.stdout
    if gpus == 1:
        assert "\nlayout: 1 GPU, so no split" in done.stdout
    else:
        for layout in ("\nlayout of the 8 GPUs", "\n  collocated, actors and learners taking turns on all 8 GPUs",
                       "\n  split, 4 actor + 4 learner GPUs: synchronous at most", "\n  faster: collocated, "):
            assert layout in done.stdout


def test_the_docs_laptop_dry_run_command_prints_the_plan():
    """docs/engines/oat.md's dry run on a laptop, as written, with this environment (.venv-oat) as its PYTHON."""
    page = (REPO / "docs" / "engines" / "oat.md").read_text()
    [command] = [line.strip() for line in page.splitlines() if line.strip().startswith("PYTHON=.venv-oat/bin/python")]
    words = shlex.split(command.split("#")[0])
    assert words[:3] == ["PYTHON=.venv-oat/bin/python", "bash", "scripts/gpu/gem.sh"] and words[-1] == "--dry-run"
    assert "make setup-oat" in page and (REPO / "Makefile").read_text().count("setup-oat: $(OAT_VENV)/.installed") == 1
    done = run_dry(*[words[2].removeprefix("scripts/gpu/"), *words[3:-1]])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "node: 1 GPU(s)" in done.stdout and "2 optimizer step(s) per round" in done.stdout


def test_an_inconsistent_plan_fails_in_one_line_with_status_2():
    done = run_dry("gem.sh", "sudoku", "--gpus", "1", "--rollout_batch_size_per_device", "16",
                   "--pi_buffer_maxlen_per_device", "16")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "set --pi_buffer_maxlen_per_device 128" in errors[0]
    assert "Traceback" not in done.stderr and "node:" not in done.stdout


@pytest.mark.fault("oat engine: `python -m dppo_oat.train --engine oat --dry_run` with no other flag (oat's "
                   "`--pi_buffer_maxlen_per_device 16` holds half of a learner's 32 samples per round at oat's other "
                   "defaults)",
                   "the plan is consistent: `--pi_buffer_maxlen_per_device` defaults to one learning round's samples "
                   "(`rollout_batch_size / learners`), so the bare dry run prints its plan (exit 0)")
def test_the_bare_dry_run_plans_its_own_defaults():
    env = {**without_visible_gpus(os.environ), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "dppo_oat.train", "--engine", "oat", "--dry_run"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "32 samples per learner, buffer 32" in done.stdout, done.stdout
    without_buffer = [flag for i, flag in enumerate(SMALL)
                      if "pi_buffer" not in flag and "pi_buffer" not in SMALL[i - 1]]
    args = validate_args(launch.parse_args([*without_buffer, "--dry_run"]), check_gpus=False)
    assert args.pi_buffer_maxlen_per_device == 16  # oat reads the number itself: it is set, never left None


@pytest.mark.parametrize("flags, fragment", [
    (["--trust_region", "sapo", "--tr_tau_pos", "1e300"], "--tr_tau_pos 1e+300 overflows float32"),
    (["--learning_rate", "1e39"], "--learning_rate 1e+39 overflows float32"),
    (["--temperature", "1e-300"], "--temperature 1e-300 underflows float32"),
])
def test_a_number_past_float32_fails_the_dry_run_in_one_line(flags, fragment):
    env = {**without_visible_gpus(os.environ), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "dppo_oat.train", "--engine", "oat", "--dry_run", *flags], env=env,
                          capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and fragment in errors[0], done.stderr[-2000:]


EIGHT_GPUS = "0,1,2,3,4,5,6,7"


def test_a_gpu_count_other_than_the_exported_one_is_refused_in_one_line():
    """oat 0.2.4 starts an actor and a learner on every GPU CUDA_VISIBLE_DEVICES lists, whatever --gpus says."""
    done = run_dry("gem.sh", "sudoku", "--gpus", "1", CUDA_VISIBLE_DEVICES=EIGHT_GPUS)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "lists 8 GPU(s) but --gpus is 1" in errors[0]
    assert "pass --gpus 8, or export CUDA_VISIBLE_DEVICES=0" in errors[0]
    assert "Traceback" not in done.stderr and "node:" not in done.stdout


def test_the_scripts_default_to_the_exported_gpus():
    done = run_dry("gem.sh", "sudoku", CUDA_VISIBLE_DEVICES="2,3")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "node: 2 GPU(s)" in done.stdout and "64 samples per learner" in done.stdout


def test_fp16_is_accepted_in_place_of_bf16(gpu_node):
    """``--fp16 --no-bf16`` reaches oat's DeepSpeed config as fp16 with a dynamic loss scale (the learner counts the
    scaler's skips apart from divergence); bf16 stays oat's default."""
    from oat.utils.deepspeed import get_train_ds_config

    with gpu_node(2):
        fp16 = validate_args(launch.parse_args(SMALL + ["--fp16", "--no-bf16"]))
        default = validate_args(launch.parse_args(SMALL))
    assert (fp16.fp16, fp16.bf16, default.fp16, default.bf16) == (True, False, False, True)
    config = get_train_ds_config(offload=False, stage=fp16.zero_stage, bf16=fp16.bf16, fp16=fp16.fp16)
    assert config["fp16"] == {"enabled": True} and config["bf16"] == {"enabled": False}


def test_program_runs_dppo_learners_and_actors(gpu_node):
    """oat's builder gets DPPOLearner and DPPOGemActor: 8 collocated actors and learners for the Sudoku command."""
    with gpu_node(8):
        args = validate_args(launch.parse_args(script_commands("gem.sh", "sudoku")[0]))
        program, resources = launch.build_program(args)
    by_class = {}
    for node in program_nodes(program):
        by_class.setdefault(node.constructor, []).append(node)
    assert set(by_class) == {PlasmaShmServer, DPPOGemActor, DPPOLearner}
    actors, learners = by_class[DPPOGemActor], by_class[DPPOLearner]
    assert len(actors) == len(learners) == 8
    assert all(isinstance(view.node, launchpad.CourierNode) for view in actors)
    assert all(isinstance(view.node, launchpad.PyClassNode) for view in learners)
    ipc, vllm_args, actor_args = actors[0].args
    assert actor_args is args and isinstance(args, DPPOOatArgs)
    assert vllm_args["model"] == "Qwen/Qwen3-1.7B-Base" and vllm_args["max_model_len"] == 12800
    world_size, rank, *_, learner_args, learner_actors, learner_ipc = learners[3].args
    assert (world_size, rank, learner_args) == (8, 3, args)
    assert len(learner_actors) == len(actors)  # each learner gets every actor's handle (dm-launchpad: new handles)
    assert resources[learners[3].label].env == {"CUDA_VISIBLE_DEVICES": "3"}


def test_main_prints_the_plan_and_launches_the_program(gpu_node, monkeypatch, capsys):
    launched = []
    monkeypatch.setattr(launchpad, "launch", lambda program, **kwargs: launched.append((program, kwargs)))
    monkeypatch.setattr(preflight, "toolkit_problem", lambda toolkit: None)  # no CUDA toolkit to compile Adam here
    with gpu_node(2):
        launch.main(SMALL + ["--trust_region", "dppo_topk_tv"])
    (program, kwargs), = launched
    assert kwargs["launch_type"] == "local_mp" and kwargs["terminal"] == "current_terminal"
    assert any(node.constructor is DPPOLearner for node in program_nodes(program))
    assert any(node.constructor is DPPOGemActor for node in program_nodes(program))
    assert "node: 2 GPU(s)" in capsys.readouterr().out


@pytest.mark.fault("oat engine: Ctrl-C before anything is launched",
                   "`error: interrupted before anything was launched: nothing was written; run the same command again` "
                   "(exit 130)")
def test_ctrl_c_before_launch_is_one_line(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "checked_plan", interrupted)
    with pytest.raises(SystemExit) as stopped:
        launch.main(SMALL)
    assert stopped.value.code == 130
    assert capsys.readouterr().err.strip() == ("error: interrupted before anything was launched: nothing was written; "
                                               "run the same command again")
