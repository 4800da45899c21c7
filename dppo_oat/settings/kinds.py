"""What a flag is to its run, declared on the flag's own field: whether a resume may change it, and whether it is a
setting of the experiment.

A field is by default an experiment setting that a resume keeps: what the run trains. :func:`flag` declares the
others: ``resumable=True`` for how long a run goes, where it runs and writes and what it logs (a resume may give
them anew, :func:`resumable_fields`); ``setting=False`` for what does not change what a run trains, so that runs
averaged as seeds need not agree on it (:func:`non_settings`). A new flag is then one field, whichever engine reads
it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

RESUMABLE = "dppo_oat.resumable"
"""Field metadata key: True when a resume may change the flag."""
SETTING = "dppo_oat.setting"
"""Field metadata key: False when the flag does not change what a run trains."""


def flag(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, resumable: bool = False,
         setting: bool = True) -> Any:
    """A dataclass field (``default`` or ``default_factory``) that declares what it is to its run (module doc)."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={RESUMABLE: resumable, SETTING: setting})


def resumable_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` (its bases' included) that a resume may change, in field order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(RESUMABLE, False))


def non_settings(*classes: type) -> frozenset[str]:
    """The fields of the dataclasses ``classes`` that change nothing a run trains."""
    return frozenset(f.name for cls in classes for f in dataclasses.fields(cls) if not f.metadata.get(SETTING, True))
