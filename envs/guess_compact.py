"""A compact observation for Gem's Guess The Number, a second multi-turn game small enough to learn on a CPU.

Gem's ``game:GuessTheNumber-v0-hard`` hides a number in 1-50 and answers each ``\\boxed{n}`` guess with whether the
number is higher or lower; the episode succeeds when the guess is right within 7 turns (reward 1), and otherwise
Gem ends it with a partial reward (1 - distance / range) at the turn limit. Gem's observation is its rules, then
only the last hint. The compact observation keeps what a guess needs, the whole history in one line per guess::

    Guess 1-50
    25 lower
    12 higher
    Guess:

``25 lower`` reads "the number is lower than 25"; a guess outside the range or guessed before shows ``outside`` or
``again``, and in the last observation of a won game the winning guess shows ``right``. A policy has to infer the
interval that is left from the lines; binary search on it (the oracle, :func:`guess_oracle_action`) always wins, in
at most 6 guesses here. The observation is a pure function of the history, so it is deterministic and parses back
(:func:`parse_compact_guess`).

:class:`CompactGuessObservation` wraps the env: termination and the hidden number are Gem's, and so are the
rewards, but for one change: a game lost at the turn limit scores 0 (Gem's ``fail_reward``) instead of Gem's
partial credit. With it, a policy that hovers one away from the number scores 0.98 against 1 for a win, so a
group-normalised advantage barely tells them apart: RL from a warm start raised the return and lowered the success
rate (0.37 → 0.1-0.2 in 50 steps). ``partial_credit=True`` keeps Gem's reward. Registered ids (``import envs``):

- ``game:GuessTheNumber-v0-hard-compact``: Gem's hard game (1-50, 7 turns);
- ``game:GuessTheNumber-v0-easy-compact``: Gem's easy game (1-10, 4 turns: binary search needs all four), the
  CPU study's second task.
"""

from __future__ import annotations

import re
from typing import Any

from gem.core import Env, EnvWrapper
from gem.envs.registration import ENV_REGISTRY, make, register
from gem.utils.constants import LanguageGameReward

from envs.sudoku_compact import without_suffix

BASE_ENV_ID = "game:GuessTheNumber-v0-hard"
COMPACT_ENV_ID = "game:GuessTheNumber-v0-hard-compact"
EASY_BASE_ENV_ID = "game:GuessTheNumber-v0-easy"
EASY_COMPACT_ENV_ID = "game:GuessTheNumber-v0-easy-compact"
GUESS_PROMPT = "Guess:"
# Gem's Guess The Number reads the last \boxed{<digits>}; the wrapper reads guesses the same way.
GUESS_PATTERN = re.compile(r"\\boxed{(\d+)}")

Hint = tuple[int, str]
"""A played guess and what it told: ``lower``/``higher`` (than the guess), ``outside`` the range, ``again``,
``right``."""


def parse_guess(action: str) -> int | None:
    """The guess Gem's Guess The Number would read from ``action`` (its last ``\\boxed{n}``), or None."""
    matches = GUESS_PATTERN.findall(action)
    return int(matches[-1]) if matches else None


def hint_for(guess: int, target: int, low: int, high: int, played: list[int]) -> str:
    """What Gem tells of ``guess`` (it checks range, then repetition, then compares; a right guess ends the game)."""
    if not low <= guess <= high:
        return "outside"
    if guess in played:
        return "again"
    if guess == target:
        return "right"
    return "lower" if guess > target else "higher"


def compact_guess_text(low: int, high: int, hints: list[Hint]) -> str:
    """The compact observation: the range, one ``<guess> <hint>`` line per guess so far, then ``Guess:``."""
    return "\n".join([f"Guess {low}-{high}", *(f"{guess} {hint}" for guess, hint in hints), GUESS_PROMPT])


