"""The tokens.jsonl sample (dppo_oat.run.token_samples): hand-computed decisions, the stratified sample and its weights,
and the update loop feeding it π_θ of the first epoch's forward pass."""

import math

import pytest
import torch
from test_update import policy, sampled_batch  # noqa: F401  (fixture)

from dppo_oat.learner.forward import PolicyOutputs
from dppo_oat.learner.update import update_policy
from dppo_oat.run.token_samples import TokenSampler, _stratum_sizes, reference_masks
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.trust_region import TrustRegion, policy_loss
from dppo_oat.update_batch import UpdateBatch


def test_reference_masks_by_hand():
    """Four tokens (μ, π, A): PPO blocks r = 2 with A > 0 (r > 1.2); GRPO-ClipHigher blocks r = 1.25 only above
    1.28, so not; DPPO-TV blocks |π − μ| = 0.5 > 0.15 in the direction of A, never a low-probability token whose
    ratio moved (μ 0.01 → π 0.02: r = 2 but |π − μ| = 0.01)."""
    mu = torch.tensor([[0.5, 0.01, 0.4, 0.6]])
    pi = torch.tensor([[1.0, 0.02, 0.5, 0.1]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    mask = torch.ones_like(mu, dtype=torch.bool)
    blocked = reference_masks(pi.log(), mu.log(), adv, mask)
    assert blocked["ppo_masked"].tolist() == [[True, True, True, True]]
    assert blocked["grpo_clip_higher_masked"].tolist() == [[True, True, False, True]]
    assert blocked["dppo_masked"].tolist() == [[True, False, False, True]]
    blocked = reference_masks(pi.log(), mu.log(), adv, torch.tensor([[True, False, True, False]]))
    assert blocked["dppo_masked"].tolist() == [[True, False, False, False]]


@pytest.mark.parametrize("available, expected", [
    ({"blocked": 100, "other": 100}, {"blocked": 16, "other": 16}),
    ({"blocked": 3, "other": 100}, {"blocked": 3, "other": 29}),
    ({"blocked": 100, "other": 5}, {"blocked": 27, "other": 5}),
    ({"blocked": 0, "other": 10}, {"other": 10}),
])
def test_stratum_sizes(available, expected):
    assert _stratum_sizes(32, available) == expected


def synthetic_batch(rows=64, width=30, seed=0):
    """A batch whose π equals μ except on a few tokens that moved far (blocked by PPO and DPPO-TV)."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.rand(rows, width, generator=g) * 0.9 + 0.05
    pi = mu.clone()
    moved = torch.rand(rows, width, generator=g) < 0.02
    pi[moved] = (mu[moved] + 0.5).clamp(max=0.999)
    response_mask = torch.zeros(rows, width, dtype=torch.bool)
    response_mask[:, 5:] = True
    batch = UpdateBatch(
        input_ids=torch.randint(0, 50, (rows, width + 1), generator=g),
        attention_mask=torch.ones(rows, width + 1, dtype=torch.long), response_mask=response_mask,
        behavior_logp=mu.log(), advantages=torch.ones(rows, 1))
    return batch, pi.log(), moved & response_mask


def sample_of(batch, logp, per_step, micro=16, seed=0):
    sampler = TokenSampler(per_step, seed=seed)
    tr = TrustRegion.preset("cispo")  # masks nothing of its own: the strata come from the reference rules
    for rows in torch.arange(len(batch)).split(micro):
        micro_batch = batch.select(rows)
        lp = logp[rows][:, : micro_batch.response_mask.shape[1]]
        result = policy_loss(lp, micro_batch.behavior_logp, micro_batch.advantages, micro_batch.response_mask, tr)
        sampler.observe(rows, micro_batch, lp, None, result)
    return sampler.rows(7, lambda ids: [f"<{i}>" for i in ids], turns=list(range(len(batch))))


def test_sample_holds_blocked_tokens_and_weights_recover_the_totals():
    batch, logp, moved = synthetic_batch()
    rows = sample_of(batch, logp, per_step=32)
    assert len(rows) == 32
    blocked = [r for r in rows if r["stratum"] == "blocked"]
    assert len(blocked) == 16 and all(r["ppo_masked"] and r["dppo_masked"] for r in blocked)
    total = sum(r["weight"] for r in rows)
    assert total == pytest.approx(int(batch.response_mask.sum()), rel=1e-3)
    reference = reference_masks(logp, batch.behavior_logp, batch.advantages.expand_as(logp), batch.response_mask)
    any_blocked = torch.stack(list(reference.values())).any(0)
    assert 0 < int(any_blocked.sum()) <= int(moved.sum())
    assert sum(r["weight"] for r in blocked) == pytest.approx(int(any_blocked.sum()), rel=1e-3)
    for r in rows:  # every field is the token's own: μ and π at its (row, position), its id and turn
        position = 5 + r["position"]
        assert r["mu"] == pytest.approx(batch.behavior_logp[r["turn"], position].exp().item(), rel=1e-5)
        assert r["pi"] == pytest.approx(logp[r["turn"], position].exp().item(), rel=1e-5)
        assert r["token"] == f"<{batch.input_ids[r['turn'], position + 1].item()}>"
        assert r["step"] == 7 and r["masked"] is False and r["entropy"] is None and r["advantage"] == 1.0


def test_sample_is_uniform_within_a_stratum():
    """Over many seeds every unblocked token is drawn about equally often (priority sampling across micro-batches)."""
    batch, logp, _ = synthetic_batch(rows=8, width=10)
    counts = {}
    for seed in range(400):
        for r in sample_of(batch, logp, per_step=8, micro=3, seed=seed):
            if r["stratum"] == "other":
                counts[(r["turn"], r["position"])] = counts.get((r["turn"], r["position"]), 0) + 1
    values = torch.tensor(list(counts.values()), dtype=torch.float64)
    population = sum(1 for _ in counts)
    assert population >= 35 and values.std() / values.mean() < 0.2


def test_tokens_without_advantage_are_not_sampled():
    batch, logp, _ = synthetic_batch(rows=8)
    batch.advantages[::2] = 0.0
    rows = sample_of(batch, logp, per_step=1000)
    assert rows and all(r["turn"] % 2 == 1 for r in rows)
    assert sum(r["weight"] for r in rows) == pytest.approx(int(batch.response_mask[1::2].sum()))


def test_zero_samples_and_negative_counts():
    batch, logp, _ = synthetic_batch(rows=4)
    assert sample_of(batch, logp, per_step=0) == []
    with pytest.raises(ValueError, match="token samples"):
        TokenSampler(-1)


def test_update_loop_feeds_first_epoch_pi_before_any_step(policy):  # noqa: F811  (the fixture imported above)
    """The sample's π is that of the forward pass whose loss first used the token (its mask was decided on it): with
    one minibatch per epoch, the weights before any optimizer step, so equal to the rollout μ on this on-policy fp32
    batch, although the second epoch (after a large SGD step) sees another π."""
    model, tokenizer = policy
    _, batch = sampled_batch(policy, n=8)
    settings = UpdateSettings(minibatch_size=8, num_epochs=2, aggregation="token-mean")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def forward(micro, with_topk):
        logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, micro.input_ids[:, 1:, None]).squeeze(-1)
        return PolicyOutputs(logp=logp, entropy=torch.zeros_like(logp))

    def step():
        optimizer.step()
        optimizer.zero_grad()

    sampler = TokenSampler(1000)
    history = update_policy(batch, TrustRegion.preset("pg_is"), forward, lambda loss: loss.backward(), step,
                            settings, token_sampler=sampler)
    assert history[1]["mismatch/abs_diff_mean"] > 1e-3  # the second epoch saw the updated policy
    rows = sampler.rows(1, lambda ids: tokenizer.convert_ids_to_tokens(ids))
    assert len(rows) == int((batch.response_mask & (batch.advantages != 0)).sum()) > 0
    assert max(abs(r["pi"] - r["mu"]) for r in rows) < 1e-4
    assert all(r["entropy"] == 0.0 and math.isfinite(r["weight"]) for r in rows)
