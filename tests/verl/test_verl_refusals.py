"""What verl cannot run faithfully is refused in one line that says what to change, never run with the wrong anchor."""

import math

import pytest
import torch

pytestmark = pytest.mark.verl
pytest.importorskip("verl.trainer.ppo.core_algos")  # not just "verl": that name also finds this tests/verl folder

from dppo_oat.engines.verl.mapping import hydra_overrides  # noqa: E402  (after pytest.importorskip)


def call(actor_config, preset, weights=None, **config):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    g = torch.Generator().manual_seed(0)
    mu = torch.log_softmax(torch.randn(4, 8, 5, generator=g), -1)[..., 0]
    logp = mu + 0.1 * torch.randn(4, 8, generator=g)
    return get_policy_loss_fn("dppo_oat." + preset)(
        old_log_prob=mu, log_prob=logp, advantages=torch.randn(4, 8, generator=g),
        response_mask=torch.ones(4, 8, dtype=torch.bool), loss_agg_mode="token-mean",
        config=actor_config("dppo_oat." + preset, **config), rollout_is_weights=weights)


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_one_delta_per_rule(actor_config):
    with pytest.raises(ValueError) as excinfo:
        call(actor_config, "dppo_binary_tv", low=0.15, high=0.2)
    assert "clip_ratio_low = actor.clip_ratio_high" in one_line(excinfo)


def test_mu_anchored_rule_outside_bypass_mode(actor_config):
    with pytest.raises(ValueError) as excinfo:
        call(actor_config, "dppo_binary_tv", bypass=False)
    assert "anchored on μ" in one_line(excinfo) and "bypass_mode=true" in one_line(excinfo)


def test_mu_anchored_rule_given_is_weights(actor_config):
    with pytest.raises(ValueError) as excinfo:
        call(actor_config, "dppo_binary_tv", weights=torch.ones(4, 8))
    assert "old_log_prob is not μ" in one_line(excinfo)


def test_recompute_rule_in_bypass_mode(actor_config):
    with pytest.raises(ValueError) as excinfo:
        call(actor_config, "minirl", high=0.28, bypass=True)
    assert "bypass_mode=false" in one_line(excinfo)


@pytest.mark.parametrize("correction", [{"rollout_is": None},
                                        {"rollout_is": "sequence", "rollout_is_threshold": math.inf},
                                        {"rollout_is": "token", "rollout_is_threshold": 2.0},
                                        {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
                                        {"rollout_is": "token", "rollout_is_threshold": math.inf,
                                         "rollout_is_batch_normalize": True}])
def test_recompute_rule_needs_untruncated_token_weights(actor_config, correction):
    with pytest.raises(ValueError) as excinfo:
        call(actor_config, "minirl", high=0.28, bypass=False, weights=torch.ones(4, 8), **correction)
    assert "rollout_is=token, rollout_is_threshold=inf" in one_line(excinfo)


def test_recompute_rule_without_weights(actor_config):
    with pytest.raises(ValueError) as excinfo:
        call(actor_config, "minirl", high=0.28, bypass=False, rollout_is="token", rollout_is_threshold=math.inf)
    assert "needs μ" in one_line(excinfo)


def test_unmirrored_config_is_refused(verl_adapter):
    """Without the launch's mirror the actor sees verl's default rollout correction (decoupled mode)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig, PolicyLossConfig

    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         policy_loss=PolicyLossConfig(loss_mode="dppo_oat.ppo"))
    with pytest.raises(ValueError) as excinfo:
        get_policy_loss_fn("dppo_oat.ppo")(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2),
                                           torch.ones(1, 2, dtype=torch.bool), "token-mean", config, None)
    assert "bypass_mode=true" in one_line(excinfo)


def test_overrides_refuse_topk_and_unsettable_fields(verl_adapter):
    with pytest.raises(ValueError) as excinfo:
        hydra_overrides("dppo_topk_tv")
    assert "refused" in one_line(excinfo)
    with pytest.raises(ValueError) as excinfo:
        hydra_overrides("relax_low", alpha=0.2)
    assert "no field for alpha" in one_line(excinfo)
    with pytest.raises(ValueError):
        hydra_overrides("no_such_preset")


def test_cli_exits_2_with_one_line(verl_adapter, capsys):
    from dppo_oat.engines.verl.__main__ import main

    assert main(["overrides", "dppo_topk_kl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: dppo_oat.dppo_topk_kl is refused") and "\n" not in err
