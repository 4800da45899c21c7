"""How a learner tells the launcher that the run diverged, so that ``python -m dppo_oat.train --engine oat`` ends with
one line and exit status 1 (launchpad ignores its workers' exit statuses when they run in the current terminal).

The launcher names a file in :data:`STATUS_FILE_ENV` before it launches (launchpad's workers inherit its
environment); rank 0 writes the reason there before it stops the program; the launcher reads it once the workers
are gone. Imports nothing of oat or launchpad.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

STATUS_FILE_ENV = "DPPO_OAT_STATUS_FILE"


@contextlib.contextmanager
def divergence_reporting() -> Iterator[Path]:
    """A fresh status file, named in this process's environment (for the workers it starts) while the body runs;
    the file and the name are gone afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="dppo_oat-"))
    previous = os.environ.get(STATUS_FILE_ENV)
    os.environ[STATUS_FILE_ENV] = str(folder / "diverged")
    try:
        yield folder / "diverged"
    finally:
        if previous is None:
            os.environ.pop(STATUS_FILE_ENV, None)
        else:
            os.environ[STATUS_FILE_ENV] = previous
        shutil.rmtree(folder, ignore_errors=True)


def report_divergence(message: str) -> None:
    """Hand ``message`` to the launcher, or print it as the one line when no launcher asked for it."""
    path = os.environ.get(STATUS_FILE_ENV)
    if path:
        Path(path).write_text(message, encoding="utf-8")
    else:
        print(f"error: training diverged: {message}", file=sys.stderr, flush=True)


def read_divergence(path: Path) -> str | None:
    """The reason a learner reported, or None when the run did not diverge."""
    return path.read_text(encoding="utf-8") if path.exists() else None
