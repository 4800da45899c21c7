"""Math tasks from local data, without the model hub.

Gem's ``math:*`` / ``eval:*`` ids download their data from the hub. This module builds the same environment — Gem's
own :class:`gem.envs.math_env.MathEnv`, single-turn, the last ``\\boxed{}`` graded with Gem's grader (math-verify
in its slow, thorough mode), reward 1 or 0 — over data on disk:

- a folder written by ``datasets.Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``;
- a JSONL file (one JSON object per line) or a JSON file holding a list of objects.

Rows need a question and an answer column: ``problem``/``answer``, or ``input``/``gt_answer`` (renamed on load; an
``input`` written in a ChatML template is reduced to the user's message). A question is a non-empty string; an answer
a non-empty string, a number, or a non-empty list of accepted ones. A file may mix these forms: numbers become their
text, and when any answer is a list every answer is stored as a list (``"2"`` as ``["2"]``; the grader takes both
alike). A row that breaks these rules, and a set without rows, are refused on load in one line that names the file
and the line (the row, for a JSON list or a saved folder).

Ids: :func:`register_math_dataset` registers one set under any id; :func:`register_math_folder` finds every set under
a folder and registers ``local-math:<name>`` for each. ``import envs`` calls it on the folder named by the
``DPPO_MATH_DATA`` environment variable, when it is set. Hub ids are left as they are and still work where the hub is
reachable. Names:

- a ``Dataset`` folder or a JSON(L) file: its folder name or file stem (``local-math:gsm8k_test``);
- every split of a ``DatasetDict`` folder: ``<folder>:<split>`` (``local-math:math_lvl3to5_8k:train``,
  ``local-math:evaluation_suite:aime``);
- the bare ``<folder>`` of a ``DatasetDict`` means its ``train`` split, and only that: a ``DatasetDict`` without a
  ``train`` split has no bare name, and asking for one is an error that lists its ``<folder>:<split>`` ids. A name
  that does not say which split it is must never train on a held-out split (oat's ``math_lvl3to5_8k`` has train and
  eval splits; a copy of it may hold only ``eval``);
- a name found twice under the folder is replaced by its path relative to the folder (``a/math:train``).

``local-math:<path>`` names a set on disk directly, with the same rule: ``<path>`` of a ``DatasetDict`` is its train
split, ``<path>:<split>`` any split (a path that exists as written is never split at a colon).

Two changes to Gem's MathEnv, in :class:`LocalMathEnv`:

- a reset seed picks problem ``seed mod N`` (Gem draws one at random), so consecutive evaluation seeds cover a set
  without repeats: seeds ``s … s + N − 1`` are every problem once;
- answers are graded in one worker process shared by every env of the process (:class:`SharedGrader`), with Gem's
  1-second timeout. Gem's default gives each env its own process pool, and an actor with hundreds of env slots would
  fork hundreds of processes; Gem's other mode times out with ``signal.alarm``, which works only in the main thread
  (a distributed actor serves its calls from other threads).

Gem's MathEnv logs "Reset env with a specific idx …" on every reset with an ``idx``, which a :class:`LocalMathEnv`
makes on every seeded reset; importing this module filters that one message out (:class:`GemIdxResetFilter`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import pyarrow
from datasets import Dataset, DatasetDict, load_from_disk
from gem.envs.math_env import MathEnv
from gem.envs.registration import ENV_REGISTRY, register
from gem.utils.constants import TERMINAL_STATE

LOCAL_MATH_PREFIX = "local-math"
TRAIN_SPLIT = "train"
"""The split of a ``DatasetDict`` that its bare name (no ``:<split>``) means."""
SPLIT_SEPARATOR = ":"
DATA_ENV_VAR = "DPPO_MATH_DATA"
QUESTION_COLUMN = "problem"
ANSWER_COLUMN = "answer"
COLUMN_ALIASES = {"input": QUESTION_COLUMN, "gt_answer": ANSWER_COLUMN}
JSON_SUFFIXES = (".jsonl", ".json")
CHATML_USER_START = "<|im_start|>user\n"
CHATML_END = "<|im_end|>"

PathOrDataset = str | os.PathLike | Dataset | DatasetDict


def strip_chat_template(text: str) -> str:
    """The user's message of a ChatML-formatted prompt; other text is returned unchanged."""
    start = text.find(CHATML_USER_START)
    if start < 0:
        return text
    body = text[start + len(CHATML_USER_START):]
    end = body.find(CHATML_END)
    return (body if end < 0 else body[:end]).strip()


