"""Math tasks from local data, without the model hub.

Gem's ``math:*`` / ``eval:*`` ids download their data from the hub. This module builds the same environment — Gem's
own :class:`gem.envs.math_env.MathEnv`, single-turn, the last ``\\boxed{}`` graded with Gem's grader (math-verify
in its slow, thorough mode), reward 1 or 0 — over data on disk:

- a folder written by ``datasets.Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``;
- a JSONL file (one JSON object per line) or a JSON file holding a list of objects.

Rows need a question and an answer column: ``problem``/``answer``, or ``input``/``gt_answer`` (renamed on load; an
``input`` written in a ChatML template is reduced to the user's message). Answers may be strings, numbers or lists
of accepted strings.

Ids: :func:`register_math_dataset` registers one set under any id; :func:`register_math_folder` finds every set under
a folder and registers ``local-math:<name>`` for each (a ``DatasetDict`` with several splits gives one id per split).
``import envs`` calls it on the folder named by the ``DPPO_MATH_DATA`` environment variable, when it is set. Hub ids
are left as they are and still work where the hub is reachable.

Two changes to Gem's MathEnv, in :class:`LocalMathEnv`:

- a reset seed picks problem ``seed mod N`` (Gem draws one at random), so consecutive evaluation seeds cover a set
  without repeats: seeds ``s … s + N − 1`` are every problem once;
- answers are graded in one worker process shared by every env of the process (:class:`SharedGrader`), with Gem's
  1-second timeout. Gem's default gives each env its own process pool, and an actor with hundreds of env slots would
  fork hundreds of processes; Gem's other mode times out with ``signal.alarm``, which works only in the main thread
  (a distributed actor serves its calls from other threads).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

from datasets import Dataset, DatasetDict, load_from_disk
from gem.envs.math_env import MathEnv
from gem.envs.registration import ENV_REGISTRY, register
from gem.utils.constants import TERMINAL_STATE

LOCAL_MATH_PREFIX = "local-math"
DATA_ENV_VAR = "DPPO_MATH_DATA"
QUESTION_COLUMN = "problem"
ANSWER_COLUMN = "answer"
COLUMN_ALIASES = {"input": QUESTION_COLUMN, "gt_answer": ANSWER_COLUMN}
JSON_SUFFIXES = (".jsonl", ".json")
CHATML_USER_START = "<|im_start|>user\n"
CHATML_END = "<|im_end|>"

PathOrDataset = Union[str, os.PathLike, Dataset, DatasetDict]


def strip_chat_template(text: str) -> str:
    """The user's message of a ChatML-formatted prompt; other text is returned unchanged."""
    start = text.find(CHATML_USER_START)
    if start < 0:
        return text
    body = text[start + len(CHATML_USER_START):]
    end = body.find(CHATML_END)
    return (body if end < 0 else body[:end]).strip()


def normalize_math_columns(dataset: Dataset) -> Dataset:
    """Rename ``input``/``gt_answer`` to ``problem``/``answer`` and strip ChatML from questions.

    Raises ValueError when a question or answer column is missing.
    """
    for alias, column in COLUMN_ALIASES.items():
        if column not in dataset.column_names and alias in dataset.column_names:
            dataset = dataset.rename_column(alias, column)
    missing = [c for c in (QUESTION_COLUMN, ANSWER_COLUMN) if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"math data set lacks column(s) {missing}; it has {dataset.column_names} "
            f"(expected {QUESTION_COLUMN}/{ANSWER_COLUMN} or input/gt_answer)"
        )
    if any(CHATML_USER_START in question for question in dataset[QUESTION_COLUMN]):
        questions = [strip_chat_template(question) for question in dataset[QUESTION_COLUMN]]
        dataset = dataset.remove_columns(QUESTION_COLUMN).add_column(QUESTION_COLUMN, questions)
    return dataset


