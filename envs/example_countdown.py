"""A complete example of a multi-turn Gem environment: Countdown, one operation per turn.

Copy this file to add your own environment (see ``envs/README.md``). It holds the three things a new task needs:

1. the environment: a subclass of ``gem.Env`` with ``reset(seed) -> (obs, info)`` and
   ``step(action) -> (obs, reward, terminated, truncated, info)``;
2. its registration under an id (``example:Countdown-v0``), so ``gem.make`` / ``gem.make_vec`` and the trainer's
   ``--env-ids`` find it;
3. its oracle policy, which plays perfectly and supplies demonstrations for a supervised warm start: a
   deterministic function of what the observation shows, registered at the bottom of the file with the env
   (``register_oracle``).

The game: the player holds a few numbers and must produce a target. Each turn it combines two of its numbers with
``+ - * /`` (exact division only, results must stay positive), written as ``\\boxed{a op b}``; the two numbers are
replaced by the result. Reaching the target wins (+1). An illegal but readable move (a number it does not hold, a
negative or fractional result) scores 0 and the game goes on. An unreadable answer scores -0.1 and ends the episode,
like Gem's Sudoku. Running out of numbers or turns ends the episode with 0.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gem.core import Env
from gem.envs.registration import ENV_REGISTRY, register
from gem.utils.constants import LanguageGameReward

from envs.oracles import register_oracle

ENV_ID = "example:Countdown-v0"
OPERATORS = ("+", "-", "*", "/")
MOVE_PATTERN = re.compile(r"\\boxed\{\s*(\d+)\s*([-+*/])\s*(\d+)\s*\}")

Move = tuple[int, str, int]


def apply_operator(left: int, operator: str, right: int) -> int | None:
    """Result of ``left operator right``, or None when it is not a positive whole number."""
    if operator == "+":
        result = left + right
    elif operator == "-":
        result = left - right
    elif operator == "*":
        result = left * right
    elif right != 0 and left % right == 0:
        result = left // right
    else:
        return None
    return result if result > 0 else None


def apply_move(numbers: Sequence[int], move: Move) -> list[int] | None:
    """The numbers after ``move`` (sorted), or None when the move is illegal for ``numbers``."""
    left, operator, right = move
    needed = Counter([left, right])
    held = Counter(numbers)
    if any(held[value] < count for value, count in needed.items()):
        return None
    result = apply_operator(left, operator, right)
    if result is None:
        return None
    remaining = list((held - needed).elements())
    return sorted(remaining + [result])


def legal_moves(numbers: Sequence[int]) -> list[Move]:
    """Every legal move on ``numbers`` (each ordered pair of positions, each operator), without repeats."""
    moves = []
    for i, left in enumerate(numbers):
        for j, right in enumerate(numbers):
            for operator in OPERATORS:
                move = (left, operator, right)
                if i != j and move not in moves and apply_operator(*move) is not None:
                    moves.append(move)
    return moves


def solve(numbers: Sequence[int], target: int, rng: random.Random | None = None) -> list[Move] | None:
    """A depth-first solution (a list of moves) reaching ``target``, or None if there is none.

    ``rng`` shuffles the order in which moves are tried, so different solutions come out for different seeds.
    """
    if target in numbers:
        return []
    moves = legal_moves(numbers)
    if rng is not None:
        rng.shuffle(moves)
    for move in moves:
        after = apply_move(numbers, move)
        if target in after:
            return [move]
    for move in moves:
        rest = solve(apply_move(numbers, move), target, rng)
        if rest is not None:
            return [move] + rest
    return None


def parse_move(action: str) -> Move | None:
    """The last ``\\boxed{a op b}`` in ``action`` as ``(a, op, b)``, or None when there is none."""
    matches = MOVE_PATTERN.findall(action)
    if not matches:
        return None
    left, operator, right = matches[-1]
    return int(left), operator, int(right)


def format_move(move: Move) -> str:
    """The action text of ``move``: ``\\boxed{a op b}``."""
    left, operator, right = move
    return f"\\boxed{{{left} {operator} {right}}}"


def generate_puzzle(rng: random.Random, num_numbers: int, max_number: int, max_target: int) -> tuple[list[int], int]:
    """Numbers and a target reachable from them: the target is where a random sequence of legal moves ends."""
    while True:
        numbers = sorted(rng.randint(1, max_number) for _ in range(num_numbers))
        pool = list(numbers)
        while len(pool) > 1:
            pool = apply_move(pool, rng.choice(legal_moves(pool)))
        target = pool[0]
        if max_number < target <= max_target:
            return numbers, target


class CountdownEnv(Env):
    """Multi-turn Countdown: combine two numbers per turn until the target appears."""

    def __init__(
        self,
        num_numbers: int = 4,
        max_number: int = 9,
        max_target: int = 100,
        max_turns: int = 6,
        seed: int | None = None,
        **_: Any,
    ):
        super().__init__()
        self.num_numbers = num_numbers
        self.max_number = max_number
        self.max_target = max_target
        self.max_turns = max_turns
        self.rng = random.Random(seed)
        self.reset()

    def instructions(self) -> str:
        """The rules, shown at the start of an episode."""
        return (
            "You are playing Countdown.\n"
            "Each turn, combine two of your numbers with +, -, * or / (exact division only, results must be "
            "positive). The two numbers are replaced by the result. Make the target number appear.\n"
            "Answer with one move in the form \\boxed{a op b}, for example \\boxed{3 + 4}.\n"
        )

    def state_text(self) -> str:
        """The current numbers, the target and the turns left."""
        numbers = " ".join(str(n) for n in self.numbers)
        return f"Numbers: {numbers}\nTarget: {self.target}\nTurns left: {self.max_turns - self.turn_count}\n"

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start a new puzzle; ``seed`` makes it reproducible (None continues the env's own random stream)."""
        super().reset(seed)
        if seed is not None:
            self.rng = random.Random(seed)
        self.numbers, self.target = generate_puzzle(self.rng, self.num_numbers, self.max_number, self.max_target)
        self.turn_count = 0
        return self.instructions() + self.state_text(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one move; see the module docstring for the rewards."""
        self.turn_count += 1
        move = parse_move(action)
        if move is None:
            return "You did not provide a valid move.", LanguageGameReward.format_error_reward, True, False, {}
        after = apply_move(self.numbers, move)
        if after is None:
            feedback = f"The move {move[0]} {move[1]} {move[2]} is not allowed with your numbers."
        else:
            self.numbers = after
            feedback = f"You played {move[0]} {move[1]} {move[2]}."
            if self.target in after:
                return feedback + " You reached the target!", LanguageGameReward.success_reward, True, False, {}
        out_of_numbers = len(self.numbers) == 1
        out_of_turns = self.turn_count >= self.max_turns
        observation = feedback + "\n" + self.state_text()
        return observation, 0.0, out_of_numbers or out_of_turns, out_of_turns, {}

    def sample_random_action(self) -> str:
        """A random (legal or not) move on two held numbers."""
        left, right = self.rng.sample(self.numbers, 2) if len(self.numbers) > 1 else (self.numbers[0],) * 2
        return format_move((left, self.rng.choice(OPERATORS), right))


def countdown_oracle_action(env: Env, rng: random.Random) -> str:
    """The first move of the first solution a depth-first search finds from the numbers and target the observation
    shows, trying moves in a fixed order: a deterministic function of the observation, so the tiny policy can learn
    it (``rng`` is unused; an oracle takes one for the choices it may make)."""
    game = env.unwrapped
    plan = solve(game.numbers, game.target)
    if not plan:
        raise ValueError(f"no solution from numbers {game.numbers} to target {game.target}")
    return format_move(plan[0])


if ENV_ID not in ENV_REGISTRY:
    register(ENV_ID, CountdownEnv, num_numbers=4, max_number=9, max_target=100, max_turns=6)
register_oracle(ENV_ID, countdown_oracle_action, env_class=CountdownEnv)
