"""Faults of a user's data and envs, each one ``error:`` line that names the file, env or plugin and the fix:

- local math data (``local-math:<path>``) whose rows the grader cannot take: refused at validation, naming the file
  and line (or row); answers that mix the forms the loader documents (strings, numbers, lists) are accepted;
- a plugin (``--env-module``) that exits when imported, or whose env or oracle breaks Gem's contract (what
  ``reset()``, ``step()`` and an oracle return): refused at validation where one probe of the env shows it (exit 2),
  else the run stops at the first episode that shows it (exit 1); it is never counted as an env-error episode, as
  an exception inside ``step()`` is.
"""

from __future__ import annotations

import json
import warnings

import gem
import pytest
from datasets import Dataset, DatasetDict
from gem.envs.math_env import MathEnv
from test_faults import TINY, one_error, write_math

import envs
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.rollout.episodes import EpisodeCollector
from dppo_oat.settings.spec import RolloutSettings, SamplingSettings
from envs.contract import BrokenEnvError
from envs.math_local import load_math_dataset, math_oracle_action

GOOD = '{"problem": "1+1?", "answer": "2"}'


def refused(capsys, tmp_path, env_id, *fragments, code=2, flags=()):
    """The command training on ``env_id`` exits with ``code`` and one ``error:`` line holding every fragment, and
    leaves no run directory behind."""
    runs = tmp_path / "runs"
    line = one_error(capsys, ["--runs-dir", str(runs), "--env-ids", env_id, *flags], code, *fragments)
    assert not runs.exists() or not any(runs.iterdir()), "a refused command left something behind"
    return line


# --- local math data ------------------------------------------------------------------------------------------------


@pytest.mark.fault("a local-math file whose answers mix strings, numbers and lists",
                   "accepted: when any answer is a list, every answer is stored as a list")
def test_answers_that_mix_strings_numbers_and_lists_are_accepted(tmp_path):
    """The docstring allows strings, numbers and lists of accepted strings; one file mixing them (a pyarrow traceback
    unhandled) loads. Every answer becomes a list of strings then, which the grader and the oracle take."""
    env_id = write_math(tmp_path / "mixed.jsonl", [GOOD, '{"problem": "2+2?", "answer": ["4", "four"]}',
                                                   '{"problem": "3+3?", "answer": 6}'])
    validate_config(TrainConfig(env_ids=(env_id,), runs_dir=str(tmp_path / "runs")))
    dataset = load_math_dataset(tmp_path / "mixed.jsonl")
    assert dataset["answer"] == [["2"], ["4", "four"], ["6"]]
    assert all(MathEnv.check_correct(f"\\boxed{{{answers[0]}}}", answers) for answers in dataset["answer"])
    env = envs.make_env(env_id, eval=True)  # problems in file order
    env.reset(seed=1)
    assert math_oracle_action(env) == "\\boxed{4}"


@pytest.mark.fault("a local-math file whose answers mix strings and numbers",
                   "accepted: numbers become text")
def test_numbers_and_strings_mixed_become_strings(tmp_path):
    write_math(tmp_path / "numbers.jsonl", ['{"problem": "3+3?", "answer": 6}', GOOD,
                                            '{"problem": "half?", "answer": 0.5}'])
    assert load_math_dataset(tmp_path / "numbers.jsonl")["answer"] == ["6", "2", "0.5"]


@pytest.mark.fault("a local-math row whose problem is not a non-empty string, or whose answer the grader cannot take "
                   "(a dict, null, an empty list, a list holding null, a bool)",
                   "`error: env local-math:…: FILE, line N: the problem must be a non-empty string, got int 7` (or "
                   "`the answer must be a non-empty string, a number, or a non-empty list of them, got …`), before "
                   "any model")
