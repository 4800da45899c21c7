"""The trust region of every method in the paper, as one per-token policy loss.

All methods share the unified gradient (eq:unified_grad, app:sanity_test_details)::

    ∇L = E_μ[ Σ_t M_t · min(r_t, C) · A_t · ∇ log π_θ(a_t|s_t) ],   r_t = π_θ(a_t|s_t) / μ(a_t|s_t)

and differ only in the mask ``M_t`` (which updates are blocked) and the importance-sampling cap ``C``. A
:class:`TrustRegion` names one such rule; :func:`policy_loss` evaluates it on a batch of tokens.

The mask is anchored on the behavior policy μ that sampled the tokens (sec:correct_ancher_for_truct_region); the
``*_recompute`` and ``minirl*`` presets anchor it on the recomputed rollout weights π_θ' instead, as ablations. The IS
weight ``min(r_t, C)`` is always against μ.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from dppo_oat import divergence as div

RULES = ("none", "ratio", "binary_tv", "binary_kl", "topk_tv", "topk_kl", "mask_negative")
"""``none``: M_t = 1 (PG-IS, CISPO). ``ratio``: PPO's clip mask (eq:ppo-clip). ``binary_*``/``topk_*``: DPPO
(eq:dppo_obj) with that divergence estimate. ``mask_negative``: Takeaway 3's minimal mask."""
ANCHORS = ("behavior", "recompute")
RELAX_MODES = ("none", "low", "high", "both")
MAX_LOG_RATIO = 60.0
"""log r is clamped here before exp so that r stays finite in fp32 (log-probs down to −60 are exact)."""
MU_BUCKETS = ((0.0, 0.1, "mu_lt_0.1"), (0.1, 0.5, "mu_0.1_0.5"), (0.5, math.inf, "mu_ge_0.5"))
"""Behavior-probability buckets of the shadow-mask metrics (low-, mid-, high-probability tokens)."""
BAD_UPDATE_THRESHOLD = 0.5
"""sec:stability, Takeaway 3: a 'bad update' is A < 0 and μ − π ≥ 0.5."""


@dataclass(frozen=True)
class TrustRegion:
    """One trust-region rule of the unified gradient (eq:unified_grad). Build it with :meth:`preset`.

    Attributes:
        rule: which mask M_t (see :data:`RULES`).
        delta: divergence threshold δ of DPPO (eq:dppo_obj) or of ``mask_negative``.
        eps_low, eps_high: PPO clip range ``[1 − ε_low, 1 + ε_high]`` of the ``ratio`` rule.
        is_cap: C, the truncation of the IS weight ``min(r, C)`` (``math.inf``: no truncation).
        anchor: the distribution the mask compares π_θ with: ``behavior`` (μ) or ``recompute`` (π_θ').
        alpha, relax: the α study (sec:training_efficiency): for tokens with μ < α, ε_low (``low``), ε_high
            (``high``) or both are set to ∞.
        k: K of the top-K rules (the set is ``TopK(μ, K) ∪ {a_t}``).
        name: the preset this came from (for logs).
    """

    rule: str = "binary_tv"
    delta: float = 0.15
    eps_low: float = 0.2
    eps_high: float = 0.28
    is_cap: float = math.inf
    anchor: str = "behavior"
    alpha: float = 0.1
    relax: str = "none"
    k: int = 20
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        _check_choice("rule", self.rule, RULES)
        _check_choice("anchor", self.anchor, ANCHORS)
        _check_choice("relax", self.relax, RELAX_MODES)
        for attr in ("delta", "eps_low", "eps_high", "is_cap", "alpha"):
            if math.isnan(getattr(self, attr)):
                raise ValueError(f"{attr} is NaN")
        if not self.delta > 0:
            raise ValueError(f"delta (δ) must be > 0, got {self.delta}")
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"eps_low and eps_high must be >= 0, got {self.eps_low}, {self.eps_high}")
        if not self.is_cap > 0:
            raise ValueError(f"is_cap (C) must be > 0 (math.inf for no truncation), got {self.is_cap}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be a probability in [0, 1], got {self.alpha}")
        if self.uses_topk and (not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"rule {self.rule!r} needs k >= 1 (the K of TopK(μ, K)), got {self.k}")
        if self.relax != "none" and self.rule != "ratio":
            raise ValueError(f"relax={self.relax!r} relaxes the PPO clip range: it needs rule='ratio'")
        if self.uses_topk and self.anchor != "behavior":
            raise ValueError("top-K rules are anchored on μ (the rollout engine's top-K); use a binary rule")

    @property
    def uses_topk(self) -> bool:
        """True when the rule needs μ's top-K set and π_θ's log-probs on it."""
        return self.rule.startswith("topk")

    @property
    def needs_recompute(self) -> bool:
        """True when the mask is anchored on the recomputed π_θ' (one extra forward pass per rollout batch)."""
        return self.anchor == "recompute"

    @classmethod
    def preset(cls, name: str, **overrides) -> "TrustRegion":
        """The paper's method ``name`` (see :data:`PRESETS`), with optional field overrides."""
        if name not in PRESETS:
            raise ValueError(f"unknown trust-region preset {name!r}; choose one of: {', '.join(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown TrustRegion field(s) {sorted(unknown)} for preset {name!r}")
        fields = {**PRESETS[name].fields, "name": name}
        fields.update(overrides)
        return cls(**fields)

    def replace(self, **overrides) -> "TrustRegion":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **overrides)


