"""Envs of one's own, in a file outside the package (``--env-module``): they train, they are checked up front (a
missing oracle, a plugin that fails to import: one line, exit 2, before any model), they import once per process,
and the contract test covers them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_env_contract as contract
import tyro
from gem.envs.registration import ENV_REGISTRY

import dppo_oat.engines.local.trainer as trainer_module
import envs
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.train import main

REPOSITORY = Path(__file__).resolve().parents[1]

GUESS_PLUGIN = r'''
"""Guess the number, a multi-turn game of one's own: the env, its registration and its oracle in one file."""
import random
import re

from gem.core import Env
from gem.envs.registration import register

import envs

ENV_ID = "__ENV_ID__"
GUESS = re.compile(r"\\boxed\{\s*(\d+)\s*\}")


class GuessNumberEnv(Env):
    def __init__(self, high=16, max_turns=6, seed=None, **_):
        super().__init__()
        self.high, self.max_turns = high, max_turns
        self.rng = random.Random(seed)
        self.reset()

    def reset(self, seed=None):
        super().reset(seed)
        if seed is not None:
            self.rng = random.Random(seed)
        self.secret = self.rng.randint(1, self.high)
        self.low, self.top, self.turn = 1, self.high, 0
        return self.state(f"Guess a number from 1 to {self.high}."), {}

    def state(self, feedback):
        return f"{feedback} It is from {self.low} to {self.top}; {self.max_turns - self.turn} guesses left."

    def step(self, action):
        self.turn += 1
        guesses = GUESS.findall(action)
        if not guesses:
            return "No guess found.", -0.1, True, False, {}
        guess = int(guesses[-1])
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
        else:
            self.top = min(self.top, guess - 1)
        out_of_turns = self.turn >= self.max_turns
        feedback = "Higher." if guess < self.secret else "Lower."
        return self.state(feedback), 0.0, out_of_turns, out_of_turns, {}


