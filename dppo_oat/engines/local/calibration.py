"""The local engine's band calibration while it trains (``--tr-calibrate``, ``--tr-calibrate-like``, and
``--tr-calibrate-every`` to hold the band at its strength): :class:`TrainingCalibration` sets the band with the core's
:class:`~dppo_oat.trust_region.held_band.HeldBand` on the step's batch before its update (π_θ at the weights before
it, :func:`~dppo_oat.learner.update.observe_before_update`) where π_θ already differs from μ there, else on the
update's own loss calls (:class:`BatchCollector`), the band then holding from the next step. A band set once is
recorded in ``config.json`` (:func:`calibration_record`), and a resumed run trains with it
(:func:`recorded_calibration`); a held band is logged at every step (``band/*``) and kept in the checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from dppo_oat.errors import RunError
from dppo_oat.run.directory import RunDir
from dppo_oat.run.safe_io import to_jsonable
from dppo_oat.trust_region import (
    REAL_FIELDS,
    RULE_TABLE,
    CalibrationBatch,
    CalibrationReport,
    HeldBand,
    PolicyLossOutput,
    TrustRegion,
    UnmovedBatch,
)

if TYPE_CHECKING:
    from dppo_oat.engines.local.config import TrainConfig
    from dppo_oat.settings.spec import CalibrationSettings, RunSpec

UNMOVED_HINT = ("π_θ equals μ on the step's batch up to rounding, so no band blocks a token that moved: give each "
                "rollout batch several optimizer steps (--minibatches-per-rollout 4, --num-epochs 2) or a stale or "
                "mismatched μ (--max-staleness 1, --rollout-dtype bfloat16)")
"""What to do when the calibration batch's π_θ is μ (:class:`~dppo_oat.trust_region.UnmovedBatch`)."""


class BatchCollector:
    """A token observer (as :class:`~dppo_oat.run.token_export.TokenExporter`) that keeps every loss call of a rollout
    batch's first epoch as a :class:`~dppo_oat.trust_region.CalibrationBatch`: π_θ of its forward pass, μ, A, the
    response mask, π_θ' where the trust region recomputes it, and its top-K divergence where it reads one."""

    def __init__(self, tr: TrustRegion) -> None:
        self.divergence = RULE_TABLE[tr.rule].divergence if tr.uses_topk else None
        self.calls: list[CalibrationBatch] = []

    def observe(self, micro_rows, micro, logp: torch.Tensor, entropy, result: PolicyLossOutput) -> None:
        divergences = {self.divergence: result.divergence.detach()} if self.divergence else {}
        self.calls.append(CalibrationBatch(logp.detach().float(), micro.behavior_logp, micro.advantages,
                                           micro.response_mask, micro.recomputed_logp, divergences=divergences))


def calibration_flags(c: TrainConfig) -> str:
    """The calibration flags a command line set, as it spells them (for messages)."""
    flags = [f"--tr-calibrate {c.tr_calibrate}" if c.tr_calibrate is not None else "",
             f"--tr-calibrate-like {c.tr_calibrate_like}" if c.tr_calibrate_like is not None else "",
             f"--tr-calibrate-every {c.tr_calibrate_every}" if c.tr_calibrate_every is not None else ""]
    return " ".join(flag for flag in flags if flag)


def calibrated_band(held: HeldBand, calls: list[CalibrationBatch], step: int, flags: str,
                    where: str) -> CalibrationReport:
    """Set ``held``'s band on step ``step``'s loss calls (``where`` they came from, for the report); a batch no band
    can be set on is a :class:`~dppo_oat.errors.RunError` of one line that names the ``flags`` and what to do
    (:class:`~dppo_oat.trust_region.UnmovedBatch` as it is, for the caller to try the update's own calls)."""
    try:
        report = held.set(step, calls)
    except UnmovedBatch:
        raise
    except ValueError as error:
        raise RunError(f"{flags} at step {step}: {error}") from None
    return replace(report, source=f"step {step}'s {where}")


def calibration_record(report: CalibrationReport, step: int) -> dict:
    """What ``config.json`` records of a calibration (its ``calibration`` entry): the report and the RL step whose
    batch it was measured on; a resumed run reads its band back (``after``)."""
    return to_jsonable({**report.as_dict(), "step": step})


