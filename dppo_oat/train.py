"""``python -m dppo_oat.train``: train a policy with DPPO (or any preset of the paper).

With no arguments, on any machine: build and cache a tiny Sudoku policy warm-started to partial success, run
DPPO-Binary-TV on ``game:Sudoku-v0-easy`` (compact observation), and print held-out success before and after.
``--engine oat`` hands the remaining arguments to the oat engine (one GPU node; see docs/engines/oat.md).
"""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
import threading
from typing import Sequence

import tyro

from dppo_oat.engines.local.config import TrainConfig


def engine_of(argv: Sequence[str]) -> str:
    """The value of ``--engine`` in ``argv`` (``local`` when absent)."""
    for i, arg in enumerate(argv):
        if arg == "--engine" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--engine="):
            return arg.split("=", 1)[1]
    return "local"


def without_engine_flag(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--engine":
            skip = True
            continue
        if not arg.startswith("--engine="):
            out.append(arg)
    return out


def run_local(config: TrainConfig) -> dict:
    """Build the local trainer (validating first) and train. What a user can reach ends in one line, never a
    traceback: bad input (exit 2), a run that cannot go on or a file that cannot be written (exit 1), Ctrl-C (exit
    130) or SIGTERM (exit 143), each with how to continue. A new run that fails before its first checkpoint leaves
    no run directory."""
    from rich.console import Console

    from dppo_oat.engines.local.trainer import LocalTrainer
    from dppo_oat.errors import RunError, TrainingDiverged
    from envs.contract import BrokenEnvError

    console, trainer, failed = Console(), None, True
    with signals_as_interrupts():
        try:
            try:
                trainer = LocalTrainer(config, console)
            except ValueError as error:  # bad input: every check runs while the trainer is built
                _fail(console, str(error), 2)
            summary = trainer.run()
            failed = False
            return summary
        except TrainingDiverged as error:
            where = "" if trainer is None else f" at step {trainer.step_in_progress}"
            _fail(console, f"training diverged{where}: {error}", 1)
        except (RunError, BrokenEnvError) as error:
            _fail(console, str(error), 1)
        except OSError as error:
            if error.filename is None:  # not a file the run reads or writes: a bug, with its traceback
                raise
            _fail(console, _file_failure(error, trainer, config), 1)
        except KeyboardInterrupt as interrupt:
            ignore_signals()  # a second Ctrl-C must not cut the cleanup short with a traceback
            _fail(console, _interrupted(trainer, config, interrupt), 143 if isinstance(interrupt, Terminated) else 130)
        finally:
            if trainer is not None:
                trainer.close(failed=failed)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, ``kill``), handled as Ctrl-C is."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def signals_as_interrupts():
    """While the block runs, SIGTERM raises :class:`Terminated` (its default would end the process without a word
    and without releasing anything); on the way out, SIGINT and SIGTERM get back the handlers they had."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ignore_signals() -> None:
    """Ignore further Ctrl-C and SIGTERM (until :func:`signals_as_interrupts` restores the handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _fail(console, message: str, code: int) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise SystemExit(code) from None


def _resume_hint(trainer, config: TrainConfig) -> str:
    if trainer is None or trainer.checkpointed_step == 0:
        return "nothing was checkpointed yet: run the same command again to start over"
    return (f"step {trainer.checkpointed_step} is checkpointed in {config.run_path()}: the same command with --resume "
            "continues")


def _interrupted(trainer, config: TrainConfig, interrupt: KeyboardInterrupt) -> str:
    """What Ctrl-C or SIGTERM left behind and how to go on."""
    what = "terminated (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"
    if trainer is None or trainer.checkpointed_step == 0:
        return f"{what} before the first checkpoint: run the same command again to start over"
    return f"{what} at step {trainer.step_in_progress}; {_resume_hint(trainer, config)}"


def _file_failure(error: OSError, trainer, config: TrainConfig) -> str:
    """A file the run could not write (a full disk, a quota, lost permissions): which, and how to go on."""
    reason = error.strerror or type(error).__name__
    fix = "free disk space; " if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
    return f"{reason}: {error.filename}; {fix}{_resume_hint(trainer, config)}"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if engine_of(argv) == "oat":
        from dppo_oat.engines.oat.launch import main as oat_main

        oat_main(without_engine_flag(argv))
        return
    config = tyro.cli(TrainConfig, args=argv, description=f"{__doc__}\n{TrainConfig.__doc__}")
    run_local(config)


if __name__ == "__main__":
    main()
