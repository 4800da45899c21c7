"""Command-line arguments of the oat engine: oat's ``PPOArgs`` (every oat flag keeps working) plus DPPO's own.

What is added: the trust region (a preset of :data:`dppo_oat.trust_region.PRESETS` with optional overrides), the Gem
tasks and how episodes are played, the advantage estimator, and held-out evaluation seeds. What changes meaning:

- ``num_samples`` is the GRPO group size: episodes started from the same seed;
- ``max_train`` counts training turn-samples (oat's placeholder prompt set has that many entries, one per sample);
- ``critic_type`` picks oat's loss aggregation (``drgrpo``: Dr.GRPO's token sum over ``generate_max_length``);
- ``eval_n`` episodes are played per evaluation seed (Avg@eval_n).

Flags of oat's own PPO loss that DPPO replaces (``cliprange``, ``tis_c``, ``beta`` ...) are refused when set, rather
than silently ignored (:data:`REPLACED_OAT_FLAGS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

from oat.algorithms.ppo import PPOArgs
from oat.args import default_args_validation

from dppo_oat.advantages import ADVANTAGE_MODES, ESTIMATORS
from dppo_oat.aggregation import AGGREGATIONS
from dppo_oat.rollout.episodes import RolloutSettings
from dppo_oat.rollout.generation import SamplingSettings
from dppo_oat.rollout.templates import TEMPLATES
from dppo_oat.trust_region import PRESETS, TrustRegion
from dppo_oat.update import UpdateSettings

OAT_AGGREGATION = {"drgrpo": "seq-mean-token-sum-norm", "grpo": "seq-mean-token-mean"}
"""oat's loss aggregation per ``critic_type``: ``masked_sum / generate_max_length`` or ``masked_mean``, then a mean
over sequences."""

REPLACED_OAT_FLAGS = {
    "cliprange": (0.2, "the clip range is the trust region's: use --tr_eps_low / --tr_eps_high"),
    "tis_c": (None, "the IS cap is the trust region's C: use --tr_is_cap"),
    "beta": (0.0, "DPPO's loss has no KL term"),
    "kl_penalty_coef": (0.0, "DPPO's loss has no KL term"),
    "reinforce_update": (False, "choose a trust-region preset instead (pg_is is plain REINFORCE with IS)"),
    "whiten_adv": (False, "advantages come from --advantage_mode (rebn normalises over the batch)"),
    "use_fused_lm_head": (False, "log-probs are always fp32, from a chunked log-softmax"),
    "whiten_rewards": (False, "advantages come from --advantage_mode"),
    "reward_scale": (1.0, "rewards are the environment's"),
    "non_stop_penalty": (0.0, "rewards are the environment's (--ignore_no_eos drops truncated responses)"),
    "non_stop_fixed_reward": (None, "rewards are the environment's (--ignore_no_eos drops truncated responses)"),
}
"""oat flags whose job DPPO's loss does differently: ``name -> (the only accepted value, what to use instead)``."""


