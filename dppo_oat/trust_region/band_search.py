"""Band calibration: set a trust region's band so that its mask blocks a target fraction of one batch's tokens.

A preset's band (DPPO's δ, PPO's and GSPO's clip range ε, a sequence mask's bound δ, M2PO's τ_M2) was tuned by its
source at the source's model scale: at another scale the same number may block nothing (the rule is then PG-IS in
effect) or most of the batch. :func:`calibrate` moves the band, on a batch of μ, π_θ and advantages, until the rule
blocks the target fraction of the batch's A ≠ 0 tokens (``unit="token"``, the run's ``mask/fraction``) or of its
sequences (``unit="sequence"``: a row counts as blocked when every A ≠ 0 token of it is, as the sequence masks'
``seq_masked_fraction``); ``like=`` takes the target from another trust region on the same batch (match DPPO-Binary-KL's
strength, say).

What it moves (:func:`band_of`): the fields of the rule's threshold (``THRESHOLDS``): δ; ε_low and ε_high together,
scaled by one factor so that their ratio stays; τ_M2. A rule that also bounds its sequences by δ (TRM, DeepSeek-V3.2's
mask, VACO: δ in its ``reads``) has δ moved by default, its PPO clip kept; ``band="clip_range"`` moves the clip alone,
``band="both"`` (:data:`BOTH_BANDS`) the two together, by one factor (where the clip alone blocks more than the target,
no δ reaches it). SAPO has no mask: its soft gate f'(r) is
its trust region, and a token counts as blocked where the gate passes less than half of the gradient it passes at
r = 1 (f'(r) < :data:`SOFT_BLOCK_LEVEL`, i.e. |r − 1| > 2·ln(1 + √2)/τ); τ_pos and τ_neg are scaled together.
PG-IS, CISPO, MinPRO and DRPO (whose δ weighs a regularizer) block no token at any setting: they are refused.

The blocked fraction of a hard mask is monotone in its band (a wider band blocks no more), a step function of it:
:func:`calibrate` bisects the band's scale on a log axis (:data:`BAND_RANGE`, :data:`BAND_RTOL`) to the step that
crosses the target and returns the band on whichever side of it blocks the fraction nearer the target (the side at or
below it on a tie). Blocked exactly as :func:`~dppo_oat.trust_region.loss.policy_loss` blocks (its ``keep``: the
rule's mask, the mismatch mask, the non-finite tokens left out), one loss call at a time (M2PO's mask reads its whole
loss call).

It matches strength on one batch, not behaviour: the fraction drifts as π_θ moves, and with π_θ = μ (the first
minibatch of an on-policy batch) no band of a μ-anchored mask blocks anything, so the batch must come after an
optimizer step, or carry a stale or mismatched μ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch

from dppo_oat.trust_region.masks import mismatch_keep
from dppo_oat.trust_region.registry import (
    DIVERGENCES,
    FIELD_SYMBOLS,
    GATE_BAND,
    RULE_TABLE,
    THRESHOLDS,
    MaskInputs,
    Rule,
    TopK,
    check_logprobs_at_most_zero,
    finite_tokens,
)

if TYPE_CHECKING:
    from dppo_oat.trust_region.config import TrustRegion

UNITS = ("token", "sequence")
"""What a target fraction counts: A ≠ 0 response tokens, or rows (one response, one turn) with such a token."""
SOFT_BLOCK_LEVEL = 0.5
"""A soft gate (SAPO's f'(r)) counts a token as blocked where it passes less than this share of the gradient it
passes at r = 1."""
BAND_RANGE = (1e-9, 1e9)
"""The values the band's largest field may take while calibrating."""
BAND_RTOL = 1e-6
"""Bisection stops when the band is known to this relative precision."""
UNMOVED_LOG_RATIO = 1e-4
"""|log π_θ − log μ| at or below this on every token is π_θ = μ up to rounding: nothing to calibrate on."""

class UnmovedBatch(ValueError):
    """A batch whose π_θ equals μ up to rounding (:data:`UNMOVED_LOG_RATIO`) wherever a band could act: no band
    blocks a token that moved."""


