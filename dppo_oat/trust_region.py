"""The trust region of every method in the paper, as one per-token policy loss.

All methods share the unified gradient (eq:unified_grad, app:sanity_test_details)::

    ∇L = E_μ[ Σ_t M_t · w_t · A_t · ∇ log π_θ(a_t|s_t) ],   w_t = min(r_t, C),   r_t = π_θ(a_t|s_t) / μ(a_t|s_t)

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
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from dppo_oat import divergence as div



@dataclass(frozen=True)
class Rule:
    """One mask M_t of the unified gradient (eq:unified_grad): the divergence D_t it reads (of π_θ against the
    anchor, :func:`rule_divergence`), how it decides what is kept (:func:`trust_region_keep`), and its threshold:
    ``delta`` (δ), ``eps`` (PPO's ε_low/ε_high), ``tau_m2`` (M2PO's τ_M2) or ``None``. Adding a rule is one entry
    of :data:`RULE_TABLE`."""

    divergence: str
    """``ratio`` (|r − 1|), ``binary_tv``, ``binary_kl``, ``topk_tv``, ``topk_kl``, ``prob_drop`` (anchor − π) or
    ``log_ratio_sq`` ((log r)²)."""
    keep: str
    """``all`` (M_t = 1), ``ratio`` (PPO's clip), ``divergence`` (DPPO: D_t > δ in the direction A_t pushes),
    ``negative`` (A_t < 0 and anchor − π ≥ δ blocked), ``regularize`` (M_t = 1, and DRPO's quadratic regularizer in
    the loss: :func:`drpo_regularizer`), ``prefix_budget`` (CPPO: :func:`prefix_budget_keep`) or ``second_moment``
    (M2PO: :func:`second_moment_keep`)."""
    threshold: str | None
    """``delta`` (δ), ``eps`` (ε_low/ε_high), ``tau_m2`` (M2PO's τ_M2) or None."""

    @property
    def uses_topk(self) -> bool:
        return self.divergence.startswith("topk")

    @property
    def couples_tokens(self) -> bool:
        """True when M_t reads other tokens than t: the earlier tokens of its response (``prefix_budget``) or the
        whole batch (``second_moment``). The loss is then no sum of per-token functions of log π_θ(a_t) alone."""
        return self.keep in ("prefix_budget", "second_moment")


RULE_TABLE: dict[str, Rule] = {
    "none": Rule("ratio", "all", None),  # PG-IS, CISPO: M_t = 1
    "ratio": Rule("ratio", "ratio", "eps"),  # PPO's clip mask (eq:ppo-clip)
    "binary_tv": Rule("binary_tv", "divergence", "delta"),  # DPPO (eq:dppo_obj), binary TV (eq:binary_tv)
    "binary_kl": Rule("binary_kl", "divergence", "delta"),  # DPPO, binary KL
    "topk_tv": Rule("topk_tv", "divergence", "delta"),  # DPPO, top-K TV on TopK(μ, K) ∪ {a_t} + other
    "topk_kl": Rule("topk_kl", "divergence", "delta"),  # DPPO, top-K KL
    "mask_negative": Rule("prob_drop", "negative", "delta"),  # Takeaway 3's minimal mask
    "drpo": Rule("binary_tv", "regularize", "delta"),  # DRPO: M_t = 1 plus |A|·μ·(r − 1)²/(2δ)
    "cppo_topk_tv": Rule("topk_tv", "prefix_budget", "delta"),  # CPPO, top-K TV
    "cppo_binary_tv": Rule("binary_tv", "prefix_budget", "delta"),  # CPPO, binary TV
    "m2po": Rule("log_ratio_sq", "second_moment", "tau_m2"),  # M2PO: (log r)² until the batch's mean ≤ τ_M2
}
"""Every rule by name: what it reads and how it masks (:class:`Rule`)."""
RULES = tuple(RULE_TABLE)
ANCHORS = ("behavior", "recompute")
RELAX_MODES = ("none", "low", "high", "both")
IS_WEIGHTS = ("behavior", "decoupled_token", "decoupled_seq", "proximal")
"""The IS weight w_t. ``behavior``: min(π_θ/μ, C) (eq:unified_grad). ``decoupled_token`` / ``decoupled_seq``:
(π_θ/π_θ')·min(ρ, C), with ρ = π_θ'/μ per token or ∏_t π_θ'/μ per response: the PPO ratio on the recomputed π_θ'
times the truncated IS weight of π_θ' against μ (decoupled PPO with token/sequence TIS). ``proximal``: π_θ/π_θ' (PPO
on π_θ' with no correction toward μ; C unused)."""
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
    """The numeric :class:`TrustRegion` fields a rule's loss reads: δ by the divergence rules, ``mask_negative`` and
    DRPO, ε by ``ratio`` (α only when relaxed), K by top-K, w_min and δ_b by CPPO, τ_M2 by M2PO, C unless w_t is
    ``proximal``, the band by a mismatch mask, τ by every rule. A value of any other field changes nothing."""
    read, spec = {"kl_tau"}, RULE_TABLE[rule]
    if spec.threshold in ("delta", "tau_m2"):
        read.add(spec.threshold)
    if spec.keep == "prefix_budget":
        read.update(("w_min", "delta_b"))
    if spec.threshold == "eps":
        read.update(("eps_low", "eps_high", *(("alpha",) if relax != "none" else ())))
    if spec.uses_topk:
        read.add("k")
    if is_weight != "proximal":
        read.add("is_cap")
    if mismatch_mask != "none":
        read.update(("mismatch_low", "mismatch_high"))
    return frozenset(read)


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
        is_weight: how w_t is built (see :data:`IS_WEIGHTS`).
        mismatch_mask, mismatch_low, mismatch_high: the mask on ρ_t = π_θ'/μ and its band (see
            :data:`MISMATCH_MASKS`; ``mismatch_low`` 0: no lower bound).
        kl_tau: τ of the penalty τ·log²(π_θ/μ) added to every response token's loss (0: none).
        w_min: CPPO's position weight at a response's last token (its first has 1; :func:`position_weights`).
        delta_b: CPPO's floor δ_b of the per-response prefix budget (:func:`prefix_budget`).
        tau_m2: M2PO's bound τ_M2 on the batch's second moment of log r (:func:`second_moment_keep`).
        mask_side: which half of a divergence rule's mask acts (:data:`MASK_SIDES`; the CPU study's ablation).
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
    is_weight: str = "behavior"
    mismatch_mask: str = "none"
    mismatch_low: float = 0.0
    mismatch_high: float = math.inf
    kl_tau: float = 0.0
    w_min: float = 0.8
    delta_b: float = 0.02
    tau_m2: float = 0.04
    mask_side: str = "both"
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        _check_choice("rule", self.rule, RULES)
        _check_choice("anchor", self.anchor, ANCHORS)
        _check_choice("relax", self.relax, RELAX_MODES)
        _check_choice("is_weight", self.is_weight, IS_WEIGHTS)
        _check_choice("mismatch_mask", self.mismatch_mask, MISMATCH_MASKS)
        _check_choice("mask_side", self.mask_side, MASK_SIDES)
        if self.mask_side != "both" and RULE_TABLE[self.rule].keep != "divergence":
            raise ValueError(f"mask_side={self.mask_side!r} keeps one half of a divergence mask: it needs a "
                             f"binary or top-K rule, not {self.rule!r}")
        for attr in ("delta", "eps_low", "eps_high", "is_cap", "alpha", "mismatch_low", "mismatch_high", "kl_tau",
                     "w_min", "delta_b", "tau_m2"):
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


