"""A stand-in for dm-launchpad in the oat engine's tests, and nothing more.

dm-launchpad ships only cp310 wheels, so it cannot be installed on the Python the tests run on. oat imports
``launchpad`` and ``launchpad.nodes.python.local_multi_processing`` at import time, and ``oat.interface.get_program``
builds a program from ``Program``, ``CourierNode`` and ``PyClassNode``. This stand-in records what is built and
launched so that a test can inspect it; it starts no process. ``tests/oat/conftest.py`` puts it on ``sys.path``
only when the real launchpad is not importable.
"""

LAUNCHES = []
"""Every ``launch(program, **kwargs)`` call, as ``(program, kwargs)``."""


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
        node.label = label
        self.nodes.append(node)
        return node


def launch(program, **kwargs):
    LAUNCHES.append((program, kwargs))


def stop():
    pass
