"""Tests of the envs package: registration, Gem behaviour the project relies on, local math, compact Sudoku."""

from __future__ import annotations

import copy
import json
import logging
import random

import gem
import pytest
from datasets import Dataset, DatasetDict
from gem.envs.math_env import MathEnv
from gem.envs.registration import ENV_REGISTRY
from gem.utils.constants import TERMINAL_STATE
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_data import MATH_DATA, needs_math_data

import envs
from envs import guess_compact
from envs.example_countdown import CountdownEnv, apply_move, legal_moves, parse_move, solve
from envs.math_local import (
    find_math_datasets,
    load_math_dataset,
    register_math_dataset,
    register_math_folder,
    strip_chat_template,
)
from envs.oracles import oracle_action
from envs.sudoku_compact import (
    CompactSudokuObservation,
    compact_sudoku_observation,
    compact_sudoku_text,
    parse_compact_sudoku,
)

SHARED_SUITE_SPLITS = ("aime", "amc", "math", "minerva", "olympiad_bench")
"""The splits of the shared ``evaluation_suite`` DatasetDict: ``local-math:evaluation_suite:<split>``."""
SHARED_TRAIN_SETS = ("gsm_8k", "asdiv_2k", "aime_975", "math_lvl3to5_8k")
"""The shared ``train/<set>`` DatasetDicts (the shared math_lvl3to5_8k has only an ``eval`` split; oat's has both)."""


def empty_cells(env):
    """(row, col) of every empty cell of a Gem Sudoku env, 0-based."""
    board = env.unwrapped.board
    return [(r, c) for r, row in enumerate(board) for c, cell in enumerate(row) if cell == 0]


# --- registration and the paper's tasks -------------------------------------------------------------------------


def test_project_ids_are_registered():
    for env_id in envs.PROJECT_ENV_IDS + envs.PAPER_TASKS:
        assert env_id in ENV_REGISTRY


@pytest.mark.parametrize("env_id", envs.PAPER_TASKS)
def test_paper_tasks_make_reset_and_step_offline(env_id):
    env = envs.make_env(env_id)
    observation, info = env.reset(seed=0)
    assert isinstance(observation, str) and observation and isinstance(info, dict)
    _, reward, terminated, truncated, _ = env.step(oracle_action(env, random.Random(0)))
    assert reward > 0


def test_hub_math_ids_are_left_to_gem():
    spec = ENV_REGISTRY["math:GSM8K"]
    assert spec.entry_point == "gem.envs.math_env:MathEnv" and spec.kwargs["dataset_name"] == "axon-rl/GSM-8k"


# --- Gem's Sudoku rewards ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad_action", ["I think 3", "\\boxed{1,2,3}", "", "\\boxed{12 3}"])
def test_sudoku_unparseable_action_is_penalised_and_ends_episode(bad_action):
    env = gem.make("game:Sudoku-v0-easy")
    env.reset(seed=3)
    _, reward, terminated, _, _ = env.step(bad_action)
    assert reward == pytest.approx(-0.1) and terminated


def test_sudoku_wrong_parseable_move_scores_zero_and_continues():
    env = gem.make("game:Sudoku-v0-easy")
    env.reset(seed=4)
    row, col = empty_cells(env)[0]
    wrong = next(n for n in range(1, 5) if n != env.unwrapped.full_grid[row][col])
    board_before = copy.deepcopy(env.unwrapped.board)
    _, reward, terminated, truncated, _ = env.step(f"\\boxed{{{row + 1} {col + 1} {wrong}}}")
    assert reward == 0 and not terminated and not truncated
    assert env.unwrapped.board == board_before


def test_sudoku_easy_board_shape():
    env = gem.make("game:Sudoku-v0-easy")
    for seed in range(20):
        env.reset(seed=seed)
        assert len(env.unwrapped.board) == 4 and 1 <= len(empty_cells(env)) <= 10


@pytest.mark.parametrize("env_id", ["rg:arc_1d", "rg:acre"])
def test_reasoning_gym_unparseable_answer_scores_zero_and_ends(env_id):
    env = gem.make(env_id)
    observation, info = env.reset(seed=1)
    assert info == {} and "answer" in env.unwrapped.data
    next_observation, reward, terminated, truncated, _ = env.step("no box here")
    assert reward == 0.0 and terminated and truncated and next_observation == TERMINAL_STATE


# --- the example env ---------------------------------------------------------------------------------------------


