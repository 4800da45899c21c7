"""The launch example composes: verl's own Hydra config with ``scripts/verl/math.sh``'s overrides passes verl's
``validate_config`` and the adapter's checks on a CPU, without Ray; every registered preset's overrides give back the
preset's own numbers and anchor; the data script writes rows verl's reward scores."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl.trainer.ppo.core_algos")  # not just "verl": that name also finds this tests/verl folder

from dppo_oat.engines.verl.mapping import hydra_overrides, rollout_correction_of, trust_region_for  # noqa: E402  (after pytest.importorskip)
from dppo_oat.trust_region import TrustRegion  # noqa: E402  (after pytest.importorskip)

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "scripts" / "verl" / "math.sh"
BASE = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.rollout.n=4", "trainer.n_gpus_per_node=1",
        "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=grpo"]


def test_every_registered_preset_composes_to_itself(verl_adapter):
    from verl.utils.config import omega_conf_to_dataclass

    from dppo_oat.engines.verl.preflight import check, compose

    for name, preset in verl_adapter.REGISTERED.items():
        config = compose(hydra_overrides(preset) + BASE)
        assert check(config).startswith(name + ": ")
        actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)  # as verl's workers build it
        assert trust_region_for(preset, actor) == TrustRegion.preset(preset), preset
        bypass = rollout_correction_of(actor)["bypass_mode"]
        assert bypass == (not TrustRegion.preset(preset).needs_recompute), preset


@pytest.mark.parametrize("drop, message", [
    ("actor_rollout_ref.model.external_lib=", "external_lib=dppo_oat.engines.verl"),
    ("+actor_rollout_ref.actor.policy_loss.rollout_correction=", "mirror the rollout correction"),
])
def test_check_refuses_a_launch_missing_a_piece(verl_adapter, drop, message):
    from dppo_oat.engines.verl.preflight import check, compose

    overrides = [o for o in hydra_overrides("dppo_binary_tv") if not o.startswith(drop)]
    with pytest.raises(ValueError, match=message):
        check(compose(overrides + BASE))


def test_check_refuses_the_legacy_trainer(verl_adapter):
    from dppo_oat.engines.verl.preflight import check, compose

    with pytest.raises(ValueError, match="use_v1=true"):
        check(compose(hydra_overrides("dppo_binary_tv") + BASE + ["trainer.use_v1=false"]))


def run_launch(tmp_path, *args, **env):
    environment = {**os.environ, "PYTHON": sys.executable, "DATA": str(tmp_path), "DRY_RUN": "1", **env}
    return subprocess.run(["bash", str(LAUNCH), *args], capture_output=True, text=True, env=environment, cwd=ROOT,
                          timeout=300)


@pytest.mark.parametrize("args, expected", [
    ((), "dppo_oat.dppo_binary_tv: rule=binary_tv, delta=0.2, is_cap=5.0 in bypass mode"),
    (("minirl", "trainer.total_epochs=1", "actor_rollout_ref.rollout.n=4"),
     "dppo_oat.minirl: rule=ratio, eps_low=0.2, eps_high=0.28, is_cap=inf, anchor=recompute in decoupled mode"),
])
def test_launch_example_composes(tmp_path, args, expected):
    result = run_launch(tmp_path, *args, NNODES="4")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert expected in lines[-2]
    command = lines[-1]
    assert "-m verl.trainer.main_ppo" in command and "trainer.nnodes=4" in command
    assert "actor_rollout_ref.model.external_lib=dppo_oat.engines.verl" in command


def test_launch_example_with_trust_region_fields(tmp_path):
    result = run_launch(tmp_path, "dppo_binary_kl", TR="delta=0.1 is_cap=inf")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rule=binary_kl, delta=0.1, is_cap=inf in bypass mode" in result.stdout


def test_launch_example_refuses_topk_in_one_line(tmp_path):
    result = run_launch(tmp_path, "dppo_topk_tv")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "top-K" in errors[0]
    assert "main_ppo" not in result.stdout


def test_prepare_math_writes_rows_verl_scores(tmp_path):
    from datasets import Dataset, load_dataset
    from verl.utils.reward_score import default_compute_score

    Dataset.from_list([{"input": "What is 1+1?", "gt_answer": "2"},
                       {"input": "What is 2*3?", "gt_answer": "6"}]).save_to_disk(str(tmp_path / "set"))
    script = ROOT / "scripts" / "verl" / "prepare_math.py"
    out = tmp_path / "parquet"
    result = subprocess.run([sys.executable, str(script), "--train", str(tmp_path / "set"), "--test",
                             str(tmp_path / "set"), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = load_dataset("parquet", data_files=str(out / "train.parquet"), split="train")
    assert len(rows) == 2 and rows[0]["prompt"][0]["role"] == "user" and "\\boxed{}" in rows[0]["prompt"][0]["content"]
    row = rows[1]
    assert default_compute_score(row["data_source"], "so \\boxed{6}", row["reward_model"]["ground_truth"]) == 1.0
    assert default_compute_score(row["data_source"], "so \\boxed{7}", row["reward_model"]["ground_truth"]) == 0.0


@pytest.mark.fault("verl engine: `python -m dppo_oat.engines.verl check` with an override Hydra cannot parse "
                   "(`garbage`, `a.b=[1,`), one verl's config refuses, or `loss_mode=dppo_oat.nosuch`",
                   "one line on stderr saying which override and why (exit 2); an unknown dppo_oat loss mode is named "
                   "before verl's own checks run")
@pytest.mark.parametrize("overrides, fragment", [
    (["garbage"], "garbage"),
    (["a.b=[1,"], "a.b=[1,"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=dppo_oat.nosuch"], "unknown trust-region preset 'nosuch'"),
    (["trainer.no_such_key=1"], "no_such_key"),
])
def test_check_refuses_a_bad_override_in_one_line(verl_adapter, overrides, fragment, capsys):
    from dppo_oat.engines.verl.__main__ import main

    assert main(["check", *overrides]) == 2
    out = capsys.readouterr()
    assert not out.out and out.err.count("\n") == 1 and out.err.startswith("error: ") and fragment in out.err, out


@pytest.mark.parametrize("override", ["garbage", "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_oat.nosuch"])
def test_launch_example_refuses_a_bad_override_in_one_line(tmp_path, override):
    result = run_launch(tmp_path, "dppo_binary_tv", override)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "main_ppo" not in result.stdout


TRM_THRESHOLD = "algorithm.rollout_correction.rollout_rs_threshold"


@pytest.mark.fault("a verl launch of `dppo_oat.trm_max` (or `trm_avg`, `opsm`, `vaco`) that sets "
                   "`algorithm.rollout_correction.rollout_rs_threshold=5.0`",
                   "the loss's δ is 5.0 (`check` says `delta=5.0`); with verl's own `rollout_rs` beside it, `check` "
                   "and the loss refuse in one line: set `rollout_rs=null` (it would mask the responses twice)")
@pytest.mark.parametrize("preset", ["trm_max", "trm_avg", "opsm", "vaco"])
def test_a_users_rejection_threshold_is_the_sequence_masks_delta(verl_adapter, preset):
    from verl.utils.config import omega_conf_to_dataclass

    from dppo_oat.engines.verl.preflight import check, compose

    config = compose(hydra_overrides(preset) + BASE + [f"{TRM_THRESHOLD}=5.0"])
    assert "delta=5.0" in check(config).splitlines()[-1]
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert trust_region_for(preset, actor) == TrustRegion.preset(preset).replace(delta=5.0)
    twice = compose(hydra_overrides(preset) + BASE + [f"{TRM_THRESHOLD}=5.0",
                                                       "algorithm.rollout_correction.rollout_rs=seq_max_k2"])
    with pytest.raises(ValueError, match="set rollout_rs=null") as excinfo:
        check(twice)
    assert "\n" not in str(excinfo.value)


def test_overrides_with_a_delta_give_back_that_delta(verl_adapter):
    from verl.utils.config import omega_conf_to_dataclass

    from dppo_oat.engines.verl.preflight import compose

    for preset in ("trm_max", "trm_avg", "opsm", "vaco"):
        config = compose(hydra_overrides(preset, delta=0.5) + BASE)
        actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        assert trust_region_for(preset, actor).delta == 0.5, preset


@pytest.mark.fault("`python -m dppo_oat.engines.verl check …` of a config that verl's own `validate_config` passes "
                   "and the adapter refuses",
                   "only the `error:` line (exit 2): verl's \"All configuration checks passed successfully!\" is "
                   "printed only when every check passes")
def test_check_says_success_only_when_every_check_passes(verl_adapter):
    overrides = [o for o in hydra_overrides("dppo_binary_tv") if not o.startswith("actor_rollout_ref.model.external")]
    done = subprocess.run([sys.executable, "-m", "dppo_oat.engines.verl", "check", *overrides, *BASE],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "passed" not in done.stdout, done.stdout
    assert done.stderr.count("error:") == 1 and "external_lib" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "dppo_oat.engines.verl", "check", *hydra_overrides("dppo_binary_tv"),
                           *BASE], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("dppo_oat.dppo_binary_tv: "), done.stdout


@pytest.mark.parametrize("override, name", [
    ("actor_rollout_ref.actor.tau_pos=1e300", "actor_rollout_ref.actor.tau_pos"),
    (f"{TRM_THRESHOLD}=1e39", TRM_THRESHOLD),
])
def test_check_refuses_a_number_past_float32(verl_adapter, override, name):
    from dppo_oat.engines.verl.preflight import check, compose

    preset = "sapo" if "tau_pos" in override else "trm_max"
    with pytest.raises(ValueError, match=rf"{name} 1e\+(300|39) overflows float32"):
        check(compose(hydra_overrides(preset) + BASE + [override]))