def _check_choice(attr: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"unknown {attr} {value!r}; choose one of: {', '.join(choices)}")


@dataclass(frozen=True)
class Preset:
    """A named method: its TrustRegion fields and where the paper defines it."""

    fields: dict
    source: str


_GRPO_CLIP = {"rule": "ratio", "eps_low": 0.2, "eps_high": 0.28}
PRESETS: dict[str, Preset] = {
    "ppo": Preset({"rule": "ratio", "eps_low": 0.2, "eps_high": 0.2}, "PPO-ratio, eq:ppo-clip, ε = 0.2"),
    "grpo_clip_higher": Preset(
        dict(_GRPO_CLIP), "GRPO with Clip-Higher, app:sanity_test_details (ε_low 0.2, ε_high 0.28; 0.27 in scaling)"
    ),
    "cispo": Preset({"rule": "none", "is_cap": 3.0}, "PG-TIS (CISPO), app:sanity_test_details, C = 3 (5 in scaling)"),
    "pg_is": Preset({"rule": "none"}, "PG-IS, app:sanity_test_details, M = 1, C = ∞"),
    "minirl": Preset({**_GRPO_CLIP, "anchor": "recompute"}, "MiniRL, app:sanity_test_details: clip on π_θ/π_θ'"),
    "minirl_tis": Preset(
        {**_GRPO_CLIP, "anchor": "recompute", "is_cap": 3.0}, "MiniRL-TIS, app:sanity_test_details, C = 3"
    ),
    "dppo_binary_tv": Preset({"rule": "binary_tv", "delta": 0.15}, "DPPO-Binary-TV, eq:binary_tv, δ = 0.15"),
    "dppo_binary_kl": Preset({"rule": "binary_kl", "delta": 0.05}, "DPPO-Binary-KL, eq:binary_kl, δ = 0.05"),
    "dppo_topk_tv": Preset({"rule": "topk_tv", "delta": 0.15, "k": 20}, "DPPO-TopK-TV, eq:topk_tv, K = 20"),
    "dppo_topk_kl": Preset({"rule": "topk_kl", "delta": 0.05, "k": 20}, "DPPO-TopK-KL, eq:topk_kl, K = 20"),
    "dppo_binary_tv_recompute": Preset(
        {"rule": "binary_tv", "delta": 0.15, "anchor": "recompute"}, "decoupled DPPO-TV, fig:which_trust_region"
    ),
    "dppo_binary_kl_recompute": Preset(
        {"rule": "binary_kl", "delta": 0.05, "anchor": "recompute"}, "decoupled DPPO-KL, fig:which_trust_region"
    ),
    "mask_negative": Preset(
        {"rule": "mask_negative", "delta": 0.5}, "Takeaway 3, fig:ablation_mask_negative: A<0 and μ−π ≥ 0.5"
    ),
    "relax_low": Preset({**_GRPO_CLIP, "relax": "low", "alpha": 0.1}, "Relax-low, fig:clip_direction, α = 0.1"),
    "relax_high": Preset({**_GRPO_CLIP, "relax": "high", "alpha": 0.1}, "Relax-high, fig:clip_direction, α = 0.1"),
    "relax_both": Preset({**_GRPO_CLIP, "relax": "both", "alpha": 0.1}, "Relax-both, fig:clip_direction, α = 0.1"),
}
"""The paper's methods with its stability-analysis defaults (sec:stability, app:sanity_test_details)."""