def select_split(dataset: Union[Dataset, DatasetDict], split: Optional[str], source: str) -> Dataset:
    """The ``split`` of a ``DatasetDict`` (its only split when ``split`` is None), or the ``Dataset`` itself."""
    if isinstance(dataset, Dataset):
        return dataset
    if split is None and len(dataset) == 1:
        return next(iter(dataset.values()))
    if split not in dataset:
        raise ValueError(f"{source}: choose a split among {list(dataset.keys())} (got {split!r})")
    return dataset[split]


def read_json_rows(path: str) -> Dataset:
    """A Dataset from a JSONL file (one object per line) or a JSON file holding a list of objects; a malformed
    line or row is a ``ValueError`` that names the file and the line."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if path.endswith(".jsonl"):
        rows = [_json_line(path, number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty list of JSON objects")
    not_objects = [i for i, row in enumerate(rows) if not isinstance(row, dict)]
    if not_objects:
        raise ValueError(f"{path}: row {not_objects[0] + 1} is not a JSON object")
    return Dataset.from_list(rows)


def _json_line(path: str, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}, line {number}: not a JSON object")
    return row


def load_math_dataset(path: Union[str, os.PathLike], split: Optional[str] = None) -> Dataset:
    """Load a math set from a ``save_to_disk`` folder or a JSON(L) file, with ``problem``/``answer`` columns.

    The set is held in memory, so MathEnv's shuffles write no cache files into the data folder.

    Raises FileNotFoundError naming ``path`` when it does not exist, ValueError when it is not a usable set.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"math data set not found: {path}")
    if os.path.isfile(path):
        if not path.endswith(JSON_SUFFIXES):
            raise ValueError(f"{path}: a math data file must end in {' or '.join(JSON_SUFFIXES)}")
        dataset = read_json_rows(path)
    else:
        try:
            dataset = load_from_disk(path, keep_in_memory=True)
        except FileNotFoundError as error:
            raise ValueError(f"{path} is not a folder written by datasets' save_to_disk: {error}") from error
        dataset = select_split(dataset, split, path)
    return normalize_math_columns(dataset)


GRADING_TIMEOUT_S = 1.0
"""Gem's MathEnv gives a grading this long before it counts the answer wrong."""


def _grader_ready() -> bool:
    """Run once in a fresh grader process: import the grader before any timed grading."""
    import gem.utils.math_grader  # noqa: F401

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


class LocalMathEnv(MathEnv):
    """Gem's MathEnv with seed-indexed problems and one shared grading process (see the module's docstring)."""

    def __init__(self, dataset: Dataset, **kwargs: Any):
        kwargs["use_mp"] = False  # no pool per env: answers go to the SharedGrader
        super().__init__(dataset=dataset, **kwargs)

    def reset(self, seed: Optional[int] = None, idx: Optional[int] = None) -> Tuple[str, Dict[str, Any]]:
        if idx is None and seed is not None:
            idx = int(seed) % len(self.dataset)
        return super().reset(seed=seed, idx=idx)

    def step(self, action: str) -> Tuple[str, float, bool, bool, Dict[str, Any]]:
        correct = SharedGrader.check(action, self.answer)
        return TERMINAL_STATE, 1.0 if correct else 0.0, True, True, {"correct": correct}


def make_local_math_env(
    data_path: Optional[str] = None, split: Optional[str] = None, dataset: Optional[Dataset] = None, **kwargs: Any
) -> LocalMathEnv:
    """:class:`LocalMathEnv` over ``dataset`` or over the set at ``data_path`` (a gem entry point).

    Other keyword arguments go to Gem's MathEnv (``seed``, ``eval``: see gem.envs.math_env).
    """
    if dataset is None:
        if data_path is None:
            raise ValueError("make_local_math_env needs data_path or dataset")
        dataset = load_math_dataset(data_path, split)
    return LocalMathEnv(dataset=dataset, **kwargs)


