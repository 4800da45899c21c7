"""``python tests/kill_points.py OUT POINTS ARGS...``: kill a run at write points, then go on as its user would.

Used by ``tests/test_kill_points.py``. Every write of a run file goes through :mod:`dppo_oat.run.safe_io`, and each
gives two *write points*: an atomic write after its content is written to its temporary file but before the
rename, and after the rename; an append after half its text (a torn line), and after all of it. This process imports the
package once and forks a child per run (it runs no torch operation itself, so the children fork safely):

- ``straight`` (for ``POINTS`` ``all`` or ``none``): the uninterrupted run, which also counts its write points
  (``OUT/points``);
- for each point ``N`` of ``POINTS`` (``all``, ``none``, or ``N,M,...``): ``kill<N>``, SIGKILLed at its N-th write
  point, then the command its user would run next: ``--resume`` where a checkpoint was written, else ``--overwrite``
  (nothing was checkpointed; the earlier files are moved aside).

``OUT/outcomes.json`` records each child's exit status (``OUT/logs/`` its output); the test compares the run
directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path

import dppo_oat.engines.local.trainer  # noqa: F401  (imported once here, not again in every child)
from dppo_oat.run import log as run_log
from dppo_oat.run import safe_io
from dppo_oat.run.directory import CHECKPOINT_FILE
from dppo_oat.train import main


class WritePoints:
    """Counts the write points of run files under ``runs`` and SIGKILLs this process at the ``kill_at``-th
    (0: never)."""

    def __init__(self, runs: Path, kill_at: int = 0):
        self.runs, self.kill_at, self.count = runs.resolve(), kill_at, 0

    def point(self, path) -> None:
        if self.runs not in Path(path).resolve().parents:  # the policy cache, ...
            return
        self.count += 1
        if self.count == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        """Wrap the atomic writes (:mod:`dppo_oat.run.safe_io`'s) and the run log's appends (module globals: every run
        file is written through them)."""
        points, real_replacing, real_append = self, safe_io._replacing, safe_io.append_text

        @contextlib.contextmanager
        def replacing(path):
            with real_replacing(path) as handle:
                yield handle
                points.point(path)  # the temporary file is written, not yet renamed
            points.point(path)

        def append_text(path, text):
            half = len(text) // 2
            real_append(path, text[:half])
            points.point(path)  # a torn line
            real_append(path, text[half:])
            points.point(path)

        safe_io._replacing = replacing
        run_log.append_text = safe_io.append_text = append_text


def in_child(argv: list[str], runs: Path, log: Path, kill_at: int = 0, count_to: Path | None = None) -> int:
    """Run the command in a forked child (killed at write point ``kill_at``), its output into ``log``; its exit
    status, or minus its signal."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(descriptor, 1)
            os.dup2(descriptor, 2)
            points = WritePoints(runs, kill_at)
            points.install()
            try:
                main(argv)
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            if count_to is not None:
                count_to.write_text(str(points.count))
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def battery(out: Path, points: str, args: list[str]) -> None:
    folder, logs = out / "runs", out / "logs"
    logs.mkdir()
    runs = ["--runs-dir", str(folder), *args]
    outcomes = {}
    if points in ("all", "none"):
        outcomes["straight"] = in_child([*runs, "--run-name", "straight"], folder, logs / "straight",
                                        count_to=out / "points")
    total = int((out / "points").read_text()) if outcomes else 0
    named = {"all": range(1, total + 1), "none": range(0)}
    chosen = named[points] if points in named else [int(n) for n in points.split(",")]
    for n in chosen:
        name = f"kill{n}"
        killed = in_child([*runs, "--run-name", name], folder, logs / f"{name}-killed", kill_at=n)
        then = "--resume" if (folder / name / CHECKPOINT_FILE).exists() else "--overwrite"
        outcomes[name] = {"killed": killed, "then": then,
                          "status": in_child([*runs, "--run-name", name, then], folder, logs / f"{name}-then")}
    (out / "outcomes.json").write_text(json.dumps(outcomes, indent=1))


if __name__ == "__main__":
    battery(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
