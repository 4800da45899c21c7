"""Oracle policies: perfect players that read the answer from the env's state.

They supply demonstrations for a supervised warm start and a ceiling for tests. An oracle is a function
``oracle(env, rng) -> action_text``: ``env`` may be wrapped (state is read through ``env.unwrapped``), ``rng`` is a
``random.Random`` or a ``numpy.random.Generator`` used for any choice the oracle makes (e.g. which Countdown solution).

- Sudoku (any Gem Sudoku id, compact ids included): the first most-constrained empty cell (fewest candidates) and
  its solution digit, ``\\boxed{row col num}`` (1-based), from ``env.unwrapped.board`` / ``.full_grid``; every move
  is correct.
- ``rg:arc_1d`` and ``rg:acre``: ``\\boxed{<env.unwrapped.data["answer"]>}`` (reward 1.0).
- local math (``local-math:*``, or any Gem MathEnv): the row's reference answer in ``\\boxed{}``.
- ``example:Countdown-v0``: the first move of a solution found by search.
- Guess The Number (any Gem GuessTheNumber env, the compact ids included): binary search on what the hints told.

:func:`demonstrations` plays an oracle in the real env and returns the (observation, action) turns, so a trainer can
format them with any prompt template. An oracle that raises or returns anything but a str, and an env that breaks
Gem's contract or raises during an oracle's episode, stop it with a one-line
:class:`~envs.contract.BrokenEnvError` naming the env, its plugin and the oracle; :func:`probe_env` tries
one move of it, for validation to refuse such a plugin before any model is built. An env of one's own (a plugin, see
``envs/plugins.py``) registers its oracle with :func:`register_oracle`; :func:`oracle_for_env_id` tells, without
making the env, whether an id has one.
"""

from __future__ import annotations

import contextlib
import importlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import gem
from gem.core import Env
from gem.envs.game_env.guess_the_number import GuessTheNumberEnv
from gem.envs.game_env.sudoku import SudokuEnv
from gem.envs.math_env import MathEnv
from gem.envs.registration import ENV_REGISTRY

from envs.contract import INVALID_ACTION, BrokenEnvError, check_step_result, checked_reset, checked_step, returned
from envs.contract import observation_text as observation_with_suffix
from envs.guess_compact import COMPACT_ENV_ID as GUESS_ENV_ID
from envs.guess_compact import EASY_COMPACT_ENV_ID as GUESS_EASY_ENV_ID
from envs.guess_compact import guess_mistake_action, guess_oracle_action
from envs.math_local import LOCAL_MATH_PREFIX, math_oracle_action
from envs.plugins import env_label, raised
from envs.sudoku_compact import COMPACT_ENV_ID, COMPACT_WRONG_ENV_ID

Oracle = Callable[[Env, Any], str]
Turn = tuple[str, str]
ObservationFn = Callable[[str, dict[str, Any]], str]
MAX_EPISODE_TURNS = 1000


def choose_index(rng: Any, size: int) -> int:
    """A uniform index in ``range(size)`` from a ``random.Random`` or a ``numpy.random.Generator``."""
    if hasattr(rng, "integers"):
        return int(rng.integers(size))
    return rng.randrange(size)


def sudoku_candidates(board: list[list[int]], row: int, col: int) -> set:
    """The digits not yet in the row, column or box of cell ``(row, col)`` (0-based; boxes of √scale × √scale)."""
    scale = len(board)
    box = int(round(scale ** 0.5))
    top, left = row - row % box, col - col % box
    seen = set(board[row]) | {board[r][col] for r in range(scale)}
    seen |= {board[r][c] for r in range(top, top + box) for c in range(left, left + box)}
    return set(range(1, scale + 1)) - seen


def most_constrained_cells(board: list[list[int]]) -> list[tuple[int, int]]:
    """The empty cells with the fewest candidates (:func:`sudoku_candidates`), in reading order."""
    counts = {(r, c): len(sudoku_candidates(board, r, c))
              for r, row in enumerate(board) for c, cell in enumerate(row) if cell == 0}
    if not counts:
        raise ValueError("the Sudoku board has no empty cell left")
    fewest = min(counts.values())
    return [cell for cell, count in counts.items() if count == fewest]


def sudoku_oracle_action(env: Env, rng: Any = None) -> str:
    """The first most-constrained empty cell (fewest candidates; reading order breaks ties) and its correct digit,
    as ``\\boxed{row col num}`` (1-based). A person fills a cell whose digit the board forces; so do the
    demonstrations, and a tiny policy learns them several times faster than moves on a random empty cell (its digit
    then often needs more than one row, column or box to be read)."""
    game = env.unwrapped
    row, col = most_constrained_cells(game.board)[0]
    return f"\\boxed{{{row + 1} {col + 1} {game.full_grid[row][col]}}}"