def normalize_math_columns(dataset: Dataset, source: str = "the math data set") -> Dataset:
    """Rename ``input``/``gt_answer`` to ``problem``/``answer``, check every row (:func:`check_math_rows`, naming
    ``source``) and strip ChatML from questions.

    Raises ValueError when a question or answer column is missing, or a row is unusable.
    """
    for alias, column in COLUMN_ALIASES.items():
        if column not in dataset.column_names and alias in dataset.column_names:
            dataset = dataset.rename_column(alias, column)
    missing = [c for c in (QUESTION_COLUMN, ANSWER_COLUMN) if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{source} lacks column(s) {missing}; it has {dataset.column_names} "
            f"(expected {QUESTION_COLUMN}/{ANSWER_COLUMN} or input/gt_answer)"
        )
    check_math_rows(source, dataset[QUESTION_COLUMN], dataset[ANSWER_COLUMN])
    if any(CHATML_USER_START in question for question in dataset[QUESTION_COLUMN]):
        questions = [strip_chat_template(question) for question in dataset[QUESTION_COLUMN]]
        dataset = dataset.remove_columns(QUESTION_COLUMN).add_column(QUESTION_COLUMN, questions)
    return dataset


ANSWER_FORMS = "a non-empty string, a number, or a non-empty list of them"
"""The answers the grader takes (Gem's ``MathEnv.check_correct``), as error messages name them."""


