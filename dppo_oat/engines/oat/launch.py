"""``python -m dppo_oat.train --engine oat [oat and DPPO flags]``: parse, validate and launch oat's program.

As oat's own entry points do: tyro parses the arguments (:class:`~dppo_oat.engines.oat.args.DPPOOatArgs`, so every
flag of oat's ``PPOArgs`` works), ``oat.interface.get_program`` builds the launchpad program with DPPO's learner and
actor classes, and ``launchpad.launch`` runs it on this node.
"""

from __future__ import annotations

import sys
import warnings
from typing import Optional, Sequence

import launchpad as lp
import tyro
from oat.interface import get_program

from dppo_oat.engines.oat.actor import DPPOGemActor
from dppo_oat.engines.oat.args import DPPOOatArgs, validate_args
from dppo_oat.engines.oat.learner import DPPOLearner

PROG = "python -m dppo_oat.train --engine oat"


def parse_args(argv: Sequence[str]) -> DPPOOatArgs:
    """The command line as :class:`DPPOOatArgs` (oat's flag spelling: ``--rollout_batch_size 128``)."""
    with warnings.catch_warnings():  # tyro warns about oat's own ``str = None`` fields
        warnings.filterwarnings("ignore", message=".*is annotated with type", category=UserWarning)
        return tyro.cli(DPPOOatArgs, args=list(argv), prog=PROG, description=__doc__)


def build_program(args: DPPOOatArgs):
    """oat's launchpad program and local resources, with :class:`DPPOLearner` and :class:`DPPOGemActor`."""
    return get_program(args, learner_cls=DPPOLearner, actor_cls=DPPOGemActor)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Parse, validate (DPPO's checks, then oat's) and launch on this node."""
    args = validate_args(parse_args(sys.argv[1:] if argv is None else argv))
    program, local_resources = build_program(args)
    lp.launch(program, launch_type=args.launch_type, local_resources=local_resources, terminal="current_terminal")


if __name__ == "__main__":
    main()