def recorded_band(record, tr: TrustRegion) -> TrustRegion:
    """``tr`` with the band a ``config.json`` calibration record holds; a record without a band of ``tr``'s
    numeric fields is one line."""
    after = record.get("after") if isinstance(record, dict) else None
    if not (isinstance(after, dict) and after and set(after) <= set(REAL_FIELDS)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in after.values())):
        raise ValueError(f"config.json's calibration record holds no band ({record!r}): restore the file, or start a "
                         "new run with another --run-name")
    return tr.replace(**{name: float(value) for name, value in after.items()})


def recorded_calibration(c: TrainConfig, spec: RunSpec, run_dir: RunDir) -> RunSpec:
    """A resumed run that calibrated its band trains with the band its config.json recorded, never a new one."""
    if not (c.resume and spec.calibration is not None):
        return spec
    record = run_dir.read_config().get("calibration")
    if record is None:
        return spec
    return replace(spec, trust_region=recorded_band(record, spec.trust_region))


class TrainingCalibration:
    """One run's band calibration: on which steps it sets the band (:class:`~dppo_oat.trust_region.HeldBand`: the
    first, and every N-th with ``--tr-calibrate-every N``), on which loss calls (:meth:`before_update`,
    :meth:`after_update`), and what the run logs and keeps of it. ``say`` prints a line."""

    def __init__(self, request: CalibrationSettings, tr: TrustRegion, flags: str, say: Callable[[str], None], *,
                 recorded: dict | None = None) -> None:
        self.held = HeldBand(tr, request.target, request.reference, request.unit, request.band, request.every,
                             set_on=recorded.get("step") if recorded else None)
        self.flags, self.say = flags, say
        self.collector: BatchCollector | None = None
        self._warned = False

    @property
    def holds(self) -> bool:
        """Whether the band is set again through the run (``--tr-calibrate-every``), not once."""
        return self.held.every is not None

    @property
    def trust_region(self) -> TrustRegion:
        """The trust region to train with now."""
        return self.held.trust_region

    def before_update(self, step: int, observe: Callable[[BatchCollector], None]) -> CalibrationReport | None:
        """On a step that sets the band: the band set on the step's loss calls at the weights before its update
        (``observe`` runs that pass into a collector); or None, and the update's own loss calls are kept instead
        (:meth:`after_update`), where π_θ equals μ on them (nothing moved yet: an on-policy batch)."""
        self.collector = None
        if not self.held.due(step):
            return None
        calls = BatchCollector(self.held.trust_region)
        observe(calls)
        try:
            return self._set(step, calls.calls, "rollout batch before its update")
        except UnmovedBatch:
            self.collector = BatchCollector(self.held.trust_region)
            return None

    def after_update(self, step: int) -> CalibrationReport | None:
        """The band set on the update's own loss calls where the pass before it found π_θ = μ: it holds from the
        next step."""
        if self.collector is None:
            return None
        calls, self.collector = self.collector.calls, None
        try:
            return self._set(step, calls, f"update (π_θ = μ before it), from step {step + 1} on")
        except UnmovedBatch:
            return self._cannot_set(step, RunError(f"{self.flags} at step {step}: {UNMOVED_HINT}"))

    def _set(self, step: int, calls: list[CalibrationBatch], where: str) -> CalibrationReport | None:
        try:
            return calibrated_band(self.held, calls, step, self.flags, where)
        except RunError as error:
            return self._cannot_set(step, error)

    def _cannot_set(self, step: int, error: RunError) -> None:
        """A batch that sets no band ends the run while none was ever set; a held band stays as it was (said once:
        a step whose advantages are all 0, say, has nothing to calibrate on)."""
        if self.held.set_on is None:
            raise error
        if not self._warned:
            self._warned = True
            self.say(f"warning: {error}; the band set on step {self.held.set_on} stays (said once; band/set_on_step in "
                     "metrics.jsonl shows the step whose batch set each step's band)")

    def metrics(self) -> dict[str, float]:
        """A held band's entries in the step's metrics, taken before its update: the band it trains with
        (``band/<field>``), the step whose batch set it (``band/set_on_step``; 0: the preset's band) and the share
        of that batch it was set to block (``band/target``: the reference's share there with ``like``; absent while
        no step has set it)."""
        if not self.holds:
            return {}
        target = {} if self.held.set_to_block is None else {"band/target": self.held.set_to_block}
        return {**{f"band/{name}": value for name, value in self.held.values.items()},
                "band/set_on_step": float(self.held.set_on or 0), **target}

    def state_dict(self) -> dict:
        """What a checkpoint keeps of a held band (:meth:`~dppo_oat.trust_region.HeldBand.state_dict`)."""
        return self.held.state_dict()

    def load_state_dict(self, state) -> None:
        self.held.load_state_dict(state)