def described(value: Any) -> str:
    """``value`` as an error message shows it: None, an empty string or list, or its type and a short repr."""
    if value is None:
        return "None"
    if isinstance(value, (str, list)) and not (value.strip() if isinstance(value, str) else value):
        return f"an empty {type(value).__name__}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def is_number(value: Any) -> bool:
    """True for an int or a float (JSON's numbers), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def question_problem(question: Any) -> str | None:
    """Why ``question`` is no usable problem (it must be a non-empty string), or None."""
    if isinstance(question, str) and question.strip():
        return None
    return f"the {QUESTION_COLUMN} must be a non-empty string, got {described(question)}"


def answer_problem(answer: Any) -> str | None:
    """Why the grader cannot take ``answer`` (see :data:`ANSWER_FORMS`), or None."""

    def accepted(item: Any) -> bool:
        return is_number(item) or (isinstance(item, str) and bool(item.strip()))

    if accepted(answer):
        return None
    if isinstance(answer, (list, tuple)) and answer:
        wrong = [item for item in answer if not accepted(item)]
        if not wrong:
            return None
        return f"the {ANSWER_COLUMN} must be {ANSWER_FORMS}, got a list holding {described(wrong[0])}"
    return f"the {ANSWER_COLUMN} must be {ANSWER_FORMS}, got {described(answer)}"


def check_math_rows(source: str, questions: Sequence[Any], answers: Sequence[Any],
                    locations: Sequence[str] | None = None) -> None:
    """Raise a one-line ValueError naming ``source`` and the row's location (``row N`` unless ``locations`` says,
    e.g. ``line N`` of a JSONL file) for the first row whose question or answer is unusable, or for no rows."""
    if not len(questions):
        raise ValueError(f"{source} has no rows: a math set needs at least one {QUESTION_COLUMN}/{ANSWER_COLUMN} row")
    for index, (question, answer) in enumerate(zip(questions, answers, strict=True)):
        problem = question_problem(question) or answer_problem(answer)
        if problem:
            where = locations[index] if locations is not None else f"row {index + 1}"
            raise ValueError(f"{source}, {where}: {problem}")


def normalized_answers(answers: Sequence[Any]) -> list[str | list[str]]:
    """Answers in one form, for one Arrow column: all strings, or all lists of strings when any answer is a list (a
    single answer ``a`` becomes ``[a]``, which the grader takes alike). Numbers become their text, as the grader
    does with them."""
    as_lists = any(isinstance(answer, (list, tuple)) for answer in answers)

    def text(value: Any) -> str:
        return value if isinstance(value, str) else str(value)

    if not as_lists:
        return [text(answer) for answer in answers]
    return [[text(item) for item in answer] if isinstance(answer, (list, tuple)) else [text(answer)]
            for answer in answers]


def row_key(rows: Sequence[dict], column: str) -> str:
    """The key the rows hold ``column`` under: ``column`` itself, else its alias (:data:`COLUMN_ALIASES`) when rows
    use it, as :func:`normalize_math_columns` renames."""
    if any(column in row for row in rows):
        return column
    aliases = [alias for alias, target in COLUMN_ALIASES.items() if target == column]
    return next((alias for alias in aliases if any(alias in row for row in rows)), column)


def split_names(source: str, splits: Sequence[str]) -> str:
    """``source:split`` for every split, comma-separated: the names a user may give instead."""
    return ", ".join(f"{source}{SPLIT_SEPARATOR}{split}" for split in splits)


def choose_split(splits: Sequence[str], split: str | None, source: str) -> str:
    """The split of a ``DatasetDict`` with ``splits`` that ``split`` names; None names its ``train`` split.

    Raises a one-line ValueError listing ``<source>:<split>`` for every split when ``split`` is not one of them, or
    is None and there is no ``train`` split (a bare name never means a held-out split).
    """
    if split is None:
        if TRAIN_SPLIT in splits:
            return TRAIN_SPLIT
        raise ValueError(f"{source} is a DatasetDict with no '{TRAIN_SPLIT}' split, the one its bare name would "
                         f"mean: name a split: {split_names(source, splits)}")
    if split not in splits:
        raise ValueError(f"{source} has no split {split!r}; its splits: {split_names(source, splits)}")
    return split


def select_split(dataset: Dataset | DatasetDict, split: str | None, source: str) -> Dataset:
    """The ``split`` of a ``DatasetDict`` (see :func:`choose_split`), or the ``Dataset`` itself (no split to name)."""
    if isinstance(dataset, Dataset):
        if split is not None:
            raise ValueError(f"{source} is not a DatasetDict: it has no split {split!r}")
        return dataset
    return dataset[choose_split(list(dataset.keys()), split, source)]


def parse_math_source(spec: str | os.PathLike) -> tuple[str, str | None]:
    """``(path, split)`` of ``PATH`` or ``PATH:SPLIT`` (a split of a saved ``DatasetDict``).

    A ``spec`` that exists as written is a path (a colon in a file name is kept); otherwise the text after its last
    colon is a split when the text before it exists. Anything else is returned whole, for the caller to report.
    """
    spec = os.fspath(spec)
    if os.path.exists(spec):
        return spec, None
    path, separator, split = spec.rpartition(SPLIT_SEPARATOR)
    if separator and path and split and "/" not in split and os.sep not in split and os.path.exists(path):
        return path, split
    return spec, None


def read_json_rows(path: str) -> Dataset:
    """A Dataset from a JSONL file (one object per line) or a JSON file holding a list of objects; a malformed
    line, an unusable question or answer (:func:`check_math_rows`) or a file without rows is a ``ValueError`` that
    names the file and the line (the row of a JSON list). Answers are put in one form (:func:`normalized_answers`)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if path.endswith(".jsonl"):
        numbered = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        rows = [_json_line(path, number, line) for number, line in numbered]
        locations = [f"line {number}" for number, _ in numbered]
    else:
        rows = _json_list(path, text)
        locations = [f"row {index}" for index in range(1, len(rows) + 1)]
    return rows_dataset(path, rows, locations)


def rows_dataset(path: str, rows: list[dict], locations: Sequence[str]) -> Dataset:
    """The Dataset of a file's ``rows``, checked and with answers in one form; columns other than the question and
    the answer are kept. A file without a question or answer column is left to :func:`normalize_math_columns`."""
    question_key, answer_key = row_key(rows, QUESTION_COLUMN), row_key(rows, ANSWER_COLUMN)
    if rows and any(question_key in row for row in rows) and any(answer_key in row for row in rows):
        check_math_rows(path, [row.get(question_key) for row in rows], [row.get(answer_key) for row in rows],
                        locations)
        answers = normalized_answers([row[answer_key] for row in rows])
        rows = [{**row, answer_key: answer} for row, answer in zip(rows, answers, strict=True)]
    elif not rows:
        check_math_rows(path, [], [])
    try:
        return Dataset.from_list(rows)
    except pyarrow.ArrowException as error:
        raise ValueError(f"{path}: column {mixed_column(rows)!r} mixes types of values "
                         f"({' '.join(str(error).split())}): give it one type, or drop it") from None


