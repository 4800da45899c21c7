"""The local engine's configuration (a tyro CLI whose ``--help`` comes in sections, :data:`HELP_GROUPS`), validated
before any model is built, and its one mapping onto the run's :class:`~dppo_oat.settings.spec.RunSpec`
(:func:`run_spec`)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dppo_oat.aggregation import AGGREGATIONS
from dppo_oat.learner.autocast import ComputeDtype
from dppo_oat.models.shapes import FIXED_SHAPES, PolicyShape
from dppo_oat.rollout.rollout_copy import RolloutPrecision
from dppo_oat.run.directory import RunDir, without_climbs_through_missing_folders
from dppo_oat.settings import spec
from dppo_oat.settings.grouped_cli import FlagGroup, parse_grouped
from dppo_oat.settings.kinds import flag
from dppo_oat.settings.run_flags import RunFlags

DEFAULT_ENV = "game:Sudoku-v0-easy-compact-wrong"


@dataclass
class WarmStartConfig:
    """Supervised warm start of the built-in policy on oracle demonstrations."""

    demo_episodes: int = 6000
    """Oracle episodes of the training env used as demonstrations."""
    mistake_rate: float = 0.25
    """Share of demonstration turns that follow an unrecorded wrong move (in envs that show the last one, as the
    default Sudoku), so that the policy learns to recover from one."""
    lr: float = 1e-3
    """AdamW learning rate."""
    batch_size: int = 64
    """Demonstration turns per optimizer step."""
    target_success: float = 0.65
    """Stop at the first check whose validation success reaches this; RL goes the rest of the way."""
    check_every: int = 100
    """Optimizer steps between success checks."""
    check_episodes: int = 96
    """Validation episodes per success check (seeds apart from the held-out evaluation ones)."""
    max_steps: int = 4000
    """Optimizer steps at most (short of the target: cached, with a warning on every use)."""
    shape: PolicyShape = "tiny"
    """tiny (~0.6M parameters: seconds a step on a CPU), tiny-8k (its vocabulary padded to 8,192, for top-K
    divergences) or qwen3-100m (~100M, 32,768 entries: a realistic LM head for a GPU)."""
    vocab_size: int = 512
    """BPE merges of the policy's tokenizer, trained on the demonstrations (fewer when they need fewer)."""
    hidden_size: int = 128
    """Hidden size of the tiny shape."""
    num_layers: int = 2
    """Transformer layers of the tiny shape."""
    seed: int | None = 0
    """Seed of the tokenizer, model and demonstrations (every RL --seed starts from this one policy). None: --seed."""

    def check(self) -> None:
        """Every flag in its range (one line naming it), before any model loads or any warm start begins."""
        for name in ("demo_episodes", "batch_size", "check_every", "check_episodes", "max_steps", "vocab_size",
                     "hidden_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{flag_of(name)} must be >= 1, got {getattr(self, name)}")
        if not (0 < self.lr < math.inf):
            raise ValueError(f"{flag_of('lr')} must be a finite number > 0, got {self.lr}")
        if not 0 <= self.mistake_rate < 1:  # NaN fails too
            raise ValueError(f"{flag_of('mistake_rate')} must be in [0, 1) (a share of demonstration turns), got "
                             f"{self.mistake_rate}")
        if not 0 <= self.target_success <= 1:  # 0: stop at the first check
            raise ValueError(f"{flag_of('target_success')} must be in [0, 1] (a validation success rate), got "
                             f"{self.target_success}")


REFERENCE_LR = 3e-4
"""The RL learning rate of the tiny policy at its default shape (:data:`REFERENCE_SHAPE`), measured there."""
REFERENCE_SHAPE = (128, 2)
"""The tiny policy's default hidden size and number of layers, where :data:`REFERENCE_LR` was measured."""
PRETRAINED_LR = 1e-6
"""The paper's learning rate for full fine-tuning of its models (its table of hyperparameters, ``optim.lr``)."""


