"""Execute the notebooks in place, top to bottom, so that their committed outputs (figures, tables) are current.

    python scripts/run_notebooks.py [NOTEBOOK ...]     (make notebooks: learning_curves and clipped_tokens)

Each runs in its own folder with the runs it finds itself (``DPPO_RUNS``, else ``runs/``, else the example runs; see
``dppo_oat.analysis.notebook_runs``). A cell that fails stops the script with the cell's error (exit 1).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
DEFAULT = ("learning_curves.ipynb", "clipped_tokens.ipynb")


def execute_in_place(path: Path, timeout: int = 600) -> None:
    """Run ``path`` in its folder and write it back with its outputs (kernel over local IPC sockets)."""
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as sockets:
        ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
        client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", config=ipc,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    nbformat.write(notebook, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=DEFAULT, help="notebook names in notebooks/")
    for name in parser.parse_args(argv).notebooks:
        path = NOTEBOOKS / name
        print(f"executing {path.relative_to(NOTEBOOKS.parent)} ...", flush=True)
        try:
            execute_in_place(path)
        except CellExecutionError as error:
            print(f"error: {name} failed:\n{error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