@dataclass
class DPPOOatArgs(PPOArgs):
    """oat's PPO arguments plus DPPO's trust region and Gem tasks."""

    trust_region: str = "dppo_binary_tv"
    """Trust region: a preset of dppo_oat.trust_region.PRESETS (e.g. dppo_binary_tv, ppo, dppo_topk_kl)."""
    tr_delta: Optional[float] = None
    """Override the preset's divergence threshold δ."""
    tr_eps_low: Optional[float] = None
    """Override the preset's lower clip range ε_low (ratio rules)."""
    tr_eps_high: Optional[float] = None
    """Override the preset's upper clip range ε_high (ratio rules)."""
    tr_is_cap: Optional[float] = None
    """Override the preset's IS-weight cap C (inf: none)."""
    tr_alpha: Optional[float] = None
    """Override the preset's α (relax_* presets)."""
    tr_k: Optional[int] = None
    """Override the preset's K (top-K rules; vLLM returns TopK(μ, K) with each token)."""

    env_ids: str = "game:Sudoku-v0-easy"
    """Comma-separated Gem ids, assigned to GRPO groups round-robin."""
    prompt_template: str = "qwen3_game"
    """How an observation becomes a prompt: qwen3_game, qwen3_general, plain or chat."""
    max_turns: Optional[int] = None
    """Turn limit on top of the env's own."""
    groups_per_step: Optional[int] = None
    """Groups played per actor step (default: enough single-turn episodes for rollout_batch_size_per_device)."""
    env_seed: int = 42
    """Constructor seed of the training envs (reasoning-gym builds its puzzle set from it)."""
    advantage_mode: str = "drgrpo"
    """drgrpo, grpo, rloo (group baselines over per-turn returns) or rebn (batch-normalised returns)."""
    loss_aggregation: Optional[str] = None
    """Loss aggregation (default: oat's rule for critic_type)."""
    logprob_chunk_size: int = 1024
    """Token rows per chunk of the fp32 log-softmax."""

    eval_env_ids: str = ""
    """Comma-separated Gem ids to evaluate on (default: env_ids)."""
    eval_seed_start: int = 1_000_000_000
    """First evaluation seed; training seeds are drawn below it."""
    num_eval_seeds: int = 32
    """Evaluation seeds per env; eval_n episodes are played from each."""
    eval_env_seed: int = 4242
    """Constructor seed of the evaluation envs (a puzzle set apart from training's for reasoning-gym)."""

    # oat defaults changed for DPPO.
    algo: Literal["DPO", "IPO", "LR_DPO", "SLiC", "SimPO", "BNF", "SFT", "PPO"] = "PPO"
    beta: float = 0.0
    tis_c: Optional[float] = None
    use_fused_lm_head: bool = False
    oracle: str = ""
    prompt_data: str = ""
    eval_temperature: float = 1.0


