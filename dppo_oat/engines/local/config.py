"""The local engine's configuration (a tyro CLI), validated before any model is built."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Tuple

from dppo_oat.advantages import ADVANTAGE_MODES
from dppo_oat.aggregation import AGGREGATIONS
from dppo_oat.rollout.templates import TEMPLATES
from dppo_oat.trust_region import PRESETS, TrustRegion

PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
DEFAULT_ENV = "game:Sudoku-v0-easy-compact-wrong"


@dataclass
class WarmStartConfig:
    """Supervised warm start of the built-in tiny policy on oracle demonstrations (REFERENCE §5)."""

    demo_episodes: int = 6000
    """Oracle episodes of the training env used as demonstrations."""
    mistake_rate: float = 0.25
    """Share of demonstration turns that follow an unrecorded wrong move, for envs that show the last one (the default
    Sudoku): the policy learns what to do after a failed move instead of repeating it."""
    lr: float = 1e-3
    batch_size: int = 64
    target_success: float = 0.25
    """Stop at the first check whose held-out success reaches this: the policy then solves some, not all."""
    check_every: int = 40
    """Optimizer steps between success checks."""
    check_episodes: int = 48
    max_steps: int = 4000
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    seed: Optional[int] = None
    """Seed of the tokenizer, model and demonstrations; None: the run's --seed. Fix it to start several RL seeds
    from one warm-started policy (as the paper's seeds share one initial model)."""


@dataclass
class TrainConfig:
    """DPPO (or any preset of the paper) on Gem environments, in one process.

    Trust-region presets: ppo, grpo_clip_higher, cispo, pg_is, minirl, minirl_tis, dppo_binary_tv, dppo_binary_kl,
    dppo_topk_tv, dppo_topk_kl, dppo_binary_tv_recompute, dppo_binary_kl_recompute, mask_negative, relax_low,
    relax_high, relax_both. Env ids: game:Sudoku-v0-easy-compact-wrong (default: compact board + last wrong move),
    game:Sudoku-v0-easy-compact, game:Sudoku-v0-easy, rg:arc_1d, rg:acre, example:Countdown-v0,
    local-math:<name or path>, or any registered Gem id.
    """

    engine: Literal["local", "oat"] = "local"
    """local: this process (CPU or one GPU). oat: oat + vLLM + DeepSpeed on a GPU node (other flags: --help there)."""
    algo: PresetName = "dppo_binary_tv"
    """Trust-region preset (the paper's method names)."""
    delta: Optional[float] = None
    """Override δ of DPPO / mask_negative."""
    eps_low: Optional[float] = None
    eps_high: Optional[float] = None
    is_cap: Optional[float] = None
    """Override C, the IS-weight cap (inf: none)."""
    alpha: Optional[float] = None
    k: Optional[int] = None
    """Override K of the top-K rules."""
    env_ids: Tuple[str, ...] = (DEFAULT_ENV,)
    pretrain: Optional[str] = None
    """A Hugging Face causal LM (local path, or hub id where the hub is reachable). None: build, warm-start and
    cache the tiny Sudoku policy."""
    template: Optional[str] = None
    """Prompt template (qwen3_game, qwen3_general, plain, chat); None: plain for the tiny policy, else qwen3_game."""
    generator: Literal["hf", "vllm"] = "hf"
    steps: int = 100
    groups_per_step: int = 16
    group_size: int = 4
    """Episodes per group (same seed): the GRPO group."""
    minibatch_size: int = 256
    """Turn samples per optimizer step (a rollout batch gives several steps: the trust region matters)."""
    minibatches_per_rollout: Optional[int] = None
    """Split every rollout batch into this many minibatches, whatever its size (the paper's sanity test: 4 gradient
    steps per rollout); overrides --minibatch-size."""
    micro_batch_size: Optional[int] = None
    num_epochs: int = 1
    lr: float = 3e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    adv_mode: Literal[ADVANTAGE_MODES] = "drgrpo"  # type: ignore[valid-type]
    """Dr.GRPO (the paper's default): return minus the group mean; rebn: batch-normalised returns (Gem's)."""
    gamma: float = 0.0
    """Discount of per-turn returns. 0: each turn is credited with its own reward, which Sudoku gives per correct
    cell; with γ > 0 a pooled group baseline also favours early turns (see --turn-baseline)."""
    turn_baseline: bool = False
    """Group baseline per turn index (compare turn t with turn t of the group's other episodes)."""
    aggregation: Literal[AGGREGATIONS] = "seq-mean-token-sum-norm"  # type: ignore[valid-type]
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 12
    max_prompt_tokens: int = 256
    max_turns: Optional[int] = None
    train_pool: Optional[int] = None
    """Draw training puzzles from a fixed pool of this many seeds (the paper's sanity test trains on a fixed problem
    set the initial policy can solve sometimes, and watches training success); None: fresh puzzles every step."""
    seed: int = 0
    eval_every: int = 50
    eval_episodes: int = 200
    probe_every: int = 0
    """Every N steps, also log binary, top-K and exact D_TV/D_KL between μ and the updated π on the step's batch
    (probe/* metrics; HF generator only). 0: never."""
    rollout_dtype: Literal["float32", "bfloat16"] = "float32"
    """Injected training-inference mismatch: sample from a bfloat16 copy of the policy, learn in float32."""
    logprob_noise: float = 0.0
    """Injected mismatch: add N(0, σ²) to the reported log μ (clamped ≤ 0), as an imperfect inference engine."""
    run_dir: str = "runs"
    run_name: Optional[str] = None
    resume: bool = False
    """Continue runs/<run_name> from its last checkpoint."""
    cache_dir: Optional[str] = None
    """Where the tiny policy is cached (default: $DPPO_CACHE or ~/.cache/dppo_oat)."""
    device: str = "cpu"
    threads: Optional[int] = None
    wandb: bool = False
    tensorboard: bool = False
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)

    # ------------------------------------------------------------------ derived
    def trust_region(self) -> TrustRegion:
        overrides = {name: getattr(self, name) for name in ("delta", "eps_low", "eps_high", "is_cap", "alpha", "k")}
        return TrustRegion.preset(self.algo, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def prompt_template(self) -> str:
        return self.template or ("plain" if self.pretrain is None else "qwen3_game")

    @property
    def episodes_per_step(self) -> int:
        return self.groups_per_step * self.group_size

    def resolved_run_name(self) -> str:
        return self.run_name or f"{self.algo}-{self.env_ids[0].replace(':', '_').replace('/', '_')}-s{self.seed}"

    def run_path(self) -> Path:
        return Path(self.run_dir) / self.resolved_run_name()

    @property
    def warm_start_seed(self) -> int:
        return self.seed if self.warm_start.seed is None else self.warm_start.seed

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir or os.environ.get("DPPO_CACHE") or Path.home() / ".cache" / "dppo_oat")