def test_countdown_makes_with_gem_make_and_is_reproducible():
    env = gem.make("example:Countdown-v0")
    assert isinstance(env, CountdownEnv) and env.env_id == "example:Countdown-v0"
    first, _ = env.reset(seed=11)
    again, _ = env.reset(seed=11)
    assert first == again and f"Target: {env.target}" in first


def test_countdown_make_vec_passes_seeds_and_steps():
    vec = gem.make_vec(["example:Countdown-v0"] * 3, seed=5)
    observations, _ = vec.reset()
    twin = gem.make_vec(["example:Countdown-v0"] * 3, seed=5)
    assert twin.reset()[0] == observations
    actions = [oracle_action(env, random.Random(0)) for env in vec.envs]
    _, rewards, terminated, _, _ = vec.step(actions)
    assert len(rewards) == 3 and not any(r < 0 for r in rewards)


def test_countdown_unparseable_action_is_penalised_and_ends():
    env = gem.make("example:Countdown-v0")
    env.reset(seed=0)
    _, reward, terminated, _, _ = env.step("seven")
    assert reward == pytest.approx(-0.1) and terminated


def test_countdown_illegal_move_scores_zero_and_continues():
    env = gem.make("example:Countdown-v0")
    env.reset(seed=0)
    numbers = list(env.numbers)
    absent = max(numbers) + 100
    observation, reward, terminated, _, _ = env.step(f"\\boxed{{{absent} + {numbers[0]}}}")
    assert reward == 0 and not terminated and env.numbers == numbers and "not allowed" in observation


def test_countdown_rules():
    assert parse_move("try \\boxed{1 + 2} then \\boxed{ 6 / 3 }") == (6, "/", 3)
    assert apply_move([2, 3], (3, "-", 3)) is None
    assert apply_move([3, 6], (3, "/", 6)) is None
    assert apply_move([3, 3, 5], (3, "*", 3)) == [5, 9]
    assert all(apply_move([1, 2, 7], move) is not None for move in legal_moves([1, 2, 7]))
    assert solve([1, 2, 7], 21) is not None and solve([1, 1], 50) is None


# --- local math ----------------------------------------------------------------------------------------------------


def save_math_dict(folder, **splits):
    """A ``DatasetDict.save_to_disk`` folder with one two-question split per keyword (``split=tag``): every question
    of a split carries its tag, so a test can tell which split an env serves."""
    data = DatasetDict({split: Dataset.from_list([{"problem": f"{tag} question {i}", "answer": str(i)}
                                                  for i in range(2)]) for split, tag in splits.items()})
    data.save_to_disk(str(folder))
    return folder


