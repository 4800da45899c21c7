"""Advantage estimators, multi-turn returns and loss aggregation against hand-computed values."""

import numpy as np
import pytest
import torch

from dppo_oat.advantages import batch_normalize, discounted_returns, group_advantages, turn_advantages
from dppo_oat.aggregation import aggregate_loss

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
GROUPS = ["a", "a", "a", "a", "b", "b"]


def test_drgrpo_is_reward_minus_group_mean():
    np.testing.assert_allclose(group_advantages(REWARDS, GROUPS), [0.5, -0.5, -0.5, 0.5, 0, 0])


def test_grpo_divides_by_group_std():
    np.testing.assert_allclose(group_advantages(REWARDS, GROUPS, "grpo"), [1, -1, -1, 1, 0, 0], atol=1e-5)


def test_rloo_uses_the_other_samples_mean():
    # sample 0 of group a: 1 − mean(0, 0, 1) = 2/3
    np.testing.assert_allclose(group_advantages(REWARDS, GROUPS, "rloo"), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0])
    assert group_advantages([3.0], [0], "rloo").tolist() == [0.0]


def test_unknown_estimator():
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        group_advantages(REWARDS, GROUPS, "ppo")


def test_discounted_returns_per_episode_in_any_order():
    # episode 7: turns 0,1,2 with rewards 0.25, 0.25, 0.5; episode 3: one turn, reward -0.1. Shuffled input.
    rewards = [0.5, -0.1, 0.25, 0.25]
    episodes = [7, 3, 7, 7]
    turns = [2, 0, 0, 1]
    g = 0.9
    expected = [0.5, -0.1, 0.25 + g * 0.25 + g * g * 0.5, 0.25 + g * 0.5]
    np.testing.assert_allclose(discounted_returns(rewards, episodes, turns, g), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns(rewards, episodes, turns, 1.5)


def test_rebn_and_turn_advantages():
    x = batch_normalize([1.0, 2.0, 3.0])
    assert abs(x.mean()) < 1e-6 and abs(x.std() - 1) < 1e-4
    adv = turn_advantages([1.0, 0.0], [0, 1], [0, 0], [5, 5], mode="drgrpo", gamma=1.0)
    np.testing.assert_allclose(adv, [0.5, -0.5])
    np.testing.assert_allclose(turn_advantages([1.0, 0.0], [0, 1], [0, 0], [5, 5], mode="rebn"), [1, -1], atol=1e-5)


LOSS = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 10 / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", (6 / 8 + 4 / 8) / 2),
    ],
)
def test_aggregation_modes(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode, norm_constant=8).item() == pytest.approx(expected)


def test_aggregation_errors():
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate_loss(LOSS, MASK, "sum")


def test_per_turn_baseline_compares_the_same_turn_of_the_group():
    # two episodes of one group, two turns each; γ = 1: returns (0.5, 0.25) for episode 0, (0.25, 0.0) for 1
    rewards, episodes, turns, groups = [0.25, 0.25, 0.25, 0.0], [0, 0, 1, 1], [0, 1, 0, 1], ["g"] * 4
    per_turn = turn_advantages(rewards, episodes, turns, groups, gamma=1.0, per_turn_baseline=True)
    np.testing.assert_allclose(per_turn, [0.125, 0.125, -0.125, -0.125])
    pooled = turn_advantages(rewards, episodes, turns, groups, gamma=1.0)
    np.testing.assert_allclose(pooled, [0.25, 0.0, 0.0, -0.25])
