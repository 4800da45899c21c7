"""``python -m dppo_oat.train --engine oat [oat and DPPO flags]``: parse, check, plan, and launch oat's program.

As oat's own entry points do: tyro parses the arguments (:class:`~dppo_oat.engines.oat.args.DPPOOatArgs`, so every
flag of oat's ``PPOArgs`` works), ``oat.interface.get_program`` builds the launchpad program with DPPO's learner and
actor classes, and ``launchpad.launch`` runs it on this node. Before that, every check that needs no GPU runs and
the resolved plan is printed (:mod:`~dppo_oat.engines.oat.plan`); ``--dry_run`` stops there, so a plan can be
checked on any machine with the ``oat`` extra installed, even without GPUs, model files or launchpad.

A mistake in the arguments, or a node that cannot compile DeepSpeed's Adam at learner start
(:mod:`~dppo_oat.engines.oat.toolkit`), ends the program with one line on stderr and exit status 2; a run whose
training diverged (every learner stops together, :mod:`~dppo_oat.engines.oat.status`), with one line and exit
status 1; Ctrl-C or SIGTERM (launchpad stops every worker), with one line saying where oat's saved models are and
exit status 130 or 143.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import types
import warnings
from typing import Optional, Sequence

PROG = "python -m dppo_oat.train --engine oat"
DRY_RUN_FLAGS = ("--dry_run", "--dry-run")


def parse_args(argv: Sequence[str]):
    """The command line as :class:`DPPOOatArgs` (oat's flag spelling: ``--rollout_batch_size 128``)."""
    import tyro

    from dppo_oat.engines.oat.args import DPPOOatArgs
    from dppo_oat.usage import one_line_usage_errors

    with warnings.catch_warnings():  # tyro warns about oat's own ``str = None`` fields
        warnings.filterwarnings("ignore", message=".*is annotated with type", category=UserWarning)
        with one_line_usage_errors(PROG):  # a mistyped value or flag: one error: line, not tyro's box
            return tyro.cli(DPPOOatArgs, args=list(argv), prog=PROG, description=__doc__)


def build_program(args):
    """oat's launchpad program and local resources, with :class:`DPPOLearner` and :class:`DPPOGemActor`."""
    from oat.interface import get_program

    from dppo_oat.engines.oat.actor import DPPOGemActor
    from dppo_oat.engines.oat.learner import DPPOLearner

    return get_program(args, learner_cls=DPPOLearner, actor_cls=DPPOGemActor)


def is_dry_run(argv: Sequence[str]) -> bool:
    return any(arg in DRY_RUN_FLAGS or arg.startswith(tuple(f"{f}=" for f in DRY_RUN_FLAGS)) for arg in argv)


def stand_in_for_missing_launchpad() -> None:
    """A dry run launches nothing, but oat imports launchpad at import time: where launchpad is not installed
    (it has Python 3.10 wheels only), put an empty module in its place whose every use fails with a clear error."""
    if importlib.util.find_spec("launchpad") is not None:
        return

    def missing(name: str):
        if name.startswith("__"):  # introspection (__file__, __path__ ...) sees an ordinary module without them
            raise AttributeError(name)
        raise ImportError(f"launchpad.{name}: launchpad is not installed (dm-launchpad, Python 3.10); "
                          "only --dry_run works without it")

    module = types.ModuleType("launchpad")
    module.__getattr__ = missing  # PEP 562: any attribute access fails loudly
    sys.modules["launchpad"] = module


def checked_plan(argv: Sequence[str]):
    """Parse and check the command line; ``(args, plan)``. Raises ValueError / AssertionError (oat's checks)."""
    from dppo_oat.engines.oat.args import validate_args
    from dppo_oat.engines.oat.plan import plan_of

    args = parse_args(argv)
    args = validate_args(args, check_gpus=not args.dry_run)
    return args, plan_of(args)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Parse, check (DPPO's checks, the plan's, then oat's) and print the plan; launch unless ``--dry_run``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if is_dry_run(argv):
        stand_in_for_missing_launchpad()
    try:
        from dppo_oat.engines.oat.plan import render_plan
        from dppo_oat.engines.oat.toolkit import optimizer_toolkit, toolkit_line, toolkit_problem

        args, plan = checked_plan(argv)
    except ImportError as error:
        _fail(f"the oat engine needs the [oat] extra (docs/engines/oat.md): {error}")
    except (ValueError, AssertionError) as error:
        _fail(str(error))
    except KeyboardInterrupt:
        _fail("interrupted before anything was launched", status=130)
    toolkit = optimizer_toolkit(args.adam_offload)
    print(render_plan(plan), toolkit_line(toolkit), sep="\n", flush=True)
    if args.dry_run:
        return
    problem = toolkit_problem(toolkit)
    if problem:
        _fail(problem)
    reason, stopped_by = launch_and_wait(args)
    if reason:
        _fail(f"training diverged: {reason}", status=1)
    if stopped_by is not None:
        _fail(stopped_message(args, stopped_by), status=128 + stopped_by)


def launch_and_wait(args) -> tuple[Optional[str], Optional[int]]:
    """Launch the program on this node and wait until its workers are gone (``lp.stop``: the end of the run, or a
    divergence; or Ctrl-C / SIGTERM, on which launchpad stops the workers itself). Returns the reason a learner
    reported for a divergence, and the signal that stopped the run (None for each when neither happened)."""
    import launchpad as lp

    from dppo_oat.engines.oat.status import divergence_reporting, read_divergence

    with divergence_reporting() as status:
        program, local_resources = build_program(args)
        manager = lp.launch(program, launch_type=args.launch_type, local_resources=local_resources,
                            terminal="current_terminal")
        stops: list[int] = []
        record_stop_signals(stops)  # launchpad's handlers are in place now
        if callable(getattr(manager, "wait", None)):
            manager.wait()  # launchpad's worker manager
        return read_divergence(status), (stops[0] if stops else None)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def record_stop_signals(received: list) -> None:
    """Put a recorder in front of this process's Ctrl-C and SIGTERM handlers. launchpad's worker manager handles
    both by stopping every worker (SIGTERM to each, a kill after its notice), after which ``wait()`` returns as at
    the end of a run: the recorder lets the launcher tell a stopped run from a finished one. A signal whose handler
    is the default is re-sent with the default restored, so it still ends the process."""
    for sig in STOP_SIGNALS:
        inner = signal.getsignal(sig)

        def record(signum, frame, inner=inner):
            received.append(signum)
            if callable(inner):
                inner(signum, frame)
            elif inner == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, record)


def stopped_message(args, signum: int) -> str:
    """What a stopped oat run left behind and how to go on (oat runs cannot be resumed)."""
    what = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    return (f"{what}: launchpad stopped every worker; the models oat saved are in {args.save_path}/"
            f"{args.wb_run_name}_<start time>/saved_models: go on with a new run from the last one (--pretrain "
            "<that folder>/step_NNNNN), as an oat run cannot be resumed")


def _fail(message: str, status: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
