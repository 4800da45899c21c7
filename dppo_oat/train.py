"""``python -m dppo_oat.train``: train a policy with DPPO (or any preset of the paper).

With no arguments, on any machine: build and cache a tiny Sudoku policy warm-started to partial success, run
DPPO-Binary-TV on ``game:Sudoku-v0-easy`` (compact observation), and print held-out success before and after.
``--engine oat`` hands the remaining arguments to the oat engine (one GPU node; see docs/engines/oat.md).
"""

from __future__ import annotations

import os
import signal
import sys


def _stopped_while_starting(signum, frame) -> None:
    """Ctrl-C or SIGTERM while ``python -m dppo_oat.train`` imports its modules (torch, transformers, the engine):
    one line, exit 130 or 143 (128 + the signal), at once. Nothing is written yet, so the process ends without
    unwinding: an exception raised inside a half-imported extension module (torch's) would leave it broken for the
    next import, or crash the interpreter at exit."""
    what = "interrupted" if signum == signal.SIGINT else "terminated (SIGTERM)"
    line = f"error: {what} before the run started: nothing was written; run the same command again\n"
    os.write(2, line.encode())
    os._exit(128 + signum)


if __name__ == "__main__":  # the first instruction of the command (the package's own import runs nothing heavy)
    signal.signal(signal.SIGINT, _stopped_while_starting)
    signal.signal(signal.SIGTERM, _stopped_while_starting)

import contextlib  # noqa: E402  (after the signal handlers: Ctrl-C while importing is one line)
import errno  # noqa: E402  (after the signal handlers: Ctrl-C while importing is one line)
import threading  # noqa: E402  (after the signal handlers: Ctrl-C while importing is one line)
from collections.abc import Sequence  # noqa: E402  (after the signal handlers: Ctrl-C while importing is one line)
from typing import TYPE_CHECKING  # noqa: E402  (after the signal handlers: Ctrl-C while importing is one line)

if TYPE_CHECKING:  # imported in main(), where Ctrl-C and SIGTERM already end in one line
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
    for arg in argv:
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
    from dppo_oat.engines.local.progress import line_console
    from dppo_oat.engines.local.trainer import LocalTrainer
    from dppo_oat.errors import RunError, TrainingBlewUp
    from envs.contract import BrokenEnvError

    console, trainer, failed = line_console(), None, True
    with signals_as_interrupts():
        try:
            try:
                trainer = LocalTrainer(config, console)
            except ValueError as error:  # bad input: every check runs while the trainer is built
                _fail(str(error), 2)
            summary = trainer.run()
            failed = False
            return summary
        except TrainingBlewUp as error:
            where = "" if trainer is None else f" at step {trainer.step_in_progress}"
            _fail(f"training diverged{where}: {error}", 1)
        except (RunError, BrokenEnvError) as error:
            _fail(str(error), 1)
        except OSError as error:
            if error.filename is None:  # not a file the run reads or writes: a bug, with its traceback
                raise
            _fail(_file_failure(error, trainer, config), 1)
        except KeyboardInterrupt as interrupt:
            ignore_signals()  # a second Ctrl-C must not cut the cleanup short with a traceback
            _fail(_interrupted(trainer, config, interrupt), _signal_status(interrupt))
        except Exception as error:
            interrupt = interrupt_behind(error)
            if interrupt is None:
                raise
            ignore_signals()
            _fail(_interrupted(trainer, config, interrupt), _signal_status(interrupt))
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
    if previous[signal.SIGINT] is _stopped_while_starting:  # Python's own: Ctrl-C raises KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
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


def _signal_status(interrupt: KeyboardInterrupt) -> int:
    """The exit status of a run a signal ended: 143 for SIGTERM (128 + 15), 130 for Ctrl-C (128 + 2)."""
    return 143 if isinstance(interrupt, Terminated) else 130


def _signal_name(interrupt: KeyboardInterrupt) -> str:
    return "terminated (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"


def _fail(message: str, code: int) -> None:
    """End the command with one ``error:`` line on stderr and exit status ``code``."""
    from rich.markup import escape

    from dppo_oat.engines.local.progress import line_console

    line_console(stderr=True).print(f"[bold red]error:[/] {escape(message)}")
    raise SystemExit(code) from None