def one_line_error(call):
    """The message of the ValueError ``call()`` raises, checked to be one line."""
    with pytest.raises(ValueError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.fixture
def math_folder(tmp_path):
    """oat's layouts under one root: a train/eval DatasetDict, an eval-only one, an evaluation suite, a JSONL set."""
    root = tmp_path / "math"
    save_math_dict(root / "train" / "t32_both", train="TRAIN", eval="EVAL")
    save_math_dict(root / "train" / "t32_evalonly", eval="EVAL")
    save_math_dict(root / "t32_suite", aime="AIME", amc="AMC")
    (root / "t32_plain.jsonl").write_text(json.dumps({"problem": "PLAIN question", "answer": "1"}) + "\n")
    return root


def test_missing_math_path_gives_clear_error(tmp_path):
    missing = tmp_path / "no_such_set"
    for call in (
        lambda: load_math_dataset(missing),
        lambda: register_math_dataset("local-math:missing-test", missing),
        lambda: find_math_datasets(missing),
    ):
        with pytest.raises(FileNotFoundError, match="no_such_set"):
            call()
    assert "local-math:missing-test" not in ENV_REGISTRY


def test_jsonl_math_set_scores_correct_and_wrong_answers(tmp_path):
    path = tmp_path / "tiny.jsonl"
    rows = [{"problem": "What is 6 times 7?", "answer": "42"}, {"problem": "Half of 1?", "answer": "\\frac{1}{2}"}]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    env = envs.make_env(f"local-math:{path}", use_mp=False)
    assert isinstance(env, MathEnv)
    for idx in range(2):
        env.reset(idx=idx)
        assert env.step(oracle_action(env))[1] == 1.0
        env.reset(idx=idx)
        assert env.step("The answer is \\boxed{41}")[1] == 0


def test_input_gt_answer_columns_and_chat_template_are_mapped():
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant"
    data = DatasetDict({"eval": Dataset.from_list([{"input": prompt, "gt_answer": "4", "output": "4"}])})
    assert "no 'train' split" in one_line_error(lambda: register_math_dataset("local-math:test-mapped", data))
    env_id = register_math_dataset("local-math:test-mapped", data, split="eval", overwrite=True, use_mp=False)
    env = gem.make(env_id)
    observation, _ = env.reset(seed=0)
    assert observation == "What is 2+2?" and strip_chat_template("plain") == "plain"
    assert env.step("\\boxed{4}")[1] == 1.0


def test_register_math_dataset_refuses_duplicates():
    data = Dataset.from_list([{"problem": "1+1?", "answer": "2"}])
    register_math_dataset("local-math:test-duplicate", data, overwrite=True)
    with pytest.raises(ValueError, match="already registered"):
        register_math_dataset("local-math:test-duplicate", data)


def test_missing_columns_are_reported():
    with pytest.raises(ValueError, match="question"):
        register_math_dataset("local-math:test-bad", Dataset.from_list([{"question": "?", "answer": "1"}]))


def test_every_split_of_a_dataset_dict_is_named_folder_colon_split(math_folder):
    found = find_math_datasets(math_folder)
    assert set(found) == {"t32_both", "t32_both:train", "t32_both:eval", "t32_evalonly:eval",
                          "t32_suite:aime", "t32_suite:amc", "t32_plain"}
    assert found["t32_both"] == found["t32_both:train"] == (str(math_folder / "train" / "t32_both"), "train")
    assert found["t32_suite:amc"] == (str(math_folder / "t32_suite"), "amc")


def test_the_bare_name_of_a_dataset_dict_is_its_train_split(math_folder):
    register_math_folder(math_folder, use_mp=False)
    for name, tag in [("t32_both", "TRAIN"), ("t32_both:train", "TRAIN"), ("t32_both:eval", "EVAL"),
                      ("t32_suite:aime", "AIME"), ("t32_plain", "PLAIN")]:
        observation, _ = envs.make_env(f"local-math:{name}").reset(seed=0)
        assert observation.startswith(f"{tag} question"), name


def test_an_eval_only_dataset_dict_has_no_bare_name(math_folder):
    """Its only split must not be trained on by a name that does not say "eval"."""
    register_math_folder(math_folder, use_mp=False)
    assert "local-math:t32_evalonly" not in ENV_REGISTRY and "local-math:t32_suite" not in ENV_REGISTRY
    message = one_line_error(lambda: envs.check_env_id("local-math:t32_evalonly"))
    assert "no 'train' split" in message and "local-math:t32_evalonly:eval" in message
    message = one_line_error(lambda: envs.make_env("local-math:t32_suite"))
    assert "local-math:t32_suite:aime, local-math:t32_suite:amc" in message


def test_an_unknown_local_math_name_lists_the_registered_ones(math_folder):
    register_math_folder(math_folder, use_mp=False)
    message = one_line_error(lambda: envs.check_env_id("local-math:t32_no_such_set"))
    assert "does not exist" in message and "local-math:t32_both:eval" in message
    message = one_line_error(lambda: envs.check_env_id("local-math:t32_both:test"))
    assert "no split 'test'" in message and "local-math:t32_both:train, local-math:t32_both:eval" in message


def test_a_path_to_a_dataset_dict_names_its_train_split_or_path_colon_split(math_folder):
    both, eval_only = math_folder / "train" / "t32_both", math_folder / "train" / "t32_evalonly"
    for spec, tag in [(both, "TRAIN"), (f"{both}:eval", "EVAL"), (f"{eval_only}:eval", "EVAL")]:
        assert load_math_dataset(spec)[0]["problem"].startswith(tag)
        assert envs.make_env(f"local-math:{spec}").reset(seed=0)[0].startswith(tag)
    message = one_line_error(lambda: envs.check_env_id(f"local-math:{eval_only}"))
    assert f"local-math:{eval_only}:eval" in message and "no 'train' split" in message
    assert f"{eval_only}:eval" in one_line_error(lambda: load_math_dataset(eval_only))
    assert "no split 'test'" in one_line_error(lambda: envs.check_env_id(f"local-math:{both}:test"))
    assert "not a DatasetDict" in one_line_error(lambda: load_math_dataset(f"{math_folder / 't32_plain.jsonl'}:x"))


def test_names_found_twice_are_paths_relative_to_the_root(tmp_path):
    for part in ("a", "b"):
        save_math_dict(tmp_path / part / "t32_twice", train="TRAIN", eval="EVAL")
    save_math_dict(tmp_path / "c" / "t32_once", eval="EVAL")
    assert set(find_math_datasets(tmp_path)) == {
        "a/t32_twice", "a/t32_twice:train", "a/t32_twice:eval",
        "b/t32_twice", "b/t32_twice:train", "b/t32_twice:eval", "t32_once:eval",
    }


@needs_math_data
def test_shared_math_sets_are_found_and_registered():
    found = find_math_datasets(MATH_DATA)
    suite = {f"evaluation_suite:{split}" for split in SHARED_SUITE_SPLITS}
    assert suite <= set(found) and not set(SHARED_SUITE_SPLITS) & set(found)
    for name in SHARED_TRAIN_SETS:
        splits = [key.split(":")[1] for key in found if key.startswith(f"{name}:")]
        assert splits and (name in found) == ("train" in splits), name
    assert "math_lvl3to5_8k:eval" in found and "gsm_8k" in found and "gsm_8k:train" in found
    env_ids = register_math_folder(MATH_DATA, use_mp=False)
    assert {f"local-math:{name}" for name in found} == set(env_ids)


@needs_math_data
@pytest.mark.parametrize("name", ["gsm_8k", "evaluation_suite:math", "evaluation_suite:minerva",
                                  "math_lvl3to5_8k:eval"])
def test_shared_math_env_scores_boxed_answers(name):
    register_math_folder(MATH_DATA, use_mp=False)
    env = gem.make(f"local-math:{name}")
    for seed in range(3):
        observation, _ = env.reset(seed=seed)
        assert observation and "<|im_start|>" not in observation
        assert env.step(oracle_action(env))[1] == 1.0
        env.reset(seed=seed)
        assert env.step("\\boxed{-987654.321}")[1] == 0


# --- compact Sudoku ------------------------------------------------------------------------------------------------


def test_compact_observation_is_deterministic_and_parses_back():
    env = gem.make("game:Sudoku-v0-easy-compact")
    for seed in range(10):
        observation, info = env.reset(seed=seed)
        assert observation == compact_sudoku_observation(env) == env.reset(seed=seed)[0]
        assert parse_compact_sudoku(observation) == env.unwrapped.board
        lines = observation.splitlines()
        assert lines[0] == "Sudoku 4x4" and lines[-1] == "Move:" and len(lines) == 6
        assert "suffix" not in info


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=9, max_size=9), min_size=9, max_size=9))
def test_compact_text_round_trips_any_board(board):
    assert parse_compact_sudoku(compact_sudoku_text(board, last_wrong_move=(1, 2, 3))) == board


