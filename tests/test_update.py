"""The core update loop on a real tiny model: direction of the update, masked tokens, micro-batching, anchors."""

import copy

import pytest
import torch

from dppo_oat.advantages import group_advantages
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.update import minibatch_step, recompute_logprobs, update_policy
from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import SamplingSettings, UpdateSettings
from dppo_oat.trust_region import TrustRegion, policy_loss
from dppo_oat.update_batch import TurnSample, build_update_batch


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)


def sampled_batch(policy, n=6, top_k=0, seed=0):
    """Real samples of the tiny model (μ from the generator) with alternating rewards in two groups."""
    model, tokenizer = policy
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][:12] for t in toy_corpus(n, seed=seed + 1)]
    completions = HFGenerator(model, tokenizer).generate(prompts, SamplingSettings(6, top_k_logprobs=top_k, seed=seed))
    samples = [
        TurnSample(prompt_ids=p, response_ids=c.token_ids, behavior_logprobs=c.logprobs, reward=float(i % 2),
                   done=True, truncated=False, turn=0, env_id="toy", episode_id=i, group_id=str(i // 3),
                   finish_reason=c.finish_reason, topk_ids=c.topk_ids, topk_logprobs=c.topk_logprobs)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    advantages = group_advantages([s.reward for s in samples], [s.group_id for s in samples])
    return samples, build_update_batch(samples, advantages, tokenizer.pad_token_id, with_topk=top_k > 0)


def response_logp(model, batch):
    with torch.no_grad():
        return causal_lm_forward(model)(batch, False).logp


def sgd_update(model, batch, tr, settings, lr=0.05):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step():
        optimizer.step()
        optimizer.zero_grad()
        return {"grad_norm": 0.0}

    return update_policy(batch, tr, causal_lm_forward(model), lambda loss: loss.backward(), step, settings,
                         generator=torch.Generator().manual_seed(0))


def test_behavior_logprobs_are_placed_on_the_response_tokens(policy):
    model, _ = policy
    samples, batch = sampled_batch(policy)
    torch.testing.assert_close(response_logp(model, batch)[batch.response_mask],
                               batch.behavior_logp[batch.response_mask], atol=1e-4, rtol=0)
    assert batch.response_mask.sum(-1).tolist() == [len(s.response_ids) for s in samples]
    for row, sample in enumerate(samples):  # the response tokens are exactly the predicted ids under the mask
        assert batch.input_ids[row, 1:][batch.response_mask[row]].tolist() == sample.response_ids


def test_update_moves_logprobs_in_the_direction_of_the_advantage(policy):
    model = copy.deepcopy(policy[0])
    _, batch = sampled_batch(policy)
    before = response_logp(model, batch)
    settings = UpdateSettings(num_epochs=2, minibatch_size=6, aggregation="seq-mean-token-sum-norm", norm_constant=6)
    history = sgd_update(model, batch, TrustRegion.preset("dppo_binary_tv"), settings)
    change = ((response_logp(model, batch) - before) * batch.response_mask).sum(-1)
    adv = batch.advantages[:, 0]
    assert (change[adv > 0] > 0).all() and (change[adv < 0] < 0).all()
    assert len(history) == 2 and all("mask/fraction" in h and "entropy" in h for h in history)


def parameter_grads(model, batch, tr, settings):
    model.zero_grad()
    index = torch.arange(len(batch))
    minibatch_step(batch, index, tr, causal_lm_forward(model), lambda loss: loss.backward(), settings)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_no_gradient_flows_through_masked_tokens(policy):
    model = copy.deepcopy(policy[0])
    _, batch = sampled_batch(policy)
    # make μ of every other response token much larger than π so that DPPO blocks it wherever A < 0
    mu = batch.behavior_logp.clone()
    positions = batch.response_mask.nonzero()[::2]
    mu[positions[:, 0], positions[:, 1]] = -1e-3
    batch.behavior_logp = mu
    settings = UpdateSettings(minibatch_size=6, aggregation="seq-mean-token-sum-norm", norm_constant=6)
    tr = TrustRegion.preset("dppo_binary_tv")
    out = minibatch_step(batch, torch.arange(len(batch)), tr, causal_lm_forward(model), lambda loss: None, settings)
    assert out["mask/fraction_neg_adv"] > 0
    # the same gradient comes from PG-IS on the kept tokens only
    logp = response_logp(model, batch)
    keep = policy_loss(logp, batch.behavior_logp, batch.advantages, batch.response_mask, tr).keep
    grads = parameter_grads(model, batch, tr, settings)
    kept_only = copy.copy(batch)
    kept_only.response_mask = keep
    reference = parameter_grads(model, kept_only, TrustRegion.preset("pg_is"), settings)
    torch.testing.assert_close(grads, reference, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_accumulate_to_the_minibatch_gradient(policy, aggregation):
    model = copy.deepcopy(policy[0])
    _, batch = sampled_batch(policy)
    tr = TrustRegion.preset("grpo_clip_higher")
    whole = UpdateSettings(minibatch_size=6, aggregation=aggregation, norm_constant=6)
    micro = UpdateSettings(minibatch_size=6, micro_batch_size=2, aggregation=aggregation, norm_constant=6)
    torch.testing.assert_close(parameter_grads(model, batch, tr, micro), parameter_grads(model, batch, tr, whole),
                               atol=1e-6, rtol=1e-4)


def test_recompute_anchor_and_topk_rules_run(policy):
    model = copy.deepcopy(policy[0])
    _, batch = sampled_batch(policy, top_k=4)
    recomputed = recompute_logprobs(batch, causal_lm_forward(model), 2)
    torch.testing.assert_close(recomputed[batch.response_mask], batch.behavior_logp[batch.response_mask],
                               atol=1e-4, rtol=0)
    settings = UpdateSettings(minibatch_size=3, aggregation="token-mean")
    for preset in ("minirl", "dppo_binary_kl_recompute", "dppo_topk_tv", "dppo_topk_kl"):
        tr = TrustRegion.preset(preset)
        history = sgd_update(model, batch, tr.replace(k=4) if tr.uses_topk else tr, settings, lr=0.01)  # top_k=4
        assert len(history) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    _, no_topk = sampled_batch(policy)
    with pytest.raises(ValueError, match="top-K"):
        sgd_update(model, no_topk, TrustRegion.preset("dppo_topk_tv"), settings)
