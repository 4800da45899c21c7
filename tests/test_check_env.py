"""``python -m dppo_oat.check_env``: the env contract as a command of the package, on a plugin that meets it, one
that breaks it, and bad input (tests/test_envs_quickstart.py runs it as envs/README.md gives it, without pytest)."""

from __future__ import annotations

import pytest
from test_env_plugins import write_guess_plugin

from dppo_oat.check_env import main


def test_a_plugin_that_meets_the_contract_passes(tmp_path, capsys):
    plugin = write_guess_plugin(tmp_path, "mine:GuessCommand-v0")
    assert main(["--env-module", str(plugin)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "env contract checked 1 env id: mine:GuessCommand-v0; 1 passed, 0 failed",
        "env contract: of them from --env-module / --env-ids: mine:GuessCommand-v0"]


def test_a_flawed_plugin_fails_with_one_line_per_broken_check(tmp_path, capsys):
    plugin = write_guess_plugin(tmp_path, "mine:GuessCommandFlawed-v0", flaw="reset ignores its seed")
    assert main(["--env-module", str(plugin)]) == 1
    out = capsys.readouterr().out.splitlines()
    broken = [line for line in out if line.startswith("env mine:GuessCommandFlawed-v0: ")]
    assert broken and all(": reset(seed) fixes the episode: " in line or ": group slots play" in line
                          for line in broken), out
    assert out[-2].endswith("0 passed, 1 failed")


@pytest.mark.fault("`python -m dppo_oat.check_env --env-module my_envs.py` on a file that is not there, an id Gem "
                   "does not know, a plugin that registers no env, or a `--min-win-rate` outside [0, 1]",
                   "one `error:` line naming it (exit 2), before any env is played")
@pytest.mark.parametrize("args, message", [
    (["--env-module", "missing.py"], "error: env module 'missing.py': no such file"),
    (["--env-ids", "mine:Nowhere-v0"], "error: unknown env id 'mine:Nowhere-v0'"),
    (["--env-module", "empty.py"], "error: --env-module empty.py registered no env id"),
    (["--min-win-rate", "2"], "error: --min-win-rate must be in [0, 1], got 2.0"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, capsys, args, message):
    (tmp_path / "empty.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and len(captured.err.splitlines()) == 1 and captured.out == ""
