r"""The trust region of every method in the paper, as one per-token policy loss.

All methods share the unified gradient (eq:unified_grad, app:sanity_test_details):

$$
\nabla L = \mathbb{E}_{\mu}\Big[\sum_t M_t \, w_t \, A_t \, \nabla \log \pi_\theta(a_t \mid s_t)\Big], \qquad
w_t = \min(r_t, C), \qquad
r_t = \frac{\pi_\theta(a_t \mid s_t)}{\mu(a_t \mid s_t)}
$$

and differ only in the mask ``M_t`` (which updates are blocked) and the importance-sampling cap ``C``. A
:class:`TrustRegion` names one such rule; :func:`policy_loss` evaluates it on a batch of tokens.

The mask is anchored on the behavior policy μ that sampled the tokens (sec:correct_ancher_for_truct_region); the
``*_recompute`` and ``minirl*`` presets anchor it on the recomputed rollout weights π_θ' instead, as ablations. The IS
weight ``min(r_t, C)`` is against μ.

The fixes for training–inference mismatch that other frameworks ship are presets of the same loss (``tis``,
``seq_tis``, ``icepop``, ``seq_geo_mask``, ``decoupled_ppo``, ``dppo_binary_tv_kl``): they multiply M_t by a mask on
the training engine's own ratio ρ_t = π_θ'(a_t)/μ(a_t) (per token, or per response through its geometric mean),
replace w_t by the *decoupled* weight (π_θ/π_θ')·min(ρ_t, C) of their PPO-on-π_θ' losses, and may add a penalty
τ·log²(π_θ/μ) per token (its gradient 2τ·log(π_θ/μ)·∇log π_θ adds to the one above). Each preset's ``source`` names
the file and defaults it follows.

Three later methods are presets too. ``drpo`` (DRPO) keeps every token (M_t = 1) and adds a smooth quadratic
regularizer on the policy shift, |A_t|·μ·(r_t − 1)²/(2δ) = |A_t|·(π_θ − μ)²/(2δ·μ); ``cppo`` and ``cppo_binary_tv``
(CPPO) mask as DPPO does but against a position-weighted threshold and a cumulative budget over each response's
prefix; ``m2po`` (M2PO) masks the tokens with the largest (log r_t)² until the batch's second moment is within τ_M2.
The masks of CPPO and M2PO read more than their own token (:attr:`Rule.couples_tokens`).

The field after DPPO is presets too: ``ipo`` (prime-rl's symmetric band |π − μ| ≤ δ, whatever A), ``trm_max`` and
``trm_avg`` (Trust Region Masking: a whole response masked when its max k2 or mean k3 to μ exceeds δ), ``opsm``
(DeepSeek-V3.2's off-policy sequence mask), ``vaco`` (a directional sequence-level binary TV of π_θ' to μ), and three
that set w_t themselves (:attr:`Rule.weight`): ``gspo`` (the sequence ratio, clipped), ``sapo`` (a soft gate) and
``minpro`` (the minimum token ratio over the prefix). A row of the loss is one turn, so their sequences are turns.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Callable

import torch

from dppo_oat import divergence as div



@dataclass(frozen=True)
class MaskInputs:
    """What a rule's mask, loss term and metrics read, per token: detached fp32 ``[B, T]`` tensors of one batch."""

    logp: torch.Tensor
    """log π_θ(a_t)."""
    anchor_logp: torch.Tensor
    """log of the anchor's probability of a_t: μ, or the recomputed π_θ' (``TrustRegion.anchor``)."""
    behavior_logp: torch.Tensor
    """log μ(a_t), the rollout engine's."""
    advantages: torch.Tensor
    """A_t, expanded to ``[B, T]``."""
    mask: torch.Tensor
    """The response tokens."""
    divergence: torch.Tensor
    """D_t, the rule's divergence of π_θ against the anchor (:data:`DIVERGENCES`)."""

    @property
    def ratio(self) -> torch.Tensor:
        """r_t = π_θ/anchor (log r clamped at :data:`MAX_LOG_RATIO`)."""
        return (self.logp - self.anchor_logp).clamp(max=MAX_LOG_RATIO).exp()


@dataclass(frozen=True)
class Rule:
    """One mask M_t of the unified gradient (eq:unified_grad) and everything it brings to the loss: the divergence D_t
    it reads (of π_θ against the anchor, :data:`DIVERGENCES`), its mask, its threshold field, the other fields it
    reads, an optional term added to each token's loss (a regularizer), its own metrics, and for a top-K rule the rule
    to run where no top-K set exists. Adding a rule is one :func:`register_rule` call (and its tests): the loss, the
    fields a command line may override, the verl engine and the docs read it from :data:`RULE_TABLE`."""

    divergence: str
    """A key of :data:`DIVERGENCES`: ``ratio`` (|r − 1|), ``binary_tv``, ``binary_kl``, ``topk_tv``, ``topk_kl``,
    ``prob_drop`` (anchor − π), ``log_ratio_sq`` ((log r)²), ``k2`` (½(log r)²) or ``k3`` (r − 1 − log r)."""
    keep: Callable[[MaskInputs, "TrustRegion"], torch.Tensor]
    """M_t: True where the token's update is kept."""
    threshold: str | None = None
    """The :class:`TrustRegion` field the mask thresholds: ``delta`` (δ), ``eps`` (ε_low/ε_high, and α when
    relaxed), ``tau_m2`` (M2PO's τ_M2) or None."""
    reads: tuple[str, ...] = ()
    """The other numeric :class:`TrustRegion` fields the rule reads (CPPO's ``w_min``, ``delta_b``)."""
    loss_term: Callable[[torch.Tensor, MaskInputs, "TrustRegion"], torch.Tensor] | None = None
    """A term added to every token's loss, from log π_θ with its gradient (DRPO's regularizer)."""
    metrics: Callable[[MaskInputs, torch.Tensor, "TrustRegion"], dict[str, torch.Tensor]] | None = None
    """0-d statistics of the rule's own, from the inputs and the mask M_t (:func:`trust_region_metrics` reports
    them)."""
    couples_tokens: bool = False
    """True when M_t reads other tokens than t: the earlier tokens of its response (CPPO) or the whole batch (M2PO).
    The loss is then no sum of per-token functions of log π_θ(a_t) alone, and the caller passes the response mask."""
    binary_twin: str | None = None
    """For a top-K rule: the same rule on binary TV, which an engine without μ's top-K set runs instead."""
    weight: Callable[[MaskInputs, "TrustRegion"], torch.Tensor] | None = None
    """w_t of the rule's own (detached ``[B, T]``), in place of the IS weight of :data:`IS_WEIGHTS` (which it then
    ignores, C included): GSPO's sequence ratio, SAPO's gate slope, MinPRO's prefix minimum."""

    @property
    def uses_topk(self) -> bool:
        return self.divergence.startswith("topk")


RULE_TABLE: dict[str, Rule] = {}
"""Every rule by name (:func:`register_rule`)."""
THRESHOLDS = ("delta", "eps", "tau_m2")
"""The threshold fields a :class:`Rule` may name."""


def register_rule(name: str, rule: Rule) -> Rule:
    """Add ``rule`` to :data:`RULE_TABLE` as ``name``; a ValueError for a name taken, an unknown divergence or
    threshold, or a top-K rule without a binary twin."""
    if name in RULE_TABLE:
        raise ValueError(f"a trust-region rule named {name!r} exists")
    if rule.divergence not in DIVERGENCES:
        raise ValueError(f"rule {name!r}: unknown divergence {rule.divergence!r}; one of {', '.join(DIVERGENCES)}")
    if rule.threshold is not None and rule.threshold not in THRESHOLDS:
        raise ValueError(f"rule {name!r}: unknown threshold {rule.threshold!r}; one of {', '.join(THRESHOLDS)}")
    if rule.uses_topk and rule.binary_twin is None:
        raise ValueError(f"rule {name!r} reads a top-K divergence: name its binary_twin")
    RULE_TABLE[name] = rule
    return rule


ANCHORS = ("behavior", "recompute")
RELAX_MODES = ("none", "low", "high", "both")
IS_WEIGHTS = ("behavior", "decoupled_token", "decoupled_seq", "proximal")
"""The IS weight w_t. ``behavior``: min(π_θ/μ, C) (eq:unified_grad). ``decoupled_token`` / ``decoupled_seq``:
(π_θ/π_θ')·min(ρ, C), with ρ = π_θ'/μ per token or ∏_t π_θ'/μ per response: the PPO ratio on the recomputed π_θ'
times the truncated IS weight of π_θ' against μ (decoupled PPO with token/sequence TIS). ``proximal``: π_θ/π_θ' (PPO
on π_θ' with no correction toward μ; C unused)."""
NUMBER_FIELDS = ("delta", "eps_low", "eps_high", "is_cap", "alpha", "mismatch_low", "mismatch_high", "kl_tau", "w_min",
                 "delta_b", "tau_m2", "tau_pos", "tau_neg")
"""The :class:`TrustRegion` fields that are real numbers (K, an integer, apart)."""
CHOICE_FIELDS = ("rule", "anchor", "relax", "is_weight", "mismatch_mask", "mask_side")
"""The :class:`TrustRegion` fields that name one of a few choices."""
MISMATCH_MASKS = ("none", "token", "seq_geo")
"""A mask on the training–inference ratio ρ_t = π_θ'/μ, kept inside ``[mismatch_low, mismatch_high]``: ``token``
masks each token outside the band (IcePop, AReaL's rejection sampling); ``seq_geo`` masks every token of a response
whose geometric mean exp(mean_t log ρ_t) leaves it (SkyRL's geometric sequence mask)."""
MASK_SIDES = ("both", "negative", "positive")
"""Which half of DPPO's mask (eq:dppo_obj) acts: ``both`` (the paper's), ``negative`` (only A<0 & r<1 & D>δ is
blocked) or ``positive`` (only A>0 & r>1 & D>δ): the CPU study's ablation of the mask's two halves."""
MAX_LOG_RATIO = 60.0
"""log r is clamped here before exp so that r stays finite in fp32 (log-probs down to −60 are exact)."""
MU_BUCKETS = ((0.0, 0.1, "mu_lt_0.1"), (0.1, 0.5, "mu_0.1_0.5"), (0.5, math.inf, "mu_ge_0.5"))
"""Behavior-probability buckets of the shadow-mask metrics (low-, mid-, high-probability tokens)."""
BAD_UPDATE_THRESHOLD = 0.5
"""sec:stability, Takeaway 3: a 'bad update' is A < 0 and μ − π ≥ 0.5."""
PREFIX_BUDGET_QUANTILE = 0.9
"""CPPO's per-response budget δ_b^seq is calibrated on this quantile (P90) of the response's D_t."""
PREFIX_BUDGET_CEILING = 2.0
"""CPPO's δ_b^seq is clamped to ``[δ_b, PREFIX_BUDGET_CEILING · δ_b]`` (δ_b: the TrustRegion's floor)."""