def sudoku_mistake_action(env: Env, rng: Any) -> str:
    """A learner's typical mistake: a random empty cell with a digit other than its solution (board unchanged)."""
    game = env.unwrapped
    empty = [(r, c) for r, row in enumerate(game.board) for c, cell in enumerate(row) if cell == 0]
    row, col = empty[choose_index(rng, len(empty))]
    wrong = [digit for digit in range(1, len(game.board) + 1) if digit != game.full_grid[row][col]]
    return f"\\boxed{{{row + 1} {col + 1} {wrong[choose_index(rng, len(wrong))]}}}"


def reasoning_gym_oracle_action(env: Env, rng: Any = None) -> str:
    """The reasoning-gym entry's reference answer in ``\\boxed{}`` (checked for ``rg:arc_1d`` and ``rg:acre``)."""
    return f"\\boxed{{{env.unwrapped.data['answer']}}}"


ORACLES: dict[str, Oracle] = {
    "game:Sudoku-v0-easy": sudoku_oracle_action,
    "game:Sudoku-v0-hard": sudoku_oracle_action,
    "game:Sudoku-v0-random": sudoku_oracle_action,
    COMPACT_ENV_ID: sudoku_oracle_action,
    COMPACT_WRONG_ENV_ID: sudoku_oracle_action,
    "rg:arc_1d": reasoning_gym_oracle_action,
    "rg:acre": reasoning_gym_oracle_action,
    GUESS_ENV_ID: guess_oracle_action,
    GUESS_EASY_ENV_ID: guess_oracle_action,
    f"{LOCAL_MATH_PREFIX}:*": math_oracle_action,
}
"""Oracles by env id; a key ``<prefix>:*`` covers every id with that prefix."""

MISTAKES: dict[str, Oracle] = {COMPACT_WRONG_ENV_ID: sudoku_mistake_action, GUESS_ENV_ID: guess_mistake_action,
                               GUESS_EASY_ENV_ID: guess_mistake_action}
"""Mistake makers, for envs whose observation shows a failed move: demonstrations with ``mistake_rate > 0`` then
also show the oracle recovering from one (the mistake itself is played, never recorded as a turn)."""

ORACLES_BY_ENV_CLASS: list[tuple[type, Oracle]] = [
    (SudokuEnv, sudoku_oracle_action),
    (MathEnv, math_oracle_action),
    (GuessTheNumberEnv, guess_oracle_action),
]
"""Fallback for envs whose id has no oracle (or that were built without ``gem.make``); a plugin adds its class with
:func:`register_oracle`'s ``env_class``."""


def register_oracle(env_id: str, oracle: Oracle, env_class: type | None = None) -> None:
    """Make ``oracle`` the oracle of ``env_id`` (or of every ``<prefix>:...`` id when given ``<prefix>:*``), and with
    ``env_class``, of every env of that class (or a subclass) whose id has none."""
    ORACLES[env_id] = oracle
    if env_class is not None and (env_class, oracle) not in ORACLES_BY_ENV_CLASS:
        ORACLES_BY_ENV_CLASS.append((env_class, oracle))


def oracle_for_id(env_id: str | None) -> Oracle | None:
    """The oracle registered for ``env_id`` exactly, else for its ``<prefix>:*``, else None."""
    if not env_id:
        return None
    if env_id in ORACLES:
        return ORACLES[env_id]
    prefix = env_id.split(":", 1)[0]
    return ORACLES.get(f"{prefix}:*")


def oracle_for_class(env_class: Any) -> Oracle | None:
    """The fallback oracle of an env class (:data:`ORACLES_BY_ENV_CLASS`), or None."""
    for base, oracle in ORACLES_BY_ENV_CLASS:
        if isinstance(env_class, type) and issubclass(env_class, base):
            return oracle
    return None


def registered_env_class(env_id: str) -> Any:
    """The class (or factory) Gem's registry builds ``env_id`` with, imported as ``gem.make`` would, without building
    an env; None for an unregistered id, or one whose entry point does not import (``gem.make`` will say why)."""
    spec = ENV_REGISTRY.get(env_id)
    if spec is None or not isinstance(spec.entry_point, str):
        return None if spec is None else spec.entry_point
    module_name, _, class_name = spec.entry_point.partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        return None


def oracle_for_env_id(env_id: str) -> Oracle | None:
    """The oracle :func:`find_oracle` would pick for an env made from ``env_id``: by id, else by the class Gem's
    registry names for it; an id registered with a factory function is made once to see its class. None when it
    has none."""
    oracle = oracle_for_id(env_id)
    entry = registered_env_class(env_id)
    if oracle is not None or entry is None:
        return oracle
    if isinstance(entry, type):
        return oracle_for_class(entry)
    try:
        return find_oracle(gem.make(env_id))
    except KeyError:
        return None


