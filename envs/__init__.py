"""The project's Gem environments.

Importing ``envs`` registers with Gem (``gem.register``):

- ``example:Countdown-v0``: a small multi-turn game, the template for new envs (``envs/example_countdown.py``);
- ``game:Sudoku-v0-easy-compact`` and ``game:Sudoku-v0-easy-compact-wrong``: Gem's Sudoku-easy with a ~25-token
  observation (``envs/sudoku_compact.py``);
- ``game:GuessTheNumber-v0-hard-compact`` and ``game:GuessTheNumber-v0-easy-compact``: Gem's Guess The Number
  (1-50 in 7 turns, 1-10 in 4) with the guesses and hints so far as the observation (``envs/guess_compact.py``);
- ``local-math:<name>`` for every math set under the folder named by ``DPPO_MATH_DATA``, when that variable is set,
  and ``local-math:<folder>:<split>`` for every split of a saved ``DatasetDict`` (its bare ``<folder>`` is its
  ``train`` split; ``envs/math_local.py``; register other sets with :func:`register_math_dataset` /
  :func:`register_math_folder`).

The paper's Gem tasks (:data:`PAPER_TASKS`) are Gem's own ids and need no registration. Oracle policies and
demonstrations are in ``envs/oracles.py``. An environment of one's own lives in one's own file, a *plugin* that
registers it (and its oracle, :func:`register_oracle`) when imported: the engines import it with ``--env-module``
(:func:`import_env_modules`, ``envs/plugins.py``) and probe its envs once before any model
(:func:`check_plugin_envs`). See ``envs/README.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gem
from gem.core import Env
from gem.envs.registration import ENV_REGISTRY

from envs import example_countdown, guess_compact, sudoku_compact
from envs.contract import BrokenEnvError
from envs.example_countdown import CountdownEnv
from envs.math_local import (
    LOCAL_MATH_PREFIX,
    load_math_dataset,
    local_math_id_problem,
    math_dataset_size,
    register_math_dataset,
    register_math_folder,
    register_math_folder_from_environment,
)
from envs.oracles import (
    ORACLES,
    demonstrations,
    oracle_action,
    oracle_for_env_id,
    probe_env,
    register_oracle,
    reset_seed_problem,
)
from envs.plugins import ENTRY_POINT_GROUP, PLUGIN_ENV_IDS, import_env_module, import_env_modules
from envs.sudoku_compact import CompactSudokuObservation, compact_sudoku_observation, parse_compact_sudoku

PAPER_TASKS = ("game:Sudoku-v0-easy", "rg:arc_1d", "rg:acre")
"""The paper's Gem tasks (multi-turn Sudoku-easy and two single-turn reasoning-gym tasks)."""

PROJECT_ENV_IDS = (
    example_countdown.ENV_ID,
    sudoku_compact.COMPACT_ENV_ID,
    sudoku_compact.COMPACT_WRONG_ENV_ID,
    guess_compact.COMPACT_ENV_ID,
    guess_compact.EASY_COMPACT_ENV_ID,
)
"""Ids this package registers on import (besides the ``local-math:*`` ids)."""

LOCAL_MATH_IDS = tuple(register_math_folder_from_environment())
"""The ``local-math:*`` ids registered on import from the ``DPPO_MATH_DATA`` folder (empty when it is unset)."""


EXAMPLE_ENV_IDS = (
    "game:Sudoku-v0-easy-compact, game:Sudoku-v0-easy, rg:arc_1d, rg:acre, example:Countdown-v0, "
    "local-math:<name, folder:split or path>"
)


def check_env_id(env_id: str) -> str:
    """Raise one clear ``ValueError`` unless ``env_id`` is registered with Gem or names existing math data
    (``local-math:<path>`` or ``local-math:<path>:<split>``); registers nothing (see :func:`ensure_registered`).
    An unknown ``local-math`` id's error lists the registered ones (:func:`local_math_id_problem`)."""
    if env_id in ENV_REGISTRY:
        return env_id
    if env_id.startswith(f"{LOCAL_MATH_PREFIX}:"):
        problem = local_math_id_problem(env_id)
        if problem is not None:
            raise ValueError(problem)
        return env_id
    raise ValueError(f"unknown env id {env_id!r}; examples: {EXAMPLE_ENV_IDS} (an env of your own: "
                     "--env-module path/to/file.py that registers it)")


def ensure_registered(env_id: str) -> str:
    """Check that Gem knows ``env_id``; ``local-math:<path>`` of an existing file or folder (``<path>:<split>`` for a
    split of a ``DatasetDict``) is registered on the fly, so a data set can be named on a command line. Raises one
    clear ``ValueError`` otherwise."""
    check_env_id(env_id)
    if env_id in ENV_REGISTRY:
        return env_id
    return register_math_dataset(env_id, env_id[len(LOCAL_MATH_PREFIX) + 1:])


def check_plugin_envs(env_ids: Sequence[str], *, env_seed: int, oracle_env_id: str | None = None) -> None:
    """Probe each of ``env_ids`` that a plugin registered (:func:`envs.oracles.probe_env`: made with ``env_seed``, reset
    once, one step; the oracle's move for ``oracle_env_id``, whose oracle warm-starts the tiny policy). Raises one
    ``ValueError`` line when an env or that oracle breaks Gem's contract. The project's and Gem's own ids are left to
    the contract check (``python -m dppo_oat.check_env``)."""
    for env_id in dict.fromkeys(env_ids):
        if env_id in PLUGIN_ENV_IDS:
            try:
                probe_env(env_id, play_oracle=env_id == oracle_env_id, env_seed=env_seed)
            except BrokenEnvError as error:
                raise ValueError(str(error)) from error


def unseeded_plugin_envs(env_ids: Sequence[str], *, env_seed: int, seeds: Sequence[int]) -> list[str]:
    """One line for each plugin env of ``env_ids`` whose ``reset(seed)`` does not fix its episode, checked on the
    first two of ``seeds`` (:func:`envs.oracles.reset_seed_problem`); the project's and Gem's own ids are left to the
    contract test."""
    return [problem for env_id in dict.fromkeys(env_ids) if env_id in PLUGIN_ENV_IDS
            for problem in [reset_seed_problem(env_id, env_seed, seeds)] if problem]


def make_env(env_id: str, **kwargs: Any) -> Env:
    """``gem.make(env_id, **kwargs)`` after :func:`ensure_registered`."""
    return gem.make(ensure_registered(env_id), **kwargs)


__all__ = [
    "CompactSudokuObservation",
    "CountdownEnv",
    "ENTRY_POINT_GROUP",
    "check_env_id",
    "check_plugin_envs",
    "LOCAL_MATH_IDS",
    "ORACLES",
    "PAPER_TASKS",
    "PROJECT_ENV_IDS",
    "compact_sudoku_observation",
    "demonstrations",
    "ensure_registered",
    "import_env_module",
    "import_env_modules",
    "load_math_dataset",
    "make_env",
    "math_dataset_size",
    "oracle_action",
    "oracle_for_env_id",
    "parse_compact_sudoku",
    "register_math_dataset",
    "register_math_folder",
    "unseeded_plugin_envs",
    "register_oracle",
]