def default_lr(*, shape: PolicyShape, hidden_size: int, num_layers: int, pretrain: str | None) -> float:
    """``--lr``'s default, by the policy: the paper's :data:`PRETRAINED_LR` for a ``--pretrain`` model; for the
    built-in policy :data:`REFERENCE_LR` × (128 / hidden size) × (2 / layers), so 3e-4 for the tiny default and
    8.3e-6 for qwen3-100m. Adam moves every weight by about the learning rate on a step whatever the gradient's
    scale; a logit sums ``hidden`` such moves in each of ``layers`` layers, so at a fixed lr one step moves the
    policy further the wider and deeper it is. Scaled so, one step's per-token KL on a fixed batch stays within a
    few times the tiny default's, where at 3e-4 it grows 155-fold to qwen3-100m (``scripts/bench/first_step_kl.py``,
    ``docs/bench/first_step_kl_cpu.jsonl``)."""
    if pretrain is not None:
        return PRETRAINED_LR
    fixed = FIXED_SHAPES.get(shape, {})
    width, depth = fixed.get("hidden_size", hidden_size), fixed.get("num_hidden_layers", num_layers)
    if width < 1 or depth < 1:  # a shape --warm-start's check refuses in one line, before any model
        return REFERENCE_LR
    reference_width, reference_depth = REFERENCE_SHAPE
    return REFERENCE_LR * (reference_width / width) * (reference_depth / depth)


def flag_of(name: str) -> str:
    """The command-line flag of a warm-start setting (``check_every`` → ``--warm-start.check-every``)."""
    return f"--warm-start.{name.replace('_', '-')}"