@pytest.mark.parametrize("row, fragments", [
    ('{"problem": 7, "answer": "7"}', ["line 2", "problem", "a non-empty string", "int"]),
    ('{"problem": null, "answer": "7"}', ["line 2", "problem", "None"]),
    ('{"problem": "   ", "answer": "7"}', ["line 2", "problem", "a non-empty string"]),
    ('{"answer": "7"}', ["line 2", "problem", "None"]),
    ('{"problem": "7?", "answer": {"value": 7}}', ["line 2", "answer", "dict"]),
    ('{"problem": "7?", "answer": null}', ["line 2", "answer", "None"]),
    ('{"problem": "7?", "answer": ""}', ["line 2", "answer", "empty"]),
    ('{"problem": "7?", "answer": []}', ["line 2", "answer", "empty"]),
    ('{"problem": "7?", "answer": ["7", null]}', ["line 2", "answer", "None"]),
    ('{"problem": "7?", "answer": true}', ["line 2", "answer", "bool"]),
])
def test_a_row_the_grader_cannot_take_is_one_line_naming_the_file_and_line(row, fragments, tmp_path, capsys,
                                                                            no_model):
    env_id = write_math(tmp_path / "bad_rows.jsonl", [GOOD, row, GOOD])
    refused(capsys, tmp_path, env_id, "bad_rows.jsonl", *fragments)


@pytest.mark.fault("a local-math file where another column mixes types",
                   "one line naming the file and the column, before any model")
def test_another_column_that_mixes_types_is_named(tmp_path, capsys, no_model):
    env_id = write_math(tmp_path / "levels.jsonl", ['{"problem": "1?", "answer": "1", "level": 3}',
                                                    '{"problem": "2?", "answer": "2", "level": "hard"}'])
    refused(capsys, tmp_path, env_id, "levels.jsonl", "column 'level' mixes types of values", "give it one type")


def test_a_json_list_file_names_the_row(tmp_path, capsys, no_model):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"problem": "1+1?", "answer": "2"}, {"problem": 3, "answer": "3"}]))
    refused(capsys, tmp_path, f"local-math:{path}", "rows.json, row 2", "problem")


@pytest.mark.fault("an empty local-math file",
                   "one line naming the file, before any model")
@pytest.mark.parametrize("text", ["", "\n\n"])
def test_an_empty_file_is_one_line(text, tmp_path, capsys, no_model):
    (tmp_path / "empty.jsonl").write_text(text)
    refused(capsys, tmp_path, f"local-math:{tmp_path / 'empty.jsonl'}", "empty.jsonl", "no rows")


@pytest.mark.fault("a saved local-math split with no rows",
                   "one line naming it, before any model")
def test_a_saved_set_without_rows_is_one_line(tmp_path, capsys, no_model):
    """A split with no rows is refused at validation (it would divide by zero at the first reset)."""
    folder = tmp_path / "no_rows"
    DatasetDict({"train": Dataset.from_dict({"problem": [], "answer": []}),
                 "eval": Dataset.from_list([{"problem": "1+1?", "answer": "2"}])}).save_to_disk(str(folder))
    refused(capsys, tmp_path, f"local-math:{folder}", "no_rows", "no rows")


def test_a_saved_set_with_a_non_string_problem_names_the_row(tmp_path, capsys, no_model):
    folder = tmp_path / "int_problems"
    Dataset.from_list([{"problem": 1, "answer": "1"}, {"problem": 2, "answer": "2"}]).save_to_disk(str(folder))
    refused(capsys, tmp_path, f"local-math:{folder}", "int_problems", "row 1", "problem", "int")
    folder = tmp_path / "null_problems"
    Dataset.from_list([{"problem": "1?", "answer": "1"}, {"problem": None, "answer": "2"}]).save_to_disk(str(folder))
    refused(capsys, tmp_path, f"local-math:{folder}", "null_problems", "row 2", "problem", "None")


def test_a_registered_dataset_is_checked_too():
    with pytest.raises(ValueError, match="row 1: the problem must be a non-empty string"):
        envs.register_math_dataset("local-math:t_faults_int", Dataset.from_list([{"problem": 5, "answer": "5"}]))


# --- plugins: importing -------------------------------------------------------------------------------------------


@pytest.mark.fault("a plugin that calls `sys.exit` while being imported",
                   "`error: env module 'X' called sys.exit(3) while being imported (file:line): a plugin must not "
                   "exit on import; …` (exit 2)")
