"""``dppo-plot``: learning curves like the paper's from run directories, as one image.

    python -m dppo_oat.plot runs/dppo-* runs/grpo-* -o figure.png --metrics reward success mismatch --sigma 2

Each ``--metrics`` name is a standard panel (listed in ``--help``) or any metric a run logs; panels no run has data
for are skipped with a note. A curve whose rule cannot be read as a trust region (it blocked under 0.1% or over 50%
of the tokens, or most of its runs collapsed within 5 steps: :mod:`dppo_oat.analysis.degenerate`) is named with its
flag in the legend and in a ``flagged curve`` note. Every path must be a run directory
(``config.json``/``metrics.jsonl``); glob patterns keep the run directories they match. A damaged run, or one that
logged nothing yet, is skipped with a warning (:func:`dppo_oat.analysis.runs.load_runs`); so are log rows whose step
lies outside [0, 1e9], and a run without ``config.json`` or with a null trust region is drawn with one. ``-o`` names
a file: a directory, or a suffix matplotlib cannot write, is refused before any run is read, as is an option out of
its range (``--ncols`` past 16, ``--dpi`` past 1200); without a suffix the image is a PNG named ``<output>.png``.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import matplotlib

matplotlib.use("Agg")

import tyro
from matplotlib.backend_bases import FigureCanvasBase

from dppo_oat.analysis import DEFAULT_PANELS, PANELS, curve_flags, load_runs, plot_runs, resolve_run_dirs
from dppo_oat.analysis.figures import group_name
from dppo_oat.analysis.panels import available_panels
from dppo_oat.settings.usage import one_line_usage_errors


@dataclass
class PlotArgs:
    """The options of ``dppo-plot``."""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR...")]
    """run directories or glob patterns (quote the pattern to let the program expand it)"""
    output: Annotated[Path, tyro.conf.arg(aliases=("-o",))] = Path("figure.png")
    """the image to write (its suffix picks the format: png, pdf, svg)"""
    metrics: tuple[str, ...] = DEFAULT_PANELS
    """panels: standard panel names (see above) or raw metric names"""
    sigma: float = 2.0
    """Gaussian smoothing in logged steps (0: raw curves only)"""
    by: Literal["method", "algo", "variant", "label", "run", "env", "seed"] = "method"
    """one curve per: method (its seeds averaged), algo (preset), label/run (every run), env, seed"""
    band: Literal["std", "minmax", "none"] = "std"
    """spread across the runs of a curve"""
    ncols: int | None = None
    """panels per row, at most 16 (None: up to 4)"""
    title: str | None = None
    """a title above the figure"""
    dpi: int = 150
    """resolution of raster images, in [1, 1200]"""


DESCRIPTION = (
    "Learning curves of DPPO runs: one panel per metric, every method overlaid, Gaussian-smoothed over the raw "
    "curves. Standard panels: " + ", ".join(PANELS) + "."
)


def parse_args(argv: Sequence[str] | None = None) -> PlotArgs:
    """The command line as :class:`PlotArgs` (exits with status 2 and one ``dppo-plot: error:`` line when it does
    not parse, :mod:`dppo_oat.settings.usage`)."""
    with one_line_usage_errors("dppo-plot", prefix="dppo-plot: error: "):
        return tyro.cli(PlotArgs, args=argv, prog="dppo-plot", description=DESCRIPTION)


class OutputError(ValueError):
    """An ``-o`` the image cannot be written to, or an option out of its range (both refused before any run is
    read)."""


def output_problem(output: Path) -> str | None:
    """Why ``output`` cannot name the image (None when it can): it is a directory, one of its folders is a file, or
    matplotlib cannot write its suffix."""
    if output.is_dir():
        return f"-o {output} is a directory: give a file name such as {output / 'figure.png'}"
    for folder in output.parents:
        if folder.exists() and not folder.is_dir():
            return f"-o {output}: {folder} is a file, not a folder"
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    suffix = output.suffix[1:].lower()
    if suffix and suffix not in formats:
        return (f"-o {output}: matplotlib cannot write .{suffix} files; give one of "
                + ", ".join(f".{name}" for name in formats))
    return None


MAX_NCOLS = 16
"""The most panels a row (``--ncols``): a figure 64 inches wide. Far past it, laying out the empty grid cells alone
takes hours (``--ncols 1000``)."""
MAX_DPI = 1200
"""The highest resolution (``--dpi``), a print shop's; far past it a figure's pixels outgrow the memory
(``--dpi 100000``: a ``MemoryError``)."""


def options_problem(args: PlotArgs) -> str | None:
    """Why an option is out of its range (None when none is): the smoothing's σ is a finite number ≥ 0, the panels
    per row are in [1, :data:`MAX_NCOLS`] and the resolution in [1, :data:`MAX_DPI`]."""
    if not 0 <= args.sigma < math.inf:
        return f"--sigma must be a finite number >= 0 (0: raw curves only), got {args.sigma}"
    if args.ncols is not None and not 1 <= args.ncols <= MAX_NCOLS:
        return f"--ncols must be in [1, {MAX_NCOLS}] (leave it out for up to 4 panels a row), got {args.ncols}"
    if not 1 <= args.dpi <= MAX_DPI:
        return f"--dpi must be in [1, {MAX_DPI}] (150 by default; 300 prints sharp), got {args.dpi}"
    return None


def output_file(output: Path) -> Path:
    """The file the image is written to: ``output``, with matplotlib's default format (``.png``) appended when it
    has no suffix (as ``savefig`` does)."""
    return output if output.suffix else output.with_name(f"{output.name}.{matplotlib.rcParams['savefig.format']}")


def plot(args: PlotArgs) -> tuple[list[str], list[str]]:
    """Check the output and every run path first, then draw and save the figure (to :func:`output_file`). Returns
    the notes on skipped panels and on flagged curves (``<curve>: <flag>``, as the legend names them).

    Raises:
        OutputError: ``args.output`` cannot name the image (:func:`output_problem`).
        ValueError: a path that is not a run directory, a pattern without one, no readable run, or nothing to plot.
    """
    problem = output_problem(args.output) or options_problem(args)
    if problem is not None:
        raise OutputError(problem)
    if not args.runs:
        raise ValueError("give at least one run directory")
    df = load_runs(resolve_run_dirs(args.runs))
    _, skipped = available_panels(df, args.metrics)
    fig = plot_runs(df, metrics=args.metrics, sigma=args.sigma, by=args.by, band=args.band, ncols=args.ncols,
                    title=args.title)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output_file(args.output), dpi=args.dpi)
    flagged = [f"{group_name(group, args.by)}: {flag}" for group, flag in curve_flags(df, args.by).items()]
    return skipped, flagged


@contextmanager
def one_line_warnings():
    """Within it, each warning is printed as one line on stderr: ``dppo-plot: warning: <message>``."""
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_, **__: print(f"dppo-plot: warning: {message}", file=sys.stderr)
        yield


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``dppo-plot``: exit status 0 with the image written; 2 for an ``-o`` that cannot name it
    (before any run is read); else 1. Each error, warning and skipped panel is one line on stderr; stdout says only
    which file was written."""
    args = parse_args(argv)
    try:
        with one_line_warnings():
            skipped, flagged = plot(args)
    except OutputError as error:
        print(f"dppo-plot: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, KeyError, OSError) as error:
        print(f"dppo-plot: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    for note in skipped:
        print(f"dppo-plot: skipped panel {note}", file=sys.stderr)
    for note in flagged:
        print(f"dppo-plot: flagged curve {note}", file=sys.stderr)
    print(f"wrote {output_file(args.output)}")


if __name__ == "__main__":
    main()