# --------------------------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class CalibrationBatch:
    """One loss call's tokens as :func:`~dppo_oat.trust_region.loss.policy_loss` reads them: detached ``[B, T]``
    log π_θ, log μ, A (``[B, 1]`` or ``[B, T]``) and the response mask, with the recomputed π_θ' where an anchor or a
    mismatch mask reads it and μ's top-K set (``topk``) or the top-K divergence itself (``divergences``, by name of
    :data:`~dppo_oat.trust_region.registry.DIVERGENCES`) where a top-K rule reads it."""

    logp: torch.Tensor
    behavior_logp: torch.Tensor
    advantages: torch.Tensor
    response: torch.Tensor
    recomputed_logp: torch.Tensor | None = None
    topk: TopK | None = None
    divergences: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._as_tensors()
        shape = tuple(self.logp.shape)
        if len(shape) != 2:
            raise ValueError(f"a calibration batch's logp must be [B, T], got shape {shape}")
        others = {"behavior_logp": self.behavior_logp, "response": self.response,
                  "recomputed_logp": self.recomputed_logp, **self.divergences}
        for name, tensor in others.items():
            if tensor is not None and tuple(tensor.shape) != shape:
                raise ValueError(f"a calibration batch's {name} has shape {tuple(tensor.shape)}, expected {shape}")
        if tuple(self.advantages.shape) not in (shape, (shape[0], 1)):
            raise ValueError(f"a calibration batch's advantages must be [B, 1] or [B, T], got "
                             f"{tuple(self.advantages.shape)}")
        check_logprobs_at_most_zero(self.response.bool(), logp=self.logp, behavior_logp=self.behavior_logp,
                                    recomputed_logp=self.recomputed_logp)

    def _as_tensors(self) -> None:
        """Lists or arrays of numbers become tensors (float32; the response mask bool); anything else is one
        ValueError naming the field."""
        for name in ("logp", "behavior_logp", "advantages", "response", "recomputed_logp"):
            value = getattr(self, name)
            if value is None or isinstance(value, torch.Tensor):
                continue
            try:
                tensor = torch.as_tensor(value, dtype=torch.bool if name == "response" else torch.float32)
            except (TypeError, ValueError, RuntimeError) as error:
                raise ValueError(f"a calibration batch's {name} must be a tensor (or a nested list of numbers), got "
                                 f"{type(value).__name__}: {error}") from None
            object.__setattr__(self, name, tensor)


@dataclass(frozen=True)
class Band:
    """What calibration moves: the :class:`TrustRegion` fields of one band, scaled together by one factor. ``soft``:
    for a rule without a mask, its gate ``(x, tr) → [B, T]`` (a token is blocked where it is below
    :data:`SOFT_BLOCK_LEVEL`)."""

    name: str
    fields: tuple[str, ...]
    soft: Callable[[MaskInputs, TrustRegion], torch.Tensor] | None = None


BOTH_BANDS = "both"
"""The band of a rule with two (TRM, DeepSeek-V3.2's mask, VACO: a sequence bound δ and a PPO clip) that moves both
together: δ, ε_low and ε_high scaled by one factor, so that the two bands keep their proportion."""


BAND_NAMES = (*THRESHOLDS, GATE_BAND, BOTH_BANDS)
"""Every band name some rule has (``--tr-calibrate-band``'s choices; :func:`band_choices` says which a rule has)."""


def band_choices(tr: TrustRegion) -> tuple[str, ...]:
    """The bands ``tr``'s rule reads, the default first: a sequence bound δ (in its ``reads``), else its
    threshold; or its soft gate's (:data:`~dppo_oat.trust_region.registry.GATE_BAND`); and, for a rule with two,
    :data:`BOTH_BANDS`. Empty for a rule without a band (:attr:`~dppo_oat.trust_region.registry.Rule.has_band`)."""
    rule = RULE_TABLE[tr.rule]
    if not rule.has_band:
        return ()
    if rule.soft_gate is not None:
        return (GATE_BAND,)
    bands = tuple(dict.fromkeys((*(("delta",) if "delta" in rule.reads else ()), rule.threshold)))
    return (*bands, BOTH_BANDS) if len(bands) == 2 else bands


