"""The wandb guard the local and oat engines run before any model loads (``--wandb`` locally, ``--use_wb`` on oat): it
refuses exactly where wandb could not log without asking for a key, with real wandb reading a real environment and
netrc."""

import pytest

from dppo_oat.run.log import check_wandb

pytest.importorskip("wandb")  # the dev extra installs it


@pytest.fixture
def fresh_machine(monkeypatch, tmp_path):
    """No WANDB_API_KEY, an empty netrc, online mode."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_no_api_key_is_refused_with_what_to_do(fresh_machine):
    with pytest.raises(ValueError, match=r"--use_wb: wandb has no API key here: run `wandb login`, or set "
                                         r"WANDB_API_KEY, or WANDB_MODE=offline \(or leave --use_wb out\)"):
        check_wandb("--use_wb")


def test_an_api_key_in_the_environment_passes(fresh_machine, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_wandb("--use_wb")


def test_the_netrc_that_wandb_login_writes_passes(fresh_machine):
    fresh_machine.write_text(f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    fresh_machine.chmod(0o600)
    check_wandb("--use_wb")


@pytest.mark.parametrize("mode", ["offline", "disabled"])
def test_offline_modes_need_no_key(fresh_machine, monkeypatch, mode):
    monkeypatch.setenv("WANDB_MODE", mode)
    check_wandb("--wandb")