def test_compact_env_has_sudoku_easy_rewards_and_dynamics():
    for seed in range(5):
        base, compact = gem.make("game:Sudoku-v0-easy"), gem.make("game:Sudoku-v0-easy-compact")
        base.reset(seed=seed)
        compact.reset(seed=seed)
        rng = random.Random(seed)
        row, col = empty_cells(base)[0]
        actions = ["\\boxed{1 1 1}", f"\\boxed{{{row + 1} {col + 1} {base.unwrapped.full_grid[row][col]}}}"]
        actions += [oracle_action(base, rng) for _ in range(2)] + ["no move"]
        for action in actions:
            expected = base.step(action)
            observed = compact.step(action)
            assert observed[1:4] == expected[1:4]
            assert compact.unwrapped.board == base.unwrapped.board


def test_compact_env_can_show_last_wrong_move():
    env = gem.make("game:Sudoku-v0-easy-compact-wrong")
    env.reset(seed=2)
    row, col = empty_cells(env)[0]
    correct = env.unwrapped.full_grid[row][col]
    wrong = next(n for n in range(1, 5) if n != correct)
    observation = env.step(f"\\boxed{{{row + 1} {col + 1} {wrong}}}")[0]
    assert f"Wrong: {row + 1} {col + 1} {wrong}" in observation
    assert parse_compact_sudoku(observation) == env.unwrapped.board
    observation = env.step(f"\\boxed{{{row + 1} {col + 1} {correct}}}")[0]
    assert "Wrong:" not in observation


