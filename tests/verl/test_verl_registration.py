"""Every preset of the core is a verl policy loss named ``dppo_oat.<preset>``, or refused in one line with the
reason."""

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl.trainer.ppo.core_algos")  # not just "verl": that name also finds this tests/verl folder

from dppo_oat.engines.verl.mapping import loss_name, preset_of, refusal  # noqa: E402  (after pytest.importorskip)
from dppo_oat.trust_region import PRESETS, TrustRegion  # noqa: E402  (after pytest.importorskip)


def test_every_preset_is_registered_or_refused(verl_adapter):
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn

    for preset in PRESETS:
        name = loss_name(preset)
        assert (name in verl_adapter.REGISTERED) != (name in verl_adapter.REFUSED), name
        if name in verl_adapter.REGISTERED:
            assert callable(get_policy_loss_fn(name))
            assert verl_adapter.REGISTERED[name] == preset and preset_of(name) == preset
        else:
            assert name not in POLICY_LOSS_REGISTRY
            assert "\n" not in verl_adapter.REFUSED[name] and name in verl_adapter.REFUSED[name]


def test_the_issues_loss_exists_after_import(verl_adapter):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    assert get_policy_loss_fn("dppo_oat.dppo_binary_tv").__name__ == "dppo_policy_loss_dppo_binary_tv"
    assert get_policy_loss_fn("dppo_oat.mask_negative")
    assert get_policy_loss_fn("dppo_tv") is not get_policy_loss_fn("dppo_oat.dppo_binary_tv")  # verl's own untouched


def test_topk_presets_are_refused_with_the_reason(verl_adapter):
    topk = [name for name in PRESETS if TrustRegion.preset(name).uses_topk]
    assert topk, "the core has top-K presets"
    for preset in topk:
        reason = verl_adapter.REFUSED[loss_name(preset)]
        assert "top-K" in reason and "logprobs=0" in reason and "\n" not in reason
        assert refusal(preset) == reason


def test_only_topk_presets_are_refused(verl_adapter):
    refused = {preset_of(name) for name in verl_adapter.REFUSED}
    assert refused == {name for name in PRESETS if TrustRegion.preset(name).uses_topk}


def test_registration_follows_presets_added_later(verl_adapter, monkeypatch):
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    from dppo_oat.trust_region import Preset

    monkeypatch.setitem(PRESETS, "tv_tight", Preset({"rule": "binary_tv", "delta": 0.05}, "a test preset"))
    try:
        assert "dppo_oat.tv_tight" in verl_adapter.register_all()
        assert "dppo_oat.tv_tight" in POLICY_LOSS_REGISTRY
    finally:
        POLICY_LOSS_REGISTRY.pop("dppo_oat.tv_tight", None)
        verl_adapter.REGISTERED.pop("dppo_oat.tv_tight", None)


def test_list_command(verl_adapter, capsys):
    from dppo_oat.engines.verl.__main__ import main

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(PRESETS)
    assert "dppo_oat.dppo_binary_tv: registered" in lines


def test_later_presets_are_registered_but_cppo_on_top_k(verl_adapter):
    for preset in ("drpo", "cppo_binary_tv", "m2po"):
        assert verl_adapter.REGISTERED[loss_name(preset)] == preset
    assert "top-K" in verl_adapter.REFUSED[loss_name("cppo")]


def test_a_refused_top_k_preset_names_its_binary_counterpart(verl_adapter):
    assert verl_adapter.REFUSED[loss_name("cppo")].endswith("use dppo_oat.cppo_binary_tv")
    assert verl_adapter.REFUSED[loss_name("dppo_topk_kl")].endswith("use dppo_oat.dppo_binary_tv or "
                                                                     "dppo_oat.dppo_binary_kl")