def mixed_column(rows: Sequence[dict]) -> str | None:
    """The first column of ``rows`` that Arrow cannot hold as one type, or None."""
    for key in dict.fromkeys(key for row in rows for key in row):
        try:
            Dataset.from_dict({key: [row.get(key) for row in rows]})
        except pyarrow.ArrowException:
            return key
    return None


def _json_list(path: str, text: str) -> list[dict]:
    try:
        rows = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a list of JSON objects, got a {type(rows).__name__}")
    not_objects = [i for i, row in enumerate(rows) if not isinstance(row, dict)]
    if not_objects:
        raise ValueError(f"{path}: row {not_objects[0] + 1} is not a JSON object")
    return rows


def _json_line(path: str, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}, line {number}: not a JSON object")
    return row


def load_math_dataset(path: str | os.PathLike, split: str | None = None) -> Dataset:
    """Load a math set from a ``save_to_disk`` folder or a JSON(L) file, with ``problem``/``answer`` columns.

    ``path`` may be ``PATH:SPLIT`` when ``split`` is None (:func:`parse_math_source`); a ``DatasetDict`` without a
    split named gives its ``train`` split (:func:`choose_split`). The set is held in memory, so MathEnv's shuffles
    write no cache files into the data folder.

    Raises FileNotFoundError naming ``path`` when it does not exist, ValueError when it is not a usable set.
    """
    path = os.fspath(path)
    if split is None:
        path, split = parse_math_source(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"math data set not found: {path}")
    if os.path.isfile(path):
        if split is not None:
            raise ValueError(f"{path} is not a DatasetDict: it has no split {split!r}")
        if not path.endswith(JSON_SUFFIXES):
            raise ValueError(f"{path}: a math data file must end in {' or '.join(JSON_SUFFIXES)}")
        dataset = read_json_rows(path)
    else:
        split = path_split(path, split, path)
        source = path if split is None else f"{path}{SPLIT_SEPARATOR}{split}"  # errors name the split
        dataset = load_saved_set(path if split is None else os.path.join(path, split), source)
        path = source
    return normalize_math_columns(dataset, path)


def load_saved_set(folder: str, source: str) -> Dataset:
    """The ``Dataset`` a ``save_to_disk`` folder holds (a split's folder, for a ``DatasetDict``), in memory; a set
    saved without rows is a ValueError naming ``source`` (datasets cannot load one in memory)."""
    state = os.path.join(folder, "state.json")
    if os.path.isfile(state):
        with open(state, encoding="utf-8") as handle:
            if json.load(handle).get("_data_files") == []:
                check_math_rows(source, [], [])
    try:
        return load_from_disk(folder, keep_in_memory=True)
    except FileNotFoundError as error:
        raise ValueError(f"{source} is not a folder written by datasets' save_to_disk: {error}") from error


GRADING_TIMEOUT_S = 1.0
"""Gem's MathEnv gives a grading this long before it counts the answer wrong."""


def _grader_ready() -> bool:
    """Run once in a fresh grader process: import the grader before any timed grading."""
    import gem.utils.math_grader  # noqa: F401  (imported to load the grader before any timed grading)

    return True


class SharedGrader:
    """One grading process for the whole process, restarted after a timeout (the stuck grading is killed)."""

    _lock = threading.Lock()
    _pool = None

    @classmethod
    def check(cls, answer: str, reference: Any, timeout: float = GRADING_TIMEOUT_S) -> bool:
        """``MathEnv.check_correct(answer, reference)``, False when it takes longer than ``timeout`` seconds."""
        with cls._lock:
            pool = cls._ready_pool()
            pending = pool.apply_async(MathEnv.check_correct, (answer, reference))
            try:
                return bool(pending.get(timeout=timeout))
            except multiprocessing.TimeoutError:
                cls._pool = None
                pool.terminate()
                return False

    @classmethod
    def _ready_pool(cls):
        if cls._pool is None:
            pool = multiprocessing.get_context("spawn").Pool(1)
            pool.apply(_grader_ready)  # the spawn's imports take longer than a grading may
            cls._pool = pool
        return cls._pool


