"""The environment contract (``dppo_oat/check_env.py``, whose command ``python -m dppo_oat.check_env --env-module
my_envs.py`` is what envs/README.md gives users), run in the test suite on every env id the project registers, the
paper's Gem tasks, and any env of one's own:

    DPPO_ENV_MODULES=path/to/my_envs.py python -m pytest tests/test_env_contract.py -q

``DPPO_ENV_MODULES`` (comma-separated modules or files, as ``--env-module`` takes them) are imported first and every
id they register is checked; ``DPPO_CONTRACT_ENV_IDS`` (comma-separated) adds ids registered some other way;
``DPPO_CONTRACT_MIN_WIN_RATE`` (default 1) is the share of its episodes an oracle must win. The run ends with two
lines (with ``-q`` too): every env id checked, and which of them ``DPPO_ENV_MODULES`` / ``DPPO_CONTRACT_ENV_IDS``
added.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from gem.envs.registration import ENV_REGISTRY

import envs
from dppo_oat.check_env import (  # noqa: F401  (tests of one's own import the checks from here too)
    CHECKS,
    check_group_slots_play_the_same_episode,
    check_has_an_oracle,
    check_makes_resets_and_steps,
    check_oracle_wins,
    check_reset_seed_fixes_the_episode,
    check_unreadable_reply_ends_the_episode,
    is_single_turn,
    oracle_win_rate,
    unreadable_reply_rule,
)

ENV_MODULES_VARIABLE = "DPPO_ENV_MODULES"
ENV_IDS_VARIABLE = "DPPO_CONTRACT_ENV_IDS"
MIN_WIN_RATE_VARIABLE = "DPPO_CONTRACT_MIN_WIN_RATE"


def listed(variable: str) -> list[str]:
    """The comma-separated items of an environment variable (none when unset)."""
    return [item.strip() for item in os.environ.get(variable, "").split(",") if item.strip()]


def user_env_ids() -> list[str]:
    """Ids registered by importing the ``DPPO_ENV_MODULES`` plugins (and installed ones), then the listed ids."""
    before = set(ENV_REGISTRY)
    envs.import_env_modules(listed(ENV_MODULES_VARIABLE))
    return [env_id for env_id in ENV_REGISTRY if env_id not in before] + listed(ENV_IDS_VARIABLE)


USER_ENV_IDS = user_env_ids()
"""The ids of ``DPPO_ENV_MODULES`` and ``DPPO_CONTRACT_ENV_IDS`` (the run's summary names them: tests/conftest.py)."""
CONTRACT_ENV_IDS = list(dict.fromkeys([*envs.PROJECT_ENV_IDS, *envs.PAPER_TASKS, *USER_ENV_IDS]))


def min_win_rate() -> float:
    return float(os.environ.get(MIN_WIN_RATE_VARIABLE, "1"))


# --- the contract on every id ------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", CONTRACT_ENV_IDS)
def test_has_an_oracle(env_id):
    check_has_an_oracle(env_id)


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
    record_property("oracle_win_rate", oracle_win_rate(env_id))
    check_oracle_wins(env_id, min_win_rate())


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
