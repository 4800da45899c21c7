"""A band held at its strength (:class:`~dppo_oat.trust_region.HeldBand`, ``--tr-calibrate-every``): the steps that
set it, its state across a checkpoint, its refusals; and the pass before an update
(:func:`~dppo_oat.learner.update.observe_before_update`) reads exactly the π_θ of the update's first minibatch."""

import copy

import pytest
import torch

from dppo_oat.engines.local.calibration import BatchCollector
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.update import observe_before_update, update_policy
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.trust_region import CalibrationBatch, HeldBand, TrustRegion, blocked_fraction
from dppo_oat.trust_region.band_search import prepare
from tests.test_update import policy, sampled_batch  # noqa: F401 (policy: the module's tiny model fixture)


def mismatched_batch(seed: int, spread: float = 0.3, b: int = 8, t: int = 12) -> CalibrationBatch:
    """π_θ ≠ μ on every token, mixed-sign A."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.log(torch.rand(b, t, generator=gen) * 0.9 + 0.05)
    pi = (mu + spread * torch.randn(b, t, generator=gen)).clamp(max=0.0)
    return CalibrationBatch(pi, mu, torch.randn(b, 1, generator=gen), torch.ones(b, t, dtype=torch.bool))


@pytest.mark.parametrize("every, steps", [(1, [1, 2, 3, 4, 5]), (2, [1, 3, 5]), (3, [1, 4])])
def test_the_band_is_set_on_steps_one_and_every_nth_after(every, steps):
    held = HeldBand(TrustRegion.preset("dppo_binary_tv"), target=0.1, every=every)
    assert [step for step in range(1, 6) if held.due(step)] == steps


def test_a_band_set_once_is_due_until_a_step_sets_it():
    held = HeldBand(TrustRegion.preset("dppo_binary_tv"), target=0.1, every=None)
    assert held.due(1) and held.due(2)
    held.set(2, mismatched_batch(0))
    assert not held.due(3) and held.set_on == 2


def test_each_step_blocks_its_own_target_and_the_band_follows_the_batch():
    """Batches drifting apart (π_θ further from μ each step): the band widens with them, and each step's band blocks
    the target on its own batch, where the first step's band would block more and more."""
    held = HeldBand(TrustRegion.preset("dppo_binary_tv"), target=0.1, every=1)
    first = None
    for step, spread in enumerate((0.1, 0.3, 0.9), start=1):
        batch = mismatched_batch(step, spread)
        report = held.set(step, batch)
        first = first or held.trust_region
        assert abs(report.achieved - 0.1) <= 1 / 96 and held.set_on == step
        assert blocked_fraction(first, [prepare(first, batch)]) >= report.achieved
    assert held.values["delta"] > first.delta


def test_like_matches_the_reference_preset_on_each_step():
    held = HeldBand(TrustRegion.preset("dppo_binary_tv"), like="dppo_binary_kl", every=1)
    for step in (1, 2):
        batch = mismatched_batch(10 + step, 0.4)
        report = held.set(step, batch)
        reference = TrustRegion.preset("dppo_binary_kl")
        assert report.target == blocked_fraction(reference, [prepare(reference, batch)])


def test_the_state_a_checkpoint_keeps_restores_the_band_exactly():
    held = HeldBand(TrustRegion.preset("gspo"), target=0.1, every=1)
    held.set(3, mismatched_batch(0))
    restored = HeldBand(TrustRegion.preset("gspo"), target=0.1, every=1)
    restored.load_state_dict(copy.deepcopy(held.state_dict()))
    assert restored.trust_region == held.trust_region and restored.set_on == 3
    assert set(held.state_dict()["band"]) == {"eps_low", "eps_high"}


@pytest.mark.parametrize("state", [None, {}, {"band": {"delta": 0.1}, "set_on": 1}, {"band": {"eps_low": "x",
                                   "eps_high": 0.1}, "set_on": 1}, {"band": {"eps_low": 0.1, "eps_high": 0.1},
                                                                   "set_on": "1"}])
def test_a_state_without_this_rules_band_is_one_error(state):
    held = HeldBand(TrustRegion.preset("gspo"), target=0.1)
    with pytest.raises(ValueError, match="a held band's state must hold the band") as error:
        held.load_state_dict(state)
    assert "\n" not in str(error.value) and held.set_on is None


@pytest.mark.parametrize("every", [0, -1, 1.5, True])
def test_every_is_a_whole_number_of_steps(every):
    with pytest.raises(ValueError, match="every N >= 1 steps"):
        HeldBand(TrustRegion.preset("dppo_binary_tv"), target=0.1, every=every)


def test_a_rule_without_a_band_is_refused_before_any_step():
    with pytest.raises(ValueError, match="has no band to calibrate"):
        HeldBand(TrustRegion.preset("pg_is"), target=0.1)


def test_a_failed_setting_leaves_the_band_as_it_was():
    held = HeldBand(TrustRegion.preset("dppo_binary_tv"), target=0.1, every=1)
    held.set(1, mismatched_batch(0))
    band = held.trust_region
    unmoved = mismatched_batch(1, spread=0.0)
    with pytest.raises(ValueError, match="π_θ equals μ"):
        held.set(2, unmoved)
    assert held.trust_region == band and held.set_on == 1


def test_the_pass_before_the_update_reads_the_first_minibatch_exactly_as_the_update_does(policy):  # noqa: F811
    """Same shuffle, same micro-batches, same weights: the loss calls the pass observes equal, bit for bit, those
    the update's first minibatch observes (later minibatches run after optimizer steps), and the pass changes no
    weight."""
    model = copy.deepcopy(policy[0])
    _, batch = sampled_batch(policy, n=8)
    settings = UpdateSettings(num_epochs=1, minibatch_size=4, micro_batch_size=2, aggregation="token-mean")
    tr = TrustRegion.preset("dppo_binary_tv")
    before, during = BatchCollector(tr), BatchCollector(tr)
    weights = copy.deepcopy(model.state_dict())
    shuffle = torch.Generator().manual_seed(7)
    observe_before_update(batch, tr, causal_lm_forward(model), settings, before, generator=shuffle)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def step():
        optimizer.step()
        optimizer.zero_grad()
        return {"grad_norm": 0.0}

    update_policy(batch, tr, causal_lm_forward(model), lambda loss: loss.backward(), step, settings,
                  generator=shuffle, token_sampler=during)
    assert len(before.calls) == len(during.calls) == 4
    for seen, trained in zip(before.calls[:2], during.calls[:2], strict=True):  # the first minibatch's two calls
        assert torch.equal(seen.logp, trained.logp) and torch.equal(seen.behavior_logp, trained.behavior_logp)
    assert not torch.equal(before.calls[2].logp, during.calls[2].logp)  # after the first optimizer step