@dataclass
class TrainConfig(spec.DPPOFlags, spec.CalibrationFlags, RunFlags):
    """DPPO (or any preset of the paper) on Gem environments, in one process.

    Env ids: game:Sudoku-v0-easy-compact-wrong (default: compact board + last wrong move),
    game:Sudoku-v0-easy-compact, game:Sudoku-v0-easy, game:GuessTheNumber-v0-easy-compact, rg:arc_1d, rg:acre,
    example:Countdown-v0, local-math:<name or path>, or any registered Gem id.
    """

    engine: Literal["local", "oat"] = "local"
    """local: this process (CPU or one GPU); oat: oat, vLLM and DeepSpeed on a GPU node."""
    env_ids: tuple[str, ...] = (DEFAULT_ENV,)
    """Gem env ids, assigned to groups round-robin."""
    prompt_template: str | None = None
    """How an observation becomes a prompt: qwen3_game (Gem's game prompt in Qwen3 markup), qwen3_general
    (single-turn questions), plain, or chat (the model's own chat template). None: plain for the tiny policy, else
    qwen3_game."""
    loss_aggregation: Literal[AGGREGATIONS] = "seq-mean-token-sum-norm"  # type: ignore[valid-type]
    """How per-token losses are aggregated (seq-mean-token-sum-norm: Dr.GRPO's, over --max-new-tokens)."""
    pretrain: str | None = None
    """A Hugging Face causal LM (local path, or hub id where the hub is reachable). None: a tiny policy warm-started
    on the oracle moves of the first --env-ids, built once and cached."""
    generator: Literal["hf", "vllm"] = "hf"
    """Rollout sampler (μ): hf samples with the training model's own layers (any device); vllm runs a vLLM
    engine in this process on the GPU, synced after every update."""
    max_staleness: int = 0
    """Sample the next batch in a background thread during the update, with the weights after step
    max(0, t − 1 − k) for step t (reproducible; μ is theirs). 0: synchronous. hf only; not with --probe-every."""
    steps: int = flag(100, resumable=True)
    """RL steps, each one rollout batch (--groups-per-step × --group-size episodes) and its update."""
    groups_per_step: int = 16
    """Groups per rollout batch, each one puzzle seed played --group-size times."""
    group_size: int = 4
    """Episodes per group (same seed): the GRPO group."""
    minibatch_size: int = 256
    """Turn samples per optimizer step (a rollout batch gives several: the trust region matters)."""
    minibatches_per_rollout: int | None = None
    """Split every rollout batch into this many minibatches, whatever its size (the paper's sanity test: 4 gradient
    steps per rollout); overrides --minibatch-size."""
    micro_batch_size: int | None = None
    """Turn samples per forward/backward pass (gradients accumulate to the same optimizer step). None: the whole
    minibatch."""
    num_epochs: int = 1
    """Passes over every rollout batch (each pass reshuffles it into minibatches)."""
    lr: float | None = None
    """AdamW learning rate. None: 1e-6 (the paper's) with --pretrain, else 3e-4 × (128 / hidden) × (2 / layers)."""
    lr_schedule: Literal["constant", "linear"] = "linear"
    """linear: lr · (steps − t + 1) / steps at step t (a resume that extends --steps re-plans it); constant."""
    weight_decay: float = 0.0
    """AdamW weight decay of the RL update."""
    grad_clip: float = 1.0
    """Clip each optimizer step's gradient to this global L2 norm."""
    gamma: float = 0.0
    """Discount of per-turn returns. 0: each turn gets its own reward; with γ > 0 a pooled group baseline also
    favours early turns (see --turn-baseline)."""
    temperature: float = 1.0
    """Sampling temperature of rollouts and evaluations (the learner scores at it too)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1: the full distribution)."""
    max_new_tokens: int = 12
    """Tokens the policy may generate per turn (also the normaliser of seq-mean-token-sum-norm)."""
    max_prompt_tokens: int = 256
    """Longest prompt in tokens (an env whose first prompt is longer is refused before training)."""
    train_pool: int | None = None
    """Draw training puzzles from a fixed pool of this many seeds (the paper's sanity test). None: fresh ones."""
    seed: int = 0
    """Seed of the RL run: torch, the training puzzles and the sampling (the warm-started policy follows
    --warm-start.seed)."""
    eval_every: int = flag(50, resumable=True)
    """Evaluate held-out success every N steps (and at steps 0 and last)."""
    eval_episodes: int = 200
    """Held-out evaluation episodes (fixed seeds, the same for every run)."""
    dtype: ComputeDtype = "float32"
    """Compute precision of the learner and the hf sampler (autocast; weights and AdamW state stay fp32).
    float16 also scales the loss; bfloat16 needs a CPU or a GPU of compute capability 8.0+."""
    rollout_dtype: RolloutPrecision = "float32"
    """Sample from a lower-precision copy of the policy: bfloat16 or float16 weights and arithmetic, or
    int-quantised weights computing at --dtype. float32: none."""
    rollout_redraw: bool = False
    """With an int --rollout-dtype: round on a grid shifted by a seeded random offset at every re-sync (a new
    error each rollout, of nearest rounding's size)."""
    logprob_noise: float = 0.0
    """Add N(0, σ²) to the reported log μ (clamped ≤ 0), as an imperfect inference engine."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """The built-in policy's shape and supervised warm start (with --pretrain None)."""

    def __post_init__(self) -> None:
        if self.lr is None:  # resolved once, so config.json, --resume and every reader see the number
            self.lr = default_lr(shape=self.warm_start.shape, hidden_size=self.warm_start.hidden_size,
                                 num_layers=self.warm_start.num_layers, pretrain=self.pretrain)

    # ------------------------------------------------------------------ derived
    @property
    def template(self) -> str:
        """The prompt template in use (``--prompt-template``, else the default for the policy)."""
        return self.prompt_template or ("plain" if self.pretrain is None else "qwen3_game")

    @property
    def episodes_per_step(self) -> int:
        return self.groups_per_step * self.group_size

    def resolved_run_name(self) -> str:
        """``--run-name`` as given (an empty one is refused by validation, not replaced), else the default name."""
        if self.run_name is not None:
            return self.run_name
        return f"{self.trust_region}-{self.env_ids[0].replace(':', '_').replace('/', '_')}-s{self.seed}"

    def run_directory(self) -> RunDir:
        """This run's directory: ``--run-name`` (resolved) inside ``--runs-dir``, the folder of runs, a ``..`` out of a
        folder that does not exist taken out with it (:func:`~dppo_oat.run.directory.without_climbs_through_missing_
        folders`: no empty folder is created on the way)."""
        return RunDir(without_climbs_through_missing_folders(Path(self.runs_dir)) / self.resolved_run_name())

    @property
    def warm_start_seed(self) -> int:
        return self.seed if self.warm_start.seed is None else self.warm_start.seed

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir or os.environ.get("DPPO_CACHE") or Path.home() / ".cache" / "dppo_oat")

    def torch_threads(self) -> int:
        """The CPU threads the run gives torch: ``--threads``, else the CPUs free now (:func:`resolved_threads`)."""
        return resolved_threads(self.threads)[0]