@dataclass
class TopK:
    """The paper's top-K set ``A'_t = TopK(μ(·|s_t), K) ∪ {a_t}`` (sec:method_topk), ``[B, T, K']`` each.

    ``K' = K + 1``: the last slot holds a_t when it is outside μ's top K, and is invalid otherwise.
    ``logp`` holds π_θ's log-probs at ``ids`` (see :func:`dppo_oat.logprobs.gather_logprobs_chunked`).
    """

    ids: torch.Tensor
    behavior_logp: torch.Tensor
    logp: torch.Tensor
    valid: torch.Tensor

    def __post_init__(self) -> None:
        shapes = {tuple(t.shape) for t in (self.ids, self.behavior_logp, self.logp, self.valid)}
        if len(shapes) != 1:
            raise ValueError(f"TopK tensors must share one shape [B, T, K'], got {sorted(shapes)}")
        if self.valid.dtype != torch.bool:
            raise ValueError("TopK.valid must be a bool tensor")


@dataclass
class PolicyLossOutput:
    """Per-token loss of eq:unified_grad and what the rule decided.

    ``loss`` is ``−M_t · min(r_t, C) · A_t`` in value (the per-token surrogate) with gradient
    ``−M_t · min(r_t, C) · A_t · ∇ log π_θ``; it is 0 where the input ``mask`` is False.
    """

    loss: torch.Tensor
    keep: torch.Tensor
    divergence: torch.Tensor
    metrics: dict[str, float]


# --------------------------------------------------------------------------------------------- masks (pure)


def ratio_keep(ratio, advantages, eps_low, eps_high) -> torch.Tensor:
    """PPO's clip mask (eq:ppo-clip as a mask): block A>0 & r>1+ε_high and A<0 & r<1−ε_low."""
    blocked = ((advantages > 0) & (ratio > 1 + eps_high)) | ((advantages < 0) & (ratio < 1 - eps_low))
    return ~blocked


def divergence_keep(ratio, advantages, divergence, delta) -> torch.Tensor:
    """DPPO's mask (eq:dppo_obj): block A>0 & r>1 & D>δ and A<0 & r<1 & D>δ.

    An update that moves r back toward 1 is never blocked. With ``D = |r − 1|`` this is PPO's mask.
    """
    outside = divergence > delta
    blocked = ((advantages > 0) & (ratio > 1) & outside) | ((advantages < 0) & (ratio < 1) & outside)
    return ~blocked


def negative_keep(anchor_prob, prob, advantages, delta) -> torch.Tensor:
    """Takeaway 3's minimal mask (sec:stability): block A<0 & anchor(a_t) − π(a_t) ≥ δ."""
    return ~((advantages < 0) & (anchor_prob - prob >= delta))


def relaxed_clip_range(behavior_prob, tr: TrustRegion) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """The α study (sec:training_efficiency): ε = ∞ for tokens with μ < α on the relaxed side(s)."""
    if tr.relax == "none":
        return tr.eps_low, tr.eps_high
    low_prob = behavior_prob < tr.alpha
    inf = torch.full_like(behavior_prob, math.inf)
    eps_low = torch.where(low_prob, inf, tr.eps_low) if tr.relax in ("low", "both") else tr.eps_low
    eps_high = torch.where(low_prob, inf, tr.eps_high) if tr.relax in ("high", "both") else tr.eps_high
    return eps_low, eps_high


