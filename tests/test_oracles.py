"""Tests of the oracle policies and of the demonstrations they produce."""

from __future__ import annotations

import random

import gem
import numpy as np
import pytest
from gem.wrappers.observation_wrapper import ObservationWrapper
from shared_data import MATH_DATA, needs_math_data

import envs
from envs.math_local import register_math_folder
from envs.oracles import (
    ORACLES,
    find_oracle,
    most_constrained_cells,
    observation_with_suffix,
    oracle_action,
    play_oracle_episode,
    raw_observation,
    register_oracle,
    sudoku_candidates,
    sudoku_oracle_action,
)

SEEDS = range(40)


def concat_wrapper(env):
    """Gem's "concat" observation wrapper (wrapper_factory itself imports optional tool dependencies)."""
    return ObservationWrapper(env, include_action=False, include_chat_template=False)


@pytest.mark.parametrize("env_id", ["game:Sudoku-v0-easy", "game:Sudoku-v0-easy-compact"])
def test_sudoku_oracle_solves_every_episode(env_id):
    env = gem.make(env_id)
    for seed in SEEDS:
        turns, episode_return = play_oracle_episode(env, seed, random.Random(seed))
        assert episode_return == pytest.approx(1.0)
        assert len(turns) == sum(action.startswith("\\boxed{") for _, action in turns) <= 10


def test_sudoku_oracle_move_is_correct_and_one_based():
    env = gem.make("game:Sudoku-v0-easy")
    env.reset(seed=7)
    action = sudoku_oracle_action(env, random.Random(0))
    row, col, num = (int(part) for part in action[len("\\boxed{"):-1].split())
    assert env.unwrapped.board[row - 1][col - 1] == 0 and env.unwrapped.full_grid[row - 1][col - 1] == num


BOARD = [[1, 0, 3, 0],
         [0, 4, 0, 2],
         [2, 0, 0, 3],
         [0, 3, 2, 0]]


def test_sudoku_candidates_by_hand():
    """(0, 1): row {1, 3}, column {4, 3} and box {1, 4} leave 2; (2, 2): row, column and box {2, 3} leave 1 and 4."""
    assert sudoku_candidates(BOARD, 0, 1) == {2}
    assert sudoku_candidates(BOARD, 2, 2) == {1, 4}
    assert sudoku_candidates(BOARD, 1, 0) == {3}


def test_most_constrained_cells_are_the_forced_ones_in_reading_order():
    empty = [(r, c) for r in range(4) for c in range(4) if BOARD[r][c] == 0]
    forced = [(r, c) for r, c in empty if len(sudoku_candidates(BOARD, r, c)) == 1]
    assert most_constrained_cells(BOARD) == forced and forced[0] == (0, 1)
    with pytest.raises(ValueError, match="no empty cell"):
        most_constrained_cells([[1, 2], [2, 1]])


@pytest.mark.parametrize("seed", range(20))
def test_sudoku_oracle_fills_a_forced_cell_first(seed):
    """On Gem's easy boards the oracle's cell has a single candidate, which is its digit, and no empty cell before it
    in reading order has fewer candidates."""
    env = gem.make("game:Sudoku-v0-easy-compact")
    env.reset(seed=seed)
    board = env.unwrapped.board
    row, col, num = (int(part) for part in sudoku_oracle_action(env)[len("\\boxed{"):-1].split())
    assert sudoku_candidates(board, row - 1, col - 1) == {num} == {env.unwrapped.full_grid[row - 1][col - 1]}
    assert (row - 1, col - 1) == most_constrained_cells(board)[0]


@pytest.mark.parametrize("env_id", ["rg:arc_1d", "rg:acre"])
def test_reasoning_gym_oracle_scores_one(env_id):
    env = gem.make(env_id)
    for seed in SEEDS:
        turns, episode_return = play_oracle_episode(env, seed, random.Random(seed))
        assert episode_return == 1.0 and len(turns) == 1
        assert turns[0][1] == "\\boxed{" + env.unwrapped.data["answer"] + "}"


def test_reasoning_gym_oracle_scores_one_without_seeds():
    env = gem.make("rg:arc_1d")
    for _ in range(20):
        env.reset()
        assert env.step(oracle_action(env))[1] == 1.0


def test_countdown_oracle_wins_every_episode():
    env = gem.make("example:Countdown-v0")
    for seed in SEEDS:
        turns, episode_return = play_oracle_episode(env, seed, random.Random(seed))
        assert episode_return == 1.0 and len(turns) <= 3


