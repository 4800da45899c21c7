"""The trust region compares the right distributions under any sampling setting, and non-finite values never reach
the weights: the core's temperature-aware forward, the blow-up guard and the checkpoint guard."""

import copy
import math

import pytest
import torch

from dppo_oat.errors import TrainingBlewUp
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.guard import SKIPPED, BlowUpGuard, nonfinite_cause
from dppo_oat.learner.update import clip_and_step, minibatch_step, summarize_steps, update_policy
from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.run.safe_io import atomic_torch_save, nonfinite_tensors
from dppo_oat.settings.spec import AdvantageSettings, RolloutSettings, RunSpec, SamplingSettings, UpdateSettings
from dppo_oat.trust_region import TopK, TrustRegion
from dppo_oat.update_batch import TurnSample, build_update_batch


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)


def on_policy_batch(policy, temperature, n=6):
    """Samples of the fp32 policy itself at ``temperature`` (μ as the generator reports it), advantages ±1."""
    model, tokenizer = policy
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][:12] for t in toy_corpus(n, seed=3)]
    settings = SamplingSettings(8, temperature=temperature, seed=1)
    completions = HFGenerator(model, tokenizer).generate(prompts, settings)
    samples = [TurnSample(p, c.token_ids, c.logprobs, 0.0, True, False, 0, "toy", i, str(i), c.finish_reason)
               for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    advantages = [1.0 if i % 2 else -1.0 for i in range(n)]
    return build_update_batch(samples, advantages, tokenizer.pad_token_id)


@pytest.mark.fault("`--temperature 0.6`",
                   "π_θ is computed at the sampling temperature (the learner divides the logits by it, as the rollout "
                   "did), so on-policy tokens have |π − μ| ≈ 0 and nothing is masked at any temperature")
@pytest.mark.parametrize("temperature", [0.3, 0.6, 1.0])
def test_on_policy_minibatch_has_no_mismatch_at_any_temperature(policy, temperature):
    """One minibatch per rollout, fp32 rollout: π_θ is μ, so |π − μ| ≈ 0 and the trust region masks nothing."""
    batch = on_policy_batch(policy, temperature)
    settings = UpdateSettings(minibatch_size=len(batch), aggregation="token-mean", temperature=temperature)
    tr = TrustRegion.preset("dppo_binary_tv", delta=1e-4)  # a δ far below any real drift
    forward = causal_lm_forward(policy[0], settings=settings)
    metrics = minibatch_step(batch, torch.arange(len(batch)), tr, forward, lambda loss: None, settings)
    assert metrics["mismatch/abs_diff_mean"] < 1e-5
    assert metrics["mask/fraction"] == 0.0


def test_without_the_temperature_the_learner_would_see_a_mismatch(policy):
    """The defect the temperature fixes: raw logits against μ sampled at T = 0.3 differ and get masked."""
    batch = on_policy_batch(policy, 0.3)
    settings = UpdateSettings(minibatch_size=len(batch), aggregation="token-mean")
    tr = TrustRegion.preset("dppo_binary_tv", delta=1e-4)
    metrics = minibatch_step(batch, torch.arange(len(batch)), tr, causal_lm_forward(policy[0]), lambda loss: None,
                             settings)
    assert metrics["mismatch/abs_diff_mean"] > 1e-3 and metrics["mask/fraction"] > 0


def spec_with(sampling: SamplingSettings, update: UpdateSettings) -> RunSpec:
    rollout = RolloutSettings(template="plain")
    return RunSpec(TrustRegion.preset("dppo_binary_tv"), rollout, sampling, rollout, sampling, AdvantageSettings(),
                   update)


@pytest.mark.fault("`--top-p 0.9` or top-k for training",
                   "refused: μ would be renormalised over a support the learner does not see (evaluation may use "
                   "them)")
@pytest.mark.parametrize("sampling, learner_temperature, message", [
    (SamplingSettings(8, top_p=0.9), 1.0, "top-p/top-k"),
    (SamplingSettings(8, top_k=20), 1.0, "top-p/top-k"),
    (SamplingSettings(8, temperature=0.6), 1.0, "differs from the sampling temperature"),
    (SamplingSettings(8, temperature=0.0), 1.0, "greedy"),
])
def test_a_run_spec_refuses_pi_and_mu_of_different_distributions(sampling, learner_temperature, message):
    with pytest.raises(ValueError, match=message):
        spec_with(sampling, UpdateSettings(aggregation="token-mean", temperature=learner_temperature))
    spec_with(SamplingSettings(8, temperature=0.6), UpdateSettings(aggregation="token-mean", temperature=0.6))


def poisoned(batch, row=0):
    """``batch`` with one non-finite μ log-prob on a response token of ``row`` (a broken rollout engine)."""
    batch = copy.deepcopy(batch)
    position = batch.response_mask[row].nonzero()[0, 0]
    batch.behavior_logp[row, position] = float("nan")
    return batch


def plain_update(model, batch, guard=None, lr=0.1, minibatch_size=3, optimizer_class=torch.optim.SGD):
    optimizer = optimizer_class(model.parameters(), lr=lr)
    settings = UpdateSettings(minibatch_size=minibatch_size, aggregation="token-mean")
    return update_policy(batch, TrustRegion.preset("pg_is"), causal_lm_forward(model), lambda loss: loss.backward(),
                         lambda: clip_and_step(list(model.parameters()), optimizer, 1.0), settings,
                         generator=torch.Generator().manual_seed(0), guard=guard,
                         discard_step=lambda: optimizer.zero_grad(set_to_none=True))


@pytest.mark.fault("a minibatch whose μ log-probs (so its loss) are non-finite",
                   "not applied; counted in `guard/skipped` and `guard/nonfinite_*`")
def test_a_minibatch_with_non_finite_mu_is_skipped_and_counted(policy):
    model = copy.deepcopy(policy[0])
    batch = poisoned(on_policy_batch(policy, 1.0))
    history = plain_update(model, batch, minibatch_size=len(batch))
    assert history[0][SKIPPED] == 1.0 and history[0]["guard/nonfinite_mu"] == 1.0
    for name, value in model.state_dict().items():  # nothing was applied
        torch.testing.assert_close(value, policy[0].state_dict()[name], atol=0, rtol=0)


@pytest.mark.fault("a minibatch whose advantages are non-finite (a broken advantage estimator or reward)",
                   "the run stops: `training diverged: the advantages are non-finite …` before any step applies "
                   "them (`policy_loss` alone would mask those tokens and count them in `nonfinite`)")
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_advantages_stop_the_run_before_any_step(policy, value):
    model = copy.deepcopy(policy[0])
    batch = copy.deepcopy(on_policy_batch(policy, 1.0))
    batch.advantages[1] = value
    with pytest.raises(TrainingBlewUp, match="advantages are non-finite"):
        plain_update(model, batch, minibatch_size=len(batch))
    for name, tensor in model.state_dict().items():  # nothing was applied
        torch.testing.assert_close(tensor, policy[0].state_dict()[name], atol=0, rtol=0)


def test_healthy_minibatches_still_train_beside_a_skipped_one(policy):
    model = copy.deepcopy(policy[0])
    history = plain_update(model, poisoned(on_policy_batch(policy, 1.0)), minibatch_size=3)
    assert sorted(step[SKIPPED] for step in history) == [0.0, 1.0]
    summary = summarize_steps(history)  # the skipped step has no gradient norm: the summary takes the other's
    assert summary[SKIPPED] == 0.5 and math.isfinite(summary["grad_norm"])
    moved = max((value - policy[0].state_dict()[name]).abs().max() for name, value in model.state_dict().items())
    assert moved > 0


def test_the_guard_stops_a_run_that_keeps_skipping(policy):
    guard = BlowUpGuard(patience=3)
    batch = poisoned(on_policy_batch(policy, 1.0))
    plain_update(copy.deepcopy(policy[0]), batch, guard=guard, minibatch_size=len(batch))
    plain_update(copy.deepcopy(policy[0]), batch, guard=guard, minibatch_size=len(batch))
    with pytest.raises(TrainingBlewUp, match="μ's log-probs .* non-finite in 3 optimizer steps in a row"):
        plain_update(copy.deepcopy(policy[0]), batch, guard=guard, minibatch_size=len(batch))


def test_an_engine_that_cannot_skip_stops_at_once(policy):
    model = copy.deepcopy(policy[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = UpdateSettings(minibatch_size=6, aggregation="token-mean")
    with pytest.raises(TrainingBlewUp, match="cannot skip"):
        update_policy(poisoned(on_policy_batch(policy, 1.0)), TrustRegion.preset("pg_is"), causal_lm_forward(model),
                      lambda loss: loss.backward(), lambda: clip_and_step(list(model.parameters()), optimizer, 1.0),
                      settings)


@pytest.mark.fault("a non-finite gradient",
                   "not applied; counted in `guard/skipped`")
def test_a_non_finite_gradient_is_never_applied(policy):
    model = copy.deepcopy(policy[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, float("inf"))
    metrics = clip_and_step(list(model.parameters()), optimizer, 1.0)
    assert metrics[SKIPPED] == 1.0 and not math.isfinite(metrics["grad_norm"])
    assert all(p.grad is None for p in model.parameters())
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, policy[0].state_dict()[name], atol=0, rtol=0)


@pytest.mark.fault("an update that leaves non-finite weights",
                   "the run stops (`training diverged`: the weights diverged) before they could be checkpointed")
def test_an_update_that_breaks_the_weights_stops_before_any_checkpoint(policy):
    """A step that leaves non-finite weights (an infinite learning rate; the CLI refuses one): the update itself
    says so, before the engine could checkpoint them."""
    model = copy.deepcopy(policy[0])
    with pytest.raises(TrainingBlewUp, match="the weights diverged"):
        plain_update(model, on_policy_batch(policy, 1.0), lr=float("inf"), minibatch_size=6)


@pytest.mark.fault("a checkpoint of non-finite weights",
                   "never written: a checkpoint never holds non-finite weights")
def test_a_checkpoint_never_holds_non_finite_weights(policy, tmp_path):
    state = copy.deepcopy(policy[0]).state_dict()
    name = next(iter(state))
    state[name][0] = float("nan")
    assert f"model.{name}" in nonfinite_tensors({"model": state})  # (and any tied alias of it)
    with pytest.raises(TrainingBlewUp, match="non-finite"):
        atomic_torch_save({"model": state}, tmp_path / "checkpoint.pt", weights=state)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_a_nan_in_mus_top_k_set_trips_the_guard_but_an_empty_slot_does_not():
    logp = torch.log(torch.full((1, 3), 0.5))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    ids = torch.tensor([[[0, 1], [0, 1], [0, -1]]])
    valid = ids >= 0
    clean = torch.log(torch.tensor([[[0.5, 0.2], [0.5, 0.2], [0.5, 0.0]]]))  # −inf in the empty slot: fine
    damaged = clean.clone()
    damaged[0, 2, 0] = float("nan")
    loss = torch.tensor(0.1)
    assert nonfinite_cause(logp, logp, loss, mask, TopK(ids, clean, clean, valid)) is None
    assert nonfinite_cause(logp, logp, loss, mask, TopK(ids, damaged, clean, valid)) == "guard/nonfinite_mu"
    damaged_off_response = clean.clone()
    damaged_off_response[0, 0, 0] = float("nan")
    assert nonfinite_cause(logp, logp, loss, mask, TopK(ids, damaged_off_response, clean, valid)) is None