def numeric_fields_read(rule: str, relax: str = "none", is_weight: str = "behavior",
                        mismatch_mask: str = "none") -> frozenset[str]:
    """The numeric :class:`TrustRegion` fields a rule's loss reads: its threshold (ε_low and ε_high for ``eps``, α
    too when relaxed) and the :attr:`Rule.reads` fields, K by top-K rules, C unless w_t is ``proximal`` or the rule's
    own (:attr:`Rule.weight`), the band by a mismatch mask, τ by every rule. A value of any other field changes
    nothing."""
    spec = RULE_TABLE[rule]
    read = {"kl_tau", *spec.reads}
    if spec.threshold == "eps":
        read.update(("eps_low", "eps_high", *(("alpha",) if relax != "none" else ())))
    elif spec.threshold is not None:
        read.add(spec.threshold)
    if spec.uses_topk:
        read.add("k")
    if is_weight != "proximal" and spec.weight is None:
        read.add("is_cap")
    if mismatch_mask != "none":
        read.update(("mismatch_low", "mismatch_high"))
    return frozenset(read)


@dataclass(frozen=True)
class TrustRegion:
    """One trust-region rule of the unified gradient (eq:unified_grad). Build it with :meth:`preset`. Each field's
    docstring is also the help of its command-line override (``--tr-<field>``, :class:`~dppo_oat.spec.DPPOFlags`)."""

    rule: str = "binary_tv"
    """Which mask M_t: a name of :data:`RULE_TABLE`."""
    delta: float = 0.15
    """divergence threshold δ (DPPO's mask, eq:dppo_obj; mask_negative; CPPO; DRPO's regularization δ; the IPO band;
    the sequence masks of TRM, DeepSeek-V3.2 and VACO)."""
    eps_low: float = 0.2
    """lower clip range ε_low: PPO's clip range is [1 − ε_low, 1 + ε_high] (ratio rules)."""
    eps_high: float = 0.28
    """upper clip range ε_high (ratio rules)."""
    is_cap: float = math.inf
    """IS-weight cap C of min(r, C) (inf: no truncation)."""
    anchor: str = "behavior"
    """The distribution the mask compares π_θ with: ``behavior`` (μ) or ``recompute`` (π_θ')."""
    alpha: float = 0.1
    """α of the α study (sec:training_efficiency): for tokens with μ < α the relaxed side's ε is ∞."""
    relax: str = "none"
    """Which side of the clip range is relaxed for μ < α: ``none``, ``low``, ``high`` or ``both``."""
    k: int = 20
    """K of the top-K rules: the set is TopK(μ, K) ∪ {a_t}, which the rollout returns with each token."""
    is_weight: str = "behavior"
    """How w_t is built (:data:`IS_WEIGHTS`)."""
    mismatch_mask: str = "none"
    """The mask on ρ_t = π_θ'/μ (:data:`MISMATCH_MASKS`)."""
    mismatch_low: float = 0.0
    """lower bound of the band on ρ_t = π_θ'/μ (0: none)."""
    mismatch_high: float = math.inf
    """upper bound of the band on ρ_t = π_θ'/μ."""
    kl_tau: float = 0.0
    """τ of the penalty τ·log²(π_θ/μ) added to every response token's loss (0: none)."""
    w_min: float = 0.8
    """position weight w_min of a response's last token, in (0, 1] (CPPO; its first has 1: :func:`position_weights`)."""
    delta_b: float = 0.02
    """floor δ_b of CPPO's per-response prefix budget (:func:`prefix_budget`)."""
    tau_m2: float = 0.04
    """bound τ_M2 of M2PO on the batch's mean (log r)² (inf: no mask; :func:`second_moment_keep`)."""
    tau_pos: float = 1.0
    """SAPO gate temperature τ for tokens with A > 0 (:func:`sapo_gate_slope`)."""
    tau_neg: float = 1.05
    """SAPO gate temperature τ for tokens with A ≤ 0."""
    mask_side: str = "both"
    """Which half of a divergence rule's mask acts: ``both``, ``negative`` or ``positive`` (:data:`MASK_SIDES`; the
    CPU study's ablation)."""
    name: str = field(default="custom", compare=False)
    """The preset this came from (for logs)."""

    def __post_init__(self) -> None:
        self._check_types()
        _check_choice("rule", self.rule, tuple(RULE_TABLE))
        _check_choice("anchor", self.anchor, ANCHORS)
        _check_choice("relax", self.relax, RELAX_MODES)
        _check_choice("is_weight", self.is_weight, IS_WEIGHTS)
        _check_choice("mismatch_mask", self.mismatch_mask, MISMATCH_MASKS)
        _check_choice("mask_side", self.mask_side, MASK_SIDES)
        if self.mask_side != "both" and RULE_TABLE[self.rule].keep is not keep_in_divergence:
            raise ValueError(f"mask_side={self.mask_side!r} keeps one half of a divergence mask: it needs a "
                             f"binary or top-K rule, not {self.rule!r}")
        for attr in NUMBER_FIELDS:
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
        if self.uses_topk and self.k < 1:
            raise ValueError(f"rule {self.rule!r} needs k >= 1 (the K of TopK(μ, K)), got {self.k}")
        if self.relax != "none" and RULE_TABLE[self.rule].threshold != "eps":
            raise ValueError(f"relax={self.relax!r} relaxes the PPO clip range: it needs rule='ratio'")
        if self.uses_topk and self.anchor != "behavior":
            raise ValueError("top-K rules are anchored on μ (the rollout engine's top-K); use a binary rule")
        if not 0 <= self.mismatch_low < self.mismatch_high:
            raise ValueError(f"the mismatch band needs 0 <= mismatch_low < mismatch_high, got "
                             f"[{self.mismatch_low}, {self.mismatch_high}]")
        if not 0 <= self.kl_tau < math.inf:
            raise ValueError(f"kl_tau (τ) must be a finite number >= 0, got {self.kl_tau}")
        if not 0 < self.w_min <= 1:
            raise ValueError(f"w_min must be in (0, 1] (a response's last position weight), got {self.w_min}")
        if not 0 <= self.delta_b < math.inf:
            raise ValueError(f"delta_b (δ_b) must be a finite number >= 0, got {self.delta_b}")
        if not self.tau_m2 >= 0:
            raise ValueError(f"tau_m2 (τ_M2) must be >= 0 (math.inf: no mask), got {self.tau_m2}")
        if not (0 < self.tau_pos < math.inf and 0 < self.tau_neg < math.inf):
            raise ValueError(f"tau_pos and tau_neg (SAPO's τ) must be finite and > 0, got {self.tau_pos}, {self.tau_neg}")

    def _check_types(self) -> None:
        """Every field has its type (a ``ValueError`` naming it, as the command line's parser would): the numbers are
        real numbers and K an integer (never a bool), the choices and the name strings."""
        for attr in NUMBER_FIELDS:
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{attr} must be a real number, got {type(value).__name__} {value!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, numbers.Integral):
            raise ValueError(f"k must be an integer (the K of TopK(μ, K)), got {type(self.k).__name__} {self.k!r}")
        for attr in (*CHOICE_FIELDS, "name"):
            if not isinstance(getattr(self, attr), str):
                raise ValueError(f"{attr} must be a string, got {type(getattr(self, attr)).__name__} "
                                 f"{getattr(self, attr)!r}")

    @property
    def uses_topk(self) -> bool:
        """True when the rule needs μ's top-K set and π_θ's log-probs on it."""
        return RULE_TABLE[self.rule].uses_topk

    @property
    def couples_tokens(self) -> bool:
        """True when the mask of a token reads other tokens (:attr:`Rule.couples_tokens`: CPPO, M2PO)."""
        return RULE_TABLE[self.rule].couples_tokens

    @property
    def fields_read(self) -> frozenset[str]:
        """The numeric fields this rule's loss reads (:func:`numeric_fields_read`)."""
        return numeric_fields_read(self.rule, self.relax, self.is_weight, self.mismatch_mask)

    @property
    def needs_recompute(self) -> bool:
        """True when the mask, the IS weight or the mismatch mask reads the recomputed π_θ' (one extra forward pass
        per rollout batch)."""
        return self.anchor == "recompute" or self.is_weight != "behavior" or self.mismatch_mask != "none"

    @classmethod
    def preset(cls, name: str, /, **overrides) -> "TrustRegion":
        """The paper's method ``name`` (see :data:`PRESETS`), with optional field overrides; a numeric override its
        rule never reads (``preset("ppo", delta=0.2)``) is refused, as the command line refuses ``--tr-delta`` there
        (:meth:`replace` changes any field)."""
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"unknown trust-region preset {name!r}; choose one of: {', '.join(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown TrustRegion field(s) {sorted(unknown)} for preset {name!r}")
        fields = {**PRESETS[name].fields, "name": name}
        fields.update(overrides)
        tr = cls(**fields)
        unread = [field for field in overrides if field in (*NUMBER_FIELDS, "k") and field not in tr.fields_read]
        if unread:
            raise ValueError(f"{', '.join(unread)}: not read by the trust region {name} (it reads "
                             f"{', '.join(sorted(tr.fields_read))}): leave it out, or choose a preset that uses it")
        return tr

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
_PPO_ON_RECOMPUTE = {"rule": "ratio", "eps_low": 0.2, "eps_high": 0.2, "anchor": "recompute"}
"""PPO's clip (ε = 0.2) on π_θ/π_θ', the loss under SkyRL's, OpenRLHF's, AReaL's and verl's mismatch corrections."""
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
    "dppo_binary_kl_neg": Preset(
        {"rule": "binary_kl", "delta": 0.05, "mask_side": "negative"},
        "DPPO-Binary-KL's A<0 half alone (the CPU study's ablation): block only A<0 & r<1 & D>δ",
    ),
    "dppo_binary_kl_pos": Preset(
        {"rule": "binary_kl", "delta": 0.05, "mask_side": "positive"},
        "DPPO-Binary-KL's A>0 half alone (the CPU study's ablation): block only A>0 & r>1 & D>δ",
    ),
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
    # --- training–inference mismatch fixes of other frameworks, as their sources define them
    "tis": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_token", "is_cap": 2.0},
        "token TIS: SkyRL skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py compute_tis_ratio "
        "(tis_ratio_type token, token_tis_ratio_clip_high 2.0) on ppo_utils.py ppo_policy_loss (ε 0.2); slime "
        "--use-tis --tis-clip 2.0; verl decoupled_token_is(threshold=2.0)",
    ),
    "seq_tis": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_seq", "is_cap": 5.0},
        "sequence TIS: SkyRL skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py compute_tis_ratio "
        "(tis_ratio_type sequence, sequence_tis_ratio_clip_high 5.0) on ppo_utils.py ppo_policy_loss (ε 0.2)",
    ),
    "icepop": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_token", "mismatch_mask": "token", "mismatch_low": 0.5,
         "mismatch_high": 5.0},
        "IcePop: OpenRLHF openrlhf/models/loss.py PolicyLoss (vllm_is_correction_type icepop, "
        "is_correction_threshold [0.5, 5.0], ε 0.2): PPO on π_θ' × ρ·1[0.5 ≤ ρ ≤ 5]; NeMo-RL the same band",
    ),
    "seq_geo_mask": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "proximal", "mismatch_mask": "seq_geo", "mismatch_low": 0.99,
         "mismatch_high": 1.01},
        "geometric sequence mask: SkyRL skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py "
        "compute_sequence_mask (sequence_mask_metric geometric, geo_mask_low 0.99, geo_mask_high 1.01) on "
        "ppo_utils.py ppo_policy_loss (ε 0.2), no TIS",
    ),
    "decoupled_ppo": Preset(
        {**_PPO_ON_RECOMPUTE, "is_weight": "decoupled_token", "mismatch_mask": "token", "mismatch_high": 5.0},
        "AReaL decoupled PPO: areal/utils/functional/functional.py ppo_actor_loss_fn (use_decoupled_loss, eps_clip "
        "0.2): PPO on π_prox = π_θ' × π_prox/μ, with rejection_sampling level token, action mask, metric ratio, "
        "upper 5.0 (areal/api/cli_args.py RejectionSamplingConfig)",
    ),
    "dppo_binary_tv_kl": Preset(
        {"rule": "binary_tv", "delta": 0.2, "kl_tau": 1e-3},
        "DPPO + KL, prime-rl's default loss: src/prime_rl/trainer/rl/loss.py default_loss_fn (DefaultLossConfig "
        "dppo_mask_low/high 0.2, kl_tau 1e-3): binary TV on π − μ + τ·log²(π/μ) on every loss token",
    ),
    # --- later trust regions: DRPO, CPPO, M2PO (equation numbers as each source cites them)
    "drpo": Preset(
        {"rule": "drpo", "delta": 12.5},
        "DRPO (arXiv 2606.09821): objective eq. 8, Σ_t r_t·A_t − |A_t|·μ(y_t|s_t)·(r_t − 1)²/(2δ), no IS "
        "truncation; gradient eq. 9, weight (Table 1) 1 − sign(A_t(r_t − 1))·|π − μ|/δ; δ = 12.5 (§4). Reference "
        "code Tencent-Hunyuan/UniRL unirl/algorithms/drpo.py _drpo_loss (drpo_epsilon 12.5); equation numbers and δ "
        "as that code and its README cite the paper",
    ),
    "cppo": Preset(
        {"rule": "cppo_topk_tv", "delta": 0.15, "k": 20, "w_min": 0.8, "delta_b": 0.02},
        "CPPO (arXiv 2606.10968): DPPO's surrogate under the mask of eq. 8-10 and Algorithm 1: keep t iff "
        "A_t(r_t − 1) ≤ 0 or w_t·D_t ≤ min(δ, δ + δ_b·W_{t−1} − S_{t−1}), w_t = 1 − (1 − w_min)(t − 1)/(T − 1) "
        "(eq. 9), δ_b = clamp(P90(D_{1:T}), δ_b,min, 2δ_b,min) per response (eq. 22); top-K TV, K = 20 (the "
        "paper's main runs), δ = 0.15 (dense models), w_min 0.8, δ_b,min 0.02. Reference code Tencent-Hunyuan/UniRL "
        "unirl/algorithms/cppo.py _cppo_mask and verl PR 6731 docs/algo/cppo.md (binary TV); equation numbers as "
        "those cite the paper",
    ),
    "cppo_binary_tv": Preset(
        {"rule": "cppo_binary_tv", "delta": 0.15, "w_min": 0.8, "delta_b": 0.02},
        "CPPO-Binary-TV: cppo with D_t = |π − μ|, as the reference code computes it (Tencent-Hunyuan/UniRL "
        "unirl/algorithms/cppo.py, verl PR 6731 docs/algo/cppo.md)",
    ),
    "m2po": Preset(
        {"rule": "m2po", "tau_m2": 0.04},
        "M2PO (arXiv 2510.01161v2, sec. 5.2): M̂2 = mean (log r)² (eq. 4); Algorithm 1 masks the trust-region tokens "
        "(A > 0 & r > 1 or A < 0 & r < 1) of largest (log r)² until their mean is ≤ τ_M2 = 0.04; objective eq. 5, "
        "M·r·A averaged over all tokens (footnote 2), no IS truncation. Batch = one loss call (a micro-batch), as "
        "Infini-AI-Lab/M2PO verl/workers/actor/dp_actor.py calls compute_m2po_policy_loss (M2_budget 0.04)",
    ),
    # --- the field after DPPO: sequence masks, the symmetric band, soft gates and sequence ratios (a row is one turn)
    "ipo": Preset(
        {"rule": "ipo", "delta": 0.1, "kl_tau": 1e-3},
        "IPO, the symmetric DPPO band: prime-rl src/prime_rl/trainer/rl/loss.py ipo_loss_fn (IPOLossConfig "
        "ipo_threshold 0.1, kl_tau 1e-3, packages/prime-rl-configs/src/prime_rl/configs/trainer.py; commit 559b447): "
        "tokens with |π − μ| > δ masked whatever the sign of A, w = π/μ untruncated, + τ·log²(π/μ) on every loss "
        "token (the PR threads #1930, #2434 were not read here)",
    ),
    "trm_max": Preset(
        {"rule": "trm_max", "eps_low": 0.2, "eps_high": 0.2, "delta": 2.5},
        "TRM-Max, Trust Region Masking (arXiv 2512.23075; only its abstract could be read here): PPO's clip (ε 0.2) "
        "on π_θ/μ, and a whole response masked when max_t ½(log π_θ/μ)² > δ, as verl's bypass mode (loss_type "
        "ppo_clip) with rollout_rs seq_max_k2 (verl/trainer/ppo/rollout_corr_helper.py "
        "compute_rollout_rejection_mask, PR #4544); δ = 2.5 from verl's "
        "examples/rollout_correction/run_qwen2_5_7b_fsdp_multi_rs.sh: verl has no TRM-Max preset and the paper's "
        "bound was not read; slime PR #1568's code was not read",
    ),
    "trm_avg": Preset(
        {"rule": "trm_avg", "eps_low": 0.2, "eps_high": 0.2, "delta": 0.01},
        "TRM-Avg, Trust Region Masking (arXiv 2512.23075; abstract only): PPO's clip (ε 0.2) on π_θ/μ, and a whole "
        "response masked when mean_t (r_t − 1 − log r_t) > δ (k3): verl/trainer/config/algorithm.py "
        "RolloutCorrectionConfig.bypass_ppo_clip_k3_rs (rollout_rs seq_mean_k3, rs_threshold 0.01; PR #4544); slime "
        "PR #1568's code was not read",
    ),
    "opsm": Preset(
        {"rule": "opsm", "eps_low": 0.2, "eps_high": 0.2, "delta": 0.5},
        "DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556 eq. 9, as TRL cites it; the paper was not read "
        "here): TRL trl/trainer/grpo_trainer.py GRPOTrainer.get_off_policy_mask keeps t iff A_t ≥ 0 or the "
        "response's mean log(μ/π_θ) ≤ δ, on GRPO's clip (epsilon 0.2), here anchored on μ; δ = 0.5, the starting "
        "point of TRL docs/source/paper_index.md (the paper gives none; off_policy_mask_threshold defaults to None); "
        "TRL's separate vLLM IS correction is not part of the preset; ms-swift was not read",
    ),
    "vaco": Preset(
        {"rule": "vaco", "anchor": "recompute", "is_weight": "decoupled_token", "is_cap": 2.0, "eps_low": 0.2,
         "eps_high": 0.272, "delta": 0.3},
        "VACO (arXiv 2603.01365; the paper could not be read here) as open-instruct PR #1755 (head 5c2bf9a) "
        "implements it, open_instruct/grpo_utils.py compute_rho_correction (rho_divergence_algo vaco, "
        "rho_divergence_type tv): t dropped when the response's mean |π_θ' − μ| > δ and sign(log π_θ'/μ)·A_t > 0, on "
        "DAPO's clip of π_θ/π_θ' (clip_lower 0.2, clip_higher 0.272) with w = (π_θ/π_θ')·min(π_θ'/μ, 2) "
        "(rho_clamp_upper_bound 2.0); δ = 0.3 is the PR's own test value (test_vaco_tv_divergence): its default "
        "rho_mask_upper_bound 0 disables the mask",
    ),
    "gspo": Preset(
        {"rule": "gspo", "eps_low": 3e-4, "eps_high": 4e-4},
        "GSPO (arXiv 2507.18071) as verl runs it: verl/trainer/ppo/core_algos.py compute_policy_loss_gspo (loss_mode "
        "gspo): s_i = exp(mean_t log π_θ/μ) per response, PPO's clip on s_i, gradient s_i·A_t·∇log π_θ(a_t), log s_i "
        "clamped at 10; ε_low 3e-4, ε_high 4e-4 (examples/gspo_trainer/README.md, which runs it seq-mean-token-mean)",
    ),
    "sapo": Preset(
        {"rule": "sapo", "tau_pos": 1.0, "tau_neg": 1.05},
        "SAPO (arXiv 2511.20347) as verl runs it: verl/trainer/ppo/core_algos.py compute_policy_loss_sapo (loss_mode "
        "sapo): loss −f(r)·A with the gate f(r) = σ(τ(r − 1))·4/τ, r = π_θ/μ (log r clamped at ±20), τ = τ_pos where "
        "A > 0 and τ_neg elsewhere; gradient r·4σ(1 − σ)·A·∇log π_θ, no mask; τ_pos 1.0, τ_neg 1.05 "
        "(verl/workers/config/actor.py ActorConfig; TRL sapo_temperature_pos/neg the same); verl aggregates it "
        "seq-mean-token-mean",
    ),
    "minpro": Preset(
        {"rule": "minpro"},
        "MinPRO (arXiv 2601.22718; only its abstract could be read here): w_t = min_{j ≤ t} π_θ(a_j)/μ(a_j) over the "
        "response's tokens so far, the non-cumulative surrogate of the prefix ratio ∏_{j ≤ t} π_θ/μ that the "
        "abstract names ('the minimum token-level ratio observed in the preceding prefix'), M = 1, no cap; whether "
        "t itself belongs to the prefix and any clip of the paper's objective are not verified",
    ),
}
"""The paper's methods with its stability-analysis defaults (sec:stability, app:sanity_test_details), then the
training–inference mismatch fixes of other frameworks, then later trust regions (see each ``source``)."""


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

    ``loss`` is ``−M_t · w_t · A_t + τ · log²(π_θ/μ)`` in value (the per-token surrogate) with gradient
    ``(−M_t · w_t · A_t + 2τ · log(π_θ/μ)) · ∇ log π_θ`` (w_t = min(r_t, C) but for the decoupled weights of
    :data:`IS_WEIGHTS`; τ = 0 but for the ``kl_tau`` presets); it is 0 where the input ``mask`` is False. ``keep`` is
    M_t: the rule's mask and, when the trust region has one, the mismatch mask.
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