def importance_weight(logp, behavior_logp, is_cap: float) -> torch.Tensor:
    """``min(r_t, C)`` with ``r_t = π_θ/μ`` (eq:unified_grad), always against μ."""
    log_ratio = (logp - behavior_logp).clamp(max=MAX_LOG_RATIO)
    if math.isfinite(is_cap):
        log_ratio = log_ratio.clamp(max=math.log(is_cap))
    return log_ratio.exp()


def rule_divergence(tr: TrustRegion, logp, anchor_logp, topk: TopK | None) -> torch.Tensor:
    """The D_t the rule thresholds: binary/top-K TV or KL, ``anchor − π`` for mask_negative, else ``|r − 1|``."""
    if tr.rule == "binary_tv":
        return div.binary_tv(anchor_logp, logp)
    if tr.rule == "binary_kl":
        return div.binary_kl(anchor_logp, logp)
    if tr.rule == "topk_tv":
        return div.topk_tv(topk.behavior_logp, topk.logp, topk.valid)
    if tr.rule == "topk_kl":
        return div.topk_kl(topk.behavior_logp, topk.logp, topk.valid)
    if tr.rule == "mask_negative":
        return anchor_logp.exp() - logp.exp()
    return ((logp - anchor_logp).clamp(max=MAX_LOG_RATIO).exp() - 1).abs()


def trust_region_keep(tr: TrustRegion, logp, anchor_logp, behavior_logp, advantages, topk=None):
    """The mask M_t of ``tr`` and the divergence it thresholded. All inputs detached fp32 ``[B, T]``."""
    divergence = rule_divergence(tr, logp, anchor_logp, topk)
    ratio = (logp - anchor_logp).clamp(max=MAX_LOG_RATIO).exp()
    if tr.rule == "none":
        keep = torch.ones_like(logp, dtype=torch.bool)
    elif tr.rule == "ratio":
        keep = ratio_keep(ratio, advantages, *relaxed_clip_range(behavior_logp.exp(), tr))
    elif tr.rule == "mask_negative":
        keep = negative_keep(anchor_logp.exp(), logp.exp(), advantages, tr.delta)
    else:
        keep = divergence_keep(ratio, advantages, divergence, tr.delta)
    return keep, divergence


# --------------------------------------------------------------------------------------------- the loss


def policy_loss(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tr: TrustRegion,
    *,
    recomputed_logp: torch.Tensor | None = None,
    topk: TopK | None = None,
) -> PolicyLossOutput:
    """Per-token loss of eq:unified_grad under trust region ``tr``.

    Args:
        logp: ``[B, T]`` log π_θ(a_t|s_t), with gradient.
        behavior_logp: ``[B, T]`` log μ(a_t|s_t) from the rollout engine.
        advantages: ``[B, 1]`` (per sequence) or ``[B, T]`` (per token).
        mask: ``[B, T]`` bool, True on response tokens.
        recomputed_logp: ``[B, T]`` log π_θ'(a_t|s_t), needed when ``tr.needs_recompute``.
        topk: the top-K set with μ's and π_θ's log-probs, needed when ``tr.uses_topk``.
    """
    _check_inputs(logp, behavior_logp, advantages, mask, tr, recomputed_logp, topk)
    logp32 = logp.float()
    mask = mask.bool()
    with torch.no_grad():
        lp = logp32.detach()
        mu = behavior_logp.detach().float()
        adv = advantages.detach().float().expand_as(lp)
        anchor = mu if tr.anchor == "behavior" else recomputed_logp.detach().float()
        keep, divergence = trust_region_keep(tr, lp, anchor, mu, adv, topk)
        keep = keep & mask
        is_weight = importance_weight(lp, mu, tr.is_cap)
        coefficient = torch.where(keep, adv * is_weight, 0.0)
    # value −M·min(r,C)·A; gradient −M·min(r,C)·A·∇log π (exp(x − sg(x)) is 1 with gradient ∇x)
    surrogate = torch.exp(torch.where(mask, logp32 - lp, 0.0))
    loss = -coefficient * surrogate
    metrics = trust_region_metrics(lp, mu, adv, mask, keep, divergence, tr)
    return PolicyLossOutput(loss=loss, keep=keep, divergence=divergence, metrics=metrics)


