"""The config: :class:`TrustRegion`, one rule of the unified gradient with its numbers, checked when built against
what the rule declares in :data:`~dppo_oat.trust_region.registry.RULE_TABLE` (the package registers the shipped rules
of :mod:`~dppo_oat.trust_region.rules` on import), and the registry of its fields (:data:`NUMBER_FIELDS`,
:data:`CHOICE_FIELDS`) that the command line, the presets and the docs read.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from dppo_oat.ranges import check_float32
from dppo_oat.trust_region.presets import PRESETS
from dppo_oat.trust_region.registry import RULE_TABLE, THRESHOLDS

ANCHORS = ("behavior", "recompute")
"""What the mask compares π_θ with: μ, or the recomputed π_θ'."""
RELAX_MODES = ("none", "low", "high", "both")
"""Which side of the clip range the α study relaxes."""
IS_WEIGHTS = ("behavior", "decoupled_token", "decoupled_seq", "proximal")
"""The choices of ``is_weight``, how w_t is built. ``behavior``: min(π_θ/μ, C) (eq:unified_grad).
``decoupled_token`` / ``decoupled_seq``: (π_θ/π_θ')·min(ρ, C), with ρ = π_θ'/μ per token or ∏_t π_θ'/μ per response:
the PPO ratio on the recomputed π_θ' times the truncated IS weight of π_θ' against μ (decoupled PPO with
token/sequence TIS). ``proximal``: π_θ/π_θ' (PPO on π_θ' with no correction toward μ; C unused)."""
MISMATCH_MASKS = ("none", "token", "seq_geo")
"""A mask on the training–inference ratio ρ_t = π_θ'/μ, kept inside ``[mismatch_low, mismatch_high]``: ``token``
masks each token outside the band (IcePop, AReaL's rejection sampling); ``seq_geo`` masks every token of a response
whose geometric mean exp(mean_t log ρ_t) leaves it (SkyRL's geometric sequence mask)."""
MASK_SIDES = ("both", "negative", "positive")
"""Which half of DPPO's mask (eq:dppo_obj) acts: ``both`` (the paper's), ``negative`` (only A<0 & r<1 & D>δ is
blocked) or ``positive`` (only A>0 & r>1 & D>δ): the CPU study's ablation of the mask's two halves."""

NUMBER_FIELDS = ("delta", "eps_low", "eps_high", "is_cap", "alpha", "k", "mismatch_low", "mismatch_high", "kl_tau",
                 "w_min", "delta_b", "tau_m2", "tau_pos", "tau_neg")
"""The :class:`TrustRegion` fields that are numbers, in their order: each is overridable (``--tr-<field>``,
``TrustRegion.preset(name, field=...)``) where the trust region reads it (:attr:`TrustRegion.fields_read`)."""
INTEGER_FIELDS = ("k",)
"""Of :data:`NUMBER_FIELDS`, the integers (K); the others are real numbers."""
REAL_FIELDS = tuple(name for name in NUMBER_FIELDS if name not in INTEGER_FIELDS)
"""Of :data:`NUMBER_FIELDS`, the real numbers."""
CHOICE_FIELDS = ("rule", "anchor", "relax", "is_weight", "mismatch_mask", "mask_side")
"""The :class:`TrustRegion` fields that name one of a few choices."""


def numeric_fields_read(rule: str, relax: str = "none", is_weight: str = "behavior",
                        mismatch_mask: str = "none") -> frozenset[str]:
    """The numeric :class:`TrustRegion` fields a rule's loss reads, from what the rule declares: the fields of its
    threshold (:data:`~dppo_oat.trust_region.registry.THRESHOLDS`; α too when the clip range is relaxed) and its
    ``reads``, K when its divergence reads the top-K set, C unless w_t is ``proximal`` or the rule's own, the band of
    a mismatch mask, τ always. A value of any other field changes nothing."""
    declared = RULE_TABLE[rule]
    read = {"kl_tau", *declared.reads, *THRESHOLDS.get(declared.threshold, ())}
    if declared.threshold == "clip_range" and relax != "none":
        read.add("alpha")
    if declared.uses_topk:
        read.add("k")
    if is_weight != "proximal" and declared.weight is None:
        read.add("is_cap")
    if mismatch_mask != "none":
        read.update(("mismatch_low", "mismatch_high"))
    return frozenset(read)