def math_dataset_size(env_id: str) -> Optional[int]:
    """The number of problems of a registered local math env, or None for an env without a local data set."""
    spec = ENV_REGISTRY.get(env_id)
    kwargs = getattr(spec, "kwargs", None) or {}
    if getattr(spec, "entry_point", None) is not make_local_math_env:
        return None
    if kwargs.get("dataset") is not None:
        return len(kwargs["dataset"])
    return len(load_math_dataset(kwargs["data_path"], kwargs.get("split")))


def register_math_dataset(
    env_id: str, path_or_dataset: PathOrDataset, split: Optional[str] = None, overwrite: bool = False, **env_kwargs: Any
) -> str:
    """Register ``env_id`` as Gem's MathEnv over a local set; returns ``env_id``.

    A path is checked now (FileNotFoundError naming it when missing) and loaded when the env is made; a
    ``Dataset``/``DatasetDict`` is normalised now. ``overwrite`` replaces an existing registration of ``env_id``
    (otherwise ValueError). ``env_kwargs`` are passed to MathEnv on every make.
    """
    if env_id in ENV_REGISTRY:
        if not overwrite:
            raise ValueError(f"environment {env_id} is already registered")
        del ENV_REGISTRY[env_id]
    if isinstance(path_or_dataset, (Dataset, DatasetDict)):
        dataset = normalize_math_columns(select_split(path_or_dataset, split, env_id))
        register(env_id, make_local_math_env, dataset=dataset, **env_kwargs)
        return env_id
    path = os.fspath(path_or_dataset)
    if not os.path.exists(path):
        raise FileNotFoundError(f"math data set not found: {path}")
    register(env_id, make_local_math_env, data_path=path, split=split, **env_kwargs)
    return env_id


def dataset_dict_splits(folder: str) -> Optional[List[str]]:
    """The split names of a ``DatasetDict.save_to_disk`` folder, or None when ``folder`` is not one."""
    marker = os.path.join(folder, "dataset_dict.json")
    if not os.path.isfile(marker):
        return None
    with open(marker, encoding="utf-8") as handle:
        return list(json.load(handle)["splits"])


def scan_math_folder(folder: str, relative: str = "") -> List[Tuple[str, str, str, Optional[str]]]:
    """``(name, qualified_name, path, split)`` for every set at or below ``folder``, in sorted order."""
    splits = dataset_dict_splits(folder)
    own_name = os.path.basename(os.path.normpath(folder))
    if splits is not None and len(splits) == 1:
        return [(own_name, relative or own_name, folder, splits[0])]
    if splits is not None:
        return [(s, f"{relative}/{s}" if relative else s, folder, s) for s in splits]
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


def find_math_datasets(root: Union[str, os.PathLike]) -> Dict[str, Tuple[str, Optional[str]]]:
    """``{name: (path, split)}`` for every set under ``root``.

    A set is named by its folder (or file stem, or split name for a multi-split ``DatasetDict``); names that
    occur twice are replaced by their path relative to ``root``. Raises FileNotFoundError naming a missing ``root``.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"math data folder not found: {root}")
    found = scan_math_folder(root)
    counts: Dict[str, int] = {}
    for name, *_ in found:
        counts[name] = counts.get(name, 0) + 1
    return {(name if counts[name] == 1 else qualified): (path, split) for name, qualified, path, split in found}


def register_math_folder(
    root: Union[str, os.PathLike], prefix: str = LOCAL_MATH_PREFIX, **env_kwargs: Any
) -> List[str]:
    """Register ``<prefix>:<name>`` for every set under ``root`` (replacing earlier registrations); returns ids."""
    env_ids = []
    for name, (path, split) in find_math_datasets(root).items():
        env_ids.append(register_math_dataset(f"{prefix}:{name}", path, split=split, overwrite=True, **env_kwargs))
    return env_ids


def register_math_folder_from_environment() -> List[str]:
    """Register the sets under the folder named by ``DPPO_MATH_DATA`` (nothing when it is unset; warn if missing)."""
    root = os.environ.get(DATA_ENV_VAR)
    if not root:
        return []
    if not os.path.isdir(root):
        warnings.warn(f"{DATA_ENV_VAR} names a missing folder: {root}; no local math ids registered")
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