def parse_compact_guess(text: str) -> tuple[int, int, list[Hint]]:
    """The range and hints written in a compact observation; inverse of :func:`compact_guess_text`."""
    lines = text.strip().splitlines()
    header = re.fullmatch(r"Guess (\d+)-(\d+)", lines[0]) if lines else None
    if header is None:
        raise ValueError(f"not a compact Guess The Number observation: {text!r}")
    hints = [(int(guess), hint) for guess, hint in (line.split() for line in lines[1:] if line != GUESS_PROMPT)]
    return int(header.group(1)), int(header.group(2)), hints


def interval_left(low: int, high: int, hints: list[Hint]) -> tuple[int, int]:
    """The numbers the hints still allow, as an inclusive ``(low, high)``."""
    for guess, hint in hints:
        if hint == "lower":
            high = min(high, guess - 1)
        elif hint == "higher":
            low = max(low, guess + 1)
    return low, high


class CompactGuessObservation(EnvWrapper):
    """Replace Guess The Number's observations with :func:`compact_guess_text` of the history; nothing else changes.

    The ``suffix`` entry of ``info`` (Gem's "Enter your next guess.") is dropped: the observation ends in ``Guess:``.
    """

    def __init__(self, env: Env, partial_credit: bool = False):
        super().__init__(env)
        self.partial_credit = partial_credit
        self.hints: list[Hint] = []

    def observation(self) -> str:
        game = self.env.unwrapped
        return compact_guess_text(game.min_number, game.max_number, self.hints)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Reset the wrapped env (a new hidden number) and return the observation of an empty history."""
        _, info = self.env.reset(seed=seed)
        self.hints = []
        return self.observation(), without_suffix(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Step the wrapped env; add the guess and its hint to the history (Gem ends the game on no guess); a game
        lost at the turn limit scores 0 unless ``partial_credit``."""
        game = self.env.unwrapped
        guess = parse_guess(action)
        played = sorted(game.previous_guesses)
        _, reward, terminated, truncated, info = self.env.step(action)
        if guess:  # Gem reads no guess, or 0, as a format error and ends the game
            hint = hint_for(guess, game.game_number, game.min_number, game.max_number, played)
            self.hints.append((guess, hint))
            if truncated and hint in ("lower", "higher", "again") and not self.partial_credit:
                reward = LanguageGameReward.fail_reward
        return self.observation(), reward, terminated, truncated, without_suffix(info)


def interval_told(env: Env) -> tuple[int, int]:
    """The interval the hints given so far allow (only what the player was told: every valid guess was a miss)."""
    game = env.unwrapped
    hints = [(guess, "lower" if guess > game.game_number else "higher") for guess in sorted(game.previous_guesses)]
    return interval_left(game.min_number, game.max_number, hints)


def guess_oracle_action(env: Env, rng: Any = None) -> str:
    """Binary search: the middle of the interval the hints still allow."""
    low, high = interval_told(env)
    return f"\\boxed{{{(low + high) // 2}}}"


def guess_mistake_action(env: Env, rng: Any) -> str:
    """A learner's typical mistake, shown in the history: a guess inside the interval left but not its middle, or,
    where every such guess would win, one outside the range (a wasted turn)."""
    game = env.unwrapped
    low, high = interval_told(env)
    choices = [n for n in range(low, high + 1) if n not in ((low + high) // 2, game.game_number)]
    choices = choices or [game.max_number + 1]
    return f"\\boxed{{{choices[int(rng.random() * len(choices))]}}}"


def make_compact_guess(base_env_id: str = BASE_ENV_ID, partial_credit: bool = False,
                       **kwargs: Any) -> CompactGuessObservation:
    """``gem.make(base_env_id, **kwargs)`` wrapped in :class:`CompactGuessObservation` (a gem entry point)."""
    return CompactGuessObservation(make(base_env_id, **kwargs), partial_credit=partial_credit)


if COMPACT_ENV_ID not in ENV_REGISTRY:
    register(COMPACT_ENV_ID, make_compact_guess)
if EASY_COMPACT_ENV_ID not in ENV_REGISTRY:
    register(EASY_COMPACT_ENV_ID, make_compact_guess, base_env_id=EASY_BASE_ENV_ID)
