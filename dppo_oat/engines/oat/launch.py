"""``python -m dppo_oat.train --engine oat [oat and DPPO flags]``: parse, check, plan, and launch oat's program.

As oat's own entry points do: tyro parses the arguments (:class:`~dppo_oat.engines.oat.args.DPPOOatArgs`, so every
flag of oat's ``PPOArgs`` works), ``oat.interface.get_program`` builds the launchpad program with DPPO's learner and
actor classes, and ``launchpad.launch`` runs it on this node. Before that, every check that needs no GPU runs and
the resolved plan is printed (:mod:`~dppo_oat.engines.oat.plan`); ``--dry_run`` stops there, so a plan can be
checked on any machine with the ``oat`` extra installed, even without GPUs, model files or launchpad.

A mistake in the arguments, or a node that cannot compile DeepSpeed's Adam at learner start
(:mod:`~dppo_oat.engines.oat.preflight`), ends the program with one line on stderr and exit status 2; a run whose
training diverged or whose checkpoint could not be written (every learner stops together,
:mod:`~dppo_oat.engines.oat.status`), with one line and exit status 1; Ctrl-C or SIGTERM (launchpad stops every
worker), with one line giving the command that resumes the run from its newest checkpoint
(:mod:`~dppo_oat.engines.oat.resume`) and exit status 130 or 143. A resumed run (``--resume_dir``) holds its run
directory's lock while it runs: a second resume of the same run is refused in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import shlex
import signal
import sys
import types
import warnings
from collections.abc import Sequence

PROG = "python -m dppo_oat.train --engine oat"
DRY_RUN_FLAGS = ("--dry_run", "--dry-run")


CALIBRATION_REFUSED = (
    "the oat engine does not calibrate a band while it trains (its learners would have to agree on one band per "
    "step from every rank's per-token divergences): calibrate offline from a run's token export (--token_export "
    "all, then python -m dppo_oat.calibrate <run directory> --target F) and pass the band it prints (--tr_delta, "
    "--tr_eps_low and --tr_eps_high, ...)"
)
"""Why the local engine's calibration flags (:class:`~dppo_oat.settings.spec.CalibrationFlags`) are not the oat
engine's."""


def local_flags_given(argv: Sequence[str]) -> list[str]:
    """The local engine's calibration flags in ``argv``, in either spelling (``--tr_calibrate``,
    ``--tr-calibrate-like=…``): the oat engine does not declare them, so that its ``--help`` lists only what it
    honours, and refuses them with :data:`CALIBRATION_REFUSED` rather than as unknown flags."""
    from dppo_oat.settings.spec import CALIBRATION_FLAGS

    spellings = {f"--{name}" for name in CALIBRATION_FLAGS} | {f"--{name.replace('_', '-')}" for name in
                                                                CALIBRATION_FLAGS}
    return [arg.split("=", 1)[0] for arg in argv if arg.split("=", 1)[0] in spellings]


def parse_args(argv: Sequence[str]):
    """The command line as :class:`DPPOOatArgs` (oat's flag spelling: ``--rollout_batch_size 128``); ``--help`` shows
    oat's flags, then DPPO's in sections (:data:`~dppo_oat.engines.oat.args.HELP_GROUPS`). A calibration flag of the
    local engine is a ValueError of one line (:func:`local_flags_given`)."""
    given = local_flags_given(argv)
    if given:
        raise ValueError(f"{', '.join(given)}: {CALIBRATION_REFUSED}")
    from dppo_oat.engines.oat.args import HELP_GROUPS, DPPOOatArgs
    from dppo_oat.settings.grouped_cli import parse_grouped
    from dppo_oat.settings.spec import without_markup
    from dppo_oat.settings.usage import one_line_usage_errors

    with warnings.catch_warnings():  # tyro warns about oat's own ``str = None`` fields
        warnings.filterwarnings("ignore", message=".*is annotated with type", category=UserWarning)
        with one_line_usage_errors(PROG):  # a mistyped value or flag: one error: line, not tyro's box
            return parse_grouped(DPPOOatArgs, HELP_GROUPS, argv, prog=PROG, description=without_markup(__doc__))