DIVERGENCES = {
    "binary_tv": lambda logp, anchor_logp, topk: div.binary_tv(anchor_logp, logp),
    "binary_kl": lambda logp, anchor_logp, topk: div.binary_kl(anchor_logp, logp),
    "topk_tv": lambda logp, anchor_logp, topk: div.topk_tv(topk.behavior_logp, topk.logp, topk.valid),
    "topk_kl": lambda logp, anchor_logp, topk: div.topk_kl(topk.behavior_logp, topk.logp, topk.valid),
    "prob_drop": lambda logp, anchor_logp, topk: anchor_logp.exp() - logp.exp(),
    "ratio": lambda logp, anchor_logp, topk: ((logp - anchor_logp).clamp(max=MAX_LOG_RATIO).exp() - 1).abs(),
    "log_ratio_sq": lambda logp, anchor_logp, topk: (logp - anchor_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).square(),
}
"""D_t by :attr:`Rule.divergence`: binary/top-K TV or KL (eq:binary_tv, eq:topk), ``anchor − π``, ``|r − 1|``, or
M2PO's M̂2_t = (log r)²."""


def rule_divergence(tr: TrustRegion, logp, anchor_logp, topk: TopK | None) -> torch.Tensor:
    """The D_t the rule thresholds (:data:`DIVERGENCES`)."""
    return DIVERGENCES[RULE_TABLE[tr.rule].divergence](logp, anchor_logp, topk)


