"""The RL steps' progress: a live bar on a terminal; where the output goes to a file or a pipe (a job's log, ``nohup``,
``tee``), where a bar draws nothing until the end, one progress line every few steps."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def line_console(stderr: bool = False) -> Console:
    """The command line's console (stdout, or stderr): it never breaks a line (``soft_wrap``), so a path or a command
    it prints stays whole in a log, a pipe or a narrow terminal, where rich would otherwise wrap at the terminal's
    width, or at 80 columns when the output is not a terminal."""
    return Console(stderr=stderr, soft_wrap=True)


PROGRESS_LINES = 20
"""About how many progress lines a run prints over its steps where no bar is drawn (every ``steps // PROGRESS_LINES``
steps, and the last)."""


def line_every(total: int) -> int:
    """Print a progress line every this many steps of ``total``."""
    return max(1, total // PROGRESS_LINES)


class StepProgress:
    """``with StepProgress(console, total, completed) as progress: ... progress.update(step, description)``: a rich
    progress bar when ``console`` is a terminal, else a line ``<description>: step s/total, <elapsed>`` every
    :func:`line_every` steps and at the last."""

    def __init__(self, console: Console, total: int, completed: int = 0):
        self.console, self.total, self.completed = console, total, completed
        self.bar = None
        if console.is_terminal:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self.bar = Progress(*columns, console=console)
        self.start = time.monotonic()

    def __enter__(self) -> StepProgress:
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task("RL steps", total=self.total, completed=self.completed)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, step: int, description: str) -> None:
        """Step ``step`` is done; ``description`` says how it went."""
        if self.bar is not None:
            self.bar.update(self.task, completed=step, description=description)
        elif step % line_every(self.total) == 0 or step == self.total:
            elapsed = time.monotonic() - self.start
            self.console.print(f"{description}: step {step}/{self.total}, {elapsed:.0f} s", soft_wrap=True,
                               highlight=False)
