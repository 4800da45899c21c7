"""Execute the notebooks top to bottom and write the executed copies (figures, tables) into an output folder.

    python scripts/run_notebooks.py [--out DIR] [NOTEBOOK ...]   (make notebooks [OUT=DIR] [NOTEBOOKS=...]: all
                                                                  three of DEFAULT unless NOTEBOOKS names some)

Each runs in notebooks/ (so ``../runs``, ``example_runs/`` and ``data/`` are found from there). learning_curves and
clipped_tokens read the runs they find themselves (``DPPO_RUNS``, else ``runs/``, else the example runs; see
``dppo_oat.analysis.notebook_runs``); cpu_study reads the CPU study's committed runs (``data/cpu_study``), or the
study folder ``DPPO_STUDY`` names. Relative paths and globs in ``DPPO_RUNS`` and ``DPPO_STUDY`` start from
``DPPO_RUNS_BASE``, which this script sets to the folder it was run from unless it is set. The executed copies go to
``--out`` (default ``notebooks/out``, ignored by git); ``--out notebooks`` rewrites the committed notebooks in place.
A cell that fails stops the script with the cell's error (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
DEFAULT = ("learning_curves.ipynb", "clipped_tokens.ipynb", "cpu_study.ipynb")
"""What ``make notebooks`` executes: every committed notebook (each runs offline in a fresh clone)."""
DEFAULT_OUT = NOTEBOOKS / "out"


def execute(path: Path, out: Path, timeout: int = 600) -> Path:
    """Run ``path`` in its folder (kernel over local IPC sockets) and write it with its outputs into ``out``;
    returns the written file."""
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as sockets:
        ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
        client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", config=ipc,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    out.mkdir(parents=True, exist_ok=True)
    written = out / path.name
    nbformat.write(notebook, written)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=DEFAULT, help="notebook names in notebooks/")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="folder for the executed copies (notebooks: rewrite the committed ones in place)")
    args = parser.parse_args(argv)
    base = os.environ["DPPO_RUNS_BASE"] = os.environ.get("DPPO_RUNS_BASE") or os.getcwd()
    if os.environ.get("DPPO_STUDY"):  # the kernel runs in notebooks/: a relative study folder starts from the caller's
        os.environ["DPPO_STUDY"] = str(Path(base) / os.environ["DPPO_STUDY"])
    out = args.out.resolve()
    for name in args.notebooks:
        path = NOTEBOOKS / name
        print(f"executing {path.relative_to(NOTEBOOKS.parent)} ...", flush=True)
        try:
            written = execute(path, out)
        except CellExecutionError as error:
            print(f"error: {name} failed:\n{error}", file=sys.stderr)
            return 1
        print(f"  wrote {written}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
