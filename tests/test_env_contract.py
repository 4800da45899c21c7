"""The environment contract (``envs/README.md``), checked on every env id the project registers, the paper's Gem
tasks, and any env of one's own:

    DPPO_ENV_MODULES=path/to/my_envs.py python -m pytest tests/test_env_contract.py -q

``DPPO_ENV_MODULES`` (comma-separated modules or files, as ``--env-module`` takes them) are imported first and every
id they register is checked; ``DPPO_CONTRACT_ENV_IDS`` (comma-separated) adds ids registered some other way. Each id
must: make through ``gem.make`` and ``gem.make_vec`` (which passes ``seed=`` to the constructor); give the same
episode for the same reset seed, whatever the env played before, and in two slots of a vector env (a GRPO group);
have an oracle that wins at least ``DPPO_CONTRACT_MIN_WIN_RATE`` (default 1) of its episodes; end the episode on an
unreadable reply (the trainer also sends one for a reply cut at the length limit) with Gem's -0.1 in a multi-turn
env, and at most 0 in a single-turn one (whose oracle always answers in one turn). The run ends with two lines
(with ``-q`` too): every env id checked, and which of them ``DPPO_ENV_MODULES`` / ``DPPO_CONTRACT_ENV_IDS`` added.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import random
import re
from pathlib import Path
from typing import List

import gem
import pytest
from gem.envs.registration import ENV_REGISTRY

import envs
from envs.contract import INVALID_ACTION
from dppo_oat.spec import FORMAT_ERROR_PENALTY, RolloutSettings
from envs.oracles import oracle_action, oracle_for_env_id, play_oracle_episode

ENV_MODULES_VARIABLE = "DPPO_ENV_MODULES"
ENV_IDS_VARIABLE = "DPPO_CONTRACT_ENV_IDS"
MIN_WIN_RATE_VARIABLE = "DPPO_CONTRACT_MIN_WIN_RATE"
ORACLE_EPISODES = 8
SUCCESS_THRESHOLD = RolloutSettings().success_threshold
"""An episode is won when its return reaches the trainer's success threshold."""
UNREADABLE_REPLIES = ("I am not sure.", INVALID_ACTION)
ENV_SEED = RolloutSettings().env_seed
"""Constructor seed of every slot of the trainer's vector env."""


def listed(variable: str) -> List[str]:
    """The comma-separated items of an environment variable (none when unset)."""
    return [item.strip() for item in os.environ.get(variable, "").split(",") if item.strip()]


def user_env_ids() -> List[str]:
    """Ids registered by importing the ``DPPO_ENV_MODULES`` plugins (and installed ones), then the listed ids."""
    before = set(ENV_REGISTRY)
    envs.import_env_modules(listed(ENV_MODULES_VARIABLE))
    return [env_id for env_id in ENV_REGISTRY if env_id not in before] + listed(ENV_IDS_VARIABLE)


USER_ENV_IDS = user_env_ids()
"""The ids of ``DPPO_ENV_MODULES`` and ``DPPO_CONTRACT_ENV_IDS`` (the run's summary names them: tests/conftest.py)."""
CONTRACT_ENV_IDS = list(dict.fromkeys([*envs.PROJECT_ENV_IDS, *envs.PAPER_TASKS, *USER_ENV_IDS]))


def min_win_rate() -> float:
    return float(os.environ.get(MIN_WIN_RATE_VARIABLE, "1"))


# --- the checks, one function each (other tests call them on envs of their own) ----------------------------------


def check_makes_resets_and_steps(env_id: str) -> None:
    """``gem.make`` builds it; ``reset`` gives ``(text, dict)``; ``step`` gives a finite reward and two flags."""
    env = envs.make_env(env_id)
    observation, info = env.reset(seed=0)
    assert isinstance(observation, str) and observation, "reset must return a non-empty observation text"
    assert isinstance(info, dict), "reset must return (observation, info dict)"
    result = env.step(oracle_action(env, random.Random(0)))
    assert len(result) == 5, "step must return (observation, reward, terminated, truncated, info)"
    observation, reward, terminated, truncated, info = result
    assert isinstance(observation, str) and isinstance(info, dict)
    assert math.isfinite(float(reward)), f"reward {reward!r} is not a finite number"
    assert terminated in (True, False) and truncated in (True, False), "terminated and truncated must be booleans"


def check_group_slots_play_the_same_episode(env_id: str) -> None:
    """Two slots of a vector env built as the trainer builds them (``gem.make_vec``, one constructor seed) and reset
    with one seed play the same episode: a GRPO group compares answers to the same puzzle."""
    with contextlib.redirect_stdout(io.StringIO()):  # make_vec prints a banner
        vec = gem.make_vec([env_id, env_id], vec_kwargs=[{"seed": ENV_SEED}, {"seed": ENV_SEED}])
    observations, _ = vec.reset(seed=[7, 7])
    assert observations[0] == observations[1], "two envs reset with the same seed must show the same observation"
    first, second = (play_oracle_episode(env, 7, random.Random(0)) for env in vec.envs)
    assert first == second, "two envs reset with the same seed must play the same episode"


