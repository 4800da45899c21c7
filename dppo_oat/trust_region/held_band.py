"""A band held at its strength through a run: :func:`~dppo_oat.trust_region.band_search.calibrate` again every
``every`` RL steps, on that step's batch.

A band calibrated once (on the first step) matches strength on that step only: the fraction it blocks drifts as π_θ
and the rollout engine move apart. :class:`HeldBand` re-sets it on steps 1, 1 + N, 1 + 2N, ... (``every`` = N), so
that with N = 1 the rule blocks the target fraction of every step's A ≠ 0 tokens, or as many as ``like`` blocks on
that same step (two rules compared at matched strength step by step). What it keeps between steps (the band in force
and the step whose batch set it) is :meth:`HeldBand.state_dict`, which a checkpoint carries so that a resumed run
trains with the band it had.

A training loop asks :meth:`HeldBand.due` before a step's update and calls :meth:`HeldBand.set` with the step's loss
calls (:class:`~dppo_oat.trust_region.band_search.CalibrationBatch`): π_θ before the update where it already differs
from μ (a stale or lower-precision μ), else the update's own loss calls, whose band then holds from the next step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dppo_oat.trust_region.band_search import (
    CalibrationBatch,
    CalibrationReport,
    band_of,
    calibrate,
)
from dppo_oat.trust_region.config import REAL_FIELDS, TrustRegion


@dataclass
class HeldBand:
    """The band of ``trust_region`` re-set every ``every`` steps (None: once, on the first step that sets it) to
    block ``target`` of a step's A ≠ 0 tokens (or sequences: ``unit``), or as many as preset ``like`` blocks there;
    ``band`` picks which band moves where a rule has two (:func:`~dppo_oat.trust_region.band_search.band_choices`).
    ``trust_region`` is the one to train with now; ``set_on`` the step whose batch set its band (None: the band as
    given) and ``set_to_block`` the share of that batch it was set to block (``like``: the reference's share
    there)."""

    trust_region: TrustRegion
    target: float | None = None
    like: TrustRegion | str | None = None
    unit: str = "token"
    band: str | None = None
    every: int | None = 1
    set_on: int | None = None
    set_to_block: float | None = None

    def __post_init__(self) -> None:
        if self.every is not None and (isinstance(self.every, bool) or not isinstance(self.every, int)
                                       or self.every < 1):
            raise ValueError(f"a held band is re-set every N >= 1 steps (None: once), got every={self.every!r}")
        band_of(self.trust_region, self.band)  # a rule without a band is refused before the first step

    def due(self, step: int) -> bool:
        """Whether step ``step`` (from 1) re-sets the band: steps 1, 1 + N, 1 + 2N, ...; once (``every`` None) until
        a step has set it."""
        if self.every is None:
            return self.set_on is None
        return (step - 1) % self.every == 0

    def set(self, step: int, calls: CalibrationBatch | Sequence[CalibrationBatch]) -> CalibrationReport:
        """Set the band on step ``step``'s loss calls and hold it from now on; the report of
        :func:`~dppo_oat.trust_region.band_search.calibrate` (its errors, one line each, leave the band as it was)."""
        tr, report = calibrate(self.trust_region, calls, self.target, like=self.like, unit=self.unit, band=self.band)
        self.trust_region, self.set_on, self.set_to_block = tr, step, report.target
        return report

    @property
    def values(self) -> dict[str, float]:
        """The band in force, by field (``{"delta": 0.0123}``)."""
        return {name: getattr(self.trust_region, name) for name in band_of(self.trust_region, self.band).fields}

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the band in force, the step whose batch set it and the share it was set to
        block."""
        return {"band": self.values, "set_on": self.set_on, "set_to_block": self.set_to_block}

    def load_state_dict(self, state: Mapping) -> None:
        """The band a checkpoint kept (:meth:`state_dict`); a state that holds no band of this rule's is one
        ValueError."""
        state = state if isinstance(state, Mapping) else {}
        band, set_on, share = state.get("band"), state.get("set_on"), state.get("set_to_block")
        if not (isinstance(band, Mapping) and set(band) == set(self.values) and set(band) <= set(REAL_FIELDS)
                and all(_is_number(v) for v in band.values()) and (set_on is None or isinstance(set_on, int))
                and (share is None or _is_number(share))):
            raise ValueError(f"a held band's state must hold the band {sorted(self.values)} and the step that set it, "
                             f"got {state!r}")
        self.trust_region = self.trust_region.replace(**{name: float(value) for name, value in band.items()})
        self.set_on, self.set_to_block = set_on, None if share is None else float(share)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