def _check_inputs(logp, behavior_logp, advantages, mask, tr, recomputed_logp, topk) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    for name, tensor in (("behavior_logp", behavior_logp), ("mask", mask), ("recomputed_logp", recomputed_logp)):
        if tensor is not None and tensor.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape, (logp.shape[0], 1)):
        raise ValueError(f"advantages must be [B, 1] or [B, T], got {tuple(advantages.shape)}")
    if tr.needs_recompute and recomputed_logp is None:
        raise ValueError(f"trust region {tr.name!r} is anchored on π_θ': pass recomputed_logp")
    if tr.uses_topk:
        if topk is None:
            raise ValueError(f"trust region {tr.name!r} needs the top-K set: pass topk=TopK(...)")
        if topk.ids.shape[:2] != logp.shape:
            raise ValueError(f"topk is {tuple(topk.ids.shape)}, expected [{logp.shape[0]}, {logp.shape[1]}, K']")


# --------------------------------------------------------------------------------------------- metrics


_PAPER_CLIP_RANGES = {"ppo": (0.2, 0.2), "grpo_clip_higher": (0.2, 0.28)}


def trust_region_metrics(logp, behavior_logp, advantages, mask, keep, divergence, tr) -> dict[str, float]:
    """Batch statistics of the trust region (sec:stability): mask fractions by sign of A (A ≠ 0 tokens only),
    training-inference mismatch |π − μ|, bad updates, IS truncation, and the *shadow masks*: what ``ppo`` and
    ``grpo_clip_higher`` would have blocked on the same batch, by μ bucket (sec:method_limitations).

    One host synchronisation: every statistic is a 0-d tensor until the final ``tolist``.
    """
    prob, mu_prob = logp.exp(), behavior_logp.exp()
    ratio = (logp - behavior_logp).clamp(max=MAX_LOG_RATIO).exp()
    active = mask & (advantages != 0)
    pos, neg = mask & (advantages > 0), mask & (advantages < 0)
    blocked = mask & ~keep
    abs_diff = (prob - mu_prob).abs()
    stats = {
        "tokens": mask.sum().float(),
        "mask/fraction": _fraction(blocked, active),
        "mask/fraction_pos_adv": _fraction(blocked, pos),
        "mask/fraction_neg_adv": _fraction(blocked, neg),
        "mismatch/abs_diff_mean": _masked_mean(abs_diff, mask),
        "mismatch/abs_diff_max": _masked_max(abs_diff, mask),
        "bad_update/fraction": _fraction(neg & (mu_prob - prob >= BAD_UPDATE_THRESHOLD), active),
        "is/truncated_fraction": _fraction(mask & (ratio > tr.is_cap), mask),
        "ratio/mean": _masked_mean(ratio, mask),
        "divergence/mean": _masked_mean(divergence, mask),
        "divergence/max": _masked_max(divergence, mask),
    }
    for preset, (eps_low, eps_high) in _PAPER_CLIP_RANGES.items():
        shadow_blocked = mask & ~ratio_keep(ratio, advantages, eps_low, eps_high)
        stats[f"shadow/{preset}/mask_fraction"] = _fraction(shadow_blocked, active)
        for low, high, bucket in MU_BUCKETS:
            in_bucket = active & (mu_prob >= low) & (mu_prob < high)
            stats[f"shadow/{preset}/mask_fraction_{bucket}"] = _fraction(shadow_blocked, in_bucket)
    values = torch.stack(list(stats.values())).tolist()
    return dict(zip(stats.keys(), values))


def _fraction(event: torch.Tensor, population: torch.Tensor) -> torch.Tensor:
    count = population.sum()
    return (event & population).sum() / count.clamp(min=1)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    largest = torch.where(mask, values, -math.inf).max()
    return torch.where(torch.isfinite(largest), largest, 0.0)
