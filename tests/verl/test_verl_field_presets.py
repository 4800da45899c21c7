"""The field after DPPO on verl: ``dppo_oat.gspo``, ``dppo_oat.sapo`` and ``dppo_oat.trm_*`` give verl's own
gradients (its ``gspo`` and ``sapo`` losses, and its ``bypass_mode`` loss with PPO-clip and the rollout-correction
rejection ``seq_max_k2`` / ``seq_mean_k3``); the presets verl has no loss for (``ipo``, ``opsm``, ``vaco``,
``minpro``) are the core's loss under their ``dppo_oat.<preset>`` name."""

import math

import pytest
import torch

pytestmark = pytest.mark.verl
pytest.importorskip("verl.trainer.ppo.core_algos")  # not just "verl": that name also finds this tests/verl folder

import test_verl_equality as verl_equality  # noqa: E402  (after pytest.importorskip)

from dppo_oat.trust_region import TrustRegion, policy_loss  # noqa: E402  (after pytest.importorskip)

AGGREGATIONS = verl_equality.AGGREGATIONS


def random_batch(seed, batch=16, length=24, spread=0.3):
    """test_verl_equality's batch, shorter and nearer μ."""
    return verl_equality.random_batch(seed, batch, length, spread)


def gradient(name, mu, logp, advantages, mask, aggregation, config):
    """∂ loss / ∂ log π_θ of the verl policy loss ``name`` in bypass mode (old_log_prob = μ), and its metrics."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    logp = logp.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(old_log_prob=mu, log_prob=logp, advantages=advantages,
                                             response_mask=mask, loss_agg_mode=aggregation, config=config)
    loss.backward()
    return logp.grad, metrics


def batch_info(mask):
    """verl's trainer sets the global batch's token and sequence counts before the loss (``global_batch_info``), so
    a loss that shrinks the mask (verl's rejection sampling) still divides by the original counts."""
    return {"global_batch_info": {"dp_size": 1, "batch_num_tokens": int(mask.sum()),
                                  "global_batch_size": int((mask.sum(-1) > 0).sum())}}


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.05, 0.05)])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_equals_verls_gspo(actor_config, eps, aggregation):
    """verl 0.9.1's ``gspo`` aggregates by ``loss_agg_mode`` (its main branch later forces seq-mean-token-mean)."""
    mu, logp, advantages, mask = random_batch(3, spread=0.05)
    config = actor_config("dppo_oat.gspo", *eps, math.inf)
    ours, metrics = gradient("dppo_oat.gspo", mu, logp, advantages, mask, aggregation, config)
    theirs, verl_metrics = gradient("gspo", mu, logp, advantages, mask, aggregation, config)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-9)
    assert ours.abs().max() > 0 and (ours == 0).sum() > (~mask).sum(), "the batch exercises the sequence clip"
    assert metrics["actor/pg_clipfrac"] == pytest.approx(verl_metrics["actor/pg_clipfrac"], abs=1e-6)


@pytest.mark.parametrize("taus", [(1.0, 1.05), (2.0, 3.0)])
def test_sapo_equals_verls_sapo(actor_config, taus):
    """verl's ``sapo`` aggregates seq-mean-token-mean whatever ``loss_agg_mode``; τ_pos/τ_neg come from verl's own
    ``actor.tau_pos``/``tau_neg``."""
    from dppo_oat.engines.verl.mapping import trust_region_for

    mu, logp, advantages, mask = random_batch(4, spread=0.8)
    config = actor_config("dppo_oat.sapo", actor={"tau_pos": taus[0], "tau_neg": taus[1]})
    assert (trust_region_for("sapo", config).tau_pos, trust_region_for("sapo", config).tau_neg) == taus
    ours, _ = gradient("dppo_oat.sapo", mu, logp, advantages, mask, "seq-mean-token-mean", config)
    theirs, _ = gradient("sapo", mu, logp, advantages, mask, "token-mean", config)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("preset, option", [("trm_max", "seq_max_k2"), ("trm_avg", "seq_mean_k3")])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_trm_equals_verls_bypass_mode_with_rejection(actor_config, preset, option, aggregation):
    """TRM is verl's bypass mode with PPO-clip and the sequence rejection of PR #4544: the same
    ``rollout_rs_threshold`` (the preset's δ, which the loss reads) with ``rollout_rs`` set for verl's loss and null
    for the core's (which masks the responses itself), ``clip_ratio_c`` = ∞ (no dual clip)."""
    tr = TrustRegion.preset(preset)
    mu, logp, advantages, mask = random_batch(7, spread=0.14 if preset == "trm_avg" else 1.2)
    ours_config, theirs_config = (
        actor_config("dppo_oat." + preset, 0.2, 0.2, math.inf, actor=batch_info(mask), rollout_rs=rs,
                     rollout_rs_threshold=tr.delta, loss_type="ppo_clip") for rs in (None, option))
    ours, metrics = gradient("dppo_oat." + preset, mu, logp, advantages, mask, aggregation, ours_config)
    theirs, verl_metrics = gradient("bypass_mode", mu, logp, advantages, mask, aggregation, theirs_config)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-9)
    assert 0 < metrics["dppo/trm/seq_masked_fraction"] < 1, "the batch exercises the sequence mask"
    assert verl_metrics[f"rollout_corr/rollout_rs_{option}_seq_masked_fraction"] > 0


@pytest.mark.parametrize("preset", ["ipo", "opsm", "minpro"])
def test_the_presets_verl_has_no_loss_for_are_the_cores_in_bypass_mode(actor_config, preset):
    from verl.trainer.ppo.core_algos import agg_loss

    from dppo_oat.engines.verl.mapping import trust_region_for

    tr = TrustRegion.preset(preset)
    low, high = (tr.delta, tr.delta) if preset == "ipo" else (tr.eps_low, tr.eps_high)
    mu, logp, advantages, mask = random_batch(9, spread=1.0)
    config = actor_config("dppo_oat." + preset, low, high, math.inf)
    assert trust_region_for(preset, config) == tr
    ours, _ = gradient("dppo_oat." + preset, mu, logp, advantages, mask, "token-mean", config)
    direct = logp.clone().requires_grad_(True)
    agg_loss(policy_loss(direct, mu, advantages, mask, tr).loss, mask, "token-mean").backward()
    torch.testing.assert_close(ours, direct.grad, rtol=1e-6, atol=1e-9)


def test_sapos_temperatures_reach_the_launch():
    from dppo_oat.engines.verl.mapping import hydra_overrides

    overrides = hydra_overrides("sapo", tau_neg=2.0)
    assert "actor_rollout_ref.actor.tau_pos=1.0" in overrides and "actor_rollout_ref.actor.tau_neg=2.0" in overrides
    assert not any("clip_ratio_c" in o for o in overrides)  # SAPO reads no C
