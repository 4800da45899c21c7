"""Several learners (oat's ranks) decide every step, skip and stop together.

A non-finite μ or π_θ usually reaches one learner's batch only. If that learner skipped or stopped alone, the others
would go on into a collective (ZeRO's gradient reduce, the next all-reduce) that it never reaches: a hang until the
communication timeout. Here two learners run the core's real update loop in two threads, with real tiny models, and
agree through an all-reduce MAX made of a barrier (:class:`ThreadedAllReduceMax`), which, like a real collective,
blocks until both arrive: a learner that went its own way would leave the other waiting, and the barrier's timeout
fails the test instead of hanging it.
"""

import copy
import threading

import pytest
import torch

from dppo_oat.errors import TrainingBlewUp
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.guard import DIVERGED, HEALTHY, SKIP, SKIPPED, check_weights_finite
from dppo_oat.learner.update import clip_and_step, finish_minibatch, update_policy
from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import SamplingSettings, UpdateSettings
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update_batch import TurnSample, build_update_batch


class ThreadedAllReduceMax:
    """An all-reduce MAX between ``n`` threads: each call blocks until every learner has made its own call."""

    def __init__(self, n: int, timeout: float = 20.0):
        self.values = [HEALTHY] * n
        self.calls = [0] * n
        self.barrier = threading.Barrier(n, timeout=timeout)

    def for_learner(self, rank: int):
        def any_learner(state: int) -> int:
            self.values[rank] = state
            self.calls[rank] += 1
            self.barrier.wait()
            worst = max(self.values)
            self.barrier.wait()
            return worst

        return any_learner


def run_learners(*jobs):
    """Run one job per learner, each in its own thread with its own ``any_learner``; their results or errors."""
    reduce = ThreadedAllReduceMax(len(jobs))
    outcomes = [None] * len(jobs)

    def play(rank, job):
        try:
            outcomes[rank] = job(reduce.for_learner(rank))
        except Exception as error:
            outcomes[rank] = error

    threads = [threading.Thread(target=play, args=(rank, job)) for rank, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a learner is still waiting for the others"
    assert not any(isinstance(o, threading.BrokenBarrierError) for o in outcomes), f"learners parted: {outcomes}"
    return outcomes, reduce.calls


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)


