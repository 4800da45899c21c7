"""A compact observation for Gem's Sudoku, for policies small enough to train on a CPU.

Gem's own Sudoku-easy observation (rules, board with row/column labels and separators, history) is 450-620 tokens
for a small byte-level tokenizer. The compact observation keeps only what a move needs::

    Sudoku 4x4
    1 . 3 4
    . 4 . 2
    2 . 4 .
    4 3 . 1
    Move:

a short header, one line per board row with ``.`` for an empty cell, then ``Move:`` (about 25 tokens). It is a pure
function of the env's own board, so it is deterministic and parses back to the same board
(:func:`parse_compact_sudoku`). Optionally a ``Wrong: r c n`` line shows the last wrong move since the last correct
one: a wrong move leaves the board unchanged, so without it a greedy policy repeats the same move until the turn limit.

:class:`CompactSudokuObservation` wraps any Gem Sudoku env: rewards, termination and the board dynamics are the
wrapped env's, only the observation text changes. Registered ids (``import envs``):

- ``game:Sudoku-v0-easy-compact``: Gem's ``game:Sudoku-v0-easy`` with the compact observation;
- ``game:Sudoku-v0-easy-compact-wrong``: the same, also showing the last wrong move.
"""

from __future__ import annotations

import copy
import random
import re
from collections import OrderedDict
from typing import Any

from gem.core import Env, EnvWrapper
from gem.envs.game_env.sudoku import SudokuEnv
from gem.envs.registration import ENV_REGISTRY, make, register
from gem.utils import seeding

BASE_ENV_ID = "game:Sudoku-v0-easy"
COMPACT_ENV_ID = "game:Sudoku-v0-easy-compact"
COMPACT_WRONG_ENV_ID = "game:Sudoku-v0-easy-compact-wrong"
MOVE_PROMPT = "Move:"
WRONG_PREFIX = "Wrong:"
# Gem's Sudoku reads the last \boxed{row col num} with single spaces; the wrapper reads moves the same way.
SUDOKU_MOVE_PATTERN = re.compile(r"\\boxed{(\d+)\s(\d+)\s(\d+)}")

Board = list[list[int]]
SudokuMove = tuple[int, int, int]


def compact_header(scale: int) -> str:
    """The first line of the compact observation, e.g. ``Sudoku 4x4``."""
    return f"Sudoku {scale}x{scale}"


def board_rows(board: Board) -> list[str]:
    """One line per row: cells separated by single spaces, ``.`` for an empty (0) cell."""
    return [" ".join(str(cell) if cell else "." for cell in row) for row in board]


def compact_sudoku_text(board: Board, last_wrong_move: SudokuMove | None = None) -> str:
    """The compact observation of ``board``, with a ``Wrong: r c n`` line when ``last_wrong_move`` is given."""
    lines = [compact_header(len(board))] + board_rows(board)
    if last_wrong_move is not None:
        lines.append(WRONG_PREFIX + " " + " ".join(str(part) for part in last_wrong_move))
    lines.append(MOVE_PROMPT)
    return "\n".join(lines)


def compact_sudoku_observation(env: Env, last_wrong_move: SudokuMove | None = None) -> str:
    """The compact observation of a (possibly wrapped) Gem Sudoku env's current board."""
    return compact_sudoku_text(env.unwrapped.board, last_wrong_move)


def parse_compact_sudoku(text: str) -> Board:
    """The board written in a compact observation (0 for ``.``); inverse of :func:`compact_sudoku_text`."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("Sudoku "):
        raise ValueError(f"not a compact Sudoku observation: {text!r}")
    rows = [line for line in lines[1:] if line != MOVE_PROMPT and not line.startswith(WRONG_PREFIX)]
    return [[0 if cell == "." else int(cell) for cell in row.split()] for row in rows]


def parse_sudoku_move(action: str) -> SudokuMove | None:
    """The move Gem's Sudoku would read from ``action`` (its last ``\\boxed{r c n}``), or None."""
    matches = SUDOKU_MOVE_PATTERN.findall(action)
    if not matches:
        return None
    row, col, num = matches[-1]
    return int(row), int(col), int(num)


