"""What a flag is to its run, declared on the flag's own field: whether a resume may change it, and whether it is a
setting of the experiment.

A field is by default an experiment setting that a resume keeps: what the run trains. :func:`flag` declares the
others: ``resumable=True`` for how long a run goes, where it runs and writes and what it logs (a resume may give
them anew, :func:`resumable_fields`); ``setting=False`` for what does not change what a run trains, so that runs
averaged as seeds need not agree on it (:func:`non_settings`). A new flag is then one field, whichever engine reads
it. A renamed flag declares its former name too (``formerly=``, :func:`former_names`): the command line refuses the
former name in one line (:func:`~dppo_oat.settings.grouped_cli.former_flag_refusal`), and a run's ``config.json``
that records the old name reads as one that records the new (:func:`with_current_names`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

RESUMABLE = "dppo_oat.resumable"
"""Field metadata key: True when a resume may change the flag."""
SETTING = "dppo_oat.setting"
"""Field metadata key: False when the flag does not change what a run trains."""
FORMERLY = "dppo_oat.formerly"
"""Field metadata key: the flag's former name."""


def flag(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, resumable: bool = False,
         setting: bool = True, formerly: str | None = None) -> Any:
    """A dataclass field (``default`` or ``default_factory``) that declares what it is to its run, and the name it had
    before a rename (module doc)."""
    metadata = {RESUMABLE: resumable, SETTING: setting, **({FORMERLY: formerly} if formerly else {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def resumable_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` (its bases' included) that a resume may change, in field order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(RESUMABLE, False))


def non_settings(*classes: type) -> frozenset[str]:
    """The fields of the dataclasses ``classes`` that change nothing a run trains."""
    return frozenset(f.name for cls in classes for f in dataclasses.fields(cls) if not f.metadata.get(SETTING, True))


def former_names(*classes: type) -> dict[str, str]:
    """The former name of each renamed field of the dataclasses ``classes``, mapped to its name now."""
    return {f.metadata[FORMERLY]: f.name for cls in classes for f in dataclasses.fields(cls) if FORMERLY in f.metadata}


def with_current_names(record: Mapping[str, Any], renamed: Mapping[str, str]) -> dict:
    """A copy of ``record`` (a run's ``config.json``) with each key of ``renamed`` (a former name,
    :func:`former_names`) under the flag's name now, so that a run recorded before the rename reads as one recorded
    after it (in the same order). Where a record holds both names, the current one is kept."""
    return {renamed.get(key, key): value for key, value in record.items()
            if not (key in renamed and renamed[key] in record)}