def test_compact_wrapper_wraps_any_sudoku_env():
    env = CompactSudokuObservation(gem.make("game:Sudoku-v0-hard"))
    observation, _ = env.reset(seed=0)
    assert observation.splitlines()[0] == "Sudoku 9x9"
    assert parse_compact_sudoku(observation) == env.unwrapped.board


def test_local_math_grades_in_one_shared_process_from_any_thread(tmp_path):
    """Gem's default gives every MathEnv a process pool (an actor with hundreds of slots forks hundreds), and its
    other mode times out with signal.alarm, which fails outside the main thread, where a distributed actor runs."""
    import threading

    from envs.math_local import LocalMathEnv, SharedGrader

    data = Dataset.from_list([{"problem": f"{a} + {a}?", "answer": str(2 * a)} for a in range(5)])
    env_id = register_math_dataset("local-math:test-threads", data, overwrite=True)
    made = [gem.make(env_id) for _ in range(20)]
    assert all(isinstance(e.unwrapped, LocalMathEnv) and not hasattr(e.unwrapped, "mp_pool") for e in made)
    rewards = []

    def play():
        for env in made[:3]:
            a = int(env.reset(seed=2)[0].split()[0])
            rewards.append(env.step(f"so \\boxed{{{2 * a}}}")[1])
            rewards.append(env.step(f"so \\boxed{{{2 * a + 1}}}")[1])

    worker = threading.Thread(target=play)
    worker.start()
    worker.join(120)
    assert rewards == [1.0, 0.0] * 3
    assert SharedGrader._pool is not None and len(SharedGrader._pool._pool) == 1


def test_consecutive_seeds_cover_a_math_set_without_repeats():
    """Evaluation seeds s … s + N − 1 are every problem once (Gem's MathEnv draws a problem at random per seed)."""
    data = Dataset.from_list([{"problem": f"question {i}", "answer": str(i)} for i in range(30)])
    env = gem.make(register_math_dataset("local-math:test-cover", data, overwrite=True, seed=7))
    start = 1_000_000_000
    questions = [env.reset(seed=seed)[0] for seed in range(start, start + 30)]
    assert sorted(questions) == sorted(f"question {i}" for i in range(30))
    assert envs.math_dataset_size("local-math:test-cover") == 30 and envs.math_dataset_size("rg:acre") is None


@pytest.mark.fault("Gem's `Reset env with a specific idx … for testing only!!!` at every local-math reset",
                   "filtered out (that message only)")
def test_a_local_math_reset_does_not_log_gems_testing_only_notice(tmp_path, caplog):
    """Gem's MathEnv logs "Reset env with a specific idx …" on the root logger on every reset with an idx, and a
    LocalMathEnv resets with one on every seeded reset: that message is filtered out, other records of the root
    logger (and of Gem's math_env logger) still come through."""
    path = tmp_path / "tiny.jsonl"
    path.write_text(json.dumps({"problem": "What is 1+1?", "answer": "2"}) + "\n")
    env = envs.make_env(f"local-math:{path}", use_mp=False)
    with caplog.at_level(logging.INFO):
        env.reset(seed=3)
        env.reset(idx=0)
        logging.info("Reset env with a different notice")
        logging.warning("a different warning")
        logging.getLogger("gem.envs.math_env").warning("a warning of gem's math env")
    messages = [record.getMessage() for record in caplog.records]
    assert not [message for message in messages if "specific idx" in message], messages
    assert messages == ["Reset env with a different notice", "a different warning", "a warning of gem's math env"]


def test_the_format_error_penalty_is_gems():
    from gem.utils.constants import LanguageGameReward

    from dppo_oat.settings.spec import FORMAT_ERROR_PENALTY

    assert FORMAT_ERROR_PENALTY == LanguageGameReward.format_error_reward


# --- compact Guess The Number ----------------------------------------------------------------------------------


def play(env, actions):
    return [env.step(action) for action in actions]