def build_program(args):
    """oat's launchpad program and local resources, with :class:`DPPOLearner` and :class:`DPPOGemActor`."""
    from oat.interface import get_program

    if args.on_cpu:
        from dppo_oat.engines.oat.on_cpu import CPUActor as actor_cls
        from dppo_oat.engines.oat.on_cpu import CPULearner as learner_cls
    else:
        from dppo_oat.engines.oat.actor import DPPOGemActor as actor_cls
        from dppo_oat.engines.oat.learner import DPPOLearner as learner_cls

    return get_program(args, learner_cls=learner_cls, actor_cls=actor_cls)


def is_dry_run(argv: Sequence[str]) -> bool:
    return any(arg in DRY_RUN_FLAGS or arg.startswith(tuple(f"{f}=" for f in DRY_RUN_FLAGS)) for arg in argv)


def launches_nothing(argv: Sequence[str]) -> bool:
    """A dry run, or ``--help``: neither needs launchpad."""
    return is_dry_run(argv) or any(arg in ("-h", "--help") for arg in argv)


def stand_in_for_missing_launchpad() -> None:
    """A dry run or --help launches nothing, but oat imports launchpad at import time: where launchpad is not installed
    (it has Python 3.10 wheels only), put an empty module in its place whose every use fails with a clear error."""
    if importlib.util.find_spec("launchpad") is not None:
        return

    def missing(name: str):
        if name.startswith("__"):  # introspection (__file__, __path__ ...) sees an ordinary module without them
            raise AttributeError(name)
        raise ImportError(f"launchpad.{name}: launchpad is not installed (dm-launchpad, Python 3.10); "
                          "only --dry_run and --help work without it")

    module = types.ModuleType("launchpad")
    module.__getattr__ = missing  # PEP 562: any attribute access fails loudly
    sys.modules["launchpad"] = module


def checked_plan(argv: Sequence[str]):
    """Parse and check the command line; ``(args, plan)``, the plan with its price. Raises ValueError /
    AssertionError (oat's checks)."""
    from dppo_oat.engines.oat.args import validate_args
    from dppo_oat.engines.oat.plan import priced_plan

    args = parse_args(argv)
    if args.on_cpu:
        check_on_cpu(args)
    args = validate_args(args, check_gpus=not args.dry_run)
    return args, priced_plan(args)


CPU_OPTIMIZER_LINE = "optimizer: torch's AdamW over oat's parameter groups (--on_cpu: DeepSpeed's FusedAdam needs CUDA)"