class GemIdxResetFilter(logging.Filter):
    """Drops the record Gem's MathEnv writes on every reset with an ``idx``
    (``Reset env with a specific idx … only recommended for testing only!!!``); every other record passes."""

    PREFIX = "Reset env with a specific idx "
    SUFFIX = "only recommended for testing only!!!"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(self.PREFIX) and message.endswith(self.SUFFIX))


GEM_MATH_LOGGERS = ("", "gem.envs.math_env")
"""The loggers that notice may come through: Gem logs it with ``logging.info`` (the root logger); its module's own
logger is filtered too."""


def silence_gem_idx_reset_notice() -> None:
    """Install :class:`GemIdxResetFilter` on :data:`GEM_MATH_LOGGERS` (once each). :class:`LocalMathEnv` resets
    with an ``idx`` on every seeded reset, so that notice would fill the log of every rollout; a logger filter
    sees only records logged on that logger itself, so the root logger's filter leaves other loggers alone."""
    for name in GEM_MATH_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(installed, GemIdxResetFilter) for installed in logger.filters):
            logger.addFilter(GemIdxResetFilter())


silence_gem_idx_reset_notice()


class LocalMathEnv(MathEnv):
    """Gem's MathEnv with seed-indexed problems and one shared grading process (see the module's docstring)."""

    def __init__(self, dataset: Dataset, **kwargs: Any):
        kwargs["use_mp"] = False  # no pool per env: answers go to the SharedGrader
        super().__init__(dataset=dataset, **kwargs)

    def reset(self, seed: int | None = None, idx: int | None = None) -> tuple[str, dict[str, Any]]:
        if idx is None and seed is not None:
            idx = int(seed) % len(self.dataset)
        return super().reset(seed=seed, idx=idx)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        correct = SharedGrader.check(action, self.answer)
        return TERMINAL_STATE, 1.0 if correct else 0.0, True, True, {"correct": correct}


def make_local_math_env(
    data_path: str | None = None, split: str | None = None, dataset: Dataset | None = None, **kwargs: Any
) -> LocalMathEnv:
    """:class:`LocalMathEnv` over ``dataset`` or over the set at ``data_path`` (a gem entry point).

    Other keyword arguments go to Gem's MathEnv (``seed``, ``eval``: see gem.envs.math_env).
    """
    if dataset is None:
        if data_path is None:
            raise ValueError("make_local_math_env needs data_path or dataset")
        dataset = load_math_dataset(data_path, split)
    return LocalMathEnv(dataset=dataset, **kwargs)


def math_dataset_size(env_id: str) -> int | None:
    """The number of problems of a registered local math env, or None for an env without a local data set."""
    spec = ENV_REGISTRY.get(env_id)
    kwargs = getattr(spec, "kwargs", None) or {}
    if getattr(spec, "entry_point", None) is not make_local_math_env:
        return None
    if kwargs.get("dataset") is not None:
        return len(kwargs["dataset"])
    return len(load_math_dataset(kwargs["data_path"], kwargs.get("split")))


def register_math_dataset(
    env_id: str, path_or_dataset: PathOrDataset, split: str | None = None, overwrite: bool = False, **env_kwargs: Any
) -> str:
    """Register ``env_id`` as Gem's MathEnv over a local set; returns ``env_id``.

    A path (``PATH:SPLIT`` too, when ``split`` is None) is checked now (FileNotFoundError naming it when missing,
    ValueError for a split it lacks) and loaded when the env is made; a ``Dataset``/``DatasetDict`` is normalised
    now. A ``DatasetDict`` without ``split`` gives its ``train`` split (:func:`choose_split`). ``overwrite``
    replaces an existing registration of ``env_id`` (otherwise ValueError). ``env_kwargs`` are passed to MathEnv on
    every make.
    """
    if env_id in ENV_REGISTRY:
        if not overwrite:
            raise ValueError(f"environment {env_id} is already registered")
        del ENV_REGISTRY[env_id]
    if isinstance(path_or_dataset, (Dataset, DatasetDict)):
        dataset = normalize_math_columns(select_split(path_or_dataset, split, env_id), env_id)
        register(env_id, make_local_math_env, dataset=dataset, **env_kwargs)
        return env_id
    path = os.fspath(path_or_dataset)
    if split is None:
        path, split = parse_math_source(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"math data set not found: {path}")
    register(env_id, make_local_math_env, data_path=path, split=path_split(path, split, path), **env_kwargs)
    return env_id


