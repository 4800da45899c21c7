"""What makes a run directory readable: the rules :func:`~dppo_oat.analysis.runs.load_runs` skips runs by.

A run is skipped, with one warning that names it and says why, when its ``config.json`` is not a JSON object, when a
field the analysis reads has the wrong type (:func:`config_problem`), when a log cannot be read at all, and when it
gives no finite number at a step (:func:`no_rows_reason`). Within a readable run, a row whose ``step`` is not a
finite number within int64 is dropped (:func:`step_numbers`) and non-numeric values are left out of the curves.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from dppo_oat.run.directory import CONFIG_FILE, EVAL_FILE, METRICS_FILE, RunDir, current_config
from dppo_oat.run.safe_io import read_jsonl

MAX_SHOWN = 40
"""Values of a wrong type longer than this (as JSON) are named by their type in messages."""

CHOICE_FIELDS = ("rule", "anchor", "is_weight", "relax", "mismatch_mask")
"""The trust-region fields that choose what a rule does (the numeric ones it reads depend on them)."""
NUMERIC_FIELDS = ("delta", "eps_low", "eps_high", "is_cap", "alpha", "mismatch_low", "mismatch_high", "kl_tau", "k")
"""The trust-region fields read as numbers (a string such as ``"inf"`` is accepted; other strings are shown as
written)."""


class DamagedRun(ValueError):
    """A run directory whose files cannot be read as a run. ``str()``: ``<path>: <reason>``."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, with its article: ``a list``, ``an object``, ``null``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def shown(value: Any) -> str:
    """A value as a message shows it: its JSON when short, else its type (``a list``)."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN else json_type(value)


def is_integer(value: Any) -> bool:
    """An int, or a float with an integer value (not a boolean)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def is_text(value: Any) -> bool:
    """A string."""
    return isinstance(value, str)