HELP_GROUPS = (
    FlagGroup("common", "", ("steps", "trust_region", "env_ids", "env_module", "pretrain", "seed", "lr", "device",
                             "dtype", "eval_every", "runs_dir", "run_name", "resume", "engine")),
    FlagGroup("trust-region", spec.OVERRIDES_ABOUT,
              spec.OVERRIDE_FLAGS + spec.CALIBRATION_FLAGS),
    FlagGroup("rollout", "", ("groups_per_step", "group_size", "train_pool", "prompt_template", "wrappers", "max_turns",
                              "max_new_tokens", "max_prompt_tokens", "temperature", "top_p")),
    FlagGroup("advantage", "", ("advantage_mode", "gamma", "turn_baseline")),
    FlagGroup("update", "", ("num_epochs", "minibatch_size", "minibatches_per_rollout", "micro_batch_size",
                             "loss_aggregation", "lr_schedule", "weight_decay", "grad_clip")),
    FlagGroup("evaluation and diagnostics", "", ("eval_episodes", "probe_every", "token_samples", "token_export")),
    FlagGroup("output", "", ("overwrite", "allow_metrics_gap", "cache_dir", "wandb", "tensorboard")),
    FlagGroup("injected mismatch", "Make μ differ from π_θ on purpose, as an inference engine's does.",
              ("rollout_dtype", "rollout_redraw", "logprob_noise")),
    FlagGroup("performance", "", ("generator", "max_staleness", "cuda_graphs", "threads")),
    FlagGroup("warm-start", "The built-in policy (with --pretrain None): its shape and its supervised warm start on "
              "oracle demonstrations.", ("warm_start",)),
)
"""The sections of ``python -m dppo_oat.train --help``, in order (every :class:`TrainConfig` field in one): the flags
a first run changes, then one section per part of a run. The flags keep their names
(:mod:`dppo_oat.settings.grouped_cli`)."""


def parse_config(args: Sequence[str], **tyro_options: Any) -> TrainConfig:
    """The local engine's command line as a :class:`TrainConfig` (tyro; ``--help`` in :data:`HELP_GROUPS`'
    sections)."""
    return parse_grouped(TrainConfig, HELP_GROUPS, args, **tyro_options)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


MAX_THREADS_PER_CPU = 4
"""``--threads`` may be at most this many times :func:`usable_cpus` (past it, torch's thread pool only costs memory
and start-up time: a count in the millions runs out of memory)."""


def one_minute_load() -> float | None:
    """The system's 1-minute load average (runnable and waiting processes), None where it reports none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this system (AttributeError: no os.getloadavg)
        return None


BUSY_SAMPLE_SECONDS = 0.25
"""How long :func:`busy_cpus_now` watches the CPUs."""


def cpu_times(stat_text: str) -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs from ``/proc/stat``'s first line (idle counts iowait; guest time is already
    in user time, so the total stops at steal)."""
    fields = [int(value) for value in stat_text.splitlines()[0].split()[1:9]]
    return fields[3] + fields[4], sum(fields)


