"""What a learner tells the launcher, so that ``python -m dppo_oat.train --engine oat`` ends with one line that says
what happened and how to go on (launchpad ignores its workers' exit statuses when they run in the current terminal):
the run directory rank 0 writes, that the run reached its end, and the reason it stopped early (it diverged, a
checkpoint could not be written, or a learner failed).

The launcher names a folder in :data:`STATUS_DIR_ENV` before it launches (launchpad's workers inherit its
environment); rank 0 writes into it; the launcher reads it once the workers are gone. Imports nothing of oat or
launchpad.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

STATUS_DIR_ENV = "DPPO_OAT_STATUS_DIR"
FAILURE_FILE = "failure"
RUN_DIR_FILE = "run_dir"
FINISHED_FILE = "finished"


@contextlib.contextmanager
def program_status() -> Iterator[Path]:
    """A fresh status folder, named in this process's environment (for the workers it starts) while the body runs;
    the folder and the name are gone afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="dppo_oat-"))
    previous = os.environ.get(STATUS_DIR_ENV)
    os.environ[STATUS_DIR_ENV] = str(folder)
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop(STATUS_DIR_ENV, None)
        else:
            os.environ[STATUS_DIR_ENV] = previous
        shutil.rmtree(folder, ignore_errors=True)


def _status_file(name: str) -> Path | None:
    folder = os.environ.get(STATUS_DIR_ENV)
    return Path(folder) / name if folder else None


def report_failure(message: str) -> None:
    """Hand the one line the run ends on to the launcher, or print it when no launcher asked for it."""
    path = _status_file(FAILURE_FILE)
    if path is not None:
        path.write_text(message, encoding="utf-8")
    else:
        print(f"error: {message}", file=sys.stderr, flush=True)


def report_run_dir(run_dir: str | Path) -> None:
    """Tell the launcher where the run writes (oat names it by the start time, in the learner's process)."""
    path = _status_file(RUN_DIR_FILE)
    if path is not None:
        path.write_text(str(Path(run_dir).absolute()), encoding="utf-8")


def report_finished() -> None:
    """Tell the launcher that the run reached its end (before ``lp.stop``, which reaches the launcher as SIGTERM)."""
    path = _status_file(FINISHED_FILE)
    if path is not None:
        path.write_text("", encoding="utf-8")


def read_status(folder: Path, name: str) -> str | None:
    """What a learner reported under ``name`` (:data:`FAILURE_FILE`, :data:`RUN_DIR_FILE`), or None."""
    path = Path(folder) / name
    return path.read_text(encoding="utf-8") if path.exists() else None
