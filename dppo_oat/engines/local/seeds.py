"""Which puzzles each part of a local run plays: disjoint seed ranges, and per-step seeds derived from the run's.

Training puzzles are drawn below :data:`EVAL_SEED` (or from ``[0, train_pool)``), held-out evaluation uses
``[EVAL_SEED, EVAL_SEED + eval_episodes)``, the warm start's success checks use a validation range above it, and
demonstrations come from :data:`DEMO_SEED` on. Every random choice of step ``t`` derives from ``(seed, t, purpose)``,
so a resumed run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import numpy as np

EVAL_SEED = 1_000_000
"""Held-out evaluation puzzles use seeds [1e6, 1e6 + eval_episodes); training seeds are drawn below 1e6."""
VALIDATION_SEED = EVAL_SEED + 500_000
"""The warm start's success checks (a validation range, disjoint from evaluation)."""
DEMO_SEED = 2_000_000
"""Demonstration puzzles come from seeds ≥ this."""
EVAL_SAMPLING_SEED = 12345


def step_seed(seed: int, step: int, stream: int) -> int:
    """A deterministic 31-bit seed for (run seed, step, purpose)."""
    return int(np.random.SeedSequence([seed, step, stream]).generate_state(1)[0] >> 1)


def train_group_seeds(seed: int, step: int, num_groups: int, pool: int | None = None) -> list[int]:
    """Puzzle seeds of one rollout batch (one per GRPO group): below the held-out range, or from ``[0, pool)``."""
    rng = np.random.default_rng(step_seed(seed, step, 0))
    return rng.integers(0, pool or EVAL_SEED, size=num_groups).tolist()