def dataset_dict_splits(folder: str) -> list[str] | None:
    """The split names of a ``DatasetDict.save_to_disk`` folder, or None when ``folder`` is not one."""
    marker = os.path.join(folder, "dataset_dict.json")
    if not os.path.isfile(marker):
        return None
    with open(marker, encoding="utf-8") as handle:
        return list(json.load(handle)["splits"])


def path_split(path: str, split: str | None, source: str) -> str | None:
    """The split to load from the set at ``path`` (existing): :func:`choose_split` among a ``DatasetDict`` folder's
    splits, None for any other set. Raises a one-line ValueError, naming ``source``, for a split it lacks."""
    splits = dataset_dict_splits(path)
    if splits is not None:
        return choose_split(splits, split, source)
    if split is not None:
        raise ValueError(f"{source} is not a DatasetDict: it has no split {split!r}")
    return None


def dataset_dict_names(
    name: str, qualified: str, folder: str, splits: Sequence[str]
) -> list[tuple[str, str, str, str | None]]:
    """``(name, qualified_name, path, split)`` of a ``DatasetDict`` folder: the bare name for its ``train`` split
    (none without one, see the module's docstring), then ``<name>:<split>`` for every split, in saved order."""
    bare = [(name, qualified, folder, TRAIN_SPLIT)] if TRAIN_SPLIT in splits else []
    return bare + [(f"{name}{SPLIT_SEPARATOR}{s}", f"{qualified}{SPLIT_SEPARATOR}{s}", folder, s) for s in splits]


def scan_math_folder(folder: str, relative: str = "") -> list[tuple[str, str, str, str | None]]:
    """``(name, qualified_name, path, split)`` for every set at or below ``folder``, in sorted order; the qualified
    name is the set's path relative to the scan's root (with ``:<split>`` for a split of a ``DatasetDict``)."""
    splits = dataset_dict_splits(folder)
    own_name = os.path.basename(os.path.normpath(folder))
    if splits is not None:
        return dataset_dict_names(own_name, relative or own_name, folder, splits)
    if os.path.isfile(os.path.join(folder, "state.json")):
        return [(own_name, relative or own_name, folder, None)]
    found = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        qualified = f"{relative}/{entry}" if relative else entry
        if os.path.isdir(path):
            found += scan_math_folder(path, qualified)
        elif entry.endswith(JSON_SUFFIXES):
            stem = os.path.splitext(entry)[0]
            found.append((stem, os.path.splitext(qualified)[0], path, None))
    return found


