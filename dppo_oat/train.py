"""``python -m dppo_oat.train``: train a policy with DPPO (or any preset of the paper).

With no arguments, on any machine: build and cache a tiny Sudoku policy warm-started to partial success, run
DPPO-Binary-TV on ``game:Sudoku-v0-easy`` (compact observation), and print held-out success before and after.
``--engine oat`` hands the remaining arguments to the oat engine (one GPU node; see README "On a GPU node").
"""

from __future__ import annotations

import sys
from typing import Sequence

import tyro

from dppo_oat.engines.local.config import TrainConfig, with_current_flags


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
    traceback: bad input (exit 2), a run that cannot go on (exit 1), Ctrl-C (exit 130, with how to continue)."""
    from rich.console import Console

    from dppo_oat.engines.local.trainer import LocalTrainer
    from dppo_oat.errors import RunError, TrainingDiverged

    console, trainer = Console(), None
    try:
        try:
            trainer = LocalTrainer(config, console)
        except ValueError as error:  # bad input: every check runs while the trainer is built
            _fail(console, str(error), 2)
        return trainer.run()
    except TrainingDiverged as error:
        where = "" if trainer is None else f" at step {trainer.step_in_progress}"
        _fail(console, f"training diverged{where}: {error}", 1)
    except RunError as error:
        _fail(console, str(error), 1)
    except KeyboardInterrupt:
        _fail(console, _interrupted(trainer, config), 130)
    finally:
        if trainer is not None:
            trainer.close()


def _fail(console, message: str, code: int) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise SystemExit(code) from None


def _interrupted(trainer, config: TrainConfig) -> str:
    """What Ctrl-C left behind and how to go on."""
    if trainer is None or trainer.checkpointed_step == 0:
        return "interrupted before the first checkpoint: run the same command again to start over"
    return (f"interrupted at step {trainer.step_in_progress}; step {trainer.checkpointed_step} is checkpointed in "
            f"{config.run_path()}: the same command with --resume continues")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if engine_of(argv) == "oat":
        from dppo_oat.engines.oat.launch import main as oat_main

        oat_main(without_engine_flag(argv))
        return
    config = tyro.cli(TrainConfig, args=with_current_flags(argv), description=f"{__doc__}\n{TrainConfig.__doc__}")
    run_local(config)


if __name__ == "__main__":
    main()