def no_band_reason(rule: Rule) -> str:
    """Why ``rule`` blocks no token at any setting, from its declaration."""
    verb = "weighs" if len(rule.reads) == 1 else "weigh"
    weighs = f" (its {', '.join(rule.reads)} {verb} its loss term)" if rule.loss_term is not None and rule.reads else ""
    return f"M_t = 1: it declares no threshold and no soft gate{weighs}"


def band_fields(name: str, choices: tuple[str, ...]) -> tuple[str, ...]:
    """The :class:`TrustRegion` fields of band ``name`` (:data:`BOTH_BANDS`: those of every other choice)."""
    if name == BOTH_BANDS:
        return tuple(f for choice in choices if choice != BOTH_BANDS for f in THRESHOLDS[choice])
    return THRESHOLDS[name]


def band_of(tr: TrustRegion, band: str | None = None) -> Band:
    """The band calibration moves on ``tr`` (``band``: one of :func:`band_choices`, None: the first); a rule with
    none, a band it does not read, or a band that is 0 or ∞ is refused in one line."""
    choices = band_choices(tr)
    if not choices:
        why = no_band_reason(RULE_TABLE[tr.rule])
        raise ValueError(f"trust region {tr.name} has no band to calibrate (rule {tr.rule!r}, {why}): choose a preset "
                         "whose mask has a band (δ, ε or τ_M2), e.g. dppo_binary_tv")
    name = choices[0] if band is None else band
    if name not in choices:
        raise ValueError(f"trust region {tr.name} has no band {name!r} to calibrate: "
                         f"choose one of {', '.join(choices)}")
    rule = RULE_TABLE[tr.rule]
    chosen = (Band(name, rule.reads, soft=rule.soft_gate) if rule.soft_gate is not None
              else Band(name, band_fields(name, choices)))
    values = [getattr(tr, f) for f in chosen.fields]
    if not all(math.isfinite(v) for v in values) or max(values) <= 0:
        shown = ", ".join(f"{f} {v}" for f, v in zip(chosen.fields, values, strict=True))
        raise ValueError(f"trust region {tr.name}'s band is {shown}: calibration scales it, so give it a finite value "
                         "> 0 first (--tr-<field>)")
    return chosen


def scaled(tr: TrustRegion, band: Band, scale: float) -> TrustRegion:
    """``tr`` with every field of ``band`` multiplied by ``scale``."""
    return tr.replace(**{f: getattr(tr, f) * scale for f in band.fields})


# --------------------------------------------------------------------------------------------- what is blocked


@dataclass(frozen=True)
class PreparedCall:
    """One loss call's mask inputs under one trust region, computed once (nothing in them depends on the band)."""

    inputs: MaskInputs
    counted: torch.Tensor
    """The response tokens the loss counts (finite inputs)."""
    mismatch: torch.Tensor
    """The mismatch mask (all True without one)."""


def check_batch_serves(tr: TrustRegion, *, recomputed: bool, topk: bool, divergences=()) -> None:
    """Refuse in one line a trust region whose mask reads what the batch lacks: the recomputed π_θ' (an anchor on
    π_θ' or a mismatch mask), or μ's top-K set (a top-K rule, unless its divergence is given)."""
    if (tr.anchor == "recompute" or tr.mismatch_mask != "none") and not recomputed:
        raise ValueError(f"the mask of {tr.name} reads the recomputed π_θ', which this batch lacks: calibrate it on a "
                         "batch that has it (a run of a trust region that recomputes π_θ')")
    divergence = RULE_TABLE[tr.rule].divergence
    if tr.uses_topk and not topk and divergence not in divergences:
        twin = RULE_TABLE[tr.rule].binary_twin
        raise ValueError(f"the mask of {tr.name} reads μ's top-K set, which this batch lacks: calibrate its binary "
                         f"twin (rule {twin}), or a batch of a run that trains {tr.name}")


