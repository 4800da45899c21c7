"""The adapter's losses against verl's own: exactly verl's ``dppo_tv``/``dppo_kl`` gradients on μ-anchored batches
(bypass mode, C = ∞), and the core's own gradients in decoupled mode (μ recovered from verl's token IS weights)."""

import math

import pytest
import torch

pytestmark = pytest.mark.verl
pytest.importorskip("verl.trainer.ppo.core_algos")  # not just "verl": that name also finds this tests/verl folder

from dppo_oat.engines.verl.mapping import DELTA_RULES  # noqa: E402  (after pytest.importorskip)
from dppo_oat.trust_region import PRESETS, TrustRegion, policy_loss  # noqa: E402  (after pytest.importorskip)

AGGREGATIONS = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def random_batch(seed, batch=16, length=48, spread=0.6):
    """μ over a range of probabilities, π_θ near it (some tokens far enough to be masked), mixed-sign A, padding."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.log_softmax(2 * torch.randn(batch, length, 8, generator=g), -1)[..., 0]
    logp = (mu + spread * torch.randn(batch, length, generator=g)).clamp(max=-1e-4)
    advantages = torch.randn(batch, 1, generator=g).expand(batch, length).contiguous()
    advantages[0] = 0.0
    mask = torch.rand(batch, length, generator=g) > 0.2
    return mu, logp, advantages, mask


def gradient(fn, mu, logp, advantages, mask, aggregation, config, weights=None):
    """∂ loss / ∂ log π_θ of one verl policy-loss call, and its metrics."""
    logp = logp.clone().requires_grad_(True)
    loss, metrics = fn(old_log_prob=mu, log_prob=logp, advantages=advantages, response_mask=mask,
                       loss_agg_mode=aggregation, config=config, rollout_is_weights=weights)
    loss.backward()
    return logp.grad, metrics


@pytest.mark.parametrize("ours, theirs, delta", [("dppo_oat.dppo_binary_tv", "dppo_tv", 0.15),
                                                 ("dppo_oat.dppo_binary_kl", "dppo_kl", 0.05)])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", range(3))
def test_gradients_equal_verls_dppo_exactly(actor_config, ours, theirs, delta, aggregation, seed):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    mu, logp, advantages, mask = random_batch(seed)
    config = actor_config(ours, delta, delta, math.inf)
    grad_ours, metrics = gradient(get_policy_loss_fn(ours), mu, logp, advantages, mask, aggregation, config)
    grad_theirs, _ = gradient(get_policy_loss_fn(theirs), mu, logp, advantages, mask, aggregation, config)
    assert (grad_ours - grad_theirs).abs().max().item() == 0.0
    assert 0 < metrics["dppo/mask/fraction"] < 0.5, "the batch exercises the mask"
    assert grad_ours.abs().max() > 0


def test_finite_cap_truncates_like_verl(actor_config):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    mu, logp, advantages, mask = random_batch(7, spread=1.0)
    config = actor_config("dppo_oat.dppo_binary_tv", 0.15, 0.15, 1.5)
    ours, _ = gradient(get_policy_loss_fn("dppo_oat.dppo_binary_tv"), mu, logp, advantages, mask, "token-mean", config)
    theirs, _ = gradient(get_policy_loss_fn("dppo_tv"), mu, logp, advantages, mask, "token-mean", config)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-9)


def test_metrics_reach_verl_under_dppo(actor_config):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    mu, logp, advantages, mask = random_batch(3)
    config = actor_config("dppo_oat.mask_negative", 0.5, 0.5)
    _, metrics = gradient(get_policy_loss_fn("dppo_oat.mask_negative"), mu, logp, advantages, mask, "token-mean",
                          config)
    for key in ("dppo/mask/fraction_neg_adv", "dppo/mismatch/abs_diff_mean", "dppo/bad_update/fraction",
                "dppo/shadow/ppo/mask_fraction", "dppo/shadow/grpo_clip_higher/mask_fraction_mu_lt_0.1",
                "actor/pg_clipfrac", "actor/ppo_kl"):
        assert isinstance(metrics[key], float), key
    assert metrics["dppo/mask/fraction_pos_adv"] == 0.0  # mask_negative never blocks A > 0


@pytest.mark.parametrize("preset", ["minirl", "minirl_tis", "dppo_binary_tv_recompute", "tis", "seq_tis", "icepop",
                                    "seq_geo_mask", "decoupled_ppo", "vaco"])
def test_decoupled_mode_recovers_mu_from_verls_is_weights(actor_config, preset):
    """verl's decoupled mode hands π_θ' as old_log_prob and π_θ'/μ as untruncated token IS weights (computed here
    by verl's own rollout_corr_helper); the loss equals the core's called with μ and π_θ' directly."""
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    from dppo_oat.engines.verl.mapping import trust_region_for

    if preset not in PRESETS:
        pytest.skip(f"the core has no preset {preset}")
    mu, recomputed, advantages, mask = random_batch(11, spread=0.3)
    noise = torch.randn(recomputed.shape, generator=torch.Generator().manual_seed(5))
    logp = (recomputed + 0.2 * noise).clamp(max=-1e-4)
    weights, new_mask, _ = compute_rollout_correction_and_rejection_mask(
        old_log_prob=recomputed, rollout_log_prob=mu, response_mask=mask, rollout_is="token",
        rollout_is_threshold=math.inf)
    assert torch.equal(new_mask, mask)
    high = 0.2 if TrustRegion.preset(preset).rule in DELTA_RULES else 0.28
    config = actor_config("dppo_oat." + preset, 0.2, high, 3.0, bypass=False, rollout_is="token",
                          rollout_is_threshold=math.inf)
    ours, _ = gradient(get_policy_loss_fn("dppo_oat." + preset), recomputed, logp, advantages, mask, "token-mean",
                       config, weights.batch["rollout_is_weights"])
    direct = logp.clone().requires_grad_(True)
    out = policy_loss(direct, mu, advantages, mask, trust_region_for(preset, config), recomputed_logp=recomputed)
    agg_loss(out.loss, mask, "token-mean").backward()
    torch.testing.assert_close(ours, direct.grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("preset", ["drpo", "cppo_binary_tv", "m2po"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_later_presets_are_the_cores_loss_in_bypass_mode(actor_config, preset, aggregation):
    """DRPO, CPPO-Binary-TV and M2PO read μ only: in bypass mode verl's call is the core's policy_loss with δ and C
    from verl's fields (DRPO's δ = 12.5 and CPPO's 0.15 through clip_ratio_low/high), reduced by verl's agg_loss; each
    reports its own metrics."""
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn

    from dppo_oat.engines.verl.mapping import trust_region_for

    tr = TrustRegion.preset(preset)
    delta = tr.delta if preset != "m2po" else 0.2  # M2PO reads no δ: verl's clip fields leave it unchanged
    mu, logp, advantages, mask = random_batch(13, spread=0.3)
    config = actor_config("dppo_oat." + preset, delta, delta, math.inf)
    assert trust_region_for(preset, config) == tr
    ours, metrics = gradient(get_policy_loss_fn("dppo_oat." + preset), mu, logp, advantages, mask, aggregation, config)
    direct = logp.clone().requires_grad_(True)
    agg_loss(policy_loss(direct, mu, advantages, mask, tr).loss, mask, aggregation).backward()
    torch.testing.assert_close(ours, direct.grad, rtol=1e-6, atol=1e-9)
    own = {"drpo": "dppo/drpo/weight_mean", "cppo_binary_tv": "dppo/cppo/budget_mask_fraction",
           "m2po": "dppo/m2po/m2_before"}[preset]
    assert isinstance(metrics[own], float)
    if preset != "drpo":
        assert 0 < metrics["actor/pg_clipfrac"] < 0.5, "the batch exercises the mask"