def learner_batch(policy, seed, n=4):
    model, tokenizer = policy
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][:10] for t in toy_corpus(n, seed=seed)]
    completions = HFGenerator(model, tokenizer).generate(prompts, SamplingSettings(6, seed=seed))
    samples = [TurnSample(p, c.token_ids, c.logprobs, 0.0, True, False, 0, "toy", i, str(i), c.finish_reason)
               for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    return build_update_batch(samples, [1.0 if i % 2 else -1.0 for i in range(n)], tokenizer.pad_token_id)


def with_nan_mu(batch):
    batch = copy.deepcopy(batch)
    batch.behavior_logp[0, batch.response_mask[0].nonzero()[0, 0]] = float("nan")
    return batch


def with_nan_weight(model):
    """A copy of ``model`` whose final norm weight is NaN: every log-prob of π_θ is NaN."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    return model


def update_job(model, batch, minibatch_size=2):
    """One learner's update of ``batch`` (plain SGD); returns its history."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = UpdateSettings(minibatch_size=minibatch_size, aggregation="token-mean")

    def job(any_learner):
        return update_policy(batch, TrustRegion.preset("pg_is"), causal_lm_forward(model), lambda loss: loss.backward(),
                             lambda: clip_and_step(list(model.parameters()), optimizer, 1.0), settings,
                             generator=torch.Generator().manual_seed(0),
                             discard_step=lambda: optimizer.zero_grad(set_to_none=True), any_learner=any_learner)

    return job


def unchanged(model, reference) -> bool:
    return all(torch.equal(value, reference.state_dict()[name]) for name, value in model.state_dict().items())


@pytest.mark.fault("oat engine: a non-finite minibatch on one learner only",
                   "every learner skips that step: each skip and stop is agreed over the learners (an all-reduce MAX "
                   "per minibatch), so none is left waiting in a collective")
def test_a_minibatch_poisoned_on_one_learner_is_skipped_by_every_learner(policy):
    """μ is NaN in learner 0's first minibatch only: both skip that step (learner 1's healthy gradient is dropped
    too, as ZeRO's shared step must) and both take the next one."""
    healthy, other = learner_batch(policy, 1), learner_batch(policy, 2)
    models = [copy.deepcopy(policy[0]), copy.deepcopy(policy[0])]
    poisoned = with_nan_mu(healthy)
    first_rows = torch.randperm(len(poisoned), generator=torch.Generator().manual_seed(0))[:2]
    assert 0 in first_rows.tolist(), "the NaN must fall in the first minibatch"
    outcomes, calls = run_learners(update_job(models[0], poisoned), update_job(models[1], other))
    assert all(isinstance(history, list) for history in outcomes), outcomes
    for history in outcomes:
        assert [step[SKIPPED] for step in history] == [1.0, 0.0]
    assert outcomes[0][0]["guard/nonfinite_mu"] == 1.0 and outcomes[1][0]["guard/nonfinite_mu"] == 0.0
    assert calls[0] == calls[1]


@pytest.mark.fault("oat engine: weights diverged on one learner only",
                   "every learner stops at the same step; the healthy learners' weights are untouched")
def test_weights_diverged_on_one_learner_stop_every_learner_together(policy):
    """π_θ is non-finite on learner 0 only: both discard the minibatch and both raise, at the same step, and the
    healthy learner's weights are untouched."""
    reference = policy[0]
    broken, healthy = with_nan_weight(reference), copy.deepcopy(reference)
    outcomes, calls = run_learners(update_job(broken, learner_batch(policy, 1)),
                                   update_job(healthy, learner_batch(policy, 2)))
    assert isinstance(outcomes[0], TrainingBlewUp) and "on another learner" not in str(outcomes[0])
    assert isinstance(outcomes[1], TrainingBlewUp) and "on another learner" in str(outcomes[1])
    assert calls == [1, 1]  # the first minibatch's agreement ended both
    assert unchanged(healthy, reference)


def test_a_weight_shard_broken_on_one_learner_stops_every_learner(policy):
    """After an update, each learner checks its own shard of the weights (ZeRO-3 splits them): one broken shard
    stops all learners, before oat could save the weights or send them to the rollout engine."""
    shards = [dict(policy[0].named_parameters()), {k: v.detach().clone() for k, v in policy[0].named_parameters()}]
    name = next(iter(shards[1]))
    shards[1][name].view(-1)[0] = float("inf")
    outcomes, _ = run_learners(lambda any_learner: check_weights_finite(shards[0].items(), any_learner),
                               lambda any_learner: check_weights_finite(shards[1].items(), any_learner))
    assert isinstance(outcomes[0], TrainingBlewUp) and "on another learner" in str(outcomes[0])
    assert isinstance(outcomes[1], TrainingBlewUp) and name in str(outcomes[1])
    outcomes, _ = run_learners(lambda any_learner: check_weights_finite(shards[0].items(), any_learner),
                               lambda any_learner: check_weights_finite(shards[0].items(), any_learner))
    assert outcomes == [None, None]


@pytest.mark.parametrize("mine, theirs, applied, raises", [
    (HEALTHY, HEALTHY, True, False),
    (HEALTHY, SKIP, False, False),
    (SKIP, HEALTHY, False, False),
    (HEALTHY, DIVERGED, False, True),
    (DIVERGED, HEALTHY, False, True),
])
def test_finish_minibatch_acts_on_the_worst_state_of_all_learners(mine, theirs, applied, raises):
    poisoned = {SKIP: {"guard/nonfinite_mu": 1.0}, DIVERGED: {"guard/nonfinite_pi": 1.0}}.get(mine, {})
    actions = []

    def any_learner(state):  # the other learner's state, reduced
        return max(state, theirs)

    def step():
        actions.append("step")
        return {}

    def discard():
        actions.append("discard")
        return {}

    if raises:
        with pytest.raises(TrainingBlewUp, match="diverged"):
            finish_minibatch(dict(poisoned), step, discard, any_learner)
        assert actions == ["discard"]
        return
    out = finish_minibatch(dict(poisoned), step, discard, any_learner)
    assert actions == (["step"] if applied else ["discard"])
    assert out[SKIPPED] == (0.0 if applied else 1.0)