def prepare(tr: TrustRegion, batch: CalibrationBatch) -> PreparedCall:
    """:func:`~dppo_oat.trust_region.loss.policy_loss`'s mask inputs of ``batch`` under ``tr``: non-finite tokens
    left out, the anchor, the divergence (given, or computed), the mismatch mask."""
    check_batch_serves(tr, recomputed=batch.recomputed_logp is not None, topk=batch.topk is not None,
                       divergences=batch.divergences)
    finite = finite_tokens(batch.logp, batch.behavior_logp, batch.advantages, batch.recomputed_logp, batch.topk)
    counted = batch.response.bool() & finite
    lp, mu, adv, recomputed = (None if x is None else torch.where(finite, x.detach().float().expand_as(finite), 0.0)
                               for x in (batch.logp, batch.behavior_logp, batch.advantages, batch.recomputed_logp))
    anchor = mu if tr.anchor == "behavior" else recomputed
    name = RULE_TABLE[tr.rule].divergence
    given = batch.divergences.get(name) if tr.uses_topk else None
    divergence = given.float() if given is not None else DIVERGENCES[name](lp, anchor, batch.topk)
    inputs = MaskInputs(lp, anchor, mu, adv, counted, divergence)
    band = mismatch_keep(tr.mismatch_mask, tr.mismatch_low, tr.mismatch_high, recomputed, mu, counted)
    return PreparedCall(inputs, counted, band)


def blocked_tokens(tr: TrustRegion, call: PreparedCall, soft=None) -> torch.Tensor:
    """``[B, T]``: the A ≠ 0 response tokens of one prepared loss call whose M_t is 0 (or whose soft gate is below
    :data:`SOFT_BLOCK_LEVEL`)."""
    x = call.inputs
    keep = RULE_TABLE[tr.rule].keep(x, tr) & call.counted & call.mismatch
    if soft is not None:
        keep &= soft(x, tr) >= SOFT_BLOCK_LEVEL
    return active_tokens(call) & ~keep


def active_tokens(call: PreparedCall) -> torch.Tensor:
    """``[B, T]``: the response tokens the loss counts with A ≠ 0 (those a mask's fraction is over)."""
    return call.counted & (call.inputs.advantages != 0)


def blocked_count(tr: TrustRegion, call: PreparedCall, unit: str, soft=None) -> tuple[int, int]:
    """``(blocked, counted)`` in ``unit`` on one prepared loss call: :func:`blocked_tokens` and the A ≠ 0 tokens,
    or the rows with an A ≠ 0 token and those every such token of which is blocked."""
    blocked, active = blocked_tokens(tr, call, soft), active_tokens(call)
    if unit == "sequence":
        rows = active.any(-1)
        return int((rows & ~(active & ~blocked).any(-1)).sum()), int(rows.sum())
    return int(blocked.sum()), int(active.sum())


def blocked_fraction(tr: TrustRegion, calls: Sequence[PreparedCall], unit: str = "token", soft=None) -> float:
    """The share of the loss calls' A ≠ 0 tokens (or sequences) that ``tr`` blocks (0 when there are none)."""
    counts = [blocked_count(tr, call, unit, soft) for call in calls]
    total = sum(counted for _, counted in counts)
    return sum(blocked for blocked, _ in counts) / total if total else 0.0


# --------------------------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class CalibrationReport:
    """What :func:`calibrate` did: the band before and after, the fraction it blocks on the batch, the target and
    where it came from, the fractions any band can reach there, and the batch it was measured on (``source``, set
    by the caller)."""

    trust_region: str
    rule: str
    band: str
    before: dict[str, float]
    after: dict[str, float]
    target: float
    achieved: float
    before_fraction: float
    reachable: tuple[float, float]
    counted: int
    unit: str = "token"
    like: str | None = None
    soft: bool = False
    source: str = ""

    def flags(self) -> str:
        """The calibrated band as the command line's overrides (``--tr-delta 0.0123``)."""
        return " ".join(f"--tr-{name.replace('_', '-')} {value:.6g}" for name, value in self.after.items())

    def line(self) -> str:
        """One line: the band before → after, what it blocks and what was asked."""
        moved = ", ".join(f"{FIELD_SYMBOLS[f]} {self.before[f]:.6g} → {self.after[f]:.6g}" for f in self.after)
        counted = f"{self.counted} A ≠ 0 {'sequences' if self.unit == 'sequence' else 'tokens'}"
        where = f" of {self.source}" if self.source else ""
        asked = f"{self.like} blocks {self.target:.4f}" if self.like else f"target {self.target:.4g}"
        soft = f", a token blocked where SAPO's gate is < {SOFT_BLOCK_LEVEL:g}" if self.soft else ""
        return (f"{self.trust_region}: {moved} blocks {self.achieved:.4f} of the {counted}{where} ({asked}; the "
                f"band before blocked {self.before_fraction:.4f}{soft})")

    def as_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------- calibration


