"""The top-K set end to end on a real multi-turn Sudoku batch from the shipped policy: what the rollout records at a
token is the top-K of the distribution that sampled it, the learner gathers π at the same ids and position, and with
an identical learner the top-K divergence is ~0 on every token (a one-position shift would make it large)."""

import copy

import numpy as np
import pytest
import torch

from dppo_oat import divergence
from dppo_oat.advantages import group_advantages
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import SHIPPED_POLICIES, policy_cache_key
from dppo_oat.engines.local.trainer import perturb_logprobs
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.models.tiny import load_policy
from dppo_oat.rollout.episodes import EpisodeCollector
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import RolloutSettings, SamplingSettings, UpdateSettings
from dppo_oat.update_batch import build_update_batch
from envs import ensure_registered

K = 20


@pytest.fixture(scope="module")
def rollout():
    config = TrainConfig()
    model, tokenizer = load_policy(SHIPPED_POLICIES / policy_cache_key(
        config.env_ids[0], config.template, config.warm_start, config.warm_start_seed))
    ensure_registered(config.env_ids[0])
    collector = EpisodeCollector(list(config.env_ids), 2, 3, tokenizer,
                                 RolloutSettings(template=config.template, max_prompt_tokens=config.max_prompt_tokens))
    try:
        result = collector.collect(HFGenerator(model, tokenizer), SamplingSettings(12, 0.7, top_k_logprobs=K, seed=1),
                                   [100, 101])
    finally:
        collector.close()
    return model, tokenizer, result


def batch_of(samples, tokenizer):
    advantages = group_advantages([s.reward for s in samples], [s.group_id for s in samples])
    return build_update_batch(samples, advantages, tokenizer.pad_token_id, with_topk=True)


@pytest.mark.parametrize("head", ["fused", "logits"])
def test_an_identical_learner_sees_no_top_k_divergence(rollout, head):
    model, tokenizer, result = rollout
    batch, temperature = batch_of(result.samples, tokenizer), 0.7
    response = batch.response_mask.bool()
    assert response.sum() > 50
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                                 .logits[:, :-1].float() / temperature, -1)
    reference_ids = full.topk(K, -1).indices.sort(-1).values
    assert torch.equal(batch.topk_ids[..., :K].sort(-1).values[response], reference_ids[response])
    shifted = full.roll(1, dims=1).gather(-1, batch.topk_ids.clamp(min=0))  # what an off-by-one would record
    valid = batch.topk_valid & response.unsqueeze(-1)
    assert (shifted - batch.topk_behavior_logp)[valid].abs().mean() > 0.5

    settings = UpdateSettings(aggregation="token-mean", temperature=temperature)
    out = causal_lm_forward(model, settings=settings, lm_head=head)(batch, True)
    top_k = divergence.topk_tv(batch.topk_behavior_logp, out.topk_logp, batch.topk_valid)
    binary = divergence.binary_tv(batch.behavior_logp, out.logp)
    assert top_k[response].max() < 1e-4 and binary[response].max() < 1e-4
    assert ((top_k - binary)[response] >= -1e-6).all()  # top-K ≥ binary (eq:topk_tv vs eq:binary_tv)


def test_logprob_noise_moves_the_tokens_top_k_slot_with_it(rollout):
    """--logprob-noise perturbs μ(a_t) in both places, so binary and top-K rules see one μ."""
    result = copy.deepcopy(rollout[2])
    before = [s.topk_logprobs.copy() for s in result.samples]
    perturb_logprobs(result, 0.5, seed=0)
    for sample, old in zip(result.samples, before, strict=True):
        slot = sample.topk_ids == np.asarray(sample.response_ids)[:, None]
        assert (slot.sum(-1) == 1).all()
        assert np.allclose(sample.topk_logprobs[slot], sample.behavior_logprobs)
        assert np.array_equal(sample.topk_logprobs[~slot], old[~slot])
