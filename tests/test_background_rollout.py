"""The schedule and the thread of rollouts with bounded staleness (dppo_oat.rollout.background)."""

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dppo_oat.rollout.background import (
    BackgroundRollout,
    CancellableGenerator,
    RolloutCancelled,
    behavior_version,
    staleness_metrics,
    versions_to_keep,
)


@given(step=st.integers(1, 10_000), k=st.integers(0, 50))
def test_the_rollout_of_step_t_is_min_k_t_minus_1_versions_behind(step, k):
    version = behavior_version(step, k)
    assert 0 <= version <= step - 1 and step - 1 - version == min(k, step - 1)
    assert behavior_version(step, 0) == step - 1  # synchronous: the latest weights


@given(step=st.integers(0, 10_000), k=st.integers(0, 50))
def test_the_kept_versions_are_those_the_next_rollouts_sample_with(step, k):
    kept = versions_to_keep(step, k)
    upcoming = {behavior_version(step + j, k) for j in range(1, k + 2)}
    assert upcoming <= set(kept) and step in kept and len(kept) <= k + 1


def test_staleness_metrics_count_versions_behind_the_update():
    assert staleness_metrics([3, 3, 1], step=5) == {"staleness/mean": pytest.approx(5 / 3), "staleness/max": 3.0}
    assert staleness_metrics([4], step=5) == {"staleness/mean": 0.0, "staleness/max": 0.0}
    with pytest.raises(ValueError):
        behavior_version(3, -1)


def test_a_background_rollout_hands_back_its_value_or_its_error():
    assert BackgroundRollout(lambda cancelled: 42).start().result() == 42

    def broken(cancelled):
        raise RuntimeError("env broke")

    with pytest.raises(RuntimeError, match="env broke"):
        BackgroundRollout(broken).start().result()


class SlowGenerator:
    """A generator whose every call takes until ``release`` is set."""

    def __init__(self):
        self.release, self.calls, self.cache = threading.Event(), 0, "kept"

    def generate(self, prompts, settings):
        self.calls += 1
        self.release.wait(5)
        return list(prompts)


def test_a_cancelled_rollout_stops_at_its_next_generator_call():
    generator = SlowGenerator()
    started = threading.Event()

    def many_turns(cancelled):
        wrapped = CancellableGenerator(generator, cancelled)
        assert wrapped.cache == "kept"  # every other attribute is the generator's
        started.set()
        for _ in range(1000):
            wrapped.generate([1], None)

    assert BackgroundRollout(many_turns).cancel()  # never started: nothing to wait for
    pending = BackgroundRollout(many_turns).start()
    started.wait(5)
    pending.cancelled.set()
    generator.release.set()
    assert pending.cancel(timeout=5) and generator.calls < 1000
    with pytest.raises(RolloutCancelled):
        pending.result()
