"""Faults of a user's data and plugins, each one ``error:`` line that names the file or plugin and the fix:

- local math data (``local-math:<path>``) whose rows the grader cannot take: refused at validation, naming the file
  and line (or row); answers that mix the forms the loader documents (strings, numbers, lists) are accepted;
- a plugin (``--env-module``) that exits while being imported: refused at validation, naming it.
"""

from __future__ import annotations

import json

import pytest
from datasets import Dataset, DatasetDict
from gem.envs.math_env import MathEnv

import envs
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import validate_config
from envs.math_local import load_math_dataset, math_oracle_action
from test_faults import no_model, one_error, write_math  # noqa: F401  (no_model is a fixture)

GOOD = '{"problem": "1+1?", "answer": "2"}'


def refused(capsys, tmp_path, env_id, *fragments, code=2, flags=()):
    """The command training on ``env_id`` exits with ``code`` and one ``error:`` line holding every fragment, and
    leaves no run directory behind."""
    runs = tmp_path / "runs"
    line = one_error(capsys, ["--run-dir", str(runs), "--env-ids", env_id, *flags], code, *fragments)
    assert not runs.exists() or not any(runs.iterdir()), "a refused command left something behind"
    return line


# --- local math data ------------------------------------------------------------------------------------------------


def test_answers_that_mix_strings_numbers_and_lists_are_accepted(tmp_path):
    """The docstring allows strings, numbers and lists of accepted strings; one file mixing them used to be a pyarrow
    traceback. Every answer becomes a list of strings then, which the grader and the oracle take."""
    env_id = write_math(tmp_path / "mixed.jsonl", [GOOD, '{"problem": "2+2?", "answer": ["4", "four"]}',
                                                   '{"problem": "3+3?", "answer": 6}'])
    validate_config(TrainConfig(env_ids=(env_id,), run_dir=str(tmp_path / "runs")))
    dataset = load_math_dataset(tmp_path / "mixed.jsonl")
    assert dataset["answer"] == [["2"], ["4", "four"], ["6"]]
    assert all(MathEnv.check_correct(f"\\boxed{{{answers[0]}}}", answers) for answers in dataset["answer"])
    env = envs.make_env(env_id, eval=True)  # problems in file order
    env.reset(seed=1)
    assert math_oracle_action(env) == "\\boxed{4}"


def test_numbers_and_strings_mixed_become_strings(tmp_path):
    write_math(tmp_path / "numbers.jsonl", ['{"problem": "3+3?", "answer": 6}', GOOD,
                                            '{"problem": "half?", "answer": 0.5}'])
    assert load_math_dataset(tmp_path / "numbers.jsonl")["answer"] == ["6", "2", "0.5"]


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


def test_another_column_that_mixes_types_is_named(tmp_path, capsys, no_model):
    env_id = write_math(tmp_path / "levels.jsonl", ['{"problem": "1?", "answer": "1", "level": 3}',
                                                    '{"problem": "2?", "answer": "2", "level": "hard"}'])
    refused(capsys, tmp_path, env_id, "levels.jsonl", "column 'level' mixes types of values", "give it one type")


def test_a_json_list_file_names_the_row(tmp_path, capsys, no_model):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"problem": "1+1?", "answer": "2"}, {"problem": 3, "answer": "3"}]))
    refused(capsys, tmp_path, f"local-math:{path}", "rows.json, row 2", "problem")


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_an_empty_file_is_one_line(text, tmp_path, capsys, no_model):
    (tmp_path / "empty.jsonl").write_text(text)
    refused(capsys, tmp_path, f"local-math:{tmp_path / 'empty.jsonl'}", "empty.jsonl", "no rows")


def test_a_saved_set_without_rows_is_one_line(tmp_path, capsys, no_model):
    """A split with no rows used to pass validation and divide by zero at the first reset."""
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


@pytest.mark.parametrize("statement, fragment", [
    ("sys.exit(3)", "called sys.exit(3)"),
    ("sys.exit('bye')", "called sys.exit('bye')"),
    ("raise SystemExit", "called sys.exit(None)"),
])
def test_a_plugin_that_exits_at_import_is_one_line_naming_it(statement, fragment, tmp_path, capsys, no_model):
    """It used to end the command with its exit code and no output at all."""
    plugin = tmp_path / "exits.py"
    plugin.write_text(f"import sys\n\n{statement}\n")
    refused(capsys, tmp_path, "example:Countdown-v0", f"env module {str(plugin)!r}", fragment, "exits.py:3",
            "if __name__", flags=["--env-module", str(plugin)])


def test_ctrl_c_while_a_plugin_imports_is_not_a_plugin_error(tmp_path):
    plugin = tmp_path / "interrupted.py"
    plugin.write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        envs.import_env_modules([str(plugin)])
