"""Shared test settings. In CI (CI=true) hypothesis runs derandomized so that a red run can be replayed."""

import os
import sys

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model is built: the error must come before."""
    import dppo_oat.engines.local.trainer as trainer_module

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the input was validated")

    monkeypatch.setattr(trainer_module, "load_or_build_tiny_policy", refuse)
    monkeypatch.setattr(trainer_module, "load_pretrained", refuse)


CONTRACT_TEST = "test_env_contract.py::test_has_an_oracle["
"""The contract test that runs once per env id: its ids name the envs the contract covered."""


def contract_env_ids(reports) -> list[str]:
    """The env ids the contract test ran on (in ``reports``' order), from the ids of ``test_has_an_oracle``."""
    ids = [report.nodeid.split(CONTRACT_TEST, 1)[1][:-1] for report in reports
           if getattr(report, "when", None) == "call" and CONTRACT_TEST in report.nodeid]
    return list(dict.fromkeys(ids))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After the env contract test, one line (shown with ``-q`` too) naming every env id it checked, and those the
    user's ``DPPO_ENV_MODULES`` / ``DPPO_CONTRACT_ENV_IDS`` added."""
    reports = [report for outcome in terminalreporter.stats.values() for report in outcome
               if hasattr(report, "nodeid")]
    checked = contract_env_ids(reports)
    if not checked:
        return
    contract = sys.modules.get("test_env_contract")
    yours = [env_id for env_id in checked if contract is not None and env_id in contract.USER_ENV_IDS]
    terminalreporter.write_line(f"env contract checked {len(checked)} env ids: {', '.join(checked)}")
    terminalreporter.write_line(f"env contract: of them from DPPO_ENV_MODULES / DPPO_CONTRACT_ENV_IDS: "
                                f"{', '.join(yours) or 'none'}")
