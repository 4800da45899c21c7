"""A minimal local launcher standing in for launchpad's ``local_mp`` launch, in the oat engine's tests only.

dm-launchpad cannot be installed on the Python these tests run on; this runs the program that oat's
``get_program`` builds with the recorder of this stub package (``Program``, ``CourierNode``, ``PyClassNode``) so a
CPU rehearsal can run oat's whole actor/learner program. It is not launchpad and is never used outside tests.

Every node runs in its own process (multiprocessing ``spawn``: vLLM and DeepSpeed each initialise torch.distributed,
so actor and learner cannot share one), with the environment of its ``local_resources`` entry and its output in
``<log_dir>/<label>.log``. As in launchpad:

- ``CourierNode``: the object is constructed, its public methods are served over RPC (:mod:`launchpad.courier`),
  then its ``run()`` is called if it has one (oat's ``PlasmaShmServer``), else it serves until the program stops;
- ``PyClassNode``: the object is constructed and its ``run()`` called;
- a node handle among another node's constructor arguments (also inside lists, tuples and dicts) reaches that node as
  a :class:`~launchpad.courier.Client` (``handle.method(...)`` and ``handle.futures.method(...)``);
- ``launchpad.stop()`` in any node ends the whole program; :meth:`LocalRunner.run` then returns normally.

Unlike launchpad, the launcher fails fast: a node that raises (while importing, constructing or running), dies, or a
program that outlives ``timeout_s`` or whose ``PyClassNode``s all return without ``launchpad.stop()`` (launchpad
would wait forever) stops every node and raises :class:`NodeFailed` with the node's traceback and the end of its log.

``prelude(label, constructor)``, if given, runs in each node's process before the node is constructed (tests use it
to make GPU-only code CPU-safe in that process only).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from launchpad import courier

LOG_TAIL_CHARS = 6000
"""How much of a failed node's log a :class:`NodeFailed` message quotes."""

_node_events = None
"""In a node's process: the queue to the launcher (``None`` in any other process)."""
_node_label = None


class NodeFailed(RuntimeError):
    """A node of the program raised or died, or the program did not end in time."""


@dataclasses.dataclass
class ProgramResult:
    """How a run ended: the node that called ``launchpad.stop()``, the nodes whose ``run()`` returned, and every
    node's exit code after the shutdown (0: it ended by itself or on SIGTERM; negative: killed by that signal)."""

    stopped_by: str | None
    finished: set
    log_dir: Path
    exit_codes: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class NodeSpec:
    """What a node's process needs (pickled by the launcher, unpickled in the node's process)."""

    label: str
    courier: bool
    constructor: Callable
    args: tuple
    kwargs: dict
    address: str | None
    prelude: Callable | None


def request_stop() -> None:
    """``launchpad.stop()``: in a node, ask the launcher to end the program; elsewhere, nothing."""
    if _node_events is not None:
        _node_events.put(("stop", _node_label, ""))


def as_clients(value, clients: dict):
    """``value`` with every node (also inside lists, tuples and dicts) replaced by its courier client."""
    if id(value) in clients:
        return clients[id(value)]
    if isinstance(value, (list, tuple)):
        return type(value)(as_clients(item, clients) for item in value)
    if isinstance(value, dict):
        return {key: as_clients(item, clients) for key, item in value.items()}
    return value