def check_on_cpu(args) -> None:
    """``--on_cpu`` runs one actor and one learner in this machine's CPU: oat then counts one GPU here."""
    from dppo_oat.engines.oat.without_cuda import CPU_GPUS, count_one_gpu

    if args.gpus != CPU_GPUS:
        raise ValueError(f"--on_cpu runs one actor and one learner: pass --gpus {CPU_GPUS} (got --gpus {args.gpus})")
    count_one_gpu()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse, check (DPPO's checks, the plan's, then oat's) and print the plan; launch unless ``--dry_run``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if launches_nothing(argv):
        stand_in_for_missing_launchpad()
    try:
        from dppo_oat.engines.oat.layout import render_with_layouts
        from dppo_oat.engines.oat.preflight import optimizer_toolkit, toolkit_line, toolkit_problem

        args, plan = checked_plan(argv)
    except ImportError as error:
        _fail(f"the oat engine needs the [oat] extra (docs/engines/oat.md): {error}")
    except (ValueError, AssertionError) as error:
        _fail(str(error))
    except KeyboardInterrupt:
        _fail("interrupted before anything was launched: nothing was written; run the same command again", status=130)
    toolkit = None if args.on_cpu else optimizer_toolkit(args.adam_offload)
    optimizer = CPU_OPTIMIZER_LINE if toolkit is None else toolkit_line(toolkit)
    print(render_with_layouts(args, plan), checkpoint_line(args, plan), optimizer, sep="\n", flush=True)
    if args.dry_run:
        return
    problem = None if toolkit is None else toolkit_problem(toolkit)
    if problem:
        _fail(problem)
    with run_lock(args):
        outcome = launch_and_wait(args)
    print(file=sys.stderr, flush=True)  # the workers' last output may end mid-line (launchpad's countdown)
    if outcome.failure:
        _fail(outcome.failure, status=1)
    if outcome.stopped_by is not None:
        _fail(stopped_message(argv, outcome.run_dir, outcome.stopped_by), status=128 + outcome.stopped_by)
    if outcome.ended_early is not None:
        _fail(ended_early_message(argv, outcome.run_dir, outcome.ended_early), status=1)
    if outcome.run_dir is not None:
        print(f"finished: {outcome.run_dir} (metrics.jsonl, eval.jsonl; curves: python -m dppo_oat.plot "
              f"{outcome.run_dir})", flush=True)


def checkpoint_line(args, plan) -> str:
    """The plan's line on resumable checkpoints (their size where the model's shape is known), and where a resume
    starts."""
    from dppo_oat.engines.oat.resume import find_resume_point

    if not args.checkpoint_every:
        return "resumable checkpoints: none (--checkpoint_every 0): a stopped run cannot be resumed"
    from dppo_oat.engines.oat.plan import checkpoint_size

    size = checkpoint_size(plan)
    line = f"resumable checkpoints: every {args.checkpoint_every} learning round(s), the newest " \
           f"{args.keep_checkpoints} kept{size}"
    if not args.resume_dir:
        return line
    point = find_resume_point(args.resume_dir, args.resume_tag)
    return f"{line}; resuming {point.run_dir} from {point.folder.name} (actor step {point.record.get('actor_steps')})"


@contextlib.contextmanager
def run_lock(args):
    """A resumed run's directory is locked for as long as the program runs (a new run's is new: oat names it by
    the start time); a second writer is refused in one line."""
    if not args.resume_dir:
        yield
        return
    from dppo_oat.engines.oat.resume import run_directory_of
    from dppo_oat.run.directory import RunLock

    try:
        lock = RunLock(run_directory_of(args.resume_dir))
    except ValueError as error:
        _fail(str(error).replace("give this run another --run-name (or wait for that run to end)",
                                 "wait for that run to end"))
    try:
        yield
    finally:
        lock.release()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a launched program ended: the one line a learner reported (a divergence, a failed checkpoint, a failed
    learner), the run directory it wrote, the signal that stopped it, and the worker that ended first without the
    run having ended (a learner killed or out of memory); None for each when there was none."""

    failure: str | None
    run_dir: str | None
    stopped_by: int | None
    ended_early: str | None = None


def launch_and_wait(args) -> Outcome:
    """Launch the program on this node and wait until its workers are gone: the end of the run (the learner's
    ``lp.stop``, which launchpad delivers to this process as SIGTERM), a divergence or a failed checkpoint, Ctrl-C
    or SIGTERM from the user, on which launchpad stops every worker (SIGTERM to each; a worker still running after
    ``--lp_termination_notice_secs``, 10 s, is killed), or a worker that ended on its own (a learner killed), after
    which the others are stopped. The learner's status files tell a run that ended from one that was stopped."""
    import launchpad as lp

    from dppo_oat.engines.oat.status import FAILURE_FILE, FINISHED_FILE, RUN_DIR_FILE, program_status, read_status

    with program_status() as status, recorded_stop_signals() as stops:
        program, local_resources = build_program(args)
        manager = lp.launch(program, launch_type=args.launch_type, local_resources=local_resources,
                            terminal="current_terminal")
        ended_early = None
        if callable(getattr(manager, "wait", None)):  # launchpad's worker manager
            ended_early = wait_for_workers(manager, lambda: bool(stops) or read_status(status, FINISHED_FILE)
                                           is not None or read_status(status, FAILURE_FILE) is not None)
        failure, finished = read_status(status, FAILURE_FILE), read_status(status, FINISHED_FILE)
        if failure or finished is not None:  # the learners ended the run (their lp.stop is a SIGTERM here)
            return Outcome(failure, read_status(status, RUN_DIR_FILE), None)
        # a worker that ended first was stopped by no signal: the SIGTERMs after it are oat's IPC server's lp.stop
        stopped_by = None if ended_early or not stops else stops[0]
        return Outcome(None, read_status(status, RUN_DIR_FILE), stopped_by, ended_early)


def wait_for_workers(manager, stopping) -> str | None:
    """Wait until every worker is gone; when the first one ends while nothing is ``stopping`` (the run did not end,
    no signal came), stop the others and return its label.

    launchpad 0.5.2's WorkerManager (``launch/worker_manager.py``) cannot tell how a worker it runs in the current
    terminal ended, so it would wait for the others forever; and after a stop it SIGKILLs the workers still running
    ``--lp_termination_notice_secs`` later, and with them its own process, the launcher, which would then end
    without the line that says how to go on: with ``_kill_main_thread`` off it kills the workers only."""
    manager._kill_main_thread = False
    manager.wait(return_on_first_completed=True)
    if stopping():
        manager.wait()
        return None
    ended = [label for label, workers in manager._active_workers.items()
             if len(workers) < manager._workers_count[label]]
    manager.stop_and_wait()
    return ", ".join(sorted(ended)) or None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def recorded_stop_signals():
    """While the program runs, Ctrl-C and SIGTERM are only recorded here (the list this yields): launchpad's worker
    manager, set up by ``lp.launch``, keeps these handlers beside its own, which stop the workers. The handlers from
    before come back afterwards."""
    received: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stopped_message(argv: Sequence[str], run_dir: str | None, signum: int) -> str:
    """What a stopped run left behind and the command that goes on from it (the same command with ``--resume_dir``
    naming the run, whose newest whole checkpoint it resumes from)."""
    what = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    return f"{what}: {what_was_left(argv, run_dir)}"


def ended_early_message(argv: Sequence[str], run_dir: str | None, labels: str) -> str:
    """A worker ended before the run did, without a word (killed, or out of memory): which, and how to go on."""
    return f"{labels} ended before the run did (killed, or out of memory: see its last lines above); " \
           f"{what_was_left(argv, run_dir)}"


def what_was_left(argv: Sequence[str], run_dir: str | None) -> str:
    """After launchpad stopped every worker: the run's newest whole checkpoint and the command that resumes it, or
    that there is none."""
    from dppo_oat.engines.oat.resume import complete_checkpoints
    from dppo_oat.run.directory import RunDir

    if run_dir is None:
        return "launchpad stopped every worker before the learner made its run directory: nothing to resume; " \
               "start the run again"
    newest = complete_checkpoints(RunDir(run_dir).round_checkpoints)
    if not newest:
        return (f"launchpad stopped every worker before the first checkpoint (every --checkpoint_every learning "
                f"rounds) of {run_dir}: start the run again")
    return f"launchpad stopped every worker; {run_dir} resumes from {newest[-1].name}: " \
           f"{resume_command(argv, run_dir)}"


def resume_command(argv: Sequence[str], run_dir: str) -> str:
    """``argv`` as a command line that resumes ``run_dir``: any ``--resume_dir`` / ``--resume_tag`` it had replaced."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0].replace("-", "_")
        if name in ("__resume_dir", "__resume_tag"):
            skip = "=" not in arg
            continue
        kept.append(arg)
    return shlex.join(["python", "-m", "dppo_oat.train", "--engine", "oat", *kept, "--resume_dir", str(run_dir)])


def _fail(message: str, status: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