def split_ids(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def trust_region_from_args(args: DPPOOatArgs) -> TrustRegion:
    """The preset ``args.trust_region`` with the ``tr_*`` overrides that are set."""
    overrides = {
        name: getattr(args, f"tr_{name}")
        for name in ("delta", "eps_low", "eps_high", "is_cap", "alpha", "k")
        if getattr(args, f"tr_{name}") is not None
    }
    return TrustRegion.preset(args.trust_region, **overrides)


def loss_aggregation(args: DPPOOatArgs) -> str:
    """``args.loss_aggregation``, else oat's aggregation for ``args.critic_type``."""
    return args.loss_aggregation or OAT_AGGREGATION[args.critic_type]


def update_settings(args: DPPOOatArgs, grad_acc_step: int) -> UpdateSettings:
    """The core's update loop as oat runs PPO: one minibatch = ``grad_acc_step`` micro-batches of
    ``train_batch_size_per_device`` on each learner, and DeepSpeed averages over the accumulation steps itself."""
    return UpdateSettings(
        num_epochs=args.num_ppo_epochs,
        minibatch_size=args.train_batch_size_per_device * grad_acc_step,
        micro_batch_size=args.train_batch_size_per_device,
        aggregation=loss_aggregation(args),
        norm_constant=float(args.generate_max_length),
        scale_micro_batches=False,
    )


def sampling_settings(args: DPPOOatArgs, tr: TrustRegion) -> SamplingSettings:
    """Training sampling: μ's top-K set is requested only for the top-K rules."""
    return SamplingSettings(
        max_new_tokens=args.generate_max_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k_logprobs=tr.k if tr.uses_topk else 0,
    )


def eval_sampling_settings(args: DPPOOatArgs) -> SamplingSettings:
    return SamplingSettings(
        max_new_tokens=args.eval_generate_max_length, temperature=args.eval_temperature, top_p=args.eval_top_p
    )


def rollout_settings(args: DPPOOatArgs, *, evaluation: bool = False) -> RolloutSettings:
    return RolloutSettings(
        template=args.prompt_template,
        max_prompt_tokens=args.prompt_max_length,
        max_turns=args.max_turns,
        gamma=args.gamma,
        env_seed=args.eval_env_seed if evaluation else args.env_seed,
    )


def groups_per_step(args: DPPOOatArgs) -> int:
    """``groups_per_step``, else enough groups for one single-turn batch of ``rollout_batch_size_per_device``."""
    return args.groups_per_step or math.ceil(args.rollout_batch_size_per_device / args.num_samples)


def check_dppo_args(args: DPPOOatArgs) -> None:
    """Everything DPPO needs of the arguments, without touching a GPU. Raises ValueError."""
    _check_replaced_flags(args)
    if args.algo != "PPO":
        raise ValueError(f"the oat engine runs algo PPO (got {args.algo!r})")
    if args.trust_region not in PRESETS:
        raise ValueError(f"unknown --trust_region {args.trust_region!r}; choose one of: {', '.join(PRESETS)}")
    trust_region_from_args(args)  # validates the overrides
    _check_sampling(args)
    _check_batches(args)
    _check_tasks(args)


def _check_replaced_flags(args: DPPOOatArgs) -> None:
    for name, (accepted, hint) in REPLACED_OAT_FLAGS.items():
        if getattr(args, name) != accepted:
            raise ValueError(f"--{name}={getattr(args, name)!r} is not used by DPPO: {hint}")
    if args.critic_type not in OAT_AGGREGATION:
        raise ValueError(f"critic_type {args.critic_type!r} needs a learned critic; DPPO uses drgrpo or grpo")


def _check_sampling(args: DPPOOatArgs) -> None:
    """vLLM 0.8.4 reports log-probs before temperature / top-p / top-k: μ is the sampling distribution only at 1."""
    if (args.temperature, args.top_p, args.top_k) != (1.0, 1.0, -1):
        raise ValueError(
            "vLLM reports raw log-probs, so μ is the sampling distribution only with --temperature 1 --top_p 1 "
            f"--top_k -1 (got {args.temperature}, {args.top_p}, {args.top_k})"
        )
    if not args.eval_temperature > 0:
        raise ValueError(f"evaluation samples episodes: --eval_temperature must be > 0, got {args.eval_temperature}")


def _check_batches(args: DPPOOatArgs) -> None:
    if args.train_batch_size % args.train_batch_size_per_device:
        raise ValueError("train_batch_size must be a multiple of train_batch_size_per_device")
    if args.rollout_batch_size % args.train_batch_size:
        raise ValueError("rollout_batch_size must be a multiple of train_batch_size (whole minibatches per round)")
    if args.pi_buffer_maxlen_per_device < args.rollout_batch_size_per_device:
        raise ValueError("pi_buffer_maxlen_per_device must hold rollout_batch_size_per_device samples")
    if args.advantage_mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown --advantage_mode {args.advantage_mode!r}; choose one of {ADVANTAGE_MODES}")
    if args.advantage_mode in ESTIMATORS and args.num_samples < 2:
        raise ValueError(f"--advantage_mode {args.advantage_mode} needs groups: --num_samples >= 2")
    if args.loss_aggregation is not None and args.loss_aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown --loss_aggregation {args.loss_aggregation!r}; choose one of {AGGREGATIONS}")


def _check_tasks(args: DPPOOatArgs) -> None:
    if not split_ids(args.env_ids):
        raise ValueError("--env_ids names no environment")
    if args.prompt_template not in TEMPLATES:
        raise ValueError(f"unknown --prompt_template {args.prompt_template!r}; choose one of {TEMPLATES}")
    if args.max_turns is not None and args.max_turns < 1:
        raise ValueError("--max_turns must be >= 1")
    if args.num_eval_seeds < 1 or args.eval_seed_start < 1:
        raise ValueError("--num_eval_seeds and --eval_seed_start must be >= 1")


def validate_args(args: DPPOOatArgs) -> DPPOOatArgs:
    """DPPO's checks, then oat's own validation (which also checks that ``args.gpus`` GPUs are visible)."""
    check_dppo_args(args)
    return default_args_validation(args)
