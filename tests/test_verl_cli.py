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
