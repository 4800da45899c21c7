"""Advantage estimators (critic-free) and multi-turn returns.

The paper's default is the group baseline without std normalisation (Dr.GRPO; app:sanity_test_details):
``Â = R(y) − mean_{group} R``. Multi-turn Gem episodes give one sample per turn with a discounted return
``G_t = Σ_k γ^k r_{t+k}``, optionally normalised over the batch (ReBN, as in Gem's oat examples).
Everything here is NumPy in, NumPy out (float32), so that any engine can call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dppo_oat.errors import RunError

if TYPE_CHECKING:
    from dppo_oat.update_batch import TurnSample

ESTIMATORS = ("drgrpo", "grpo", "rloo")
FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest return advantages can be computed from: they are float32 (about 3.4e38)."""


class RewardOverflow(RunError):
    """The env's rewards give a return that is not finite, or past :data:`FLOAT32_MAX`: no advantage can be formed
    from it (the run would stop later as "advantages non-finite", after numpy's overflow warnings)."""


def check_returns(returns: np.ndarray) -> None:
    """Raise :class:`RewardOverflow` (one line) when a return (float64) is NaN, infinite or past float32's range."""
    if not np.isnan(returns).any() and not (np.abs(returns) > FLOAT32_MAX).any():
        return
    if np.isnan(returns).any():
        raise RewardOverflow("the env's rewards are NaN (a turn's return is NaN): fix the env's rewards")
    largest = float(np.abs(returns).max())
    raise RewardOverflow(f"the env's rewards overflow: a turn's return reaches {largest:.3g}, past the float32 range "
                         f"(±{FLOAT32_MAX:.3g}) advantages are computed in: scale the env's rewards down")


def group_advantages(rewards, group_ids, estimator: str = "drgrpo", *, eps: float = 1e-6) -> np.ndarray:
    """Per-sample advantages against the other samples of the same group (same prompt / puzzle seed).

    - ``drgrpo``: ``R − mean_g R`` (Liu et al., 2025; the paper's default).
    - ``grpo``: ``(R − mean_g R) / (std_g R + eps)`` (Shao et al., 2024), population std.
    - ``rloo``: ``R − mean of the other n − 1 samples`` = ``n/(n−1) (R − mean_g R)``; 0 for a group of one.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of: {', '.join(ESTIMATORS)}")
    rewards = np.asarray(rewards, dtype=np.float64)
    _, group_index, counts = np.unique(np.asarray(group_ids), return_inverse=True, return_counts=True)
    group_index = group_index.reshape(-1)
    sums = np.bincount(group_index, weights=rewards)
    means = sums / counts
    centered = rewards - means[group_index]
    if estimator == "drgrpo":
        return centered.astype(np.float32)
    if estimator == "grpo":
        variances = np.bincount(group_index, weights=centered**2) / counts
        return (centered / (np.sqrt(variances)[group_index] + eps)).astype(np.float32)
    n = counts[group_index].astype(np.float64)
    return np.where(n > 1, centered * n / np.maximum(n - 1, 1), 0.0).astype(np.float32)


def discounted_returns(rewards, episode_ids, turn_indices, gamma: float) -> np.ndarray:
    """``G_t = r_t + γ G_{t+1}`` within each episode, for per-turn samples in any order; :class:`RewardOverflow`
    when a return is NaN or past float32's range."""
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    rewards = np.asarray(rewards, dtype=np.float64)
    episode_ids, turn_indices = np.asarray(episode_ids), np.asarray(turn_indices)
    order = np.lexsort((-turn_indices, episode_ids))  # each episode from its last turn back to its first
    returns = np.zeros_like(rewards)
    running, current_episode = 0.0, None
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is said in one line below
        for i in order:
            if episode_ids[i] != current_episode:
                running, current_episode = 0.0, episode_ids[i]
            running = rewards[i] + gamma * running
            returns[i] = running
    check_returns(returns)
    return returns.astype(np.float32)


def batch_normalize(values, *, eps: float = 1e-6) -> np.ndarray:
    """ReBN: ``(x − mean) / (std + eps)`` over the whole batch (return batch normalisation)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values.astype(np.float32)
    return ((values - values.mean()) / (values.std() + eps)).astype(np.float32)


ADVANTAGE_MODES = (*ESTIMATORS, "rebn")


@dataclass(frozen=True)
class AdvantageSettings:
    """Per-turn advantages: discounted returns (γ), then a group baseline or ReBN (:func:`turn_advantages`).

    ``per_turn_baseline`` compares a turn only with the same turn of the group's other episodes.
    """

    mode: str = "drgrpo"
    gamma: float = 1.0
    per_turn_baseline: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ADVANTAGE_MODES:
            raise ValueError(f"unknown advantage mode {self.mode!r}; choose one of: {', '.join(ADVANTAGE_MODES)}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.per_turn_baseline and self.mode == "rebn":
            raise ValueError("a per-turn baseline is a group baseline: use it with drgrpo, grpo or rloo, not rebn")

    @property
    def needs_groups(self) -> bool:
        """True for the group baselines, which compare episodes started from the same seed."""
        return self.mode in ESTIMATORS


def turn_advantages(rewards, episode_ids, turn_indices, group_ids, *, mode: str = "drgrpo", gamma: float = 1.0,
                    per_turn_baseline: bool = False):
    """Advantages of per-turn samples: discounted returns, then a group baseline (``drgrpo``/``grpo``/``rloo``)
    or ReBN (``rebn``). Single-turn tasks reduce to the group estimators on R(y).

    The group baseline compares a turn's return with every turn of its group, or — ``per_turn_baseline`` — only
    with the same turn of the group's other episodes (same puzzle, same number of moves played): early turns then
    stop looking better merely because more reward lies ahead of them.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; choose one of: {', '.join(ADVANTAGE_MODES)}")
    returns = discounted_returns(rewards, episode_ids, turn_indices, gamma)
    if mode == "rebn":
        return batch_normalize(returns)
    if per_turn_baseline:
        group_ids = [f"{group}@{turn}" for group, turn in zip(group_ids, turn_indices, strict=True)]
    return group_advantages(returns, group_ids, mode)


def sample_returns(samples: Sequence[TurnSample], gamma: float) -> np.ndarray:
    """:func:`discounted_returns` of per-turn samples (each with ``reward``, ``episode_id``, ``turn``)."""
    return discounted_returns([s.reward for s in samples], [s.episode_id for s in samples],
                              [s.turn for s in samples], gamma)


def sample_advantages(samples: Sequence[TurnSample], settings: AdvantageSettings) -> np.ndarray:
    """:func:`turn_advantages` of per-turn samples (each with ``reward``, ``episode_id``, ``turn``, ``group_id``)."""
    return turn_advantages(
        [s.reward for s in samples], [s.episode_id for s in samples], [s.turn for s in samples],
        [s.group_id for s in samples], mode=settings.mode, gamma=settings.gamma,
        per_turn_baseline=settings.per_turn_baseline,
    )
