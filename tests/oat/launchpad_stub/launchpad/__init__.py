"""A stand-in for dm-launchpad in the oat engine's tests, and nothing more.

dm-launchpad ships only cp310 wheels, so it cannot be installed on the Python the tests run on. oat imports
``launchpad`` and ``launchpad.nodes.python.local_multi_processing`` at import time, and ``oat.interface.get_program``
builds a program from ``Program``, ``CourierNode`` and ``PyClassNode``. This stand-in records what is built and
launched so that a test can inspect it, and starts no process, unless a test installs a runner with
:func:`running`: then ``launch`` also runs the program with the minimal local launcher of
:mod:`launchpad.local_runner` (one process per node, RPC between them), which stands in for launchpad's ``local_mp``
launch in tests only. ``tests/oat/conftest.py`` puts this package on ``sys.path`` only when the real launchpad is not
importable.
"""

import contextlib

LAUNCHES = []
"""Every ``launch(program, **kwargs)`` call, as ``(program, kwargs)``."""

_runner = None
"""The runner ``launch`` hands programs to (see :func:`running`); ``None``: record only."""


class Node:
    """A node of the program: the class (or callable) it would run, with its arguments."""

    def __init__(self, constructor, *args, **kwargs):
        self.constructor, self.args, self.kwargs = constructor, args, kwargs
        self.label = None


class CourierNode(Node):
    pass


class PyClassNode(Node):
    pass


class Program:
    def __init__(self, name):
        self.name = name
        self.nodes = []

    def add_node(self, node, label=None):
        """Adds ``node``; it is also its own handle (the runner turns it into an RPC client in other nodes)."""
        node.label = label
        self.nodes.append(node)
        return node


def launch(program, **kwargs):
    """Record the launch; with a runner installed (:func:`running`), also run the program until it stops."""
    LAUNCHES.append((program, kwargs))
    if _runner is None:
        return None
    if kwargs.get("launch_type", "local_mp") != "local_mp":
        raise NotImplementedError(f"the local runner stands in for launch_type='local_mp' only: {kwargs}")
    return _runner.run(program, kwargs.get("local_resources") or {})


@contextlib.contextmanager
def running(runner):
    """Within this context, ``launch`` runs programs with ``runner`` (a ``launchpad.local_runner.LocalRunner``)."""
    global _runner
    previous, _runner = _runner, runner
    try:
        yield runner
    finally:
        _runner = previous


def stop():
    """In a node run by the local runner: end the whole program. Elsewhere: nothing."""
    from launchpad import local_runner

    local_runner.request_stop()