def divergence_keep(ratio, advantages, divergence, delta, side: str = "both") -> torch.Tensor:
    """DPPO's mask (eq:dppo_obj): block A>0 & r>1 & D>δ and A<0 & r<1 & D>δ (``side``: both halves, or only the
    ``negative`` or the ``positive`` one, :data:`MASK_SIDES`).

    An update that moves r back toward 1 is never blocked. With ``D = |r − 1|`` this is PPO's mask. A NaN D counts
    as outside: an unknown divergence is no licence to move further.
    """
    outside = ~(divergence <= delta)
    positive = (advantages > 0) & (ratio > 1) & outside if side != "negative" else torch.zeros_like(outside)
    negative = (advantages < 0) & (ratio < 1) & outside if side != "positive" else torch.zeros_like(outside)
    return ~(positive | negative)


def negative_keep(anchor_prob, prob, advantages, delta) -> torch.Tensor:
    """Takeaway 3's minimal mask (sec:stability): block A<0 & anchor(a_t) − π(a_t) ≥ δ."""
    return ~((advantages < 0) & (anchor_prob - prob >= delta))


def position_weights(mask: torch.Tensor, w_min: float) -> torch.Tensor:
    """CPPO's w_t (arXiv 2606.10968 eq. 9, Algorithm 1): ``1 − (1 − w_min)(t − 1)/(T − 1)``, t the 1-based position
    among the row's response tokens ``mask`` and T their number: 1 at the first token, w_min at the last (1 for a
    one-token response), 0 off the response. fp64 ``[B, T]``."""
    position = mask.long().cumsum(-1)
    length = mask.long().sum(-1, keepdim=True)
    elapsed = (position - 1).clamp(min=0).double() / (length - 1).clamp(min=1).double()
    return torch.where(mask, 1.0 - (1.0 - w_min) * elapsed, 0.0)