def guess_oracle(env, rng):
    """Binary search: the middle of the numbers still possible."""
    game = env.unwrapped
    return "\\boxed{%d}" % ((game.low + game.top) // 2)


ENV_CLASS = GuessNumberEnv
__FLAW__
register(ENV_ID, ENV_CLASS, high=16, max_turns=6)  # unguarded: the file must be imported once per process
if __WITH_ORACLE__:
    envs.register_oracle(ENV_ID, guess_oracle)
'''

FLAWS = {
    "an unreadable reply scores 0": """
class Flawed(GuessNumberEnv):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, (reward if GUESS.findall(action) else 0.0), terminated, truncated, info
ENV_CLASS = Flawed
""",
    "reset ignores its seed": """
class Flawed(GuessNumberEnv):
    def reset(self, seed=None):
        return super().reset(None)
ENV_CLASS = Flawed
""",
    "the secret comes from a counter": """
import itertools
RESETS = itertools.count()
class Flawed(GuessNumberEnv):
    def reset(self, seed=None):
        observation, info = super().reset(seed)
        self.secret = next(RESETS) % self.high + 1
        return observation, info
ENV_CLASS = Flawed
""",
}


def write_guess_plugin(folder: Path, env_id: str, *, with_oracle: bool = True, flaw: str = "") -> Path:
    """A plugin file registering ``env_id`` (Guess the number), with or without its oracle, or with a flaw."""
    text = (GUESS_PLUGIN.replace("__ENV_ID__", env_id).replace("__WITH_ORACLE__", str(with_oracle))
            .replace("__FLAW__", FLAWS[flaw] if flaw else ""))
    path = folder / f"{env_id.split(':')[1].replace('-', '_').lower()}.py"
    path.write_text(text)
    return path


def no_model(*args, **kwargs):
    raise AssertionError("a model was built before the input was validated")


def cli_error(capsys, monkeypatch, argv) -> str:
    """The one ``error:`` line the CLI prints for ``argv`` (it must exit 2 before any model is built)."""
    monkeypatch.setattr(trainer_module, "load_or_build_tiny_policy", no_model)
    monkeypatch.setattr(trainer_module, "load_pretrained", no_model)
    monkeypatch.setenv("COLUMNS", "1000")  # the console wraps long lines at its width
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# --- the user's path: a file of one's own trains -----------------------------------------------------------------


def test_a_plugin_file_outside_the_package_trains(tmp_path):
    plugin = write_guess_plugin(tmp_path, "mine:GuessTrain-v0")
    main(["--env-module", str(plugin), "--env-ids", "mine:GuessTrain-v0", "--gamma", "1", "--turn-baseline",
          "--steps", "2", "--runs-dir", str(tmp_path / "runs"), "--run-name", "guess",
          "--cache-dir", str(tmp_path / "cache"), "--groups-per-step", "4", "--group-size", "2",
          "--eval-episodes", "4", "--eval-every", "2", "--warm-start.demo-episodes", "100",
          "--warm-start.max-steps", "10", "--warm-start.check-every", "10", "--warm-start.check-episodes", "4",
          "--warm-start.vocab-size", "300", "--warm-start.batch-size", "16"])
    run = tmp_path / "runs" / "guess"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["rollout/episodes"] == 8 and row["rollout/turns_per_episode"] >= 1 for row in rows)
    config = json.loads((run / "config.json").read_text())
    assert config["env_module"] == [str(plugin)] and config["env_ids"] == ["mine:GuessTrain-v0"]


def test_env_module_is_repeatable_on_the_command_line():
    config = tyro.cli(TrainConfig, args=["--env-module", "a.py", "--env-module", "my_lab.envs"])
    assert config.env_module == ("a.py", "my_lab.envs")


# --- mistakes: one line, before any model ------------------------------------------------------------------------


def test_an_env_without_an_oracle_is_refused_before_any_model(tmp_path, capsys, monkeypatch):
    plugin = write_guess_plugin(tmp_path, "mine:GuessNoOracle-v0", with_oracle=False)
    line = cli_error(capsys, monkeypatch, ["--env-module", str(plugin), "--env-ids", "mine:GuessNoOracle-v0",
                                           "--runs-dir", str(tmp_path / "runs")])
    assert "no oracle for env mine:GuessNoOracle-v0" in line
    assert "envs.register_oracle" in line and "--pretrain" in line


def test_only_the_tiny_policys_env_needs_an_oracle(tmp_path):
    """The tiny policy is warm-started on the first id's oracle; other ids, or a model of one's own, need none."""
    plugin = write_guess_plugin(tmp_path, "mine:GuessNoOracle2-v0", with_oracle=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    (model / "model.safetensors").write_bytes(b"")  # validation reads the config and sees weights; loads nothing
    common = {"env_module": (str(plugin),), "runs_dir": str(tmp_path / "runs")}
    validate_config(TrainConfig(env_ids=("mine:GuessNoOracle2-v0",), pretrain=str(model), **common))
    validate_config(TrainConfig(env_ids=("example:Countdown-v0", "mine:GuessNoOracle2-v0"), **common))
    with pytest.raises(ValueError, match="no oracle for env mine:GuessNoOracle2-v0"):
        validate_config(TrainConfig(env_ids=("mine:GuessNoOracle2-v0", "example:Countdown-v0"), **common))


def test_a_plugin_that_fails_to_import_is_one_line_with_its_own_error(tmp_path, capsys, monkeypatch):
    plugin = tmp_path / "broken_envs.py"
    plugin.write_text("import envs\n\nSIZE = 1 / 0\n")
    line = cli_error(capsys, monkeypatch, ["--env-module", str(plugin), "--runs-dir", str(tmp_path / "runs")])
    assert "broken_envs.py" in line and "ZeroDivisionError: division by zero (broken_envs.py:3)" in line


@pytest.mark.parametrize("name, message", [
    ("no/such/my_envs.py", "no such file"),
    ("no_such_module_of_envs", "not found"),
])
def test_a_plugin_that_is_not_there_is_one_line(tmp_path, capsys, monkeypatch, name, message):
    line = cli_error(capsys, monkeypatch, ["--env-module", name, "--runs-dir", str(tmp_path / "runs")])
    assert message in line and name in line


def test_a_missing_import_inside_a_plugin_is_its_own_error(tmp_path):
    plugin = tmp_path / "needs_more.py"
    plugin.write_text("import a_package_nobody_installed\n")
    with pytest.raises(ValueError, match="failed to import: ModuleNotFoundError: No module named "
                                         "'a_package_nobody_installed'"):
        envs.import_env_modules([str(plugin)])


# --- importing -----------------------------------------------------------------------------------------------------


def test_a_plugin_file_is_imported_once_per_process(tmp_path):
    """Validation and the trainer both import it; its unguarded ``register`` would fail on a second run."""
    plugin = write_guess_plugin(tmp_path, "mine:GuessOnce-v0")
    first = envs.import_env_modules([str(plugin)])
    again = envs.import_env_modules([str(plugin), str(tmp_path / ".." / tmp_path.name / plugin.name)])
    assert first[0] is again[0] is again[1]
    assert "mine:GuessOnce-v0" in ENV_REGISTRY and envs.oracle_for_env_id("mine:GuessOnce-v0") is not None


def test_a_dotted_module_name_is_imported(tmp_path, monkeypatch):
    write_guess_plugin(tmp_path, "mine:GuessDotted-v0")
    monkeypatch.syspath_prepend(str(tmp_path))
    module, = envs.import_env_modules(["guessdotted_v0"])
    assert module.ENV_ID == "mine:GuessDotted-v0" and "mine:GuessDotted-v0" in ENV_REGISTRY


def test_installed_packages_declare_plugins_as_entry_points(tmp_path, monkeypatch):
    """An installed distribution's ``dppo_oat.envs`` entry points are imported with the named plugins."""
    write_guess_plugin(tmp_path, "mine:GuessInstalled-v0")
    dist_info = tmp_path / "my_lab_envs-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-lab-envs\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[{envs.ENTRY_POINT_GROUP}]\nguess = guessinstalled_v0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    envs.import_env_modules()
    assert "mine:GuessInstalled-v0" in ENV_REGISTRY


# --- the contract test covers envs of one's own ---------------------------------------------------------------------


def test_the_contract_test_checks_every_id_a_plugin_registers(tmp_path):
    plugin = write_guess_plugin(tmp_path, "mine:GuessContract-v0")
    environment = {**os.environ, contract.ENV_MODULES_VARIABLE: str(plugin)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_env_contract.py",
         "-k", "GuessContract"], cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "6 passed" in result.stdout
    # -q prints dots only: the summary names the envs checked, and which of them came from the plugin
    assert "env contract checked 1 env ids: mine:GuessContract-v0" in result.stdout
    assert "from DPPO_ENV_MODULES / DPPO_CONTRACT_ENV_IDS: mine:GuessContract-v0" in result.stdout


def readme_single_turn_example() -> str:
    """The code of the single-turn example in ``envs/README.md``."""
    section = (REPOSITORY / "envs" / "README.md").read_text().split("## Single-turn tasks", 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_the_readmes_single_turn_example_meets_the_contract(tmp_path):
    plugin = tmp_path / "sums.py"
    plugin.write_text(readme_single_turn_example())
    envs.import_env_modules([str(plugin)])
    for check in contract.CHECKS:
        check("mine:Sum-v0")
    assert contract.is_single_turn("mine:Sum-v0") and contract.oracle_win_rate("mine:Sum-v0") == 1.0


@pytest.mark.parametrize("flaw, failing_check", [
    ("an unreadable reply scores 0", contract.check_unreadable_reply_ends_the_episode),
    ("reset ignores its seed", contract.check_reset_seed_fixes_the_episode),
    ("the secret comes from a counter", contract.check_group_slots_play_the_same_episode),
])
def test_the_contract_catches_a_flawed_env(tmp_path, flaw, failing_check):
    env_id = f"mine:GuessFlawed{list(FLAWS).index(flaw)}-v0"
    envs.import_env_modules([str(write_guess_plugin(tmp_path, env_id, flaw=flaw))])
    contract.check_makes_resets_and_steps(env_id)
    assert contract.oracle_win_rate(env_id) == 1.0 and not contract.is_single_turn(env_id)
    with pytest.raises(AssertionError):
        failing_check(env_id)


def test_an_env_registered_with_a_factory_finds_its_class_oracle():
    """A factory entry point (not a class) is made once to see the class: its oracle is found, not refused."""
    from gem.envs.registration import ENV_REGISTRY, register

    from envs.oracles import oracle_for_env_id, sudoku_oracle_action
    from envs.sudoku_compact import make_compact_sudoku

    if "mine:FactorySudoku-v0" not in ENV_REGISTRY:
        register("mine:FactorySudoku-v0", make_compact_sudoku, show_last_wrong_move=False)
    assert oracle_for_env_id("mine:FactorySudoku-v0") is sudoku_oracle_action