def find_math_datasets(root: str | os.PathLike) -> dict[str, tuple[str, str | None]]:
    """``{name: (path, split)}`` for every set under ``root``.

    A set is named by its folder or file stem; a ``DatasetDict``'s splits by ``<folder>:<split>``, and its bare
    ``<folder>`` is its ``train`` split, when it has one (the module's docstring says why). Names that occur twice
    are replaced by their path relative to ``root``. Raises FileNotFoundError naming a missing ``root``.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"math data folder not found: {root}")
    found = scan_math_folder(root)
    counts: dict[str, int] = {}
    for name, *_ in found:
        counts[name] = counts.get(name, 0) + 1
    return {(name if counts[name] == 1 else qualified): (path, split) for name, qualified, path, split in found}


def register_math_folder(
    root: str | os.PathLike, prefix: str = LOCAL_MATH_PREFIX, **env_kwargs: Any
) -> list[str]:
    """Register ``<prefix>:<name>`` for every set under ``root`` (replacing earlier registrations); returns ids."""
    env_ids = []
    for name, (path, split) in find_math_datasets(root).items():
        env_ids.append(register_math_dataset(f"{prefix}:{name}", path, split=split, overwrite=True, **env_kwargs))
    return env_ids


MAX_LISTED_IDS = 40
"""An unknown-id error lists at most this many registered ``local-math`` ids."""


def registered_math_ids(prefix: str = LOCAL_MATH_PREFIX) -> list[str]:
    """The registered ids that start with ``<prefix>:``, in registration order."""
    return [env_id for env_id in ENV_REGISTRY if env_id.startswith(f"{prefix}{SPLIT_SEPARATOR}")]


def listed_ids(env_ids: Sequence[str]) -> str:
    """``env_ids`` comma-separated, at most :data:`MAX_LISTED_IDS` of them, or a hint when there are none."""
    if not env_ids:
        return f"none (set {DATA_ENV_VAR} to a folder of math sets, or give a path)"
    more = len(env_ids) - MAX_LISTED_IDS
    return ", ".join(env_ids[:MAX_LISTED_IDS]) + (f", … ({more} more)" if more > 0 else "")


def registered_split_problem(env_id: str, registered: Sequence[str]) -> str | None:
    """Why ``env_id``, unregistered, names no set, when registered ids are splits of it or of the name before its
    last colon: a ``DatasetDict`` without a ``train`` split named bare, or a split it lacks; else None."""
    for name in (env_id, env_id.rpartition(SPLIT_SEPARATOR)[0]):
        split_ids = [i for i in registered if i.startswith(f"{name}{SPLIT_SEPARATOR}")]
        if not split_ids or SPLIT_SEPARATOR not in name:
            continue
        split = None if name == env_id else env_id[len(name) + 1:]
        try:
            choose_split([i[len(name) + 1:] for i in split_ids], split, name)
        except ValueError as error:
            return str(error)
        return f"unknown env id {env_id!r}; registered splits of {name}: {', '.join(split_ids)}"
    return None


def local_math_id_problem(env_id: str, prefix: str = LOCAL_MATH_PREFIX) -> str | None:
    """Why ``<prefix>:<name or path>`` names no math set, in one line; None when it names one.

    A registered id names one; so does an existing path, or ``PATH:SPLIT``, whose split exists (a ``DatasetDict``
    path without a split needs a ``train`` split, :func:`choose_split`). A bare name whose ``<name>:<split>`` ids are
    registered is a ``DatasetDict`` without a ``train`` split, and a ``<name>:<split>`` beside registered splits of
    ``<name>`` a split it lacks: both errors list those ids. Any other name lists every registered ``<prefix>`` id.
    Reads the registry and the file system only.
    """
    if env_id in ENV_REGISTRY:
        return None
    spec = env_id[len(prefix) + 1:]
    path, split = parse_math_source(spec)
    if os.path.exists(path):
        try:
            path_split(path, split, f"{prefix}{SPLIT_SEPARATOR}{path}")
        except ValueError as error:
            return str(error)
        return None
    registered = registered_math_ids(prefix)
    return registered_split_problem(env_id, registered) or (
        f"unknown env id {env_id!r}: math data {spec!r} does not exist and no local math set of that name is "
        f"registered; registered: {listed_ids(registered)}")


def register_math_folder_from_environment() -> list[str]:
    """Register the sets under the folder named by ``DPPO_MATH_DATA`` (nothing when it is unset; warn if missing)."""
    root = os.environ.get(DATA_ENV_VAR)
    if not root:
        return []
    if not os.path.isdir(root):
        warnings.warn(f"{DATA_ENV_VAR} names a missing folder: {root}; no local math ids registered", stacklevel=1)
        return []
    return register_math_folder(root)


def math_oracle_action(env: Any, rng: Any = None) -> str:
    """The current row's reference answer in ``\\boxed{}`` (the first one when several are accepted)."""
    answer = env.unwrapped.answer
    if isinstance(answer, (list, tuple)):
        answer = answer[0]
    answer = str(answer).strip()
    if "\\boxed" in answer:
        return answer
    return f"\\boxed{{{answer}}}"