def prefix_budget(divergence: torch.Tensor, mask: torch.Tensor, delta_b: float) -> torch.Tensor:
    """CPPO's per-response budget δ_b^seq (arXiv 2606.10968 eq. 22): the P90 of the row's D_t over its response
    tokens, clamped to ``[δ_b, 2δ_b]`` (:data:`PREFIX_BUDGET_QUANTILE`, :data:`PREFIX_BUDGET_CEILING`); δ_b for a row
    with no response token or no finite D_t. fp64 ``[B, 1]``."""
    values = torch.where(mask, divergence.double(), math.nan)
    quantile = torch.nanquantile(values, PREFIX_BUDGET_QUANTILE, dim=-1, keepdim=True)
    budget = quantile.clamp(min=delta_b, max=PREFIX_BUDGET_CEILING * delta_b)
    return torch.where(torch.isnan(quantile), delta_b, budget)


def prefix_thresholds(divergence: torch.Tensor, mask: torch.Tensor, tr: TrustRegion) -> tuple[torch.Tensor, ...]:
    """``(Z_t, c_t, δ_b^seq)`` of CPPO (arXiv 2606.10968 eq. 8): Z_t = w_t·D_t and the effective threshold
    ``c_t = min(δ, δ + δ_b^seq·W_{t−1} − S_{t−1})``, S and W the sums of Z and w over the response's earlier tokens
    (S_0 = W_0 = 0). A NaN D_t makes every later c_t NaN: an unknown prefix leaves no budget. fp64 ``[B, T]``."""
    weights = position_weights(mask, tr.w_min)
    z = weights * torch.where(mask, divergence.double(), 0.0)
    budget = prefix_budget(divergence, mask, tr.delta_b)
    c = torch.clamp(tr.delta + budget * sum_before(weights) - sum_before(z), max=tr.delta)
    return z, c, budget


def sum_before(values: torch.Tensor) -> torch.Tensor:
    """``Σ_{j<t} values_j`` along the last dimension (0 at t = 1)."""
    return torch.cat([torch.zeros_like(values[..., :1]), values.cumsum(-1)[..., :-1]], -1)


def prefix_budget_keep(ratio, advantages, divergence, mask, tr: TrustRegion) -> torch.Tensor:
    """CPPO's mask (arXiv 2606.10968 eq. 10): keep t iff A_t(r_t − 1) ≤ 0 (toward the anchor) or Z_t ≤ c_t
    (:func:`prefix_thresholds`). With w_min = 1 and a δ_b too large to bind it is DPPO's :func:`divergence_keep`."""
    z, c, _ = prefix_thresholds(divergence, mask, tr)
    away = ((advantages > 0) & (ratio > 1)) | ((advantages < 0) & (ratio < 1))
    return ~(away & ~(z <= c))


def second_moment_keep(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       tau_m2: float) -> torch.Tensor:
    """M2PO's mask (arXiv 2510.01161 Algorithm 1): among the trust-region tokens T (response tokens with A > 0 and
    r > 1, or A < 0 and r < 1), block those of largest M̂2_i = (log r_i)² until the mean over T of the rest is
    ≤ τ_M2. The running mean of ascending values never decreases, so the kept ones are the longest ascending prefix
    whose mean is ≤ τ_M2 (no host synchronisation). Over the whole ``[B, T]`` batch."""
    trust = m2po_trust_region(log_ratio, advantages, mask)
    second_moment = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).double().square().reshape(-1)
    flat_trust = trust.reshape(-1)
    ordered, order = torch.where(flat_trust, second_moment, math.inf).sort(stable=True)
    count = torch.arange(1, ordered.numel() + 1, device=ordered.device, dtype=torch.float64)
    prefix_mean = torch.where(torch.isfinite(ordered), ordered, 0.0).cumsum(0) / count
    kept = ((prefix_mean <= tau_m2) & (count <= flat_trust.sum())).sum()
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return ~(flat_trust & (rank >= kept)).reshape(mask.shape)


def m2po_trust_region(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The tokens M2PO constrains (arXiv 2510.01161 sec. 5.2, as PPO's clip would): A > 0 & r > 1 or A < 0 & r < 1."""
    return mask & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))


def relaxed_clip_range(behavior_prob, tr: TrustRegion) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """The α study (sec:training_efficiency): ε = ∞ for tokens with μ < α on the relaxed side(s)."""
    if tr.relax == "none":
        return tr.eps_low, tr.eps_high
    low_prob = behavior_prob < tr.alpha
    inf = torch.full_like(behavior_prob, math.inf)
    eps_low = torch.where(low_prob, inf, tr.eps_low) if tr.relax in ("low", "both") else tr.eps_low
    eps_high = torch.where(low_prob, inf, tr.eps_high) if tr.relax in ("high", "both") else tr.eps_high
    return eps_low, eps_high


