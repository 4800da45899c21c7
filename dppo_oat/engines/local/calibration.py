"""The local engine's band calibration while it trains (``--tr-calibrate``, ``--tr-calibrate-like``): it keeps the
loss calls of the first RL step's update (:class:`BatchCollector`), sets the band on them with the core's band search
(:func:`~dppo_oat.trust_region.band_search.calibrate`, :func:`calibrated_band`), records the band in ``config.json``
(:func:`calibration_record`), and a resumed run trains with the band it recorded (:func:`recorded_calibration`)."""

from __future__ import annotations

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
    PolicyLossOutput,
    TrustRegion,
    UnmovedBatch,
    calibrate,
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
             f"--tr-calibrate-like {c.tr_calibrate_like}" if c.tr_calibrate_like is not None else ""]
    return " ".join(flag for flag in flags if flag)


def calibrated_band(tr: TrustRegion, calls: list[CalibrationBatch], request: CalibrationSettings, step: int,
                    flags: str) -> tuple[TrustRegion, CalibrationReport]:
    """``tr`` with its band set on step ``step``'s loss calls as ``request`` asks, and the report; a batch no band
    can be set on is a :class:`~dppo_oat.errors.RunError` of one line that names the ``flags`` and what to do."""
    try:
        tr, report = calibrate(tr, calls, request.target, like=request.reference, unit=request.unit,
                               band=request.band)
    except UnmovedBatch:
        raise RunError(f"{flags} at step {step}: {UNMOVED_HINT}") from None
    except ValueError as error:
        raise RunError(f"{flags} at step {step}: {error}") from None
    return tr, replace(report, source=f"step {step}'s rollout batch")


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
