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
    """Build the local trainer (validating first) and train; user errors exit with one clear message."""
    from rich.console import Console

    from dppo_oat.engines.local.trainer import LocalTrainer

    console = Console()
    try:
        trainer = LocalTrainer(config, console)
    except ValueError as error:
        console.print(f"[bold red]error:[/] {error}")
        raise SystemExit(2) from None
    return trainer.run()


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