class LocalRunner:
    """Runs a recorded program, one process per node (see the module docstring)."""

    def __init__(self, *, prelude: Callable | None = None, timeout_s: float = 900.0, log_dir=None,
                 grace_s: float = 15.0) -> None:
        self.prelude, self.timeout_s, self.grace_s = prelude, timeout_s, grace_s
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="lp-logs-"))
        self.result: ProgramResult | None = None
        self._ending: set = set()  # nodes that are ending by themselves: returned from run(), or called stop()

    def run(self, program, local_resources: dict) -> ProgramResult:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        socket_dir = tempfile.mkdtemp(prefix="lp-")  # short path: Unix socket names are limited to 108 bytes
        specs = self._specs(program, socket_dir)
        context = mp.get_context("spawn")
        events = context.Queue()
        processes = {}
        try:
            for spec in specs:
                env = getattr(local_resources.get(spec.label), "env", None) or {}
                processes[spec.label] = context.Process(
                    target=node_main, name=spec.label,
                    args=(pickle.dumps(spec), dict(env), str(self.log_dir / f"{spec.label}.log"), events),
                )
                processes[spec.label].start()
            result = self._monitor(specs, processes, events)
        finally:
            self._shutdown(processes)
            shutil.rmtree(socket_dir, ignore_errors=True)
        result.exit_codes = {label: process.exitcode for label, process in processes.items()}
        self.result = result
        return result

    def _specs(self, program, socket_dir: str) -> list[NodeSpec]:
        addresses = {id(node): os.path.join(socket_dir, f"{i}.sock") for i, node in enumerate(program.nodes)}
        clients = {
            id(node): courier.Client(addresses[id(node)], node.label)
            for node in program.nodes if type(node).__name__ == "CourierNode"
        }
        return [
            NodeSpec(node.label, id(node) in clients, node.constructor, as_clients(node.args, clients),
                     as_clients(node.kwargs, clients), addresses[id(node)], self.prelude)
            for node in program.nodes
        ]

    def _monitor(self, specs: list[NodeSpec], processes: dict, events) -> ProgramResult:
        """Wait for ``launchpad.stop()``; raise :class:`NodeFailed` on an error, a dead node or the timeout."""
        deadline = time.monotonic() + self.timeout_s
        py_nodes = {spec.label for spec in specs if not spec.courier}
        finished: set = set()
        while True:
            try:
                kind, label, text = events.get(timeout=0.5)
            except queue.Empty:
                kind = None
            if kind == "stop":
                self._ending.add(label)
                return ProgramResult(stopped_by=label, finished=finished, log_dir=self.log_dir)
            if kind == "error":
                self._fail(label, f"{label} raised:\n{text}")
            if kind == "done":
                finished.add(label)
                self._ending.add(label)
                if py_nodes <= finished:
                    self._fail(label, "every PyClassNode returned without launchpad.stop() (launchpad would hang)")
            self._check_alive(processes, events)
            if time.monotonic() > deadline:
                tails = "\n".join(self._log_tail(label, 1500) for label in processes)
                raise NodeFailed(f"the program did not stop within {self.timeout_s:.0f} s\n{tails}")

    def _check_alive(self, processes: dict, events) -> None:
        for label, process in processes.items():
            if process.exitcode not in (None, 0):
                try:  # its own report, if it made one, says more than the exit code
                    kind, reporter, text = events.get(timeout=2.0)
                    if kind == "error":
                        self._fail(reporter, f"{reporter} raised:\n{text}")
                except queue.Empty:
                    pass
                self._fail(label, f"{label} died with exit code {process.exitcode}")

    def _fail(self, label: str, message: str) -> None:
        raise NodeFailed(f"{message}\n{self._log_tail(label)}")

    def _log_tail(self, label: str, chars: int = LOG_TAIL_CHARS) -> str:
        path = self.log_dir / f"{label}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"--- end of {path} ---\n{text[-chars:]}"

    def _shutdown(self, processes: dict) -> None:
        """Let the nodes that are ending by themselves end, SIGTERM the others (their handler exits cleanly), then
        SIGKILL what is left of each node's process group."""
        for label in self._ending:
            processes[label].join(self.grace_s)
        for process in processes.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for process in processes.values():
            process.join(max(deadline - time.monotonic(), 0.1))
        for process in processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)  # each node leads its own group (see node_main)
            except (ProcessLookupError, PermissionError):
                pass
            process.join(5)


def node_main(spec_bytes: bytes, env: dict, log_path: str, events) -> None:
    """A node's process: own process group, output to its log, environment, prelude, then the node itself."""
    global _node_events, _node_label
    os.setpgrp()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _die_with_launcher(os.getppid())
    _redirect_output(log_path)
    os.environ.update(env)
    label = "?"
    try:
        spec: NodeSpec = pickle.loads(spec_bytes)
        label = _node_label = spec.label
        _node_events = events
        if spec.prelude is not None:
            spec.prelude(spec.label, spec.constructor)
        run_node(spec)
    except SystemExit:
        raise
    except BaseException:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        events.put(("error", label, text))
        sys.exit(1)
    events.put(("done", label, ""))


def run_node(spec: NodeSpec) -> None:
    instance = spec.constructor(*spec.args, **spec.kwargs)
    if not spec.courier:
        instance.run()
        return
    server = courier.Server(instance, spec.address, spec.label)
    server.start()
    if hasattr(instance, "run"):
        instance.run()  # launchpad stops serving when run() returns
        server.stop()
    else:
        signal.pause()  # serve until the launcher ends the program


def _exit_on_sigterm(*_) -> None:
    """The launcher ends the program: exit through SystemExit, so that ``finally`` blocks and context managers run
    (oat's plasma store is a child process its server kills on the way out). Only once."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def _die_with_launcher(launcher_pid: int) -> None:
    """A node never outlives its launcher: should the launcher's process vanish (killed, crashed), the node kills
    its own process group (itself and what it started, e.g. the plasma store)."""

    def watch() -> None:
        while os.getppid() == launcher_pid:
            time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr, including output from C code, to ``log_path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
