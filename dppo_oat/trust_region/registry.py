"""The rule registry: what a rule reads (:class:`MaskInputs`), what it may threshold (:data:`DIVERGENCES`,
:data:`THRESHOLDS`), what it declares (:class:`Rule`), and :data:`RULE_TABLE`, filled by :func:`register_rule`.

As verl registers a policy loss (``@register_policy_loss("name")`` in ``verl/trainer/ppo/core_algos.py``), a rule is
one function registered with a decorator: its mask M_t, under a name, with everything else it brings declared as
arguments (its divergence, its threshold, the fields it reads, its own w_t, loss term and metrics, and its
capabilities: whether ``mask_side`` picks a half of it, whether its mask reads other tokens of the row or of the
batch, whether it reads the recomputed π_θ'). Nothing about a rule is inferred from its code: the loss, the checks of a
:class:`~dppo_oat.trust_region.config.TrustRegion`, the command line, the verl engine and the docs read the
declaration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dppo_oat import divergence as div
from dppo_oat.trust_region.masks import MAX_LOG_RATIO, ROLLOUT_CORR_LOG_BOUND


@dataclass
class TopK:
    """The paper's top-K set ``A'_t = TopK(μ(·|s_t), K) ∪ {a_t}`` (sec:method_topk), ``[B, T, K']`` each: what the
    top-K divergences read.

    ``K' = K + 1``: the last slot holds a_t when it is outside μ's top K, and is invalid otherwise.
    ``logp`` holds π_θ's log-probs at ``ids`` (see :func:`dppo_oat.divergence.logprobs.gather_logprobs_chunked`).
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


@dataclass(frozen=True)
class MaskInputs:
    """What a rule's mask, weight, loss term and metrics read, per token: detached fp32 ``[B, T]`` tensors of one
    batch."""

    logp: torch.Tensor
    """log π_θ(a_t)."""
    anchor_logp: torch.Tensor
    """log of the anchor's probability of a_t: μ, or the recomputed π_θ' (``TrustRegion.anchor``)."""
    behavior_logp: torch.Tensor
    """log μ(a_t), the rollout engine's."""
    advantages: torch.Tensor
    """A_t, expanded to ``[B, T]``."""
    response: torch.Tensor
    """The response tokens the loss counts (a row is one response, one turn)."""
    divergence: torch.Tensor
    """D_t, the rule's divergence of π_θ against the anchor (:data:`DIVERGENCES`)."""

    @property
    def ratio(self) -> torch.Tensor:
        """r_t = π_θ/anchor (log r clamped at :data:`~dppo_oat.trust_region.masks.MAX_LOG_RATIO`)."""
        return (self.logp - self.anchor_logp).clamp(max=MAX_LOG_RATIO).exp()


# --------------------------------------------------------------------------------------------- divergences


@dataclass(frozen=True)
class Divergence:
    """One D_t a rule may threshold, of π_θ against the anchor: ``compute(logp, anchor_logp, topk)``."""

    compute: Callable[[torch.Tensor, torch.Tensor, TopK | None], torch.Tensor]
    needs_topk: bool = False
    """True when it reads μ's top-K set and π_θ's log-probs on it (the rollout must return them)."""

    def __call__(self, logp: torch.Tensor, anchor_logp: torch.Tensor, topk: TopK | None) -> torch.Tensor:
        return self.compute(logp, anchor_logp, topk)


def k2_divergence(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k2 per token, ``½ (log r)²`` (verl ``rollout_corr_helper.compute_rollout_rejection_mask``
    ``token_k2``; log r clamped at :data:`~dppo_oat.trust_region.masks.ROLLOUT_CORR_LOG_BOUND`). Symmetric in the
    direction of the move."""
    return 0.5 * log_ratio.clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND).square()


def k3_divergence(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 per token, ``r − 1 − log r`` with r = π/μ: ≥ 0, an unbiased estimate of KL(μ ‖ π) under μ's
    samples (verl ``token_k3``, ``compute_offpolicy_metrics`` ``k3_kl``; log r clamped at
    :data:`~dppo_oat.trust_region.masks.ROLLOUT_CORR_LOG_BOUND`)."""
    log_ratio = log_ratio.clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND)
    return log_ratio.exp() - 1 - log_ratio


DIVERGENCES = {
    "binary_tv": Divergence(lambda logp, anchor_logp, topk: div.binary_tv(anchor_logp, logp)),
    "binary_kl": Divergence(lambda logp, anchor_logp, topk: div.binary_kl(anchor_logp, logp)),
    "topk_tv": Divergence(lambda logp, anchor_logp, topk: div.topk_tv(topk.behavior_logp, topk.logp, topk.valid),
                          needs_topk=True),
    "topk_kl": Divergence(lambda logp, anchor_logp, topk: div.topk_kl(topk.behavior_logp, topk.logp, topk.valid),
                          needs_topk=True),
    "prob_drop": Divergence(lambda logp, anchor_logp, topk: anchor_logp.exp() - logp.exp()),
    "ratio": Divergence(
        lambda logp, anchor_logp, topk: ((logp - anchor_logp).clamp(max=MAX_LOG_RATIO).exp() - 1).abs()),
    "log_ratio_sq": Divergence(
        lambda logp, anchor_logp, topk: (logp - anchor_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).square()),
    "k2": Divergence(lambda logp, anchor_logp, topk: k2_divergence(logp - anchor_logp)),
    "k3": Divergence(lambda logp, anchor_logp, topk: k3_divergence(logp - anchor_logp)),
}
"""D_t by name (:attr:`Rule.divergence`): binary/top-K TV or KL (eq:binary_tv, eq:binary_kl, eq:topk_tv,
eq:topk_kl), ``prob_drop`` (anchor − π), ``ratio`` (|r − 1|), M2PO's M̂2_t = (log r)² (``log_ratio_sq``), or
Schulman's k2 and k3 (TRM)."""
THRESHOLDS = {"delta": ("delta",), "clip_range": ("eps_low", "eps_high"), "tau_m2": ("tau_m2",)}
"""What a rule's mask may threshold (:attr:`Rule.threshold`), by name, with the
:class:`~dppo_oat.trust_region.config.TrustRegion` fields that hold it: the divergence bound δ, PPO's clip range
``[1 − ε_low, 1 + ε_high]`` (and α when relaxed) or M2PO's τ_M2."""
GATE_BAND = "gate_temperature"
"""The band of a rule's soft gate (:attr:`Rule.soft_gate`): the fields it reads, SAPO's τ_pos and τ_neg."""
FIELD_SYMBOLS = {
    "rule": "rule", "delta": "δ", "eps_low": "ε_low", "eps_high": "ε_high", "is_cap": "C",
    "anchor": "anchor", "alpha": "α", "relax": "relax", "k": "K", "is_weight": "w",
    "mismatch_mask": "mismatch mask", "mismatch_low": "ρ_low", "mismatch_high": "ρ_high", "kl_tau": "τ",
    "w_min": "w_min", "delta_b": "δ_b", "tau_m2": "τ_M2", "tau_pos": "τ_pos", "tau_neg": "τ_neg",
    "mask_side": "mask side",
}
"""How the docs, the dry run's plan and the curves' labels write each field of
:class:`~dppo_oat.trust_region.config.TrustRegion` (:data:`~dppo_oat.trust_region.config.NUMBER_FIELDS` and
:data:`~dppo_oat.trust_region.config.CHOICE_FIELDS`), in the order a label lists them."""


LOGPROB_TOLERANCE = 1e-4
"""How far above 0 a log-probability may round (a log-softmax never exceeds 0; an inference engine's may by a hair)."""


def check_logprobs_at_most_zero(response: torch.Tensor, **logprobs: torch.Tensor | None) -> None:
    """A log-probability is at most 0 (beyond :data:`LOGPROB_TOLERANCE`): a larger one is no probability, e.g. a
    logit or a probability passed where a log-probability belongs."""
    for name, values in logprobs.items():
        if values is not None and bool((response & (values > LOGPROB_TOLERANCE)).any()):
            worst = float(torch.where(response, values, -math.inf).max())
            raise ValueError(f"{name} holds values > 0 (up to {worst:.4g}): it must be log-probabilities (≤ 0), not "
                             "logits or probabilities")


def finite_tokens(logp, behavior_logp, advantages, recomputed_logp=None, topk: TopK | None = None) -> torch.Tensor:
    """``[B, T]``: True where every input of the token is finite (its log-probs, its advantage, its top-K log-probs
    but for the padding slots, where μ may be −∞). :func:`~dppo_oat.trust_region.loss.policy_loss` leaves the others
    out and counts them in its ``nonfinite`` metric."""
    finite = torch.isfinite(logp) & torch.isfinite(behavior_logp) & torch.isfinite(advantages).expand_as(logp)
    if recomputed_logp is not None:
        finite &= torch.isfinite(recomputed_logp)
    if topk is not None:
        finite &= ~(topk.valid & (torch.isnan(topk.behavior_logp) | torch.isnan(topk.logp))).any(-1)
    return finite


# --------------------------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rule:
    """One mask M_t of the unified gradient (eq:unified_grad) and everything it declares: the divergence D_t it reads
    (of π_θ against the anchor), its mask, its threshold, the other fields it reads, an optional term added to each
    token's loss, an optional w_t of its own, its own metrics, and its capabilities. :func:`register_rule` makes one
    from a decorated mask function; the loss, the fields a command line may override, the verl engine and the docs
    read it from :data:`RULE_TABLE`."""

    divergence: str
    """A key of :data:`DIVERGENCES`: the D_t it thresholds (reported as ``divergence/mean`` and ``/max``)."""
    keep: Callable[..., torch.Tensor]
    """M_t of ``(x, tr)``, the batch's :class:`MaskInputs` and the :class:`~dppo_oat.trust_region.config.TrustRegion`:
    True where the token's update is kept."""
    threshold: str | None = None
    """A key of :data:`THRESHOLDS`: ``delta`` (δ), ``clip_range`` (ε_low/ε_high, and α when relaxed), ``tau_m2``
    (M2PO's τ_M2), or None."""
    reads: tuple[str, ...] = ()
    """The other numeric :class:`~dppo_oat.trust_region.config.TrustRegion` fields it reads (CPPO's ``w_min``,
    ``delta_b``)."""
    loss_term: Callable[..., torch.Tensor] | None = None
    """A term added to every token's loss, of ``(logp, x, tr)``: from log π_θ with its gradient (DRPO's
    regularizer)."""
    metrics: Callable[..., dict[str, torch.Tensor]] | None = None
    """0-d statistics of its own, of ``(x, keep, tr)``: the inputs and the mask M_t (reported after the common
    ones)."""
    couples_tokens: bool = False
    """True when M_t reads other tokens than t: the other tokens of its response (CPPO, the sequence masks, GSPO,
    MinPRO) or the whole batch (M2PO). The loss is then no sum of per-token functions of log π_θ(a_t) alone, and
    the caller passes the response mask."""
    binary_twin: str | None = None
    """For a top-K rule: the same mask on a binary divergence, registered before it, which an engine without μ's
    top-K set runs instead."""
    weight: Callable[..., torch.Tensor] | None = None
    """w_t of its own, of ``(x, tr)`` (detached ``[B, T]``), in place of the IS weight of the trust region's
    ``is_weight`` (which it then ignores, C included): GSPO's sequence ratio, SAPO's gate slope, MinPRO's prefix
    minimum."""
    reads_mask_side: bool = False
    """True when ``TrustRegion.mask_side`` picks one half of its mask (DPPO's, eq:dppo_obj); other rules refuse a
    ``mask_side`` but ``both``."""
    needs_recompute: bool = False
    """True when its mask compares the recomputed π_θ' with μ (VACO): the trust region must anchor on π_θ'."""
    reads_batch: bool = False
    """True when M_t reads the whole batch, not only the token's row (M2PO's second moment): a row's mask then
    depends on the other rows of the loss call (one micro-batch). Such a rule couples tokens."""
    soft_gate: Callable[..., torch.Tensor] | None = None
    """For a rule without a threshold whose w_t gates softly (SAPO): the gate of ``(x, tr)``, 1 at r = 1, below it
    where the gate passes less gradient; its band (:data:`GATE_BAND`) is every field it ``reads``, scaled
    together."""

    @property
    def has_band(self) -> bool:
        """True when some setting of it blocks tokens: a threshold, or a soft gate."""
        return self.threshold is not None or self.soft_gate is not None

    @property
    def uses_topk(self) -> bool:
        """True when its divergence reads μ's top-K set (:attr:`Divergence.needs_topk`)."""
        return DIVERGENCES[self.divergence].needs_topk


RULE_TABLE: dict[str, Rule] = {}
"""Every rule by name (:func:`register_rule`)."""


def register_rule(name: str, rule: Rule | None = None, /, **declared):
    """Add a rule to :data:`RULE_TABLE` as ``name``.

    As a decorator above a mask function, with the :class:`Rule`'s other fields as keyword arguments
    (``@register_rule("ipo", divergence="binary_tv", threshold="delta")``), it registers ``Rule(keep=function,
    **declared)`` and returns the function unchanged, so decorators stack to register one mask under several names
    (a top-K rule and its binary twin share theirs). Called with a :class:`Rule` (``register_rule(name, Rule(...))``),
    it registers that rule and returns it. A ValueError for a name taken, an unknown divergence or threshold, or a
    top-K rule without a registered binary twin.
    """
    if rule is not None:
        if declared:
            raise TypeError(f"register_rule({name!r}, rule) takes no other argument: declare {sorted(declared)} on "
                            "the Rule")
        _add_rule(name, rule)
        return rule

    def register(keep: Callable[..., torch.Tensor]):
        _add_rule(name, Rule(keep=keep, **declared))
        return keep

    return register


def _add_rule(name: str, rule: Rule) -> None:
    if name in RULE_TABLE:
        raise ValueError(f"a trust-region rule named {name!r} exists")
    if rule.divergence not in DIVERGENCES:
        raise ValueError(f"rule {name!r}: unknown divergence {rule.divergence!r}; one of {', '.join(DIVERGENCES)}")
    if rule.threshold is not None and rule.threshold not in THRESHOLDS:
        raise ValueError(f"rule {name!r}: unknown threshold {rule.threshold!r}; one of {', '.join(THRESHOLDS)}")
    if rule.uses_topk and rule.binary_twin is None:
        raise ValueError(f"rule {name!r} reads a top-K divergence: name its binary_twin")
    if rule.reads_batch and not rule.couples_tokens:
        raise ValueError(f"rule {name!r} reads the whole batch: declare couples_tokens=True too")
    if rule.soft_gate is not None and (rule.threshold is not None or not rule.reads):
        raise ValueError(f"rule {name!r} has a soft gate: its band is the fields it reads, so declare reads and no "
                         "threshold")
    if rule.binary_twin is not None and (rule.binary_twin not in RULE_TABLE or RULE_TABLE[rule.binary_twin].uses_topk):
        raise ValueError(f"rule {name!r}: its binary_twin {rule.binary_twin!r} is no registered binary rule "
                         "(register the twin first)")
    RULE_TABLE[name] = rule