def importance_weight(tr: TrustRegion, logp, behavior_logp, recomputed_logp, mask) -> tuple[torch.Tensor, ...]:
    """w_t of :data:`IS_WEIGHTS` and where its truncation ``min(·, C)`` bit. All inputs detached fp32 ``[B, T]``.

    ``behavior``: min(π_θ/μ, C) (eq:unified_grad). ``decoupled_*``: (π_θ/π_θ')·min(ρ, C), ρ = π_θ'/μ per token or
    ∏_t π_θ'/μ over the response (SkyRL ``off_policy_correction_utils.compute_tis_ratio``). ``proximal``: π_θ/π_θ'.
    """
    if tr.is_weight == "behavior":
        log_truncated, log_untruncated = logp - behavior_logp, torch.zeros_like(logp)
    elif tr.is_weight == "proximal":
        log_truncated, log_untruncated = torch.zeros_like(logp), logp - recomputed_logp
    else:
        log_truncated, log_untruncated = recomputed_logp - behavior_logp, logp - recomputed_logp
        if tr.is_weight == "decoupled_seq":
            log_truncated = sequence_log_ratio(log_truncated, mask, mean=False).expand_as(logp)
    log_cap = math.log(tr.is_cap) if math.isfinite(tr.is_cap) and tr.is_weight != "proximal" else math.inf
    log_weight = log_truncated.clamp(max=log_cap) + log_untruncated
    return log_weight.clamp(max=MAX_LOG_RATIO).exp(), log_truncated > log_cap


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, *, mean: bool) -> torch.Tensor:
    """``[B, 1]``: the sum (log of the product) or the mean (log of the geometric mean) of ``log_ratio`` over each
    row's response tokens ``mask``; 0 for a row without any."""
    total = torch.where(mask, log_ratio, 0.0).sum(-1, keepdim=True)
    return total / mask.sum(-1, keepdim=True).clamp(min=1) if mean else total


def band_keep(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``low ≤ exp(log_ratio) ≤ high``, compared in log space (``low`` 0: no lower bound, ``high`` ∞: no upper)."""
    keep = torch.ones_like(log_ratio, dtype=torch.bool)
    if low > 0:
        keep &= log_ratio >= math.log(low)
    if math.isfinite(high):
        keep &= log_ratio <= math.log(high)
    return keep


def mismatch_keep(tr: TrustRegion, recomputed_logp, behavior_logp, mask) -> torch.Tensor:
    """The mask on ρ_t = π_θ'/μ of :data:`MISMATCH_MASKS` (all True for ``none``). Inputs detached fp32 ``[B, T]``.

    ``token``: ρ_t in the band (OpenRLHF ``loss.py`` icepop; AReaL ``apply_rejection_sampling``, token level).
    ``seq_geo``: the response's exp(mean_t log ρ_t) in the band (SkyRL ``compute_sequence_mask``, geometric).
    """
    if tr.mismatch_mask == "none":
        return torch.ones_like(mask, dtype=torch.bool)
    log_rho = recomputed_logp - behavior_logp
    if tr.mismatch_mask == "seq_geo":
        log_rho = sequence_log_ratio(log_rho, mask, mean=True).expand_as(log_rho)
    return band_keep(log_rho, tr.mismatch_low, tr.mismatch_high)


def kl_penalty(logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor, kl_tau: float) -> torch.Tensor:
    """τ·log²(π_θ/μ) on every response token, with gradient 2τ·log(π_θ/μ)·∇log π_θ (prime-rl ``loss.py``
    ``default_loss_fn``: added to the per-token loss of masked and kept tokens alike, aggregated with it)."""
    log_ratio = torch.where(mask, logp - behavior_logp, 0.0)
    return kl_tau * log_ratio.square()


def drpo_regularizer(logp: torch.Tensor, anchor_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     delta: float) -> torch.Tensor:
    """DRPO's regularizer (arXiv 2606.09821 eq. 8) on every response token: ``|A_t|·μ·(r_t − 1)²/(2δ)``, μ the anchor's
    probability and r_t = π_θ/μ (log r clamped at :data:`MAX_LOG_RATIO`), written ``(π − μ)·(r − 1)`` so that it stays
    finite at r = e^60. With the policy term −r_t·A_t its gradient is −r_t·A_t·ω_t·∇log π_θ, ω_t of
    :func:`drpo_weight`."""
    log_ratio = torch.where(mask, logp - anchor_logp, 0.0).clamp(max=MAX_LOG_RATIO)
    ratio = log_ratio.exp()
    shift = anchor_logp.exp() * (ratio - 1)  # π − μ, through r
    return advantages.abs() * shift * (ratio - 1) / (2 * delta)


def drpo_weight(prob: torch.Tensor, anchor_prob: torch.Tensor, advantages: torch.Tensor, delta: float) -> torch.Tensor:
    """DRPO's gradient weight (arXiv 2606.09821 Table 1): ``ω_t = 1 − sign(A_t)·(π − μ)/δ`` = 1 − sign(A_t(r_t − 1))·
    |π − μ|/δ, in [1 − 1/δ, 1 + 1/δ]: below 1 for a move away from μ, 0 at |π − μ| = δ, negative (corrective)
    beyond, above 1 for a move back."""
    return 1 - torch.sign(advantages) * (prob - anchor_prob) / delta


# --------------------------------------------------------------------------------------------- later fields (pure)


ROLLOUT_CORR_LOG_BOUND = 20.0
"""verl clamps log r to ``[−20, 20]`` before its k2/k3 statistics (``rollout_corr_helper.SAFETY_BOUND``) and SAPO's
ratio (``core_algos.compute_policy_loss_sapo``); the rules that follow those sources do the same."""
GSPO_LOG_RATIO_CAP = 10.0
"""verl's ``compute_policy_loss_gspo`` clamps log s_i at 10 (``torch.clamp(..., max=10.0)``): above it no gradient
passes."""


def k2_divergence(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k2 per token, ``½ (log r)²`` (verl ``rollout_corr_helper.compute_rollout_rejection_mask``
    ``token_k2``; log r clamped at :data:`ROLLOUT_CORR_LOG_BOUND`). Symmetric in the direction of the move."""
    return 0.5 * log_ratio.clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND).square()


def k3_divergence(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 per token, ``r − 1 − log r`` with r = π/μ: ≥ 0, an unbiased estimate of KL(μ ‖ π) under μ's
    samples (verl ``token_k3``, ``compute_offpolicy_metrics`` ``k3_kl``; log r clamped at
    :data:`ROLLOUT_CORR_LOG_BOUND`)."""
    log_ratio = log_ratio.clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND)
    return log_ratio.exp() - 1 - log_ratio


def sequence_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, 1]``: the max of ``values`` over each row's response tokens ``mask`` (0 for a row without any), as verl's
    ``_sequence_max``."""
    largest = torch.where(mask, values, -math.inf).amax(-1, keepdim=True)
    return torch.where(torch.isneginf(largest), 0.0, largest)


def sequence_statistic_keep(divergence: torch.Tensor, mask: torch.Tensor, bound: float, reduce: str) -> torch.Tensor:
    """TRM's sequence mask (arXiv 2512.23075; verl ``compute_rollout_rejection_mask`` ``seq_max_*``/``seq_mean_*``):
    every token of a row is kept iff the ``max`` or ``mean`` of its response tokens' ``divergence`` is ≤ ``bound``
    (a NaN statistic counts as outside). ``[B, T]``, the same for every token of a row."""
    statistic = sequence_max(divergence, mask) if reduce == "max" else sequence_log_ratio(divergence, mask, mean=True)
    return (statistic <= bound).expand_as(divergence)


def off_policy_sequence_keep(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                             delta: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL ``GRPOTrainer.get_off_policy_mask``): keep t iff A_t ≥ 0 or the
    row's mean of ``log μ − log π_θ`` over its response tokens is ≤ δ (``log_ratio`` = log π_θ − log μ)."""
    mean_log_mu_over_pi = -sequence_log_ratio(log_ratio, mask, mean=True)
    return (advantages >= 0) | (mean_log_mu_over_pi <= delta)


def directional_sequence_keep(anchor_logp: torch.Tensor, behavior_logp: torch.Tensor, advantages: torch.Tensor,
                              mask: torch.Tensor, delta: float) -> torch.Tensor:
    """VACO's mask as open-instruct PR #1755 computes it (``grpo_utils.compute_rho_correction``, ``vaco`` with
    ``tv``): block t iff the row's mean binary TV ``|π_θ' − μ|`` over its response tokens exceeds δ and the update of
    t moves π_θ' further from μ, ``sign(log π_θ' − log μ)·A_t > 0``. ``anchor_logp`` is log π_θ'."""
    tv = torch.where(mask, (anchor_logp.exp() - behavior_logp.exp()).abs(), 0.0)
    outside = sequence_log_ratio(tv, mask, mean=True) > delta
    moving_away = torch.sign(anchor_logp - behavior_logp) * advantages > 0
    return ~(outside & moving_away)


def symmetric_band_keep(divergence: torch.Tensor, delta: float) -> torch.Tensor:
    """The IPO band (prime-rl ``loss.py`` ``ipo_loss_fn``): keep t iff D_t = |π − μ| ≤ δ, whatever the sign of A_t and
    the direction of the move (a NaN D counts as outside)."""
    return divergence <= delta


def gspo_keep(sequence_log_ratio_: torch.Tensor, advantages: torch.Tensor, eps_low: float,
              eps_high: float) -> torch.Tensor:
    """GSPO's clip as a mask (arXiv 2507.18071; verl ``compute_policy_loss_gspo``): PPO's clip (:func:`ratio_keep`)
    on the sequence ratio s_i = exp(mean_t log r_t), and no gradient where log s_i > :data:`GSPO_LOG_RATIO_CAP`."""
    capped = sequence_log_ratio_ <= GSPO_LOG_RATIO_CAP
    ratio = sequence_log_ratio_.clamp(max=GSPO_LOG_RATIO_CAP).exp()
    return ratio_keep(ratio, advantages, eps_low, eps_high) & capped


def sapo_gate_slope(ratio: torch.Tensor, advantages: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """f'(r) of SAPO's gate f(r) = σ(τ(r − 1))·4/τ (arXiv 2511.20347; verl ``compute_policy_loss_sapo``
    ``gate_function``): ``4σ(τ(r − 1))(1 − σ(τ(r − 1)))``, τ = τ_pos where A > 0 and τ_neg elsewhere. 1 at r = 1,
    falling smoothly on both sides: a soft trust region. The gradient of −f(r)·A is −r·f'(r)·A·∇log π_θ."""
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1))
    return 4 * gate * (1 - gate)