def check_reset_seed_fixes_the_episode(env_id: str) -> None:
    """The oracle's episode from ``reset(seed)`` is the same on a fresh env and after other episodes on another
    (the trainer keeps its envs for the whole run)."""
    fresh = play_oracle_episode(envs.make_env(env_id, seed=ENV_SEED), 5, random.Random(0))
    env = envs.make_env(env_id, seed=ENV_SEED)
    play_oracle_episode(env, 6, random.Random(1))
    again = play_oracle_episode(env, 5, random.Random(0))
    assert again == fresh, "reset(seed) must make the episode reproducible, whatever the env played before"


def oracle_episodes(env_id: str, episodes: int = ORACLE_EPISODES) -> list:
    """``(turns, return)`` of the oracle's episodes from seeds ``0 .. episodes - 1``."""
    env = envs.make_env(env_id)
    return [play_oracle_episode(env, seed, random.Random(seed)) for seed in range(episodes)]


def oracle_win_rate(env_id: str) -> float:
    """The share of the oracle's episodes whose return reaches the trainer's success threshold."""
    return sum(ret >= SUCCESS_THRESHOLD for _, ret in oracle_episodes(env_id)) / ORACLE_EPISODES


def is_single_turn(env_id: str) -> bool:
    """True when every oracle episode is one turn: a question and its answer."""
    return all(len(turns) == 1 for turns, _ in oracle_episodes(env_id))


def unreadable_reply_rule(env_id: str) -> str:
    """The rule :func:`check_unreadable_reply_ends_the_episode` applies to ``env_id``, in words: which kind of env
    its oracle's episodes make it, and what an unreadable reply must then score."""
    if is_single_turn(env_id):
        return (f"{env_id} is single-turn (every oracle episode is one turn): an unreadable reply ends the episode "
                "(terminated=True) and scores at most 0, as a wrong answer does")
    return (f"{env_id} is multi-turn (an oracle episode takes more than one turn): an unreadable reply ends the "
            f"episode (terminated=True) with Gem's format-error reward {FORMAT_ERROR_PENALTY}, so that it costs more "
            "than a legal move")


def check_unreadable_reply_ends_the_episode(env_id: str) -> None:
    """A reply with no readable answer ends the episode: Gem's -0.1 in a multi-turn env (so that format errors cost
    more than a legal move), at most 0 in a single-turn one (Gem's ``rg:*`` give 0). A failure states the rule it
    applied (:func:`unreadable_reply_rule`)."""
    single_turn = is_single_turn(env_id)
    env = envs.make_env(env_id)
    for reply in UNREADABLE_REPLIES:
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step(reply)
        got = f"the reply {reply!r} gave terminated={terminated}, reward {reward}"
        ok = terminated and (float(reward) <= 0 if single_turn else float(reward) == pytest.approx(FORMAT_ERROR_PENALTY))
        assert ok, f"{unreadable_reply_rule(env_id)}; {got}"


CHECKS = (check_makes_resets_and_steps, check_group_slots_play_the_same_episode, check_reset_seed_fixes_the_episode,
          check_unreadable_reply_ends_the_episode)
"""Every check that takes only an env id (the oracle's win rate: :func:`oracle_win_rate`)."""


# --- the contract on every id ------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", CONTRACT_ENV_IDS)
def test_has_an_oracle(env_id):
    assert oracle_for_env_id(env_id) is not None, (
        f"no oracle for {env_id}: register one with envs.register_oracle({env_id!r}, oracle)")


@pytest.mark.parametrize("env_id", CONTRACT_ENV_IDS)
def test_makes_resets_and_steps(env_id):
    check_makes_resets_and_steps(env_id)


@pytest.mark.parametrize("env_id", CONTRACT_ENV_IDS)
def test_group_slots_play_the_same_episode(env_id):
    check_group_slots_play_the_same_episode(env_id)


@pytest.mark.parametrize("env_id", CONTRACT_ENV_IDS)
def test_reset_seed_fixes_the_episode(env_id):
    check_reset_seed_fixes_the_episode(env_id)


@pytest.mark.parametrize("env_id", CONTRACT_ENV_IDS)
def test_oracle_wins(env_id, record_property):
    rate = oracle_win_rate(env_id)
    record_property("oracle_win_rate", rate)
    assert rate >= min_win_rate(), f"the oracle of {env_id} won {rate:.0%} of {ORACLE_EPISODES} episodes"


@pytest.mark.parametrize("env_id", CONTRACT_ENV_IDS)
def test_unreadable_reply_ends_the_episode(env_id):
    check_unreadable_reply_ends_the_episode(env_id)


README = Path(__file__).resolve().parents[1] / "envs" / "README.md"


def readme_plugin(tmp_path) -> tuple[str, list[str]]:
    """The README's complete plugin (its single-turn example) as a file: (its path, the env ids it registers)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    [code] = [block for block in blocks if "class " in block and "register(" in block]
    path = tmp_path / "readme_plugin.py"
    path.write_text(code)
    return str(path), re.findall(r'register\("([^"]+)"', code)


def test_a_plugin_that_follows_the_docs_passes_the_contract(tmp_path):
    """envs/README.md's plugin, as written there, passes every check, the oracle's win rate included."""
    path, env_ids = readme_plugin(tmp_path)
    envs.import_env_modules([path])
    assert env_ids
    for env_id in env_ids:
        for check in CHECKS:
            check(env_id)
        assert oracle_win_rate(env_id) >= 1.0
        assert "single-turn" in unreadable_reply_rule(env_id)