@pytest.mark.parametrize("statement, fragment", [
    ("sys.exit(3)", "called sys.exit(3)"),
    ("sys.exit('bye')", "called sys.exit('bye')"),
    ("raise SystemExit", "called sys.exit(None)"),
])
def test_a_plugin_that_exits_at_import_is_one_line_naming_it(statement, fragment, tmp_path, capsys, no_model):
    """Not the command's end with the plugin's exit code and no output at all."""
    plugin = tmp_path / "exits.py"
    plugin.write_text(f"import sys\n\n{statement}\n")
    refused(capsys, tmp_path, "example:Countdown-v0", f"env module {str(plugin)!r}", fragment, "exits.py:3",
            "if __name__", flags=["--env-module", str(plugin)])


# --- plugins: envs and oracles that break the contract ---------------------------------------------------------------

PLUGIN = r'''
import random
import re

from gem.core import Env
from gem.envs.registration import ENV_REGISTRY, register

import envs

ENV_ID = "__ENV_ID__"
FLAW = "__FLAW__"


class Guess(Env):
    """Guess a number from 1 to 16."""

    def __init__(self, seed=None, **_):
        super().__init__()
        self.rng = random.Random(seed)
        self.reset()

    def reset(self, seed=None):
        super().reset(seed)
        if seed is not None:
            self.rng = random.Random(seed)
        self.secret, self.low, self.top, self.turn = self.rng.randint(1, 16), 1, 16, 0
        if FLAW == "reset raises" and seed == 3:
            raise KeyError("no puzzle 3")
        if FLAW == "reset returns None":
            return None
        if FLAW == "reset returns an int observation":
            return 7, {}
        if FLAW == "reset returns the observation alone":
            return "Guess a number from 1 to 16."
        return "Guess a number from 1 to 16.", {}

    def step(self, action):
        self.turn += 1
        guesses = re.findall(r"\\boxed\{(\d+)\}", action)
        if not guesses:
            result = ("No guess.", -0.1, True, False, {})
        elif int(guesses[-1]) == self.secret:
            result = ("Correct!", 1.0, True, False, {})
        else:
            guess = int(guesses[-1])
            self.low, self.top = (guess + 1, self.top) if guess < self.secret else (self.low, guess - 1)
            result = (f"From {self.low} to {self.top}.", 0.0, self.turn >= 6, self.turn >= 6, {})
        if FLAW == "step returns a bool reward":
            result = (result[0], result[1] > 0, *result[2:])
        if FLAW == "step returns an int observation at the end" and result[2]:
            result = (7, *result[1:])
        if FLAW == "step never ends the episode":
            result = (result[0], 0.0, False, False, {})
        if FLAW == "step returns 3 values":
            return result[:3]
        if FLAW == "step returns no info":
            return (*result[:4], None)
        return result


def oracle(env, rng):
    game = env.unwrapped
    if FLAW == "the oracle raises":
        raise IndexError("no move left")
    if FLAW == "the oracle returns None":
        return None
    if FLAW == "the oracle raises on its second move" and game.turn >= 1:
        raise IndexError("no move left")
    return "\\boxed{%d}" % ((game.low + game.top) // 2)


if ENV_ID not in ENV_REGISTRY:
    register(ENV_ID, Guess)
envs.register_oracle(ENV_ID, oracle)
'''


def write_plugin(folder, flaw: str, name: str) -> tuple[str, str]:
    """A plugin file registering ``mine:<name>`` with ``flaw``: (its path, the env id)."""
    env_id = f"mine:{name}"
    path = folder / f"{name.lower().replace('-', '_')}.py"
    path.write_text(PLUGIN.replace("__ENV_ID__", env_id).replace("__FLAW__", flaw))
    return str(path), env_id


STEP = "(observation: str, reward: float, terminated: bool, truncated: bool, info: dict)"
RESET = "(observation: str, info: dict)"


@pytest.mark.fault("a plugin env whose `step()` or `reset()` breaks Gem's contract (3 values, `None`, an observation "
                   "that is not text)",
                   "one line at validation (each plugin env is made, reset and stepped once) naming the env, its "
                   "plugin and what Gem envs return: `… step() returned 3 values; Gem envs return (observation: str, "
                   "reward: float, terminated: bool, truncated: bool, info: dict): fix its step()` (exit 2)")
