"""The launchpad stand-in's local launcher (``launchpad_stub/launchpad/local_runner.py``) on toy programs.

What the oat rehearsal relies on, in seconds rather than minutes: node handles become RPC clients with synchronous
calls and futures, a CourierNode with ``run()`` serves while it runs, ``launchpad.stop()`` ends the program with
every node exiting cleanly, and a node that raises, dies or hangs fails the launch instead of hanging it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import launchpad
import pytest

pytestmark = pytest.mark.oat

if not hasattr(launchpad, "running"):
    pytest.skip("tests the launchpad stand-in (the real launchpad is installed)", allow_module_level=True)

from launchpad.local_runner import LocalRunner, NodeFailed  # noqa: E402  (after the stand-in check)


class Counter:
    """A CourierNode without ``run()``: serves until the program stops."""

    def __init__(self, start: int) -> None:
        self.value = start

    def add(self, amount: int) -> int:
        self.value += amount
        return self.value

    def fail(self) -> None:
        raise KeyError("no such counter")


class Store:
    """A CourierNode with ``run()`` (like oat's PlasmaShmServer): it serves while ``run()`` runs."""

    def __init__(self) -> None:
        self.ready = False

    def is_ready(self) -> bool:
        return self.ready

    def run(self) -> None:
        self.ready = True
        while True:
            time.sleep(0.1)


class Driver:
    """A PyClassNode that uses both handles (one inside a list, as oat passes its actors), then stops the program."""

    def __init__(self, counters: list, store, out: str, behaviour: str = "stop") -> None:
        self.counters, self.store, self.out, self.behaviour = counters, store, out, behaviour

    def run(self) -> None:
        while not self.store.is_ready():
            time.sleep(0.05)
        futures = [counter.futures.add(10) for counter in self.counters]
        results = [future.result() for future in futures] + [self.counters[0].add(1)]
        Path(self.out).write_text(" ".join(map(str, results)))
        getattr(self, self.behaviour)()

    def stop(self) -> None:
        launchpad.stop()

    def remote_error(self) -> None:
        self.counters[0].fail()

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def hang(self) -> None:
        time.sleep(3600)

    def just_return(self) -> None:
        pass


def program(out: Path, behaviour: str):
    program = launchpad.Program("toy")
    counter = program.add_node(launchpad.CourierNode(Counter, 1), label="counter")
    store = program.add_node(launchpad.CourierNode(Store), label="store")
    program.add_node(launchpad.PyClassNode(Driver, [counter], store, str(out), behaviour=behaviour), label="driver")
    return program


def launch(tmp_path: Path, behaviour: str, timeout_s: float = 120.0):
    runner = LocalRunner(timeout_s=timeout_s, log_dir=tmp_path / "logs", grace_s=5.0)
    with launchpad.running(runner):
        return launchpad.launch(program(tmp_path / "out.txt", behaviour), local_resources={})


def test_rehearsal_launcher_runs_nodes_and_stops_cleanly(tmp_path):
    result = launch(tmp_path, "stop")
    assert (tmp_path / "out.txt").read_text() == "11 12"  # a future, then a synchronous call, on the same node
    assert result.stopped_by == "driver"
    assert result.exit_codes == {"counter": 0, "store": 0, "driver": 0}
    assert launchpad.LAUNCHES[-1][0].name == "toy"


@pytest.mark.parametrize("behaviour,message,timeout_s", [
    ("remote_error", r"driver raised:(.|\n)*counter\.fail raised:(.|\n)*KeyError: 'no such counter'", 120),
    ("die", "driver died with exit code -9", 120),
    ("hang", "did not stop within 8 s", 8),
    ("just_return", "without launchpad.stop", 120),
])
def test_rehearsal_launcher_fails_fast(tmp_path, behaviour, message, timeout_s):
    with pytest.raises(NodeFailed, match=message):
        launch(tmp_path, behaviour, timeout_s=timeout_s)