def busy_cpus_now(seconds: float = BUSY_SAMPLE_SECONDS) -> float | None:
    """How many CPUs other work keeps busy now: the machine's non-idle share over ``seconds`` (``/proc/stat``) times
    its CPU count; None where the system has no ``/proc/stat``. Unlike the 1-minute load average, it does not count
    work that has just ended (an install that ran before the run)."""
    import time

    try:
        idle0, total0 = cpu_times(Path("/proc/stat").read_text())
        time.sleep(seconds)
        idle1, total1 = cpu_times(Path("/proc/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def threads_for_free_cpus(cpus: int, load: float | None) -> int:
    """``--threads``' default on ``cpus`` usable CPUs under a 1-minute load average of ``load``: the CPUs the load
    leaves free, ``cpus - load`` rounded half up, at least 1 and at most ``cpus``; half of ``cpus`` (at least 1)
    where the load is unknown (None). torch's OpenMP threads wait for each other at the end of every operation, so
    a thread on a core that other work holds stalls every small operation of the tiny policy: on 2 cores beside
    other work, two threads took 7 to 10 times as long a step as one; on an idle 2-core machine, two threads
    trained the default run in 175 s where one took 319 s (docs/engines/local.md#cpu-threads)."""
    if load is None:
        return max(1, cpus // 2)
    return min(cpus, max(1, math.floor(cpus - load + 0.5)))


def resolved_threads(threads: int | None) -> tuple[int, str]:
    """The CPU threads a run gives torch, and the line of the run's output that says why: ``threads``
    (``--threads``) when given, else :func:`threads_for_free_cpus` of :func:`usable_cpus` and the CPUs busy now
    (:func:`busy_cpus_now`; the 1-minute load average where the system cannot tell)."""
    if threads is not None:
        return threads, f"torch threads: {threads} (--threads {threads})"
    cpus, busy = usable_cpus(), busy_cpus_now()
    source = "CPUs busy now"
    if busy is None:
        busy, source = one_minute_load(), "1-minute load"
    count = threads_for_free_cpus(cpus, busy)
    why = (f"half of the {cpus} usable CPUs: this system reports no load" if busy is None else
           f"the CPUs free at the start: {cpus} usable, {source} {busy:.2f}")
    return count, f"torch threads: {count} ({why}; --threads N pins the count)"


PROBE_READS = ("delta", "k")
"""What ``--probe-every`` reads of the trust region, whatever its rule: the K of its top-K estimate and the δ of its
``above_delta`` fractions."""


def run_spec(config: TrainConfig) -> spec.RunSpec:
    """The local engine's command line as the run's spec (validates every setting; builds nothing)."""
    tr = config.build_trust_region(also_read=PROBE_READS if config.probe_every else ())
    rollout = spec.RolloutSettings(template=config.template, max_prompt_tokens=config.max_prompt_tokens,
                                   max_turns=config.max_turns, wrappers=spec.split_ids(config.wrappers))
    sampling = spec.SamplingSettings(config.max_new_tokens, config.temperature, config.top_p,
                                     top_k_logprobs=spec.topk_logprobs_of(tr))
    return spec.RunSpec(
        trust_region=tr, rollout=rollout, sampling=sampling, eval_rollout=rollout, eval_sampling=sampling,
        advantages=spec.AdvantageSettings(config.advantage_mode, config.gamma, config.turn_baseline),
        update=spec.UpdateSettings(num_epochs=config.num_epochs, minibatch_size=config.minibatch_size,
                                   micro_batch_size=config.micro_batch_size, aggregation=config.loss_aggregation,
                                   norm_constant=float(config.max_new_tokens), temperature=config.temperature),
        calibration=config.calibration_settings(tr),
    )


def logged_config(config: TrainConfig, run: spec.RunSpec) -> dict:
    """What ``config.json`` records: its schema (:mod:`~dppo_oat.engines.local.config_schema`), every flag, the
    resolved run name, trust region and template."""
    from dataclasses import asdict

    from dppo_oat.engines.local.config_schema import CONFIG_SCHEMA

    return {"schema": CONFIG_SCHEMA, **asdict(config), "run_name": config.resolved_run_name(),
            "trust_region": asdict(run.trust_region), "prompt_template": run.rollout.template, "engine": "local"}
