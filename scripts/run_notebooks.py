"""Execute the notebooks top to bottom: copies with their outputs into a folder, or the committed ones refreshed.

    python scripts/run_notebooks.py [--out DIR] [NOTEBOOK ...]          (make notebooks [OUT=DIR] [NOTEBOOKS=...])
    python scripts/run_notebooks.py --refresh [--force] [NOTEBOOK ...]  (make notebooks-refresh [FORCE=1])

A NOTEBOOK is one of :data:`NOTEBOOKS` by its name (``cpu_study.ipynb``) or its path from the repository's root,
or the path of any other notebook; none: all of :data:`NOTEBOOKS`. Each runs in its own folder (so ``../runs``,
``example_runs/`` and ``data/`` are found from there). learning_curves and clipped_tokens read the runs they find
themselves (``DPPO_RUNS``, else ``runs/``, else the example runs; see ``dppo_oat.analysis.notebook_runs``);
cpu_study reads the CPU study's committed runs (``studies/cpu/data``), or the study folder ``DPPO_STUDY`` names.
Relative paths and globs in ``DPPO_RUNS`` and ``DPPO_STUDY`` start from ``DPPO_RUNS_BASE``, which this script sets
to the folder it was run from unless it is set. The executed copies go to ``--out`` (default ``notebooks/out``,
ignored by git).

The committed notebooks keep their outputs, so that their figures show on GitHub (as palette PNGs:
:func:`palette_images`), and record in their metadata a hash of their inputs (:func:`inputs_digest`: their code
cells and the committed files :data:`NOTEBOOKS` says they read). ``--refresh`` re-executes in place only the
committed notebooks whose inputs changed since they were executed (``--force``: all of them), so a change that
touches no notebook's inputs leaves every notebook's outputs alone; a test checks each committed notebook's hash. A
cell that fails stops the script with the cell's error (exit 1).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

from dppo_oat.run.safe_io import atomic_write_bytes

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {
    "notebooks/learning_curves.ipynb": ("notebooks/example_runs",),
    "notebooks/clipped_tokens.ipynb": ("notebooks/example_runs",),
    "studies/cpu/cpu_study.ipynb": ("studies/cpu/data", "studies/cpu/claims.py", "studies/cpu/report.py",
                                    "studies/cpu/page.py", "studies/cpu/packed.py", "studies/cpu/figures.py"),
}
"""The committed notebooks (what ``make notebooks`` executes; each runs offline in a fresh clone), each with the
committed files and folders it reads (from the repository's root): the inputs its recorded hash covers. The
package's own code is not among them: a change there that changes a figure is refreshed with ``--force``."""
DEFAULT_OUT = ROOT / "notebooks" / "out"
METADATA_KEY = "dppo_oat"
"""The notebook metadata entry that records ``inputs`` (the list of :data:`NOTEBOOKS`) and ``inputs_sha256``."""


def input_files(inputs: tuple[str, ...], root: Path | None = None) -> list[Path]:
    """Every file of ``inputs`` (files and folders, from ``root``: the repository's by default), sorted, without
    Python's caches and hidden files (a run directory's ``.lock``, which a run leaves and git ignores)."""
    root, files = root or ROOT, []
    for name in inputs:
        path = root / name
        found = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        files += [p for p in found if "__pycache__" not in p.parts and p.suffix != ".pyc"
                  and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return files


def inputs_digest(notebook: nbformat.NotebookNode, inputs: tuple[str, ...], root: Path | None = None) -> str:
    """SHA-256 of what a notebook's outputs are computed from: its code cells' sources and the bytes of each file of
    ``inputs`` with its path from ``root`` (the repository's by default; markdown cells and outputs are not
    inputs)."""
    root, digest = root or ROOT, hashlib.sha256()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode() + b"\0")
    for path in input_files(inputs, root):
        if not path.is_file():
            raise FileNotFoundError(f"{path.relative_to(root)}: an input of the notebook is missing")
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded_digest(notebook: nbformat.NotebookNode) -> str | None:
    """The inputs hash a committed notebook recorded when it was executed, if any."""
    return notebook.metadata.get(METADATA_KEY, {}).get("inputs_sha256")


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Run ``path`` in its folder (kernel over local IPC sockets), without timestamps in its cells; returns the
    executed notebook."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    with tempfile.TemporaryDirectory() as sockets:
        ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
        client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", config=ipc, record_timing=False,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    return notebook


PALETTE_COLORS = 64
"""Colours of a committed notebook's figures: enough for their curves, bands and text, at a quarter of the bytes."""


def palette_images(notebook: nbformat.NotebookNode, colors: int = PALETTE_COLORS) -> None:
    """Re-encode each PNG a cell displayed as a palette PNG of ``colors`` colours (on white), where that is smaller,
    so that the committed notebooks stay small."""
    from PIL import Image

    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" not in data:
                continue
            png = base64.b64decode(data["image/png"])
            image = Image.open(io.BytesIO(png)).convert("RGBA")
            white = Image.new("RGBA", image.size, "white")
            palette = Image.alpha_composite(white, image).convert("RGB").quantize(
                colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
            small = io.BytesIO()
            palette.save(small, format="PNG", optimize=True)
            if small.tell() < len(png):
                data["image/png"] = base64.b64encode(small.getvalue()).decode()


class Refused(ValueError):
    """A command line this script refuses, before any notebook runs: its message is the one line it prints."""


def resolve(name: str, refresh: bool = False) -> tuple[Path, tuple[str, ...]]:
    """A notebook named on the command line: its path and its inputs (none for a notebook not in :data:`NOTEBOOKS`,
    which ``refresh`` refuses: it rewrites committed notebooks only)."""
    for committed, inputs in NOTEBOOKS.items():
        if name in (committed, Path(committed).name) or Path(name).resolve() == ROOT / committed:
            return ROOT / committed, inputs
    names = ", ".join(Path(committed).name for committed in NOTEBOOKS)
    if refresh:
        raise Refused(f"error: --refresh rewrites the committed notebooks only ({names}), not {name!r}")
    if not Path(name).is_file():
        raise Refused(f"error: no notebook {name!r}: name one of {names}, or give a notebook's path")
    return Path(name).resolve(), ()


def check_target(args: argparse.Namespace) -> None:
    """Refuse what would write outputs that are not the committed notebooks' on their committed inputs: a refresh
    that would read other runs, or copies written over the committed notebooks."""
    if args.refresh:
        chosen = [name for name in ("DPPO_RUNS", "DPPO_STUDY") if os.environ.get(name)]
        if chosen:
            raise Refused(f"error: --refresh executes the committed notebooks on their committed inputs: unset "
                          f"{' and '.join(chosen)} (or write copies with --out)")
    elif args.out.resolve() in {(ROOT / committed).parent for committed in NOTEBOOKS}:
        raise Refused(f"error: --out {args.out} would write copies over committed notebooks: re-execute those "
                      "with --refresh (make notebooks-refresh)")


def refresh(path: Path, inputs: tuple[str, ...], force: bool) -> str:
    """Re-execute the committed notebook ``path`` in place when its inputs changed since it was executed (or
    ``force``), recording their hash; returns what was done."""
    committed = nbformat.read(path, as_version=4)
    digest = inputs_digest(committed, inputs)
    if recorded_digest(committed) == digest and not force:
        return "inputs unchanged since it was executed: kept as it is"
    print(f"executing {shown(path)} in place ...", flush=True)
    notebook = execute(path)
    palette_images(notebook)
    notebook.metadata[METADATA_KEY] = {"inputs": list(inputs), "inputs_sha256": digest}
    atomic_write_bytes(path, nbformat.writes(notebook).encode() + b"\n")  # a kill mid-write leaves the old one
    return "re-executed and rewritten, with the hash of its inputs"


def shown(path: Path) -> Path:
    """``path`` from the repository's root when it lies inside it (no machine path in what is printed)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=list(NOTEBOOKS),
                        help="notebook names or paths (default: every committed notebook)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the executed copies")
    parser.add_argument("--refresh", action="store_true",
                        help="re-execute the committed notebooks whose inputs changed, in place")
    parser.add_argument("--force", action="store_true", help="with --refresh: re-execute even unchanged ones")
    args = parser.parse_args(argv)
    try:
        check_target(args)
        chosen = [resolve(name, args.refresh) for name in args.notebooks]
    except Refused as refused:
        print(refused, file=sys.stderr)
        return 2
    base = os.environ["DPPO_RUNS_BASE"] = os.environ.get("DPPO_RUNS_BASE") or os.getcwd()
    if os.environ.get("DPPO_STUDY"):  # the kernel runs in the notebook's folder: a relative study folder starts
        os.environ["DPPO_STUDY"] = str(Path(base) / os.environ["DPPO_STUDY"])  # from the caller's
    for path, inputs in chosen:
        try:
            if args.refresh:
                print(f"{shown(path)}: {refresh(path, inputs, args.force)}", flush=True)
                continue
            print(f"executing {shown(path)} ...", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            written = args.out.resolve() / path.name
            nbformat.write(execute(path), written)
        except CellExecutionError as error:
            print(f"error: {path.name} failed:\n{error}", file=sys.stderr)
            return 1
        except FileNotFoundError as error:  # an input of a committed notebook is missing from this checkout
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"  wrote {written}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