def _checkpointed_step(trainer, config: TrainConfig) -> int | None:
    """The step the run directory's checkpoint holds now (None: none), as far as this process knows: the trainer's,
    or, for a resume that stopped before its trainer was built, the checkpoint validation found (left untouched)."""
    if trainer is not None and trainer.checkpointed_step:
        return trainer.checkpointed_step
    if config.resume:
        from dppo_oat.engines.local.validation import checkpointed_step

        return checkpointed_step(config.run_directory())
    return None


def _resume_hint(trainer, config: TrainConfig) -> str:
    step = _checkpointed_step(trainer, config)
    if step is None:
        return "nothing was checkpointed yet: run the same command again to start over"
    return f"step {step} is checkpointed in {config.run_directory()}: the same command with --resume continues"


def _interrupted(trainer, config: TrainConfig, interrupt: KeyboardInterrupt) -> str:
    """What Ctrl-C or SIGTERM left behind and how to go on."""
    if _checkpointed_step(trainer, config) is None:
        return f"{_signal_name(interrupt)} before the first checkpoint: run the same command again to start over"
    where = f" at step {trainer.step_in_progress}" if trainer is not None else " while the run was being built"
    return f"{_signal_name(interrupt)}{where}; {_resume_hint(trainer, config)}"


def _file_failure(error: OSError, trainer, config: TrainConfig) -> str:
    """A file the run could not write (a full disk, a quota, lost permissions): which, and how to go on."""
    reason = error.strerror or type(error).__name__
    fix = "free disk space; " if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
    return f"{reason}: {error.filename}; {fix}{_resume_hint(trainer, config)}"


def main(argv: Sequence[str] | None = None) -> None:
    """The command line. Ctrl-C and SIGTERM end in one line from here on, the imports and the parsing included (the
    package's own import is lazy: nothing heavy runs before this function)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with signals_end_the_start():
        import_engine(argv)
    with signals_as_interrupts():
        try:
            if engine_of(argv) == "oat":
                from dppo_oat.engines.oat.launch import main as oat_main

                oat_main(without_engine_flag(argv))
                return
            config = _parse(argv)
            run_local(config)  # which ends every fault of the run itself in one line
        except KeyboardInterrupt as interrupt:
            ignore_signals()
            _fail(f"{_signal_name(interrupt)} before the run started: nothing was written; run the same command "
                  "again", _signal_status(interrupt))


PROG = "python -m dppo_oat.train"
"""How ``--help`` names the command (not the module's file)."""


@contextlib.contextmanager
def signals_end_the_start():
    """While the block runs, Ctrl-C and SIGTERM end the command at once in one line (:func:`_stopped_while_starting`);
    on the way out, they get back the handlers they had."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, _stopped_while_starting)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def import_engine(argv: Sequence[str]) -> None:
    """Import the modules the command runs (torch, transformers and the engine's; for ``--help``, the flags' alone),
    so that a signal while they load ends the command before anything starts (:func:`signals_end_the_start`)."""
    import importlib

    if engine_of(argv) == "oat":
        importlib.import_module("dppo_oat.engines.oat.launch")
        return
    importlib.import_module("dppo_oat.engines.local.config")
    if not any(arg in ("-h", "--help") for arg in argv):
        importlib.import_module("dppo_oat.engines.local.trainer")


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (:class:`KeyboardInterrupt`) that ``error`` was raised from, if any: a library that
    imports lazily (transformers' model classes) reports an interrupt of its import as its own error."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _parse(argv: list[str]) -> TrainConfig:
    """The local engine's flags (tyro: ``--help`` in sections, or a usage error as one ``error:`` line on stderr with
    exit 2, :mod:`dppo_oat.settings.usage`; a flag under a former name too:
    :func:`~dppo_oat.settings.grouped_cli.former_flag_refusal`). Help piped into a reader that stops early
    (``--help | head``) ends quietly."""
    import inspect

    from dppo_oat.engines.local.config import TrainConfig, parse_config
    from dppo_oat.settings.grouped_cli import as_help
    from dppo_oat.settings.usage import one_line_usage_errors

    description = as_help(f"{__doc__.splitlines()[0]}\n\n{inspect.cleandoc(TrainConfig.__doc__)}")
    try:
        with one_line_usage_errors(PROG):  # a mistyped value or flag: one error: line, not tyro's box
            return parse_config(argv, prog=PROG, description=description)
    except ValueError as error:  # a flag under its former name, refused before tyro parses
        _fail(str(error), 2)


if __name__ == "__main__":
    main()
