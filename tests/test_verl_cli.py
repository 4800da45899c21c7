"""The verl engine's command line where verl is not installed (this environment): the mapping imports, ``list`` and
``overrides`` work, ``check`` says in one line that it needs verl, and every bad field override is one line."""

import subprocess
import sys

import pytest


def verl_cli(*args):
    done = subprocess.run([sys.executable, "-m", "dppo_oat.engines.verl", *args], capture_output=True, text=True,
                          timeout=120)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(autouse=True)
def without_verl():
    from dppo_oat.engines.verl import verl_installed

    if verl_installed():
        pytest.skip("verl is installed here (tests/verl covers that environment)")


@pytest.mark.fault("`python -m dppo_oat.engines.verl list` or `overrides`, or importing "
                   "`dppo_oat.engines.verl.mapping`, where verl is not installed",
                   "they work (the mapping needs no verl); `check` says in one line that it needs verl (`pip install "
                   "'dppo_oat[verl]'`, exit 2)")
def test_the_mapping_and_its_commands_need_no_verl():
    from dppo_oat.engines.verl.mapping import hydra_overrides

    assert "actor_rollout_ref.model.external_lib=dppo_oat.engines.verl" in hydra_overrides("dppo_binary_tv")
    code, out, err = verl_cli("list")
    assert code == 0 and "dppo_oat.dppo_binary_tv: registered" in out and "dppo_oat.dppo_topk_tv is refused" in out
    code, out, err = verl_cli("check", "trainer.use_v1=true")
    assert code == 2 and err.strip().count("\n") == 0 and err.startswith("error: check") and "dppo_oat[verl]" in err


@pytest.mark.fault("`python -m dppo_oat.engines.verl overrides dppo_binary_tv delta=nan` (or `delta=abc`, `delta=`, "
                   "`=0.2`)",
                   "one line on stderr naming the pair: a trust-region field takes a number (exit 2)")
@pytest.mark.parametrize("pair", ["delta=nan", "delta=abc", "delta=", "=0.2", "delta"])
def test_a_bad_field_override_is_one_line(pair):
    code, out, err = verl_cli("overrides", "dppo_binary_tv", pair)
    assert code == 2 and not out and err.count("\n") == 1 and err.startswith("error: ") and pair in err, err


@pytest.mark.fault("`python -m dppo_oat.engines.verl overrides dppo_binary_tv tr_calibrate=0.1` (or `tr_delta=0.1`, "
                   "a name that is no TrustRegion field)",
                   "one line naming the fields it takes, and the field meant (`delta=`) or, for calibration, the "
                   "offline route (exit 2); never a flag spelled `--tr-tr-calibrate`")
@pytest.mark.parametrize("pair, hint", [("tr_calibrate=0.1", "calibrate offline (python -m dppo_oat.calibrate"),
                                        ("calibrate_like=1", "calibrate offline"), ("tr_delta=0.1", "write delta="),
                                        ("gamma=0.5", "names one of delta, eps_low")])
def test_a_name_that_is_no_trust_region_field_is_one_line(pair, hint):
    code, out, err = verl_cli("overrides", "dppo_binary_tv", pair)
    assert code == 2 and not out and err.count("\n") == 1, err
    assert f"{pair.split('=')[0]} is no TrustRegion field" in err and hint in err and "--tr-tr" not in err, err


@pytest.mark.fault("`python -m dppo_oat.engines.verl overrides sapo tau_pos=2 tau_pos=3` (a field given twice)",
                   "one line naming the field and both values: give each field once (exit 2); the last one never "
                   "silently wins")
def test_a_field_given_twice_is_one_line():
    code, out, err = verl_cli("overrides", "sapo", "tau_pos=2", "tau_pos=3")
    assert code == 2 and not out and err.count("\n") == 1, err
    assert "tau_pos is given twice" in err and "tau_pos=3" in err, err


@pytest.mark.fault("`python -m dppo_oat.engines.verl overrides trm_max delta=0.5` (also `trm_avg`, `opsm`, `vaco`)",
                   "the overrides carry δ as `algorithm.rollout_correction.rollout_rs_threshold=0.5` with "
                   "`rollout_rs=null` (the loss masks the responses, verl does not mask them again)")
@pytest.mark.parametrize("preset", ["trm_max", "trm_avg", "opsm", "vaco"])
def test_the_delta_of_a_sequence_mask_goes_to_verls_rejection_threshold(preset):
    code, out, err = verl_cli("overrides", preset, "delta=0.5")
    assert code == 0, err
    lines = out.splitlines()
    assert "algorithm.rollout_correction.rollout_rs_threshold=0.5" in lines and \
        "algorithm.rollout_correction.rollout_rs=null" in lines, out


@pytest.mark.parametrize("pair", ["tau_pos=1e300", "tau_neg=1e-300"])
def test_an_override_past_float32_is_one_line(pair):
    code, out, err = verl_cli("overrides", "sapo", pair)
    assert code == 2 and not out and err.count("\n") == 1 and "float32" in err and pair.split("=")[0] in err, err
