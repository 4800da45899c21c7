"""``dppo-plot``: learning curves like the paper's from run directories, as one image.

    python -m dppo_oat.plot runs/dppo-* runs/grpo-* -o figure.png --metrics reward success mismatch --sigma 2

Each ``--metrics`` name is a standard panel (listed in ``--help``) or any metric a run logs; panels no run has data
for are skipped with a note. Every path must be a run directory (``config.json``/``metrics.jsonl``); glob patterns
keep the run directories they match.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")

import tyro  # noqa: E402

from dppo_oat.analysis import DEFAULT_PANELS, PANELS, load_runs, plot_runs, resolve_run_dirs  # noqa: E402
from dppo_oat.analysis.panels import available_panels  # noqa: E402


@dataclass
class PlotArgs:
    """The options of ``dppo-plot``."""

    runs: Annotated[Tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR...")]
    """run directories or glob patterns (quote the pattern to let the program expand it)"""
    output: Annotated[Path, tyro.conf.arg(aliases=("-o",))] = Path("figure.png")
    """the image to write (its suffix picks the format: png, pdf, svg)"""
    metrics: Tuple[str, ...] = DEFAULT_PANELS
    """panels: standard panel names (see above) or raw metric names"""
    sigma: float = 2.0
    """Gaussian smoothing in logged steps (0: raw curves only)"""
    by: Literal["method", "algo", "variant", "label", "run", "env", "seed"] = "method"
    """one curve per: method (its seeds averaged), algo (preset), label/run (every run), env, seed"""
    band: Literal["std", "minmax", "none"] = "std"
    """spread across the runs of a curve"""
    ncols: Optional[int] = None
    """panels per row (None: up to 4)"""
    title: Optional[str] = None
    """a title above the figure"""
    dpi: int = 150
    """resolution of raster images"""


DESCRIPTION = (
    "Learning curves of DPPO runs: one panel per metric, every method overlaid, Gaussian-smoothed over the raw "
    "curves. Standard panels: " + ", ".join(PANELS) + "."
)


def parse_args(argv: Sequence[str] | None = None) -> PlotArgs:
    """The command line as :class:`PlotArgs` (exits with a usage message when it does not parse)."""
    return tyro.cli(PlotArgs, args=argv, prog="dppo-plot", description=DESCRIPTION)


def plot(args: PlotArgs) -> list[str]:
    """Check every run path first, then draw and save the figure. Returns the notes on skipped panels.

    Raises:
        ValueError: a path that is not a run directory, a pattern without one, or nothing to plot.
    """
    if not args.runs:
        raise ValueError("give at least one run directory")
    df = load_runs(resolve_run_dirs(args.runs))
    _, skipped = available_panels(df, args.metrics)
    fig = plot_runs(df, metrics=args.metrics, sigma=args.sigma, by=args.by, band=args.band, ncols=args.ncols,
                    title=args.title)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=args.dpi)
    return skipped


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``dppo-plot``: exit status 0 with the image written, else 1 and an error on stderr."""
    args = parse_args(argv)
    try:
        skipped = plot(args)
    except (ValueError, KeyError, OSError) as error:
        print(f"dppo-plot: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    for note in skipped:
        print(f"skipped panel {note}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