def prefix_min_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MinPRO's weight in log space (arXiv 2601.22718): ``min_{j ≤ t} log r_j`` over the row's response tokens up to
    and including t (the prefix ratio ∏_{j ≤ t} r_j's non-cumulative surrogate); 0 off the response."""
    running = torch.where(mask, log_ratio, math.inf).cummin(-1).values
    return torch.where(mask, running, 0.0)


DIVERGENCES = {
    "binary_tv": lambda logp, anchor_logp, topk: div.binary_tv(anchor_logp, logp),
    "binary_kl": lambda logp, anchor_logp, topk: div.binary_kl(anchor_logp, logp),
    "topk_tv": lambda logp, anchor_logp, topk: div.topk_tv(topk.behavior_logp, topk.logp, topk.valid),
    "topk_kl": lambda logp, anchor_logp, topk: div.topk_kl(topk.behavior_logp, topk.logp, topk.valid),
    "prob_drop": lambda logp, anchor_logp, topk: anchor_logp.exp() - logp.exp(),
    "ratio": lambda logp, anchor_logp, topk: ((logp - anchor_logp).clamp(max=MAX_LOG_RATIO).exp() - 1).abs(),
    "log_ratio_sq": lambda logp, anchor_logp, topk: (logp - anchor_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).square(),
    "k2": lambda logp, anchor_logp, topk: k2_divergence(logp - anchor_logp),
    "k3": lambda logp, anchor_logp, topk: k3_divergence(logp - anchor_logp),
}
"""D_t by :attr:`Rule.divergence`: binary/top-K TV or KL (eq:binary_tv, eq:binary_kl, eq:topk_tv, eq:topk_kl), ``anchor − π``, ``|r − 1|``,
M2PO's M̂2_t = (log r)², or Schulman's k2 and k3 (TRM)."""


def rule_divergence(tr: TrustRegion, logp, anchor_logp, topk: TopK | None) -> torch.Tensor:
    """The D_t the rule thresholds (:data:`DIVERGENCES`)."""
    return DIVERGENCES[RULE_TABLE[tr.rule].divergence](logp, anchor_logp, topk)


# --------------------------------------------------------------------------------------------- the rules


def keep_all(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """M_t = 1 (PG-IS, CISPO, DRPO)."""
    return torch.ones_like(x.logp, dtype=torch.bool)


def keep_in_clip_range(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """PPO's clip (:func:`ratio_keep`) on r = π_θ/anchor, relaxed for μ < α (:func:`relaxed_clip_range`)."""
    return ratio_keep(x.ratio, x.advantages, *relaxed_clip_range(x.behavior_logp.exp(), tr))


def keep_in_divergence(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """DPPO's mask (:func:`divergence_keep`, eq:dppo_obj) at δ."""
    return divergence_keep(x.ratio, x.advantages, x.divergence, tr.delta, tr.mask_side)


def keep_but_negative_drops(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """Takeaway 3's mask (:func:`negative_keep`) at δ."""
    return negative_keep(x.anchor_logp.exp(), x.logp.exp(), x.advantages, tr.delta)


def keep_in_prefix_budget(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """CPPO's mask (:func:`prefix_budget_keep`)."""
    return prefix_budget_keep(x.ratio, x.advantages, x.divergence, x.mask, tr)


def keep_in_second_moment(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """M2PO's mask (:func:`second_moment_keep`) at τ_M2."""
    return second_moment_keep(x.logp - x.anchor_logp, x.advantages, x.mask, tr.tau_m2)


def drpo_term(logp: torch.Tensor, x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """DRPO's regularizer (:func:`drpo_regularizer`) from log π_θ with its gradient."""
    return drpo_regularizer(logp, x.anchor_logp, x.advantages, x.mask, tr.delta)


def drpo_metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> dict[str, torch.Tensor]:
    """ω_t of :func:`drpo_weight` over the A ≠ 0 tokens (``drpo/weight_mean``, ``drpo/weight_min``, and
    ``drpo/corrective_fraction``, ω_t < 0: beyond the boundary) and the regularizer's mean per response token."""
    active = x.mask & (x.advantages != 0)
    weight = drpo_weight(x.logp.exp(), x.anchor_logp.exp(), x.advantages, tr.delta)
    return {
        "drpo/weight_mean": masked_mean(weight, active),
        "drpo/weight_min": -_masked_max(-weight, active),
        "drpo/corrective_fraction": _fraction(weight < 0, active),
        "drpo/regularizer_mean": masked_mean(drpo_term(x.logp, x, tr), x.mask),
    }


def cppo_metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> dict[str, torch.Tensor]:
    """``cppo/budget_mask_fraction``, the A ≠ 0 tokens the prefix budget blocked although Z_t ≤ δ, and the mean
    per-response budget δ_b^seq."""
    z, _, budget = prefix_thresholds(x.divergence, x.mask, tr)
    return {
        "cppo/budget_mask_fraction": _fraction(~keep & (z <= tr.delta), x.mask & (x.advantages != 0)),
        "cppo/delta_b_mean": masked_mean(budget, x.mask.any(-1, keepdim=True)),
    }


def m2po_metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> dict[str, torch.Tensor]:
    """M̂2 over the trust-region tokens before and after the mask (Algorithm 1's quantity; ``divergence/mean`` is
    eq. 4's over all tokens), the masked fraction of the response tokens and the fraction that are trust-region
    tokens."""
    trust = m2po_trust_region(x.logp - x.anchor_logp, x.advantages, x.mask)
    return {
        "m2po/m2_before": masked_mean(x.divergence, trust),
        "m2po/m2_after": masked_mean(x.divergence, trust & keep),
        "m2po/masked_fraction": _fraction(~keep, x.mask),
        "m2po/trust_region_fraction": _fraction(trust, x.mask),
    }


register_rule("none", Rule("ratio", keep_all))  # PG-IS, CISPO: M_t = 1
register_rule("ratio", Rule("ratio", keep_in_clip_range, threshold="eps"))  # PPO's clip mask (eq:ppo-clip)
register_rule("binary_tv", Rule("binary_tv", keep_in_divergence, threshold="delta"))  # DPPO (eq:dppo_obj, eq:binary_tv)
register_rule("binary_kl", Rule("binary_kl", keep_in_divergence, threshold="delta"))  # DPPO, binary KL (eq:binary_kl)
register_rule("topk_tv", Rule("topk_tv", keep_in_divergence, threshold="delta",  # DPPO, top-K TV (eq:topk_tv)
                              binary_twin="binary_tv"))
register_rule("topk_kl", Rule("topk_kl", keep_in_divergence, threshold="delta",  # DPPO, top-K KL (eq:topk_kl)
                              binary_twin="binary_kl"))
register_rule("mask_negative", Rule("prob_drop", keep_but_negative_drops, threshold="delta"))  # Takeaway 3's mask
register_rule("drpo", Rule("binary_tv", keep_all, threshold="delta", loss_term=drpo_term,  # DRPO: M_t = 1 + penalty
                           metrics=drpo_metrics))
register_rule("cppo_topk_tv", Rule("topk_tv", keep_in_prefix_budget, threshold="delta", reads=("w_min", "delta_b"),
                                   metrics=cppo_metrics, couples_tokens=True, binary_twin="cppo_binary_tv"))  # CPPO
register_rule("cppo_binary_tv", Rule("binary_tv", keep_in_prefix_budget, threshold="delta", reads=("w_min", "delta_b"),
                                     metrics=cppo_metrics, couples_tokens=True))  # CPPO on binary TV
register_rule("m2po", Rule("log_ratio_sq", keep_in_second_moment, threshold="tau_m2", metrics=m2po_metrics,
                           couples_tokens=True))  # M2PO: (log r)² until the batch's mean ≤ τ_M2


# --- later fields: sequence masks, the symmetric band, soft gates and sequence weights (a row is one turn)


def keep_in_band(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """The IPO band (:func:`symmetric_band_keep`) at δ."""
    return symmetric_band_keep(x.divergence, tr.delta)


def keep_in_clip_and_sequence_max(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """TRM-Max: PPO's clip (:func:`keep_in_clip_range`) and the row's max k2 ≤ δ (:func:`sequence_statistic_keep`)."""
    return keep_in_clip_range(x, tr) & sequence_statistic_keep(x.divergence, x.mask, tr.delta, "max")


def keep_in_clip_and_sequence_mean(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """TRM-Avg: PPO's clip and the row's mean k3 ≤ δ (:func:`sequence_statistic_keep`)."""
    return keep_in_clip_range(x, tr) & sequence_statistic_keep(x.divergence, x.mask, tr.delta, "mean")


def keep_in_clip_unless_off_policy(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """DeepSeek-V3.2: PPO's clip and the off-policy sequence mask on μ (:func:`off_policy_sequence_keep`)."""
    log_ratio = x.logp - x.behavior_logp
    return keep_in_clip_range(x, tr) & off_policy_sequence_keep(log_ratio, x.advantages, x.mask, tr.delta)


def keep_in_clip_and_directional_sequence(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """VACO: PPO's clip on π_θ/π_θ' and :func:`directional_sequence_keep` on π_θ' against μ."""
    vaco = directional_sequence_keep(x.anchor_logp, x.behavior_logp, x.advantages, x.mask, tr.delta)
    return keep_in_clip_range(x, tr) & vaco


def gspo_log_ratio(x: MaskInputs) -> torch.Tensor:
    """log s_i = mean_t log(π_θ/anchor) over the row's response tokens, ``[B, 1]`` (GSPO's sequence ratio)."""
    return sequence_log_ratio(x.logp - x.anchor_logp, x.mask, mean=True)


def keep_in_sequence_clip(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """GSPO's mask (:func:`gspo_keep`) on the row's s_i."""
    return gspo_keep(gspo_log_ratio(x), x.advantages, tr.eps_low, tr.eps_high)


def sequence_ratio_weight(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """GSPO's w_t = s_i (the gradient of s_{i,t} = sg[s_i]·π_θ/sg[π_θ] is s_i·∇log π_θ(a_t))."""
    return gspo_log_ratio(x).clamp(max=GSPO_LOG_RATIO_CAP).exp().expand_as(x.logp)


def keep_inside_log_bound(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """SAPO's M_t: 1 but where verl's clamp of log r at ±:data:`ROLLOUT_CORR_LOG_BOUND` passes no gradient."""
    return (x.logp - x.anchor_logp).abs() <= ROLLOUT_CORR_LOG_BOUND


def soft_gate_weight(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """SAPO's w_t = r_t·f'(r_t) (:func:`sapo_gate_slope`)."""
    ratio = (x.logp - x.anchor_logp).clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND).exp()
    return ratio * sapo_gate_slope(ratio, x.advantages, tr.tau_pos, tr.tau_neg)


def prefix_min_weight(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """MinPRO's w_t = min_{j ≤ t} r_j (:func:`prefix_min_log_ratio`)."""
    return prefix_min_log_ratio(x.logp - x.anchor_logp, x.mask).clamp(max=MAX_LOG_RATIO).exp()


def sequence_masked_metrics(prefix: str):
    """Metrics of a sequence-level mask: ``<prefix>/seq_masked_fraction``, the rows with a response token whose every
    A ≠ 0 token the rule blocked, and ``<prefix>/masked_fraction`` over the A ≠ 0 tokens."""

    def metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> dict[str, torch.Tensor]:
        active = x.mask & (x.advantages != 0)
        rows = active.any(-1)
        whole = rows & ~(keep & active).any(-1)
        return {f"{prefix}/seq_masked_fraction": _fraction(whole, rows),
                f"{prefix}/masked_fraction": _fraction(~keep, active)}

    return metrics


def own_weight_metrics(prefix: str):
    """``<prefix>/weight_mean`` and ``<prefix>/weight_min`` of the rule's own w_t over the A ≠ 0 tokens."""

    def metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> dict[str, torch.Tensor]:
        active = x.mask & (x.advantages != 0)
        weight = RULE_TABLE[tr.rule].weight(x, tr)
        return {f"{prefix}/weight_mean": masked_mean(weight, active), f"{prefix}/weight_min": -_masked_max(-weight, active)}

    return metrics


register_rule("ipo", Rule("binary_tv", keep_in_band, threshold="delta"))  # IPO: |π − μ| ≤ δ whatever A
register_rule("trm_max", Rule("k2", keep_in_clip_and_sequence_max, threshold="eps", reads=("delta",),
                              metrics=sequence_masked_metrics("trm"), couples_tokens=True))  # TRM-Max
register_rule("trm_avg", Rule("k3", keep_in_clip_and_sequence_mean, threshold="eps", reads=("delta",),
                              metrics=sequence_masked_metrics("trm"), couples_tokens=True))  # TRM-Avg
register_rule("opsm", Rule("ratio", keep_in_clip_unless_off_policy, threshold="eps", reads=("delta",),
                           metrics=sequence_masked_metrics("opsm"), couples_tokens=True))  # DeepSeek-V3.2's mask
register_rule("vaco", Rule("ratio", keep_in_clip_and_directional_sequence, threshold="eps", reads=("delta",),
                           metrics=sequence_masked_metrics("vaco"), couples_tokens=True))  # VACO
register_rule("gspo", Rule("ratio", keep_in_sequence_clip, threshold="eps", weight=sequence_ratio_weight,
                           metrics=own_weight_metrics("gspo"), couples_tokens=True))  # GSPO: s_i, clipped
register_rule("sapo", Rule("ratio", keep_inside_log_bound, reads=("tau_pos", "tau_neg"), weight=soft_gate_weight,
                           metrics=own_weight_metrics("sapo")))  # SAPO: the soft gate's slope
register_rule("minpro", Rule("ratio", keep_all, weight=prefix_min_weight, metrics=own_weight_metrics("minpro"),
                             couples_tokens=True))  # MinPRO: min_{j ≤ t} r_j


def mask_inputs(tr: TrustRegion, logp, anchor_logp, behavior_logp, advantages, topk=None, mask=None) -> MaskInputs:
    """The :class:`MaskInputs` of a batch under ``tr``, its divergence D_t computed. All inputs detached fp32
    ``[B, T]``; ``mask`` (the response tokens) is required by the rules that couple tokens."""
    if tr.couples_tokens and mask is None:
        raise ValueError(f"trust region {tr.name!r} masks a token by the others: pass the response mask")
    divergence = rule_divergence(tr, logp, anchor_logp, topk)
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask
    return MaskInputs(logp, anchor_logp, behavior_logp, advantages, mask, divergence)


def trust_region_keep(tr: TrustRegion, logp, anchor_logp, behavior_logp, advantages, topk=None, mask=None):
    """The mask M_t of ``tr`` and the divergence it thresholded (inputs as :func:`mask_inputs`'s)."""
    inputs = mask_inputs(tr, logp, anchor_logp, behavior_logp, advantages, topk, mask)
    return RULE_TABLE[tr.rule].keep(inputs, tr), inputs.divergence


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
        mask: ``[B, T]`` bool, True on response tokens; a row is one response (one turn), the sequence the
            sequence-level rules (``decoupled_seq``, ``seq_geo``) aggregate over.
        recomputed_logp: ``[B, T]`` log π_θ'(a_t|s_t), needed when ``tr.needs_recompute``.
        topk: the top-K set with μ's and π_θ's log-probs, needed when ``tr.uses_topk``.
    """
    _check_inputs(logp, behavior_logp, advantages, mask, tr, recomputed_logp, topk)
    rule = RULE_TABLE[tr.rule]
    response = mask.bool()
    with torch.no_grad():
        finite = finite_tokens(logp.detach(), behavior_logp, advantages, recomputed_logp, topk)
        mask = response & finite  # a token with a non-finite input is masked: no NaN reaches the loss
        lp, mu, adv, recomputed = (None if x is None else torch.where(finite, x.detach().float().expand_as(finite), 0.0)
                                   for x in (logp, behavior_logp, advantages, recomputed_logp))
        _check_logprobs_at_most_zero(mask, logp=lp, behavior_logp=mu, recomputed_logp=recomputed)
        anchor = mu if tr.anchor == "behavior" else recomputed
        inputs = mask_inputs(tr, lp, anchor, mu, adv, topk, mask)
        keep = rule.keep(inputs, tr) & mask & mismatch_keep(tr, recomputed, mu, mask)
        if rule.weight is None:
            is_weight, truncated = importance_weight(tr, lp, mu, recomputed, mask)
        else:
            is_weight, truncated = rule.weight(inputs, tr), torch.zeros_like(mask)
        coefficient = torch.where(keep, adv * is_weight, 0.0)
    logp32 = torch.where(finite, logp.float(), 0.0)
    # value −M·w·A; gradient −M·w·A·∇log π (exp(x − sg(x)) is 1 with gradient ∇x)
    surrogate = torch.exp(torch.where(mask, logp32 - lp, 0.0))
    loss = -coefficient * surrogate
    if rule.loss_term is not None:
        loss = loss + rule.loss_term(logp32, inputs, tr)
    if tr.kl_tau > 0:
        loss = loss + kl_penalty(logp32, mu, mask, tr.kl_tau)
    extra = mismatch_diagnostics(lp, mu, mask, is_weight)
    extra.update(rule.metrics(inputs, keep, tr) if rule.metrics is not None else {})
    extra["nonfinite"] = (response & ~finite).sum()
    metrics = trust_region_metrics(lp, mu, adv, mask, keep, inputs.divergence, mask & truncated, extra=extra)
    return PolicyLossOutput(loss=loss, keep=keep, divergence=inputs.divergence, metrics=metrics)


LOGPROB_TOLERANCE = 1e-4
"""How far above 0 a log-probability may round (a log-softmax never exceeds 0; an inference engine's may by a hair)."""


def finite_tokens(logp, behavior_logp, advantages, recomputed_logp=None, topk: TopK | None = None) -> torch.Tensor:
    """``[B, T]``: True where every input of the token is finite (its log-probs, its advantage, its top-K log-probs
    but for the padding slots, where μ may be −∞). :func:`policy_loss` masks the others and counts them in its
    ``nonfinite`` metric."""
    finite = torch.isfinite(logp) & torch.isfinite(behavior_logp) & torch.isfinite(advantages).expand_as(logp)
    if recomputed_logp is not None:
        finite &= torch.isfinite(recomputed_logp)
    if topk is not None:
        finite &= ~(topk.valid & (torch.isnan(topk.behavior_logp) | torch.isnan(topk.logp))).any(-1)
    return finite


def _check_logprobs_at_most_zero(mask: torch.Tensor, **logprobs: torch.Tensor | None) -> None:
    """A log-probability is at most 0 (beyond :data:`LOGPROB_TOLERANCE`): a larger one is no probability, e.g. a
    logit or a probability passed where a log-probability belongs."""
    for name, values in logprobs.items():
        if values is not None and bool((mask & (values > LOGPROB_TOLERANCE)).any()):
            worst = float(torch.where(mask, values, -math.inf).max())
            raise ValueError(f"{name} holds values > 0 (up to {worst:.4g}): it must be log-probabilities (≤ 0), not "
                             "logits or probabilities")


def _check_inputs(logp, behavior_logp, advantages, mask, tr, recomputed_logp, topk) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    if logp.numel() == 0:
        raise ValueError(f"logp holds no token (shape {tuple(logp.shape)}): give a batch of at least one response "
                         "token")
    for name, tensor in (("behavior_logp", behavior_logp), ("mask", mask), ("recomputed_logp", recomputed_logp)):
        if tensor is not None and tensor.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape, (logp.shape[0], 1)):
        raise ValueError(f"advantages must be [B, 1] or [B, T], got {tuple(advantages.shape)}")
    if tr.needs_recompute and recomputed_logp is None:
        raise ValueError(f"trust region {tr.name!r} reads the recomputed π_θ': pass recomputed_logp")
    if tr.uses_topk:
        if topk is None:
            raise ValueError(f"trust region {tr.name!r} needs the top-K set: pass topk=TopK(...)")
        if topk.ids.shape != (*logp.shape, tr.k + 1):
            raise ValueError(f"topk is {tuple(topk.ids.shape)}, expected [{logp.shape[0]}, {logp.shape[1]}, K + 1 = "
                             f"{tr.k + 1}]: TopK(μ, {tr.k}) ∪ {{a_t}} (tr.k is {tr.k})")


# --------------------------------------------------------------------------------------------- metrics


SHADOW_CLIP_RANGES = {"ppo": (0.2, 0.2), "grpo_clip_higher": (0.2, 0.28)}
"""The paper's two ratio clips ``(ε_low, ε_high)`` every run also reports as shadow masks (and tokens.jsonl as
decisions)."""
SHADOW_MISMATCH_PRESETS = ("icepop", "seq_geo_mask")
"""The mismatch masks every run also reports as shadows (their bands from :data:`PRESETS`)."""
_SHADOW_TRUST_REGIONS = {name: TrustRegion.preset(name) for name in SHADOW_MISMATCH_PRESETS}


def trust_region_metrics(logp, behavior_logp, advantages, mask, keep, divergence, truncated,
                         extra: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Batch statistics of the trust region (sec:stability): mask fractions by sign of A (A ≠ 0 tokens only),
    training-inference mismatch |π − μ|, bad updates, IS truncation (``truncated``: tokens whose w_t hit C), and the
    *shadow masks*: what ``ppo`` and ``grpo_clip_higher`` would have blocked on the same batch, by μ bucket
    (sec:method_limitations), and what ``icepop`` and ``seq_geo_mask`` would have masked. The shadows read the
    current π_θ in place of π_θ' (equal on a rollout batch's first minibatch), so every run reports them. ``extra``:
    0-d statistics of the rule's own (:attr:`Rule.metrics`), reported after these.

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
        "mismatch/abs_diff_mean": masked_mean(abs_diff, mask),
        "mismatch/abs_diff_max": _masked_max(abs_diff, mask),
        "bad_update/fraction": _fraction(neg & (mu_prob - prob >= BAD_UPDATE_THRESHOLD), active),
        "is/truncated_fraction": _fraction(truncated, mask),
        "ratio/mean": masked_mean(ratio, mask),
        "divergence/mean": masked_mean(divergence, mask),
        "divergence/max": _masked_max(divergence, mask),
    }
    for preset, (eps_low, eps_high) in SHADOW_CLIP_RANGES.items():
        shadow_blocked = mask & ~ratio_keep(ratio, advantages, eps_low, eps_high)
        stats.update(_shadow_stats(preset, shadow_blocked, active, mu_prob))
    mismatch_blocked = {preset: mask & ~mismatch_keep(tr, logp, behavior_logp, mask)
                        for preset, tr in _SHADOW_TRUST_REGIONS.items()}
    for preset, shadow_blocked in mismatch_blocked.items():
        stats.update(_shadow_stats(preset, shadow_blocked, active, mu_prob))
    stats["shadow/seq_geo_mask/sequence_fraction"] = _fraction(mismatch_blocked["seq_geo_mask"].any(-1), mask.any(-1))
    stats.update(sign_cell_stats(blocked, active, advantages, prob, mu_prob, behavior_logp, logp))
    stats.update({key: value.to(stats["tokens"].dtype) for key, value in (extra or {}).items()})
    values = torch.stack(list(stats.values())).tolist()
    return dict(zip(stats.keys(), values))


OVER_DELTA_KL = 0.05
"""The binary KL between μ and π_θ (anchored on μ) above which ``over_delta/*`` counts a token: DPPO-Binary-KL's δ."""
SIGN_CELLS = (("pos_adv", "mu_above"), ("pos_adv", "mu_below"), ("neg_adv", "mu_above"), ("neg_adv", "mu_below"))
"""Sign of Â × sign of μ − π: ``mu_above`` is μ(a_t) > π_θ(a_t) (the rollout engine over-weights the token)."""


def sign_cell_stats(blocked, active, advantages, prob, mu_prob, behavior_logp, logp) -> dict[str, torch.Tensor]:
    """Shares of the A ≠ 0 tokens by sign of Â and of μ − π (:data:`SIGN_CELLS`): ``over_delta/<cell>``, tokens
    whose binary KL to μ exceeds :data:`OVER_DELTA_KL` whatever the rule did (so a run without a mask reports
    where a μ-anchored mask would act), and ``mask_cell/<cell>_<μ bucket>``, the tokens the run's mask blocked."""
    over = active & (div.binary_kl(behavior_logp, logp) > OVER_DELTA_KL)
    signs = {"pos_adv": advantages > 0, "neg_adv": advantages < 0, "mu_above": mu_prob > prob,
             "mu_below": mu_prob < prob}
    stats = {}
    for adv, direction in SIGN_CELLS:
        cell = signs[adv] & signs[direction]
        stats[f"over_delta/{adv}_{direction}"] = _fraction(over & cell, active)
        for low, high, bucket in MU_BUCKETS:
            in_bucket = cell & (mu_prob >= low) & (mu_prob < high)
            stats[f"mask_cell/{adv}_{direction}_{bucket}"] = _fraction(blocked & in_bucket, active)
    return stats


def mismatch_diagnostics(logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor,
                         is_weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far π_θ is from μ on a batch, under the names other frameworks log, as 0-d tensors (inputs detached fp32
    ``[B, T]``; ``is_weight`` the loss's w_t). A sequence is a row (one turn); the statistics over sequences take
    the rows with a response token.

    verl ``rollout_corr_helper.compute_offpolicy_metrics`` (under ``rollout_corr/``): ``kl`` (mean log μ − log π),
    ``k3_kl`` (mean r − 1 − log r, r = π/μ), ``chi2_token`` (mean r² − 1) and ``chi2_seq`` (mean over sequences of
    (∏ r)² − 1, log ∏ r clamped at ±20), ``training_ppl`` / ``rollout_ppl`` (mean over sequences of exp(−mean log π) /
    of μ), ``log_ppl_diff`` and ``ppl_ratio`` (mean over sequences of mean log μ − mean log π, and of its exp);
    ``compute_is_metrics``'s ``rollout_is_eff_sample_size``, 1/mean((w/mean w)²) over the response tokens, here of
    the loss's own w_t. ``k3_kl_seq`` (this project's: verl logs no sequence k3) is the mean over sequences of
    Σ_t k3, an estimate of the sequence-level KL(μ ‖ π). SkyRL ``trainer.py``:
    ``policy/rollout_train_logprobs_abs_diff_{mean,std,max}`` of |log π − log μ| (std with Bessel's correction).
    ``mismatch/abs_diff_std`` is the std of |π − μ| beside :func:`trust_region_metrics`'s mean and max."""
    log_ratio = torch.where(mask, (logp - behavior_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)
    rows = mask.any(-1)
    sum_log_ratio = log_ratio.sum(-1)
    bounded = log_ratio.clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND)
    k3 = torch.where(mask, log_ratio.exp() - 1 - log_ratio, 0.0)
    mean_logp = sequence_log_ratio(logp, mask, mean=True).squeeze(-1)
    mean_mu = sequence_log_ratio(behavior_logp, mask, mean=True).squeeze(-1)
    log_ppl_diff = mean_mu - mean_logp
    weight = torch.where(mask, is_weight, 0.0)
    weight = weight / weight.amax().clamp(min=torch.finfo(weight.dtype).tiny)  # ESS is scale-free; w² stays finite
    ess = masked_mean(weight, mask).square() / masked_mean(weight.square(), mask).clamp(min=torch.finfo(weight.dtype).tiny)
    abs_log_diff = log_ratio.abs()
    abs_diff = (logp.exp() - behavior_logp.exp()).abs()
    return {
        "rollout_corr/kl": masked_mean(-log_ratio, mask),
        "rollout_corr/k3_kl": masked_mean(k3, mask),
        "rollout_corr/k3_kl_seq": masked_mean(k3.sum(-1), rows),
        "rollout_corr/chi2_token": masked_mean((2 * bounded).exp(), mask) - 1,
        "rollout_corr/chi2_seq": masked_mean((2 * sum_log_ratio.clamp(-20.0, 20.0)).exp(), rows) - 1,
        "rollout_corr/training_ppl": masked_mean((-mean_logp).exp(), rows),
        "rollout_corr/rollout_ppl": masked_mean((-mean_mu).exp(), rows),
        "rollout_corr/log_ppl_diff": masked_mean(log_ppl_diff, rows),
        "rollout_corr/ppl_ratio": masked_mean(log_ppl_diff.exp(), rows),
        "rollout_corr/rollout_is_eff_sample_size": torch.where(mask.any(), ess, 1.0),
        "policy/rollout_train_logprobs_abs_diff_mean": masked_mean(abs_log_diff, mask),
        "policy/rollout_train_logprobs_abs_diff_std": masked_std(abs_log_diff, mask),
        "policy/rollout_train_logprobs_abs_diff_max": _masked_max(abs_log_diff, mask),
        "mismatch/abs_diff_std": masked_std(abs_diff, mask),
    }


def masked_std(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The standard deviation of ``values`` where ``mask`` holds, with Bessel's correction (torch's ``std``, as SkyRL
    takes it); 0 for fewer than two values."""
    count = mask.sum()
    centred = torch.where(mask, values - masked_mean(values, mask), 0.0)
    variance = centred.square().sum() / (count - 1).clamp(min=1)
    return torch.where(count > 1, variance.sqrt(), 0.0)


def _shadow_stats(preset: str, blocked: torch.Tensor, active: torch.Tensor, mu_prob: torch.Tensor) -> dict:
    """``shadow/<preset>/mask_fraction`` over the A ≠ 0 tokens, and by μ bucket (:data:`MU_BUCKETS`)."""
    stats = {f"shadow/{preset}/mask_fraction": _fraction(blocked, active)}
    for low, high, bucket in MU_BUCKETS:
        in_bucket = active & (mu_prob >= low) & (mu_prob < high)
        stats[f"shadow/{preset}/mask_fraction_{bucket}"] = _fraction(blocked, in_bucket)
    return stats


def _fraction(event: torch.Tensor, population: torch.Tensor) -> torch.Tensor:
    count = population.sum()
    return (event & population).sum() / count.clamp(min=1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``mask`` holds (0 where it holds nowhere)."""
    mask = mask.bool()
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    largest = torch.where(mask, values, -math.inf).max()
    return torch.where(torch.isfinite(largest), largest, 0.0)