@dataclass(frozen=True)
class TrustRegion:
    """One trust-region rule of the unified gradient (eq:unified_grad). Build it with :meth:`preset`. Each field's
    docstring is also the help of its command-line override (``--tr-<field>``,
    :class:`~dppo_oat.settings.spec.DPPOFlags`)."""

    rule: str = "binary_tv"
    """Which mask M_t: a name of :data:`RULE_TABLE`."""
    delta: float = 0.15
    """divergence threshold δ (DPPO's mask, eq:dppo_obj, and the other δ masks; DRPO's regularizer weight)."""
    eps_low: float = 0.2
    """lower clip range ε_low: PPO's [1 − ε_low, 1 + ε_high] (ratio rules)."""
    eps_high: float = 0.28
    """upper clip range ε_high (ratio rules)."""
    is_cap: float = math.inf
    """IS-weight cap C of min(r, C) (inf: no truncation)."""
    anchor: str = "behavior"
    """The distribution the mask compares π_θ with: ``behavior`` (μ) or ``recompute`` (π_θ')."""
    alpha: float = 0.1
    """α of sec:training_efficiency: for μ < α the relaxed side's ε is ∞."""
    relax: str = "none"
    """Which side of the clip range is relaxed for μ < α: ``none``, ``low``, ``high`` or ``both``."""
    k: int = 20
    """K of the top-K rules' set TopK(μ, K) ∪ {a_t} (the rollout returns it with each token)."""
    is_weight: str = "behavior"
    """How w_t is built (:data:`IS_WEIGHTS`)."""
    mismatch_mask: str = "none"
    """The mask on ρ_t = π_θ'/μ (:data:`MISMATCH_MASKS`)."""
    mismatch_low: float = 0.0
    """lower bound on ρ_t = π_θ'/μ (0: none)."""
    mismatch_high: float = math.inf
    """upper bound on ρ_t = π_θ'/μ."""
    kl_tau: float = 0.0
    """τ of the penalty τ·log²(π_θ/μ) on every response token (0: none)."""
    w_min: float = 0.8
    """position weight w_min of a response's last token, in (0, 1] (CPPO; its first has 1: :func:`position_weights`)."""
    delta_b: float = 0.02
    """floor δ_b of CPPO's per-response prefix budget."""
    tau_m2: float = 0.04
    """bound τ_M2 of M2PO on the batch's mean (log r)² (inf: no mask)."""
    tau_pos: float = 1.0
    """SAPO gate temperature τ for tokens with A > 0."""
    tau_neg: float = 1.05
    """SAPO gate temperature τ for tokens with A ≤ 0."""
    mask_side: str = "both"
    """Which half of a divergence rule's mask acts: ``both``, ``negative`` or ``positive`` (:data:`MASK_SIDES`; the
    CPU study's ablation)."""
    name: str = field(default="custom", compare=False)
    """The preset this came from (for logs)."""

    def __post_init__(self) -> None:
        self._check_types()
        self._check_choices()
        self._check_numbers()

    def _check_types(self) -> None:
        """Every field has its type (a ``ValueError`` naming it, as the command line's parser would): the numbers are
        real numbers and K an integer (never a bool), the choices and the name strings."""
        for attr in REAL_FIELDS:
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{attr} must be a real number, got {type(value).__name__} {value!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, numbers.Integral):
            raise ValueError(f"k must be an integer (the K of TopK(μ, K)), got {type(self.k).__name__} {self.k!r}")
        for attr in (*CHOICE_FIELDS, "name"):
            if not isinstance(getattr(self, attr), str):
                raise ValueError(f"{attr} must be a string, got {type(getattr(self, attr)).__name__} "
                                 f"{getattr(self, attr)!r}")

    def _check_choices(self) -> None:
        """Each choice is one of its kind, and one the rule declares it takes
        (:class:`~dppo_oat.trust_region.registry.Rule`)."""
        _check_choice("rule", self.rule, tuple(RULE_TABLE))
        _check_choice("anchor", self.anchor, ANCHORS)
        _check_choice("relax", self.relax, RELAX_MODES)
        _check_choice("is_weight", self.is_weight, IS_WEIGHTS)
        _check_choice("mismatch_mask", self.mismatch_mask, MISMATCH_MASKS)
        _check_choice("mask_side", self.mask_side, MASK_SIDES)
        rule = RULE_TABLE[self.rule]
        if self.mask_side != "both" and not rule.reads_mask_side:
            raise ValueError(f"mask_side={self.mask_side!r} keeps one half of a divergence mask: it needs a "
                             f"binary or top-K rule, not {self.rule!r}")
        if self.relax != "none" and rule.threshold != "clip_range":
            raise ValueError(f"relax={self.relax!r} relaxes the PPO clip range: it needs rule='ratio'")
        if rule.uses_topk and self.anchor != "behavior":
            raise ValueError("top-K rules are anchored on μ (the rollout engine's top-K); use a binary rule")
        if rule.needs_recompute and self.anchor != "recompute":
            raise ValueError(f"rule {self.rule!r} compares the recomputed π_θ' with μ: it needs anchor='recompute'")

    def _check_numbers(self) -> None:
        """Each number is in its range (no NaN anywhere, and none past what float32, which the loss computes in,
        holds: :func:`~dppo_oat.ranges.check_float32`)."""
        for attr in REAL_FIELDS:
            if math.isnan(getattr(self, attr)):
                raise ValueError(f"{attr} is NaN")
            check_float32(attr, getattr(self, attr))
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
            raise ValueError(f"tau_pos and tau_neg (SAPO's τ) must be finite and > 0, "
                             f"got {self.tau_pos}, {self.tau_neg}")

    @property
    def uses_topk(self) -> bool:
        """True when the rule needs μ's top-K set and π_θ's log-probs on it."""
        return RULE_TABLE[self.rule].uses_topk

    @property
    def couples_tokens(self) -> bool:
        """True when the mask of a token reads other tokens
        (:attr:`~dppo_oat.trust_region.registry.Rule.couples_tokens`)."""
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
    def preset(cls, name: str, /, **overrides) -> TrustRegion:
        """The method ``name`` of :data:`~dppo_oat.trust_region.presets.PRESETS`, with optional field overrides; a
        numeric override its rule never reads (``preset("ppo", delta=0.2)``) is refused, as the command line refuses
        ``--tr-delta`` there (:meth:`replace` changes any field)."""
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"unknown trust-region preset {name!r}; choose one of: {', '.join(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown TrustRegion field(s) {sorted(unknown)} for preset {name!r}")
        base = cls(**{**PRESETS[name].fields, "name": name})
        tr = cls(**{**PRESETS[name].fields, **overrides, "name": variant_name(base, overrides)})
        unread = [field for field in overrides if field in NUMBER_FIELDS and field not in tr.fields_read]
        if unread:
            raise ValueError(f"{', '.join(unread)}: not read by the trust region {name} (it reads "
                             f"{', '.join(sorted(tr.fields_read))}): leave it out, or choose a preset that uses it")
        return tr

    def replace(self, **overrides) -> TrustRegion:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **overrides)

    def calibrate(self, batch, target: float | None = None, *, like: TrustRegion | None = None, unit: str = "token",
                  band: str | None = None):
        """A copy whose band blocks ``target`` of ``batch``'s A ≠ 0 tokens (or as many as ``like`` does), and the
        :class:`~dppo_oat.trust_region.band_search.CalibrationReport`
        (:func:`~dppo_oat.trust_region.band_search.calibrate`)."""
        from dppo_oat.trust_region.band_search import calibrate

        return calibrate(self, batch, target, like=like, unit=unit, band=band)


def variant_name(base: TrustRegion, overrides: dict) -> str:
    """The name of preset ``base`` with ``overrides``: its own while the choices that define the method stay (a
    changed number is a setting of the same method), ``<preset>+<field>=<value>`` for each choice changed
    (``dppo_binary_tv+mismatch_mask=token``), or the ``name`` given, unless that is another preset's."""
    given = overrides.get("name")
    if given is not None:
        if given in PRESETS and given != base.name:
            raise ValueError(f"name={given!r} is another preset's: TrustRegion.preset({base.name!r}) stays "
                             f"{base.name!r}, or give the variant a name of its own")
        return given
    changed = [f"+{field}={overrides[field]}" for field in CHOICE_FIELDS
               if field in overrides and overrides[field] != getattr(base, field)]
    return base.name + "".join(changed)


def _check_choice(attr: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"unknown {attr} {value!r}; choose one of: {', '.join(choices)}")