def find_oracle(env: Env) -> Oracle:
    """The oracle for a (possibly wrapped) env: by its id, the unwrapped env's id, then the env's class."""
    for env_id in (getattr(env, "env_id", None), getattr(env.unwrapped, "env_id", None)):
        oracle = oracle_for_id(env_id)
        if oracle is not None:
            return oracle
    oracle = oracle_for_class(type(env.unwrapped))
    if oracle is None:
        env_id = getattr(env, "env_id", type(env.unwrapped).__name__)
        raise KeyError(f"no oracle for env {env_id}: register one with envs.register_oracle({env_id!r}, oracle)")
    return oracle


def oracle_action(env: Env, rng: Any = None) -> str:
    """The oracle's action text for the env's current state (``rng`` defaults to ``random.Random(0)``)."""
    return find_oracle(env)(env, random.Random(0) if rng is None else rng)


def raw_observation(observation: str, info: dict[str, Any]) -> str:
    """The observation as the env returned it (use with wrappers that already render ``info``)."""
    return observation


def play_oracle_episode(
    env: Env, seed: int | None, rng: Any, observation_fn: ObservationFn = observation_with_suffix,
    mistake: Oracle | None = None, mistake_rate: float = 0.0,
) -> tuple[list[Turn], float]:
    """One episode of the oracle from ``env.reset(seed)``: its (observation, action) turns and its return.

    With a ``mistake`` maker, each oracle turn is preceded with probability ``mistake_rate`` by a mistake that is
    played in the env but not recorded: the next recorded observation is what the policy sees after a failed move.
    """
    oracle, label = find_oracle(env), env_label(getattr(env, "env_id", type(env.unwrapped).__name__))
    observation, info = checked_reset(env, seed, label)
    turns: list[Turn] = []
    episode_return = 0.0
    for _ in range(MAX_EPISODE_TURNS):
        if mistake is not None and rng.random() < mistake_rate:
            wrong = oracle_move(mistake, env, rng, label)
            observation, reward, terminated, truncated, info = oracle_step(env, wrong, label, seed)
            episode_return += float(reward)
            if terminated or truncated:
                return turns, episode_return
        action = oracle_move(oracle, env, rng, label)
        turns.append((observation_fn(observation, info), action))
        observation, reward, terminated, truncated, info = oracle_step(env, action, label, seed)
        episode_return += float(reward)
        if terminated or truncated:
            return turns, episode_return
    raise BrokenEnvError(f"{label}: the oracle's episode from reset(seed={seed}) did not end within "
                         f"{MAX_EPISODE_TURNS} turns: the env must end an episode (terminated or truncated)")


def oracle_name(oracle: Oracle) -> str:
    """The oracle's function name, as errors show it."""
    return getattr(oracle, "__qualname__", None) or type(oracle).__name__


def oracle_move(oracle: Oracle, env: Env, rng: Any, label: str) -> str:
    """The oracle's (or a mistake maker's) action text; one that raises or returns anything but a str is a
    :class:`BrokenEnvError` naming it and the env (``label``): the warm start has no demonstration to learn from."""
    try:
        action = oracle(env, rng)
    except Exception as error:
        raise BrokenEnvError(f"the oracle {oracle_name(oracle)} of {label} raised {raised(error, oracle)}: fix the "
                             "oracle, or train a model of your own with --pretrain (no warm start)") from error
    if not isinstance(action, str):
        raise BrokenEnvError(f"the oracle {oracle_name(oracle)} of {label} returned {returned(action)}; an oracle "
                             "returns the action text (a str): fix the oracle")
    return action


def oracle_step(env: Env, action: str, label: str, seed: int | None) -> tuple:
    """``env.step(action)`` checked (:func:`checked_step`); an exception is a :class:`BrokenEnvError`: an oracle's
    episode is a demonstration, which an env error cannot end."""
    try:
        return checked_step(env, action, label)
    except BrokenEnvError:
        raise
    except Exception as error:
        raise BrokenEnvError(f"{label}: step() raised {raised(error, type(env.unwrapped).step)} in the oracle's "
                             f"episode from reset(seed={seed}): fix the env") from error


PROBE_SEED = 0
"""The reset seed of :func:`probe_env`."""