@pytest.mark.fault("an oracle that raises or returns something other than text",
                   "`error: the oracle NAME of env ID (plugin X) raised E: msg (file:line): fix the oracle, or … "
                   "--pretrain`, at validation (exit 2)")
@pytest.mark.parametrize("flaw, fragments", [
    ("step returns 3 values", ["step() returned 3 values", f"Gem envs return {STEP}", "fix its step()"]),
    ("step returns no info", ["step() returned an info of type NoneType", STEP]),
    ("reset returns None", ["reset(seed=0) returned None", f"Gem envs return {RESET}", "fix its reset()"]),
    ("reset returns an int observation", ["reset(seed=0) returned an observation of type int", RESET]),
    ("reset returns the observation alone", ["reset(seed=0) returned a str", RESET]),
    ("the oracle raises", ["the oracle oracle", "raised IndexError: no move left", ".py:", "--pretrain"]),
    ("the oracle returns None", ["the oracle oracle", "returned None", "the action text (a str)"]),
])
def test_a_plugin_env_that_breaks_the_contract_is_refused_before_any_model(flaw, fragments, tmp_path, capsys,
                                                                          no_model):
    """One reset and one step of each plugin env at validation: a wrong shape is named with the env and its
    plugin (not a tokenizer or unpacking error, or a traceback, naming neither)."""
    name = f"Flawed{sorted(FLAW_NAMES).index(flaw)}-v0"
    plugin, env_id = write_plugin(tmp_path, flaw, name)
    refused(capsys, tmp_path, env_id, f"env {env_id}", f"(plugin {plugin})", *fragments,
            flags=["--env-module", plugin])


FLAW_NAMES = ("step returns 3 values", "step returns no info", "reset returns None", "reset returns an int observation",
              "reset returns the observation alone", "the oracle raises", "the oracle returns None",
              "the oracle raises on its second move")


@pytest.mark.fault("an oracle that fails only after its first move",
                   "the same line, from the warm start (exit 1)")
def test_an_oracle_that_fails_later_stops_the_warm_start_in_one_line(tmp_path, capsys):
    """The probe plays one move; a later failure surfaces in the warm start's demonstrations: exit 1, one line."""
    plugin, env_id = write_plugin(tmp_path, "the oracle raises on its second move", "LateOracle-v0")
    refused(capsys, tmp_path, env_id, f"the oracle oracle of env {env_id} (plugin {plugin})",
            "raised IndexError: no move left", code=1,
            flags=["--env-module", plugin, "--cache-dir", str(tmp_path / "cache"), *TINY])


@pytest.fixture(scope="module")
def tokenizer():
    from dppo_oat.models.tiny import build_tiny_policy

    return build_tiny_policy(["Guess a number from 1 to 16. \\boxed{8}"] * 20, seed=0, vocab_size=300)[1]


class Replies:
    """A generator that answers every prompt with ``text``."""

    def __init__(self, tokenizer, text):
        self.tokenizer, self.text = tokenizer, text

    def generate(self, prompts, settings):
        from dppo_oat.rollout.generation import Completion

        ids = self.tokenizer(self.text, add_special_tokens=False)["input_ids"]
        return [Completion(token_ids=ids, logprobs=[-1.0] * len(ids), text=self.text, finish_reason="stop")
                for _ in prompts]


COLLECT_FLAWS = ("step returns 3 values", "reset returns None", "reset raises", "step returns a bool reward",
                 "step returns an int observation at the end")


@pytest.mark.fault("a plugin env that breaks Gem's contract only in play (a model of one's own plays no oracle at "
                   "validation), or whose `reset()` raises",
                   "the run stops at the first episode that shows it, in one line naming the env and its plugin (exit "
                   "1); never counted as an env error")
