"""The modules that moved into the core's folders or took clearer names, under their old import paths.

``import dppo_oat.update`` (or ``from dppo_oat import runlog``) gives the module itself, :mod:`dppo_oat.learner.update`
(:mod:`dppo_oat.run.log`), not a copy of its names: what code sets on it, a test's ``monkeypatch`` included, is set
where the module's own functions read it. :func:`install` puts :class:`MovedModules` on ``sys.meta_path`` when the
package is imported; new code imports the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "dppo_oat.update": "dppo_oat.learner.update",
    "dppo_oat.learner_forward": "dppo_oat.learner.forward",
    "dppo_oat.fused_head": "dppo_oat.learner.fused_head",
    "dppo_oat.guard": "dppo_oat.learner.guard",
    "dppo_oat.mixed_precision": "dppo_oat.learner.autocast",
    "dppo_oat.logprobs": "dppo_oat.divergence.logprobs",
    "dppo_oat.divergence_probe": "dppo_oat.divergence.probe",
    "dppo_oat.runlog": "dppo_oat.run.log",
    "dppo_oat.safe_io": "dppo_oat.run.safe_io",
    "dppo_oat.token_export": "dppo_oat.run.token_export",
    "dppo_oat.token_samples": "dppo_oat.run.token_samples",
    "dppo_oat.spec": "dppo_oat.settings.spec",
    "dppo_oat.docstrings": "dppo_oat.settings.docstrings",
    "dppo_oat.usage": "dppo_oat.settings.usage",
    "dppo_oat.grouped_cli": "dppo_oat.settings.grouped_cli",
    "dppo_oat.samples": "dppo_oat.update_batch",
    "dppo_oat.rollout.precision": "dppo_oat.rollout.rollout_copy",
    "dppo_oat.engines.oat.toolkit": "dppo_oat.engines.oat.preflight",
}
"""Old import path → the module's path now."""


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module it names now (imported under its own name)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """Nothing to run: the module ran when it was imported under its own name."""


def install() -> None:
    """Put :class:`MovedModules` first on ``sys.meta_path`` (once): it answers the old paths alone, before a finder
    that could find a stale copy under them (an editable install's, of another checkout)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