def is_name(value: Any) -> bool:
    """A string or a number (a run name may be written as either)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def is_env_ids(value: Any) -> bool:
    """One environment id, or a list of them."""
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(item, str) for item in value))


def is_number_or_text(value: Any) -> bool:
    """A number or a string (``"inf"``), as trust-region numbers are written."""
    return isinstance(value, (int, float, str))


Rule = tuple[Callable[[Any], bool], str]

CONFIG_FIELDS: dict[str, Rule] = {
    "run_name": (is_name, "a string"),
    "algo": (is_text, "a string"),
    "seed": (is_integer, "an integer"),
    "env_ids": (is_env_ids, "a list of environment ids"),
    "trust_region": (lambda value: isinstance(value, dict), "an object"),
}
"""The top-level fields of ``config.json`` the analysis reads, and what each must be when present (null is
absent)."""

TRUST_REGION_FIELDS: dict[str, Rule] = {
    "name": (is_text, "a string"),
    **{key: (is_text, "a string") for key in CHOICE_FIELDS},
    **{key: (is_number_or_text, "a number") for key in NUMERIC_FIELDS},
}
"""The fields of ``trust_region`` the analysis reads, and what each must be when present (null is absent)."""


def fields_problem(fields: dict, rules: dict[str, Rule], prefix: str = "") -> str | None:
    """The first field of ``fields`` that breaks its rule, as ``"<prefix><key>": <value>, not <what>``."""
    for key, (accepts, what) in rules.items():
        value = fields.get(key)
        if value is not None and not accepts(value):
            return f'"{prefix}{key}": {shown(value)}, not {what}'
    return None


def config_problem(config: Any) -> str | None:
    """Why a parsed ``config.json`` cannot describe a run (None when it can): it is not a JSON object, or a field the
    analysis reads has the wrong type (:data:`CONFIG_FIELDS`, :data:`TRUST_REGION_FIELDS`). Missing fields are
    fine: each has a default."""
    if not isinstance(config, dict):
        return f"its {CONFIG_FILE} holds {json_type(config)}, not a JSON object"
    problem = fields_problem(config, CONFIG_FIELDS)
    if problem is None and isinstance(config.get("trust_region"), dict):
        problem = fields_problem(config["trust_region"], TRUST_REGION_FIELDS, prefix="trust_region.")
    return None if problem is None else f"its {CONFIG_FILE} has {problem}"


def read_config(path: Path) -> dict:
    """The ``config.json`` of run directory ``path`` as parsed (``{}`` when it has none), a key under a flag's former
    name read under its name now (:func:`~dppo_oat.run.directory.current_config`).

    Raises:
        DamagedRun: it cannot be read, is not JSON, or :func:`config_problem` finds a problem with it.
    """
    config_path = RunDir(path).config
    if not config_path.is_file():
        return {}
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except OSError as error:
        raise DamagedRun(path, f"its {CONFIG_FILE} cannot be read ({error.strerror or error})") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise DamagedRun(path, f"its {CONFIG_FILE} is not JSON ({error})") from None
    problem = config_problem(config)
    if problem is not None:
        raise DamagedRun(path, problem)
    return current_config(config)


def file_problem(path: Path, name: str) -> str | None:
    """Why the run file ``name`` of run directory ``path`` cannot be read as one (None when it is absent, or a
    regular file this process may read): a directory, a dangling link, a socket... would read as an empty log."""
    file = Path(path) / name
    if not os.path.lexists(file):
        return None
    if file.is_symlink() and not file.exists():
        return f"its {name} is a dangling link (to {os.readlink(file)})"
    if file.is_dir():
        return f"its {name} is a directory"
    if not file.is_file():
        return f"its {name} is not a regular file"
    if not os.access(file, os.R_OK):
        return f"its {name} cannot be read (permission denied)"
    return None


def check_run_files(path: Path) -> None:
    """Every run file of ``path`` that exists is a regular, readable file (:func:`file_problem`); ``DamagedRun``
    naming the first that is not."""
    for name in (CONFIG_FILE, METRICS_FILE, EVAL_FILE):
        problem = file_problem(path, name)
        if problem is not None:
            raise DamagedRun(path, problem)


MAX_STEP = 10**9
"""The largest step the analysis draws (and 0 the smallest: the evaluation before RL): a log row outside [0,
MAX_STEP] comes from a damaged or hand-edited log, not from a run, and is left out with a warning."""


def step_in_range(steps: pd.Series) -> pd.Series:
    """Where ``steps`` (numbers) lie in [0, :data:`MAX_STEP`]."""
    return steps.between(0, MAX_STEP)


def step_numbers(column: pd.Series) -> pd.Series:
    """A ``step`` column as floats: NaN where a value is not a finite number within int64's range (booleans and
    strings that are not numbers included)."""
    values = pd.to_numeric(column.map(lambda v: None if isinstance(v, bool) else v), errors="coerce")
    values = values.astype("float64")
    return values.where(values.abs() < 2.0 ** 63)


def no_rows_reason(path: Path) -> str:
    """Why run directory ``path`` gives no finite number at a step (ask only when it gives none): no step logged
    yet, a ``metrics.jsonl`` that is a folder, no readable line, no numeric ``step``, or nothing but steps."""
    log = RunDir(path).metrics
    if not (log.is_file() or log.with_name(log.name + ".gz").is_file()):
        return f"its {METRICS_FILE} is not a file" if log.exists() else f"no step logged yet (no {METRICS_FILE})"
    with warnings.catch_warnings(record=True) as unreadable:
        warnings.simplefilter("always")
        rows = read_jsonl(log)
    if not rows:
        return f"no line of its {METRICS_FILE} is a JSON object" if unreadable else \
            f"no step logged yet (its {METRICS_FILE} holds no row)"
    steps = step_numbers(pd.Series([row.get("step") for row in rows], dtype=object))
    if steps.isna().all():
        return f'no row of its {METRICS_FILE} has a numeric "step"'
    if not step_in_range(steps).any():
        return f"no row of its {METRICS_FILE} has a step in [0, {MAX_STEP:,}]"
    return f"its {METRICS_FILE} holds no number besides the steps"


def skipped_message(path: Path, reason: str) -> str:
    """The warning of a run skipped for ``reason``."""
    return f"{path}: skipped, {reason}"


def none_left_message(given: int) -> str:
    """The error when each of the ``given`` runs was skipped."""
    runs = "the 1 run given was" if given == 1 else f"all {given} runs given were"
    return f"no run left to read: {runs} skipped (see the warning{'' if given == 1 else 's'} above)"