@pytest.mark.parametrize("flaw, message", [
    ("step returns 3 values", r"env mine:Collect0-v0 \(plugin .*collect0_v0.py\): step\(\) returned 3 values; "
                              r"Gem envs return \(observation: str, reward: float, .*\): fix its step\(\)"),
    ("reset returns None", r"env mine:Collect1-v0 \(plugin .*collect1_v0.py\): reset\(seed=3\) returned None; "
                           r"Gem envs return \(observation: str, info: dict\): fix its reset\(\)"),
    ("reset raises", r"env mine:Collect2-v0 \(plugin .*collect2_v0.py\): reset\(seed=3\) raised KeyError: 'no "
                     r"puzzle 3': fix its reset\(\)"),
    ("step returns a bool reward", r"env mine:Collect3-v0 \(plugin .*\): step\(\) returned the reward False, a bool: "
                                   r"rewards are real numbers"),
    ("step returns an int observation at the end", r"env mine:Collect4-v0 \(plugin .*\): step\(\) returned an "
                                                   r"observation of type int"),
])
def test_a_contract_violation_stops_a_rollout_and_is_not_an_env_error(flaw, message, tmp_path, tokenizer):
    """With a model of one's own no oracle is played before the first rollout: the collector checks what the env
    returns, in both engines (the oat actor uses the same collector), and stops the run instead of counting it. A
    reset() that raises stops the run too: no episode can start."""
    name = f"Collect{COLLECT_FLAWS.index(flaw)}-v0"
    plugin, env_id = write_plugin(tmp_path, flaw, name)
    envs.import_env_modules([plugin])
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with pytest.raises(BrokenEnvError, match=message):
            collector = EpisodeCollector([env_id], 1, 2, tokenizer, RolloutSettings(template="plain", max_turns=3))
            collector.collect(Replies(tokenizer, "no guess"), SamplingSettings(8), [3])
    assert not [w for w in shown if "env_error" in str(w.message)], "counted as an env error"


@pytest.mark.fault("an env that never ends its episodes, with no turn limit of its own and no `--max-turns`",
                   "each episode ends at the default turn cap (100 turns, counted in `end/max_turns`), with one "
                   "warning per env naming the cap and `--max-turns`; never a rollout that runs forever")
def test_an_env_that_never_ends_is_stopped_by_the_default_turn_cap(tmp_path, tokenizer):
    from dppo_oat.settings.spec import DEFAULT_MAX_TURNS

    plugin, env_id = write_plugin(tmp_path, "step never ends the episode", "Endless-v0")
    envs.import_env_modules([plugin])
    collector = EpisodeCollector([env_id], 1, 2, tokenizer, RolloutSettings(template="plain"))
    with pytest.warns(UserWarning, match=rf"env {env_id}: its episodes reached the turn cap {DEFAULT_MAX_TURNS}.*"
                                         r"--max-turns") as shown:
        rollout = collector.collect(Replies(tokenizer, "\\boxed{8}"), SamplingSettings(8), [3])
        collector.collect(Replies(tokenizer, "\\boxed{8}"), SamplingSettings(8), [4])
    assert len([w for w in shown if "turn cap" in str(w.message)]) == 1
    assert rollout.stats()["end/max_turns"] == 2.0 and rollout.stats()["turns_per_episode"] == DEFAULT_MAX_TURNS


def test_an_env_whose_step_raises_is_still_counted(tmp_path, tokenizer):
    """An ordinary exception inside step() ends only that episode (end/env_error), as before."""
    (tmp_path / "raises.py").write_text(PLUGIN.replace("__ENV_ID__", "mine:Raises-v0").replace("__FLAW__", "")
                                        + "\nGuess.step = lambda self, action: 1 / 0\n")
    envs.import_env_modules([str(tmp_path / "raises.py")])
    collector = EpisodeCollector(["mine:Raises-v0"], 1, 2, tokenizer, RolloutSettings(template="plain"))
    with pytest.warns(UserWarning, match=r"env mine:Raises-v0: step\(\) raised ZeroDivisionError"):
        rollout = collector.collect(Replies(tokenizer, "\\boxed{8}"), SamplingSettings(8), [3])
    assert rollout.stats()["end/env_error"] == 2.0


