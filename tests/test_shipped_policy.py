"""The warm-started tiny policy shipped with the package is the one the default run would build, and it loads."""

import json

import pytest
from rich.console import Console

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import (
    SHIPPED_POLICIES,
    load_or_build_tiny_policy,
    policy_cache_key,
    validation_success,
)


def default_key(config: TrainConfig) -> str:
    return policy_cache_key(config.env_ids[0], config.template, config.warm_start, config.warm_start_seed)


def test_the_default_run_finds_the_shipped_policy(tmp_path):
    """With an empty cache, the default settings load the shipped policy (no warm start); a stale one (other
    warm-start settings or format) would be named here."""
    config = TrainConfig(cache_dir=str(tmp_path))
    shipped = SHIPPED_POLICIES / default_key(config)
    assert (shipped / "warm_start.json").is_file(), (
        f"no shipped policy {shipped.name}: rebuild it (dppo_oat/policies/README.md)")
    console = Console(record=True, width=200)
    model, tokenizer = load_or_build_tiny_policy(config, console)
    assert "shipped with the package" in console.export_text()
    assert not (tmp_path / "policies").exists()
    assert sum(p.numel() for p in model.parameters()) > 1e5 and tokenizer.eos_token_id is not None


@pytest.mark.slow
def test_the_shipped_policy_solves_what_its_record_says(tmp_path):
    """Its recorded validation success (the warm start's last check) is reproduced on the same validation puzzles."""
    config = TrainConfig(cache_dir=str(tmp_path))
    record = json.loads((SHIPPED_POLICIES / default_key(config) / "warm_start.json").read_text())
    assert record["success"] >= config.warm_start.target_success
    model, tokenizer = load_or_build_tiny_policy(config, Console(quiet=True))
    assert validation_success(config, model, tokenizer) == pytest.approx(record["success"], abs=0.1)
