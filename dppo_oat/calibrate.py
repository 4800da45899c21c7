"""Band calibration offline, on a run's token export (the local engine calibrates while it trains,
:mod:`dppo_oat.engines.local.calibration`).

    python -m dppo_oat.calibrate runs/<run> --trust-region gspo --target 0.01 [--step N] [--json]

The offline command reads ``<run>/token_exports/step_<step>.jsonl`` (``--token-export all``; the first exported step
unless ``--step``), sets the band of ``--trust-region`` (the run's own trust region, from its ``config.json``, when
left out) so that it blocks ``--target`` of the step's A ≠ 0 tokens, or as many as ``--like`` blocks there
(:func:`~dppo_oat.trust_region.band_search.calibrate`), and prints one line with the band and the flags that train with
it (``--json``: the report as JSON). An export holds π_θ as each token's loss read it, μ, A and the response mask:
not μ's top-K set nor the recomputed π_θ', so the rules that read them are refused; and not which rows shared a
loss call, so M2PO's mask (which reads its whole loss call) reads the whole step.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

import torch
import tyro

from dppo_oat.run.directory import TOKEN_EXPORT_DIR, RunDir
from dppo_oat.run.safe_io import to_jsonable
from dppo_oat.run.token_export import read_token_export
from dppo_oat.settings.usage import one_line_usage_errors
from dppo_oat.trust_region import (
    PRESETS,
    REAL_FIELDS,
    RULE_TABLE,
    UNITS,
    CalibrationBatch,
    CalibrationReport,
    TrustRegion,
    band_of,
    calibrate,
)
from dppo_oat.trust_region.band_search import check_target

PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]


# --------------------------------------------------------------------------------------------- from a token export


def export_step(run_dir: Path, step: int | None) -> int:
    """``step``, or the first exported one; a run without an export, or without that step, is one line."""
    steps = RunDir(run_dir).exported_steps()
    if not steps:
        raise ValueError(f"{run_dir} has no token export ({TOKEN_EXPORT_DIR}/step_*.jsonl): "
                         "train it with --token-export all")
    if step is None:
        return steps[0]
    if step not in steps:
        shown = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
        raise ValueError(f"{run_dir}'s token export has no step {step}: it has step(s) {shown}")
    return step


def export_batch(run_dir: Path, step: int) -> CalibrationBatch:
    """One step's token export as one loss call: a row per record, π_θ (``trainer_logprobs``; a null one counts as
    non-finite, left out as the loss leaves it out), μ (``inference_logprobs``), A and the response mask."""
    path = RunDir(run_dir).export(step)
    try:
        frame = read_token_export(run_dir, step)
        if frame.empty:
            raise ValueError(f"token export {path} (step {step}) holds no record (an empty file): restore it, or "
                             "calibrate on another --step")
        rows = torch.tensor(frame.groupby(["row"], sort=True).ngroup().to_numpy(copy=True))
        positions = torch.tensor(frame["position"].to_numpy(copy=True))
        shape = (int(rows.max()) + 1, int(positions.max()) + 1) if len(frame) else (0, 0)

        def column(name: str, dtype, fill) -> torch.Tensor:
            values = frame[name].astype(float if dtype is torch.float32 else bool).to_numpy(copy=True)
            out = torch.full(shape, fill, dtype=dtype)
            out[rows, positions] = torch.tensor(values, dtype=dtype)
            return out

        columns = {name: column(name, torch.float32, 0.0)
                   for name in ("trainer_logprobs", "inference_logprobs", "advantages")}
        response = column("loss_mask", torch.bool, False)
    except ValueError:  # the reader's one line names the file, the step, the line and what to do
        raise
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a token export ({type(error).__name__}: {error}): restore it, or calibrate "
                         "on another --step") from None
    if not bool(response.any()):
        raise ValueError(f"{path} holds no response token: calibrate on another --step")
    return CalibrationBatch(columns["trainer_logprobs"], columns["inference_logprobs"], columns["advantages"],
                            response)


def check_export_serves(tr: TrustRegion, flag: str) -> None:
    """A trust region whose mask reads what a token export lacks (μ's top-K set, the recomputed π_θ') is refused in
    one line naming the flag that chose it."""
    if tr.uses_topk:
        twin = RULE_TABLE[tr.rule].binary_twin
        preset = next((name for name, p in PRESETS.items() if p.fields.get("rule") == twin), twin)
        raise ValueError(f"{flag} {tr.name}: its mask reads μ's top-K set, which a token export does not hold: "
                         f"calibrate its binary twin ({preset}), or calibrate while training with --tr-calibrate")
    if tr.anchor == "recompute" or tr.mismatch_mask != "none":
        raise ValueError(f"{flag} {tr.name}: its mask reads the recomputed π_θ', which a token export does not hold: "
                         "calibrate while training with --tr-calibrate")


def run_trust_region(run_dir: Path) -> TrustRegion:
    """The trust region a run trained (its ``config.json``'s ``trust_region``)."""
    run = RunDir(run_dir)
    config = run.read_config()
    recorded = config.get("trust_region")
    if not config:
        raise ValueError(f"{run_dir} has no config.json to read its trust region from: give --trust-region")
    if recorded is None:
        raise ValueError(f"{run.config} records no trust_region: give --trust-region")
    if not isinstance(recorded, dict):
        raise ValueError(f"{run.config} records trust_region as {type(recorded).__name__} {recorded!r}, not the "
                         "settings of one: restore the file, or give --trust-region")
    try:
        fields = {key: float(value) if key in REAL_FIELDS else value for key, value in recorded.items()}
        return TrustRegion(**fields)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{run_dir}/config.json's trust region does not load ({error}): give --trust-region") from None


# --------------------------------------------------------------------------------------------- the command


@dataclass
class CalibrateArgs:
    """Set a trust region's band on a run's token export (docs/trust-region.md, Calibrating a band)."""

    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """a run directory trained with --token-export all"""
    trust_region: PresetName | None = None  # type: ignore[valid-type]
    """the preset whose band is calibrated (None: the run's own trust region, from its config.json)"""
    target: float | None = None
    """the fraction of the step's A ≠ 0 tokens (or sequences) the band should block, in [0, 1)"""
    like: PresetName | None = None  # type: ignore[valid-type]
    """block as many tokens as this preset blocks on the same step (in place of --target)"""
    step: int | None = None
    """the RL step whose export is read (None: the first exported one)"""
    unit: Literal[UNITS] = "token"  # type: ignore[valid-type]
    """token (A ≠ 0 tokens, as mask/fraction) or sequence (responses every A ≠ 0 token of which is blocked)"""
    band: str | None = None
    """which band to move where a rule has two (TRM, OPSM, VACO: delta, their sequence bound, or clip_range)"""
    json: bool = False
    """print the report as JSON instead of one line"""


def calibrate_export(args: CalibrateArgs) -> CalibrationReport:
    """Check the arguments, read the step's export and calibrate on it; ValueError in one line for what a user can
    fix."""
    if not args.run.is_dir():
        raise ValueError(f"{args.run} is not a run directory")
    if (args.target is None) == (args.like is None):
        raise ValueError("give --target (a fraction of tokens to block) or --like (a preset to match), one of them")
    tr = TrustRegion.preset(args.trust_region) if args.trust_region else run_trust_region(args.run)
    like = TrustRegion.preset(args.like) if args.like else None
    band_of(tr, args.band)
    if args.target is not None:
        check_target(args.target)
    check_export_serves(tr, "--trust-region")
    if like is not None:
        check_export_serves(like, "--like")
    step = export_step(args.run, args.step)
    _, report = calibrate(tr, export_batch(args.run, step), args.target, like=like, unit=args.unit, band=args.band)
    return replace(report, source=f"step {step}'s token export")


def summary_line(report: CalibrationReport) -> str:
    """The report's line and the flags that train with the band."""
    return f"{report.line()}; train with --trust-region {report.trust_region} {report.flags()}"


PROG = "python -m dppo_oat.calibrate"


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: exit 0 with the band printed; 2 with one ``error:`` line on stderr for bad input."""
    with one_line_usage_errors(PROG):  # a mistyped value, flag or a missing run: one error: line, not tyro's box
        args = tyro.cli(CalibrateArgs, args=argv, prog=PROG)
    try:
        report = calibrate_export(args)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.json:
        print(json.dumps(to_jsonable(report.as_dict()), indent=2))
    else:
        print(summary_line(report))


if __name__ == "__main__":
    main()