def test_the_probe_checks_only_plugin_envs(monkeypatch):
    """Built-in and Gem ids are covered by the contract test; the probe makes only the envs of a plugin."""
    made = []
    monkeypatch.setattr(gem, "make", lambda env_id, **kwargs: made.append(env_id))
    envs.check_plugin_envs(["game:Sudoku-v0-easy", "example:Countdown-v0"], env_seed=42,
                           oracle_env_id="example:Countdown-v0")
    assert made == []


def test_with_a_model_of_ones_own_the_probe_steps_without_the_oracle(tmp_path):
    """--pretrain plays no oracle: the probe's step sends an unreadable reply, and an env that raises on it is let
    be (the trainer counts such episodes), while a wrong shape is refused."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    (model / "model.safetensors").write_bytes(b"")  # validation sees weights; nothing loads them here
    plugin, env_id = write_plugin(tmp_path, "step returns 3 values", "Pretrained0-v0")
    config = TrainConfig(env_ids=(env_id,), env_module=(plugin,), pretrain=str(model), runs_dir=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match=r"step\(\) returned 3 values"):
        validate_config(config)
    raising = tmp_path / "raising.py"
    raising.write_text(PLUGIN.replace("__ENV_ID__", "mine:Pretrained1-v0").replace("__FLAW__", "")
                       + "\nGuess.step = lambda self, action: 1 / 0\n")
    validate_config(TrainConfig(env_ids=("mine:Pretrained1-v0",), env_module=(str(raising),), pretrain=str(model),
                                runs_dir=str(tmp_path / "runs")))


def test_ctrl_c_while_a_plugin_imports_is_not_a_plugin_error(tmp_path):
    plugin = tmp_path / "interrupted.py"
    plugin.write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        envs.import_env_modules([str(plugin)])


# --- envs that train without an error but not as meant ---------------------------------------------------------------

PLAIN = r'''
import random

from gem.core import Env
from gem.envs.registration import ENV_REGISTRY, register

FLAW = "__FLAW__"


class Puzzle(Env):
    """Three turns on a numbered puzzle; reset(seed) picks the puzzle (unless FLAW says otherwise)."""

    def __init__(self, seed=None, **_):
        super().__init__()
        self.rng = random.Random(seed)

    def reset(self, seed=None):
        super().reset(seed)
        if seed is not None and FLAW != "reset ignores the seed":
            self.rng = random.Random(seed)
        self.puzzle, self.turn = self.rng.randint(1, 10**6), 0
        return f"Puzzle {self.puzzle}: say anything.", {}

    def step(self, action):
        self.turn += 1
        more = " more" * 600 if FLAW == "observations grow" else ""
        return f"Puzzle {self.puzzle}, turn {self.turn}:{more}", 0.0, self.turn >= 3, False, {}


if "__ENV_ID__" not in ENV_REGISTRY:
    register("__ENV_ID__", Puzzle)
'''
SHIPPED = ["--groups-per-step", "2", "--group-size", "4", "--minibatch-size", "32", "--eval-episodes", "2",
           "--eval-every", "5", "--token-samples", "4", "--steps", "1"]
"""One step of the shipped tiny Sudoku policy; the plugin env gets the second group (ids are assigned round-robin)."""


def run_beside_sudoku(tmp_path, capsys, flaw, name):
    """One step on Sudoku and a plugin env ``mine:<name>`` with ``flaw``: its output, and the metrics line."""
    from dppo_oat.engines.local.config import DEFAULT_ENV
    from dppo_oat.run.safe_io import read_jsonl
    from dppo_oat.train import main

    tmp_path.mkdir(exist_ok=True)
    plugin = tmp_path / f"{name.lower().replace('-', '_')}.py"
    plugin.write_text(PLAIN.replace("__ENV_ID__", f"mine:{name}").replace("__FLAW__", flaw))
    main(["--runs-dir", str(tmp_path / "runs"), "--run-name", "one", "--cache-dir", str(tmp_path / "cache"),
          "--env-ids", DEFAULT_ENV, f"mine:{name}", "--env-module", str(plugin), *SHIPPED])
    out = capsys.readouterr()
    return " ".join((out.out + out.err).split()), read_jsonl(tmp_path / "runs" / "one" / "metrics.jsonl")[0]


@pytest.mark.fault("an env whose later observations outgrow `--max-prompt-tokens` (its first prompt fits)",
                   "the run trains, and says once in a warning line how many of a step's episodes ended when a later "
                   "prompt outgrew it (metric `rollout/end/prompt_too_long`): raise `--max-prompt-tokens`")
def test_prompts_that_outgrow_the_limit_are_said_once(tmp_path, capsys):
    text, metrics = run_beside_sudoku(tmp_path, capsys, "observations grow", "Grows-v0")
    assert metrics["rollout/end/prompt_too_long"] == 4, metrics
    assert "warning: step 1: 4 of 8 episodes ended when a later turn's prompt outgrew --max-prompt-tokens 256" in text
    assert "raise --max-prompt-tokens" in text


@pytest.mark.fault("a plugin env whose `reset(seed)` ignores the seed (it draws its puzzle from a generator of its "
                   "own)",
                   "one warning line at the start, from the first training seeds: the run cannot be repeated and a "
                   "group's samples play different episodes; draw the puzzle from reset's seed")
def test_an_env_that_ignores_the_reset_seed_is_warned_of_at_the_start(tmp_path, capsys):
    text, _ = run_beside_sudoku(tmp_path, capsys, "reset ignores the seed", "Unseeded-v0")
    assert "warning: env mine:Unseeded-v0" in text and "ignores the seed" in text, text
    clean, _ = run_beside_sudoku(tmp_path / "seeded", capsys, "", "Seeded-v0")
    assert "warning" not in clean, clean


@pytest.mark.fault("an env whose rewards overflow (a reward of 1e300: past float32, in which advantages are "
                   "computed)",
                   "`error: step N: the env's rewards overflow: a turn's return reaches 1e+300, past the float32 "
                   "range … scale the env's rewards down` (exit 1), with no numpy warning before it (never \"training "
                   "diverged … advantages non-finite\")")
def test_rewards_that_overflow_are_one_line(tmp_path, capsys):
    """(A NaN reward is refused by the rollout's contract check: ``tests/test_rollout.py``.)"""
    from dppo_oat.engines.local.config import DEFAULT_ENV

    plugin = tmp_path / "huge.py"
    plugin.write_text(PLAIN.replace("__ENV_ID__", "mine:Huge-v0").replace("__FLAW__", "")
                      + "\n_step = Puzzle.step\nPuzzle.step = lambda self, action: (_step(self, action)[0], 1e300, "
                        "True, False, {})\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's overflow warnings
        line = one_error(capsys, ["--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"),
                                  "--env-ids", DEFAULT_ENV, "mine:Huge-v0", "--env-module", str(plugin), *SHIPPED],
                         1, "step 1:", "rewards overflow: a turn's return reaches 1e+300")
    assert "diverged" not in line and "scale the env's rewards down" in line


@pytest.mark.fault("every optimizer step of an RL step skipped by the blow-up guard (`--trust-region ipo --tr-kl-tau "
                   "1e30`: the penalty's gradient overflows)",
                   "the run goes on, and one warning line says the guard skipped every update of step N and why "
                   "(metric `guard/all_skipped`); never an exit 0 without a word")
def test_a_step_whose_every_update_is_skipped_is_said_once(tmp_path, capsys):
    """``--trust-region ipo --tr-kl-tau 1e30``: the penalty's gradient overflows, the guard skips every optimizer step
    and the run would end with exit 0 and no word."""
    from dppo_oat.run.safe_io import read_jsonl
    from dppo_oat.train import main

    main(["--runs-dir", str(tmp_path / "runs"), "--run-name", "ipo", "--cache-dir", str(tmp_path / "cache"),
          *SHIPPED, "--steps", "2", "--trust-region", "ipo", "--tr-kl-tau", "1e30"])
    text = " ".join(capsys.readouterr().out.split())
    assert [row["guard/all_skipped"] for row in read_jsonl(tmp_path / "runs" / "ipo" / "metrics.jsonl")] == [1.0, 1.0]
    assert text.count("warning:") == 1 and "step 1: the guard skipped every optimizer step" in text, text
    assert "the gradient norm non-finite" in text and "guard/all_skipped" in text, text