def check_target(target: float) -> None:
    """A target is a fraction in [0, 1) (1 would block every token: no update at all)."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target < 1:
        raise ValueError(f"a calibration target is the fraction of tokens to block, in [0, 1), got {target!r}")


def calibrate(tr: TrustRegion | str, batch: CalibrationBatch | Sequence[CalibrationBatch],
              target: float | None = None, *, like: TrustRegion | str | None = None, unit: str = "token",
              band: str | None = None) -> tuple[TrustRegion, CalibrationReport]:
    """``tr`` with its band (:func:`band_of`) set so that it blocks ``target`` of ``batch``'s A ≠ 0 tokens (or
    sequences: ``unit``), or as many as ``like`` blocks there; and the report. ``batch``: one loss call, or several
    (each one :func:`~dppo_oat.trust_region.loss.policy_loss` call, as the update made them); ``tr`` and ``like``
    may be presets' names, as :func:`~dppo_oat.trust_region.loss.policy_loss` takes them. ValueError in one line
    for a rule without a band, a target outside [0, 1), and a target no band reaches on the batch."""
    from dppo_oat.trust_region.loss import as_trust_region

    tr, like = as_trust_region(tr), None if like is None else as_trust_region(like)
    if unit not in UNITS:
        raise ValueError(f"unknown calibration unit {unit!r}; choose one of: {', '.join(UNITS)}")
    if (target is None) == (like is None):
        raise ValueError("calibration takes a target fraction or a trust region to match (like=): give one of them")
    moved = band_of(tr, band)
    batches = [batch] if isinstance(batch, CalibrationBatch) else list(batch)
    if target is None:
        reference = [prepare(like, b) for b in batches]
        target = blocked_fraction(like, reference, unit, _soft_of(like))
    check_target(target)
    calls = [prepare(tr, b) for b in batches]
    fraction = _fraction_of(tr, moved, calls, unit)
    lo, hi = _scale_range(tr, moved)
    reachable = _check_reachable(tr, moved, calls, target, (lo, hi), fraction, unit)
    scale = 1.0 if fraction(1.0) == target else _crossing(fraction, lo, hi, target)
    calibrated = scaled(tr, moved, scale)
    report = CalibrationReport(
        trust_region=tr.name, rule=tr.rule, band=moved.name, before={f: getattr(tr, f) for f in moved.fields},
        after={f: getattr(calibrated, f) for f in moved.fields}, target=target, achieved=fraction(scale),
        before_fraction=fraction(1.0), reachable=reachable, counted=_counted(calls, unit), unit=unit,
        like=None if like is None else like.name, soft=moved.soft is not None)
    return calibrated, report


def _soft_of(tr: TrustRegion):
    return RULE_TABLE[tr.rule].soft_gate


def _fraction_of(tr: TrustRegion, band: Band, calls: Sequence[PreparedCall], unit: str) -> Callable[[float], float]:
    """The blocked fraction as a function of the band's scale (memoised: bisection asks some scales twice)."""
    seen: dict[float, float] = {}

    def fraction(scale: float) -> float:
        if scale not in seen:
            seen[scale] = blocked_fraction(scaled(tr, band, scale), calls, unit, band.soft)
        return seen[scale]

    return fraction


def _scale_range(tr: TrustRegion, band: Band) -> tuple[float, float]:
    """The scales that put the band's largest field at either end of :data:`BAND_RANGE`."""
    largest = max(getattr(tr, f) for f in band.fields)
    return BAND_RANGE[0] / largest, BAND_RANGE[1] / largest


