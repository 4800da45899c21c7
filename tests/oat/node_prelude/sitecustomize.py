"""The oat rehearsal's test-only probes, in every process of a program launched by ``python -m dppo_oat.train
--engine oat --on_cpu`` (tests/oat/test_oat_rehearsal.py): Python imports ``sitecustomize`` at start-up from
``PYTHONPATH``, where the rehearsal puts this folder, and launchpad's node processes inherit the launcher's
environment. When ``DPPO_OAT_REHEARSAL`` names the probes' settings (JSON), ``oat_cpu_prelude.install`` runs right
after ``dppo_oat.engines.oat.on_cpu`` is imported, which a node process does when it unpickles its learner or actor
class. Nothing happens without that variable.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys

SETTINGS = os.environ.get("DPPO_OAT_REHEARSAL")
TARGET = "dppo_oat.engines.oat.on_cpu"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of :data:`TARGET` so that the probes install once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/oat
            import oat_cpu_prelude

            oat_cpu_prelude.install(module, **json.loads(SETTINGS))

        spec.loader.exec_module = exec_module
        return spec


if SETTINGS:
    sys.meta_path.insert(0, _AfterImport())