def trust_region_keep(tr: TrustRegion, logp, anchor_logp, behavior_logp, advantages, topk=None, mask=None):
    """The mask M_t of ``tr`` and the divergence it thresholded. All inputs detached fp32 ``[B, T]``; ``mask`` (the
    response tokens) is read by the rules that couple tokens (:attr:`TrustRegion.couples_tokens`)."""
    divergence = rule_divergence(tr, logp, anchor_logp, topk)
    ratio = (logp - anchor_logp).clamp(max=MAX_LOG_RATIO).exp()
    how = RULE_TABLE[tr.rule].keep
    if tr.couples_tokens and mask is None:
        raise ValueError(f"trust region {tr.name!r} masks a token by the others: pass the response mask")
    if how in ("all", "regularize"):
        keep = torch.ones_like(logp, dtype=torch.bool)
    elif how == "ratio":
        keep = ratio_keep(ratio, advantages, *relaxed_clip_range(behavior_logp.exp(), tr))
    elif how == "negative":
        keep = negative_keep(anchor_logp.exp(), logp.exp(), advantages, tr.delta)
    elif how == "prefix_budget":
        keep = prefix_budget_keep(ratio, advantages, divergence, mask, tr)
    elif how == "second_moment":
        keep = second_moment_keep(logp - anchor_logp, advantages, mask, tr.tau_m2)
    else:
        keep = divergence_keep(ratio, advantages, divergence, tr.delta, tr.mask_side)
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
        mask: ``[B, T]`` bool, True on response tokens; a row is one response (one turn), the sequence the
            sequence-level rules (``decoupled_seq``, ``seq_geo``) aggregate over.
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
        recomputed = None if recomputed_logp is None else recomputed_logp.detach().float()
        anchor = mu if tr.anchor == "behavior" else recomputed
        keep, divergence = trust_region_keep(tr, lp, anchor, mu, adv, topk, mask)
        keep = keep & mask & mismatch_keep(tr, recomputed, mu, mask)
        is_weight, truncated = importance_weight(tr, lp, mu, recomputed, mask)
        coefficient = torch.where(keep, adv * is_weight, 0.0)
    # value −M·w·A; gradient −M·w·A·∇log π (exp(x − sg(x)) is 1 with gradient ∇x)
    surrogate = torch.exp(torch.where(mask, logp32 - lp, 0.0))
    loss = -coefficient * surrogate
    if RULE_TABLE[tr.rule].keep == "regularize":
        loss = loss + drpo_regularizer(logp32, anchor, adv, mask, tr.delta)
    if tr.kl_tau > 0:
        loss = loss + kl_penalty(logp32, mu, mask, tr.kl_tau)
    extra = rule_metrics(tr, lp, anchor, adv, mask, keep, divergence)
    metrics = trust_region_metrics(lp, mu, adv, mask, keep, divergence, mask & truncated, extra=extra)
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
        raise ValueError(f"trust region {tr.name!r} reads the recomputed π_θ': pass recomputed_logp")
    if tr.uses_topk:
        if topk is None:
            raise ValueError(f"trust region {tr.name!r} needs the top-K set: pass topk=TopK(...)")
        if topk.ids.shape[:2] != logp.shape:
            raise ValueError(f"topk is {tuple(topk.ids.shape)}, expected [{logp.shape[0]}, {logp.shape[1]}, K']")


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
    0-d statistics of the rule's own (:func:`rule_metrics`), reported after these.

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


def rule_metrics(tr: TrustRegion, logp, anchor_logp, advantages, mask, keep, divergence) -> dict[str, torch.Tensor]:
    """0-d statistics of the later rules (none for the others; inputs as :func:`trust_region_metrics`'s).

    DRPO: ω_t of :func:`drpo_weight` over the A ≠ 0 tokens (``drpo/weight_mean``, ``drpo/weight_min``, and
    ``drpo/corrective_fraction``, ω_t < 0: beyond the boundary) and its regularizer's mean per response token.
    CPPO: ``cppo/budget_mask_fraction``, the A ≠ 0 tokens the prefix budget blocked although Z_t ≤ δ, and the mean
    per-response budget δ_b^seq. M2PO: M̂2 over the trust-region tokens before and after the mask (Algorithm 1's
    quantity; ``divergence/mean`` is eq. 4's over all tokens), the masked fraction of the response tokens and the
    fraction that are trust-region tokens.
    """
    how = RULE_TABLE[tr.rule].keep
    active = mask & (advantages != 0)
    if how == "regularize":
        weight = drpo_weight(logp.exp(), anchor_logp.exp(), advantages, tr.delta)
        return {
            "drpo/weight_mean": masked_mean(weight, active),
            "drpo/weight_min": -_masked_max(-weight, active),
            "drpo/corrective_fraction": _fraction(weight < 0, active),
            "drpo/regularizer_mean": masked_mean(drpo_regularizer(logp, anchor_logp, advantages, mask, tr.delta), mask),
        }
    if how == "prefix_budget":
        z, _, budget = prefix_thresholds(divergence, mask, tr)
        return {
            "cppo/budget_mask_fraction": _fraction(~keep & (z <= tr.delta), active),
            "cppo/delta_b_mean": masked_mean(budget, mask.any(-1, keepdim=True)),
        }
    if how == "second_moment":
        trust = m2po_trust_region(logp - anchor_logp, advantages, mask)
        return {
            "m2po/m2_before": masked_mean(divergence, trust),
            "m2po/m2_after": masked_mean(divergence, trust & keep),
            "m2po/masked_fraction": _fraction(~keep, mask),
            "m2po/trust_region_fraction": _fraction(trust, mask),
        }
    return {}


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