def _counted(calls: Sequence[PreparedCall], unit: str) -> int:
    return int(sum(int((active_tokens(c).any(-1) if unit == "sequence" else active_tokens(c)).sum()) for c in calls))


def _why_nothing_counts(calls: Sequence[PreparedCall]) -> str:
    """Why no token of the batch counts: its response tokens all have a non-finite input (a NaN or infinite
    log-prob or advantage), or all have A = 0."""
    finite = sum(int(c.counted.sum()) for c in calls)
    if finite == 0:
        return ("every response token of the batch has a non-finite input (NaN or infinite log π_θ, log μ, π_θ' or "
                "A): calibrate on a batch of finite log-probs and advantages")
    return "the batch has no response token with A ≠ 0: calibrate on a batch whose advantages are not all 0"


def _check_reachable(tr, band, calls, target, scales, fraction, unit) -> tuple[float, float]:
    """The fractions any band blocks on the batch, ``(least, most)``; a batch without an A ≠ 0 token, a batch whose
    π_θ is μ up to rounding wherever the tightest band blocks, and a target outside the fractions are refused in one
    line."""
    if _counted(calls, unit) == 0:
        raise ValueError(_why_nothing_counts(calls))
    least, most = sorted(fraction(scale) for scale in scales)
    tightest = scales[0] if fraction(scales[0]) >= fraction(scales[1]) else scales[1]
    if _only_rounding(scaled(tr, band, tightest), calls, band.soft, blocks_some=most > 0):
        raise UnmovedBatch(f"π_θ equals μ on this batch (|log π_θ − log μ| ≤ {UNMOVED_LOG_RATIO:g} wherever a mask "
                         f"could act), so no band of {tr.name} blocks a token that moved: calibrate on a batch taken "
                         "after an optimizer step, or with a stale or mismatched μ")
    if not least <= target <= most:
        symbols = "/".join(FIELD_SYMBOLS[f] for f in band.fields)
        raise ValueError(f"no band of {tr.name} blocks {target:.4g} of this batch's A ≠ 0 {unit}s: any {symbols} "
                         f"blocks between {least:.4g} and {most:.4g} of them; give a target in that range")
    return least, most


def _only_rounding(tightest: TrustRegion, calls: Sequence[PreparedCall], soft, *, blocks_some: bool) -> bool:
    """True when every token the tightest band blocks is unmoved (π_θ, the anchor and μ within
    :data:`UNMOVED_LOG_RATIO` of each other), and it blocks some or no counted token moved at all."""
    moved_blocked = moved_any = False
    for call in calls:
        x = call.inputs
        spread = torch.stack([x.logp, x.anchor_logp, x.behavior_logp]).float()
        moved = active_tokens(call) & ((spread.amax(0) - spread.amin(0)) > UNMOVED_LOG_RATIO)
        moved_any |= bool(moved.any())
        moved_blocked |= bool((moved & blocked_tokens(tightest, call, soft)).any())
    return not moved_blocked and (blocks_some or not moved_any)


def _crossing(fraction: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """The scale at the step of ``fraction`` (monotone on ``[lo, hi]``) that crosses ``target``, bisected on a log
    axis to :data:`BAND_RTOL`; of the scales on either side of it, the one whose fraction is nearer the target (the
    one at or below it on a tie)."""
    decreasing = fraction(lo) >= fraction(hi)
    more, less = (math.log(lo), math.log(hi)) if decreasing else (math.log(hi), math.log(lo))
    strict = fraction(math.exp(more)) > target  # else the target is the most any band blocks: its loosest band

    def blocks_more(log_scale: float) -> bool:
        value = fraction(math.exp(log_scale))
        return value > target if strict else value >= target

    while abs(less - more) > math.log1p(BAND_RTOL):
        middle = (more + less) / 2
        if blocks_more(middle):
            more = middle
        else:
            less = middle
    above, below = math.exp(more), math.exp(less)
    if not strict:
        return above
    return above if abs(fraction(above) - target) < abs(fraction(below) - target) else below