def test_compact_guess_has_gems_rewards_and_ends_and_shows_every_hint():
    for seed in range(8):
        base, compact = gem.make("game:GuessTheNumber-v0-hard"), gem.make("game:GuessTheNumber-v0-hard-compact")
        base.reset(seed=seed)
        observation, info = compact.reset(seed=seed)
        assert observation == "Guess 1-50\nGuess:" and "suffix" not in info
        target = base.unwrapped.game_number
        assert compact.unwrapped.game_number == target
        wrong = 1 if target != 1 else 2
        actions = [f"\\boxed{{{wrong}}}", f"\\boxed{{{wrong}}}", "\\boxed{99}", f"say \\boxed{{{target}}}"]
        for action, expected in zip(actions, play(base, actions), strict=True):
            observed = compact.step(action)
            assert observed[1:4] == expected[1:4]
        assert guess_compact.parse_compact_guess(observed[0]) == (
            1, 50, [(wrong, "higher" if wrong < target else "lower"), (wrong, "again"), (99, "outside"),
                    (target, "right")])
        assert observed[1] == 1.0 and observed[2]


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 50), st.lists(st.integers(1, 50), max_size=6))
def test_compact_guess_text_round_trips_and_the_interval_holds_the_number(target, guesses):
    hints = [(g, guess_compact.hint_for(g, target, 1, 50, guesses[:i])) for i, g in enumerate(guesses) if g != target]
    text = guess_compact.compact_guess_text(1, 50, hints)
    assert guess_compact.parse_compact_guess(text) == (1, 50, hints)
    low, high = guess_compact.interval_left(1, 50, hints)
    assert low <= target <= high


@pytest.mark.parametrize("env_id", ["game:GuessTheNumber-v0-easy-compact", "game:GuessTheNumber-v0-hard-compact"])
def test_guess_oracle_is_binary_search_and_mistakes_stay_in_the_interval(env_id):
    env = gem.make(env_id)
    rng = random.Random(0)
    for seed in range(60):
        observation, _ = env.reset(seed=seed)
        for turn in range(1, 8):  # noqa: B007  (read after the loop: the turn that won)
            low, high = guess_compact.interval_left(*guess_compact.parse_compact_guess(observation))
            mistake = guess_compact.parse_guess(guess_compact.guess_mistake_action(env, rng))
            avoid = ((low + high) // 2, env.unwrapped.game_number)
            if mistake == env.unwrapped.max_number + 1:  # every guess left would win: a wasted turn instead
                assert all(n in avoid for n in range(low, high + 1))
            else:
                assert low <= mistake <= high and mistake not in avoid
            action = oracle_action(env, rng)
            assert guess_compact.parse_guess(action) == (low + high) // 2
            observation, reward, terminated, truncated, _ = env.step(action)
            if terminated:
                break
        assert reward == 1.0 and turn <= env.unwrapped.max_turns


@pytest.mark.parametrize("partial_credit", [False, True])
def test_compact_guess_scores_a_lost_game_zero_unless_partial_credit(partial_credit):
    base = gem.make("game:GuessTheNumber-v0-hard")
    compact = guess_compact.make_compact_guess(partial_credit=partial_credit)
    base.reset(seed=3)
    compact.reset(seed=3)
    target = base.unwrapped.game_number
    misses = [n for n in range(1, 51) if n != target][:7]
    for number in misses:
        expected, observed = base.step(f"\\boxed{{{number}}}"), compact.step(f"\\boxed{{{number}}}")
        assert observed[2:4] == expected[2:4]
    assert observed[3] and 0 < expected[1] < 1
    assert observed[1] == (expected[1] if partial_credit else 0.0)


def test_a_seeded_sudoku_reset_seen_before_is_replayed_exactly(monkeypatch):
    """The group members of a rollout share a seed: the board is generated once, and a replayed reset leaves the env
    and the global RNGs exactly as Gem's own reset does."""
    import numpy as np
    from gem.envs.game_env.sudoku import SudokuEnv

    from envs import sudoku_compact

    sudoku_compact.SEEDED_BOARDS.clear()
    first, second = gem.make(sudoku_compact.COMPACT_WRONG_ENV_ID), gem.make(sudoku_compact.COMPACT_WRONG_ENV_ID)
    for seed in (3, 17, 123456):
        observation, _ = first.reset(seed=seed)
        state = copy.deepcopy(vars(first.unwrapped)), random.getstate(), np.random.get_state()
        random.seed(999)  # whatever happened between the two resets
        np.random.seed(999)
        with monkeypatch.context() as patch:
            patch.setattr(SudokuEnv, "_generate_board", lambda self: pytest.fail("the board was generated again"))
            replayed, info = second.reset(seed=seed)
        assert replayed == observation and info == {}
        assert vars(second.unwrapped) == state[0]
        assert random.getstate() == state[1]
        np.testing.assert_equal(np.random.get_state(), state[2])
    assert sudoku_compact.replay_sudoku_reset(first.unwrapped, None) is False  # unseeded: always generated