def probe_env(env_id: str, play_oracle: bool, env_seed: int) -> None:
    """Make ``env_id`` (with ``env_seed``, the trainer's constructor seed), reset it on :data:`PROBE_SEED` and take one
    step: the oracle's move when ``play_oracle`` (checked as in :func:`oracle_move`), else :data:`INVALID_ACTION`.
    Raises :class:`BrokenEnvError` when the env or the oracle breaks the contract, or the env cannot be made. Without
    the oracle an exception inside ``step()`` is let be: the trainer counts such episodes."""
    label = env_label(env_id)
    try:
        env = gem.make(env_id, seed=env_seed)
    except Exception as error:
        entry = ENV_REGISTRY[env_id].entry_point
        raise BrokenEnvError(f"{label} could not be made: {raised(error, getattr(entry, '__init__', entry))}: fix "
                             "its constructor") from error
    try:
        checked_reset(env, PROBE_SEED, label)
        if play_oracle:
            oracle_step(env, oracle_move(find_oracle(env), env, random.Random(0), label), label, PROBE_SEED)
            return
        try:
            result = env.step(INVALID_ACTION)
        except Exception:
            return
        check_step_result(result, label)
    finally:
        with contextlib.suppress(Exception):  # closing is best effort, as the trainer's
            close_env(env)


def seeded_play(env: Env, env_id: str, seed: int) -> list:
    """What ``env`` shows from ``reset(seed)``: the oracle's episode (its turns and return) when ``env_id`` has an
    oracle, else the first observation and what one invalid action returns."""
    oracle = oracle_for_env_id(env_id)
    if oracle is not None:
        return list(play_oracle_episode(env, seed, random.Random(seed)))
    observation, info = checked_reset(env, seed, env_label(env_id))
    result = env.step(INVALID_ACTION)
    return [observation_with_suffix(observation, info), observation_with_suffix(result[0], result[4]), *result[1:4]]


def reset_seed_problem(env_id: str, env_seed: int, seeds: Sequence[int]) -> str | None:
    """Whether ``reset(seed)`` fixes the episode of ``env_id`` (made with ``env_seed``, as the trainer makes it):
    ``seeds[0]`` is played on a fresh env and again after ``seeds[1]`` on another; a different episode (one line
    saying so) means the env draws from a generator that ``reset``'s seed does not set, so a run cannot be repeated
    and a group's samples play different episodes. None when they agree, or when the env cannot be played here (the
    probe and the run report that)."""
    first, other = seeds[0], seeds[1]
    envs_made = []
    try:
        envs_made = [gem.make(env_id, seed=env_seed), gem.make(env_id, seed=env_seed)]
        fresh = seeded_play(envs_made[0], env_id, first)
        seeded_play(envs_made[1], env_id, other)
        again = seeded_play(envs_made[1], env_id, first)
    except Exception:
        return None
    finally:
        for env in envs_made:
            with contextlib.suppress(Exception):
                close_env(env)
    if fresh == again:
        return None
    return (f"{env_label(env_id)}: reset(seed={first}) played another episode after reset(seed={other}) than on a "
            "fresh env: its reset() ignores the seed, so the run cannot be repeated and a group's samples play "
            "different episodes; draw its puzzle from reset's seed (envs/README.md)")


def close_env(env: Env) -> None:
    """Close ``env`` when it can be closed (Gem's MathEnv holds a process pool).

    Gem's ``MathEnv.close`` fails when it was made with ``use_mp=False`` (no pool): nothing to close then.
    """
    if isinstance(env.unwrapped, MathEnv) and not hasattr(env.unwrapped, "mp_pool"):
        return
    close = getattr(env, "close", None)
    if callable(close):
        close()


def demonstrations(
    env_id: str,
    n_episodes: int,
    seed: int = 0,
    observation_fn: ObservationFn = observation_with_suffix,
    wrappers: Sequence[Callable[[Env], Env]] = (),
    mistake_rate: float = 0.0,
    **make_kwargs: Any,
) -> list[list[Turn]]:
    """``n_episodes`` oracle episodes of ``env_id``, each a list of (observation_text, action_text) turns.

    Episode ``i`` starts from ``reset(seed + i)``; the oracle's own choices come from ``random.Random(seed)``, so
    the result is deterministic. ``wrappers`` are applied in order, as ``gem.make_vec`` does; the default
    ``observation_fn`` appends ``info["suffix"]`` (pass :func:`raw_observation` when a wrapper already does).
    ``mistake_rate``: for envs with a mistake maker (:data:`MISTAKES`), the share of turns preceded by an unrecorded
    mistake (see :func:`play_oracle_episode`); ignored for other envs, where a mistake would not change the view.
    """
    env = gem.make(env_id, **make_kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    rng = random.Random(seed)
    mistake = MISTAKES.get(env_id) if mistake_rate > 0 else None
    try:
        return [play_oracle_episode(env, seed + i, rng, observation_fn, mistake, mistake_rate)[0]
                for i in range(n_episodes)]
    finally:
        close_env(env)
