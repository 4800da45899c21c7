"""``--env_module`` on the oat engine: the plugin is imported before the ids are checked (a broken one is one line,
exit 2, before anything launches), and again in every actor and learner process from the pickled arguments (as
``DPPOGemActor.init`` and ``DPPOLearner._init`` do)."""

import os
import pickle
import subprocess
import sys

import pytest

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder

from dppo_oat.engines.oat import launch  # noqa: E402  (after pytest.importorskip)

PLUGIN = '''
from gem.envs.registration import register

import envs
from envs.example_countdown import CountdownEnv

register("mine:OatCountdown-v0", CountdownEnv, max_turns=4)  # unguarded: imported once per process
envs.register_oracle("mine:OatCountdown-v0", lambda env, rng: "\\\\boxed{1 + 1}")
'''
SMALL = ["--pretrain", "some/model", "--gpus", "2", "--rollout_batch_size", "16",
         "--rollout_batch_size_per_device", "8", "--pi_buffer_maxlen_per_device", "16", "--train_batch_size", "8",
         "--num_samples", "4", "--dry_run"]
IN_A_FRESH_PROCESS = """
import pickle, sys
from gem.envs.registration import ENV_REGISTRY
assert "mine:OatCountdown-v0" not in ENV_REGISTRY
args = pickle.loads(open(sys.argv[1], "rb").read())
import envs
envs.import_env_modules(args.env_module)  # what DPPOLearner._init does first
from dppo_oat.engines.oat.learner import eval_seeds_of
print(len(eval_seeds_of(args)))
"""


def test_a_plugins_ids_are_known_to_the_checks_and_to_every_process(tmp_path, capsys):
    plugin = tmp_path / "my_envs.py"
    plugin.write_text(PLUGIN)
    argv = SMALL + ["--env_module", str(plugin), "--env_ids", "mine:OatCountdown-v0", "--num_eval_seeds", "3"]
    launch.main(argv)
    assert "node: 2 GPU(s)" in capsys.readouterr().out
    args, _ = launch.checked_plan(argv)
    (tmp_path / "args.pkl").write_bytes(pickle.dumps(args))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # the launchpad stand-in, where in use
    done = subprocess.run([sys.executable, "-c", IN_A_FRESH_PROCESS, str(tmp_path / "args.pkl")], env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "3"  # the learner's evaluation seeds of the plugin's env


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path, capsys):
    plugin = tmp_path / "broken_envs.py"
    plugin.write_text("raise RuntimeError('no data here')\n")
    with pytest.raises(SystemExit) as stopped:
        launch.main(SMALL + ["--env_module", str(plugin)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert "RuntimeError: no data here (broken_envs.py:1)" in err


BROKEN_STEP = '''
from gem.envs.registration import register

from envs.example_countdown import CountdownEnv


class ThreeValues(CountdownEnv):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated


register("mine:OatThreeValues-v0", ThreeValues, max_turns=4)
'''


@pytest.mark.fault("oat engine: a plugin env that breaks Gem's contract",
                   "the local engine's one line, before anything launches (exit 2)")
def test_a_plugin_env_that_breaks_gems_contract_is_one_line_before_anything_launches(tmp_path, capsys):
    """The same probe as the local engine's (made, reset and stepped once), in the launcher's checks."""
    plugin = tmp_path / "three_values.py"
    plugin.write_text(BROKEN_STEP)
    with pytest.raises(SystemExit) as stopped:
        launch.main(SMALL + ["--env_module", str(plugin), "--env_ids", "mine:OatThreeValues-v0"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "mine:OatThreeValues-v0" in err and "step() returned 3 values" in err