class CompactSudokuObservation(EnvWrapper):
    """Replace a Sudoku env's observations with :func:`compact_sudoku_observation`; nothing else changes.

    The ``suffix`` entry of ``info`` (Gem's long board rendering, which Gem's observation wrappers append) is
    dropped, because the compact observation already shows the board.
    """

    def __init__(self, env: Env, show_last_wrong_move: bool = False):
        super().__init__(env)
        self.show_last_wrong_move = show_last_wrong_move
        self.last_wrong_move: SudokuMove | None = None

    def observation(self) -> str:
        """The compact observation of the current board (with the last wrong move when enabled)."""
        wrong = self.last_wrong_move if self.show_last_wrong_move else None
        return compact_sudoku_observation(self.env, wrong)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Reset the wrapped env and return the compact observation of the new board (a seeded reset of Gem's
        Sudoku that was done before, by any env of this process, is replayed: :func:`replay_sudoku_reset`)."""
        if replay_sudoku_reset(self.env, seed):
            info: dict[str, Any] = {}
        else:
            _, info = self.env.reset(seed=seed)
            remember_sudoku_reset(self.env, seed)
        self.last_wrong_move = None
        return self.observation(), without_suffix(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Step the wrapped env; remember the move when it was readable but left the board unchanged."""
        board_before = [list(row) for row in self.env.unwrapped.board]  # a board is a list of lists of ints
        _, reward, terminated, truncated, info = self.env.step(action)
        move = parse_sudoku_move(action)
        if move is not None:
            board_changed = self.env.unwrapped.board != board_before
            self.last_wrong_move = None if board_changed else move
        return self.observation(), reward, terminated, truncated, without_suffix(info)


SEEDED_BOARDS: OrderedDict[tuple, tuple] = OrderedDict()
"""What a seeded reset of Gem's Sudoku left behind (solution, board, ``random``'s state), by settings and seed."""
SEEDED_BOARDS_KEPT = 4096
"""The most recent resets kept (a rollout's groups share their seed; evaluation repeats its puzzles)."""


def _seeded_board_key(env: Env, seed: int | None) -> tuple | None:
    """The memo key of a seeded reset of exactly Gem's fixed-size Sudoku, else None (never replayed)."""
    if seed is None or type(env) is not SudokuEnv or env._is_random:
        return None
    return env.scale, env.clues, env.max_turns, int(seed)


def remember_sudoku_reset(env: Env, seed: int | None) -> None:
    """Record the state Gem's ``reset(seed)`` just left in ``env``, for :func:`replay_sudoku_reset`."""
    key = _seeded_board_key(env, seed)
    if key is not None:
        SEEDED_BOARDS[key] = (copy.deepcopy(env.full_grid), copy.deepcopy(env.board), random.getstate())
        while len(SEEDED_BOARDS) > SEEDED_BOARDS_KEPT:
            SEEDED_BOARDS.popitem(last=False)


def replay_sudoku_reset(env: Env, seed: int | None) -> bool:
    """Put ``env`` in the state Gem's ``reset(seed)`` would, without generating the board again (Gem's Sudoku
    builds it by randomized search: the group members of a rollout share a seed, evaluation repeats its puzzles).
    The global RNGs end where the real reset leaves them: seeded as Gem seeds them, then ``random`` advanced past
    the board's generation. False when the reset was never seen (or is not Gem's fixed-size Sudoku)."""
    key = _seeded_board_key(env, seed)
    if key is None or key not in SEEDED_BOARDS:
        return False
    full_grid, board, random_state = SEEDED_BOARDS[key]
    SEEDED_BOARDS.move_to_end(key)
    seeding.set_seed(seed)  # numpy's state as after Gem's reset (the board generation draws from ``random`` only)
    random.setstate(random_state)
    env.full_grid, env.board = copy.deepcopy(full_grid), copy.deepcopy(board)
    env.init_num_empty = sum(row.count(0) for row in env.board)
    env.turn_count = 0
    return True


def without_suffix(info: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``info`` without its ``suffix`` entry."""
    return {key: value for key, value in info.items() if key != "suffix"}


def make_compact_sudoku(
    show_last_wrong_move: bool = False, base_env_id: str = BASE_ENV_ID, **kwargs: Any
) -> CompactSudokuObservation:
    """``gem.make(base_env_id, **kwargs)`` wrapped in :class:`CompactSudokuObservation` (a gem entry point)."""
    return CompactSudokuObservation(make(base_env_id, **kwargs), show_last_wrong_move=show_last_wrong_move)


def register_compact_sudoku() -> None:
    """Register the compact Sudoku ids (idempotent)."""
    if COMPACT_ENV_ID not in ENV_REGISTRY:
        register(COMPACT_ENV_ID, make_compact_sudoku, show_last_wrong_move=False)
    if COMPACT_WRONG_ENV_ID not in ENV_REGISTRY:
        register(COMPACT_WRONG_ENV_ID, make_compact_sudoku, show_last_wrong_move=True)


register_compact_sudoku()