def test_oracle_works_through_wrappers_and_numpy_rngs():
    vec = gem.make_vec(["game:Sudoku-v0-easy"] * 2, wrappers=[concat_wrapper], seed=3)
    vec.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        actions = [oracle_action(env, rng) for env in vec.envs]
        _, rewards, _, _, _ = vec.step(actions)
        assert all(r > 0 for r in rewards)


def test_demonstrations_are_deterministic_observation_action_pairs():
    episodes = envs.demonstrations("game:Sudoku-v0-easy", n_episodes=5, seed=1)
    assert episodes == envs.demonstrations("game:Sudoku-v0-easy", n_episodes=5, seed=1)
    assert len(episodes) == 5
    for episode in episodes:
        for observation, action in episode:
            assert isinstance(observation, str) and "R1" in observation and action.startswith("\\boxed{")


def test_demonstration_actions_replay_to_a_win():
    for env_id in ("game:Sudoku-v0-easy-compact", "example:Countdown-v0", "rg:acre"):
        episodes = envs.demonstrations(env_id, n_episodes=3, seed=10)
        env = gem.make(env_id)
        for i, episode in enumerate(episodes):
            observation, info = env.reset(seed=10 + i)
            assert observation_with_suffix(observation, info) == episode[0][0]
            assert sum(env.step(action)[1] for _, action in episode) == pytest.approx(1.0)


def test_demonstrations_with_mistakes_show_recovery_and_record_only_oracle_moves():
    """compact-wrong Sudoku: some recorded observations show an (unrecorded) wrong move; every recorded move is
    the cell's solution, so it never repeats the wrong move shown."""
    from envs.sudoku_compact import COMPACT_WRONG_ENV_ID, parse_compact_sudoku, parse_sudoku_move

    episodes = envs.demonstrations(COMPACT_WRONG_ENV_ID, n_episodes=20, seed=3, mistake_rate=0.4)
    env = gem.make(COMPACT_WRONG_ENV_ID)
    shown = 0
    for i, episode in enumerate(episodes):
        env.reset(seed=3 + i)
        solution = env.unwrapped.full_grid
        for observation, action in episode:
            row, col, digit = parse_sudoku_move(action)
            assert parse_compact_sudoku(observation)[row - 1][col - 1] == 0 and solution[row - 1][col - 1] == digit
            wrong = [line for line in observation.splitlines() if line.startswith("Wrong:")]
            if wrong:
                shown += 1
                r, c, d = (int(x) for x in wrong[0].split()[1:])
                assert solution[r - 1][c - 1] != d and (r, c, d) != (row, col, digit)
    turns = sum(len(episode) for episode in episodes)
    assert 0.2 * turns < shown < 0.6 * turns
    plain = envs.demonstrations(COMPACT_WRONG_ENV_ID, n_episodes=5, seed=3)
    assert not any("Wrong:" in observation for episode in plain for observation, _ in episode)
    # envs whose view a mistake would not change get no mistakes: the same demonstrations as without
    assert envs.demonstrations("game:Sudoku-v0-easy-compact", 3, seed=3, mistake_rate=0.4) == \
        envs.demonstrations("game:Sudoku-v0-easy-compact", 3, seed=3)


def test_demonstrations_with_gem_wrappers():
    episodes = envs.demonstrations(
        "game:Sudoku-v0-easy", 2, seed=0, wrappers=[concat_wrapper], observation_fn=raw_observation
    )
    first_observation, _ = episodes[0][0]
    assert first_observation.startswith("You are playing") and "Enter your move." in first_observation


def test_oracle_lookup():
    assert {"game:Sudoku-v0-easy", "rg:arc_1d", "rg:acre", "example:Countdown-v0"} <= set(ORACLES)
    with pytest.raises(KeyError, match="no oracle"):
        find_oracle(gem.make("game:TowerofHanoi-v0-easy"))
    register_oracle("test:*", sudoku_oracle_action)
    env = gem.make("game:Sudoku-v0-easy")
    env.env_id = "test:AnySudoku"
    assert find_oracle(env) is sudoku_oracle_action
    del ORACLES["test:*"]


@needs_math_data
def test_local_math_oracle_and_demonstrations():
    register_math_folder(MATH_DATA, use_mp=False)
    for name in ("evaluation_suite:aime", "gsm_8k", "math_lvl3to5_8k:eval"):
        env = gem.make(f"local-math:{name}")
        for seed in range(5):
            assert play_oracle_episode(env, seed, None)[1] == 1.0
    episodes = envs.demonstrations("local-math:asdiv_2k", n_episodes=3, seed=0)
    assert all(len(episode) == 1 and episode[0][1].startswith("\\boxed{") for episode in episodes)
