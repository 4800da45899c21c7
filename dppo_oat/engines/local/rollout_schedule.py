"""Where each RL step's rollout comes from, and with which weights: one object the trainer calls at fixed points.

With ``max_staleness`` 0 (the default) the rollout of step ``t`` is sampled when the step asks for it, by the rollout
copy that holds the weights after step ``t − 1``: the synchronous loop. With ``max_staleness k > 0`` it was launched
in a background thread while step ``t − 1`` updated, by its own sampler loaded with the weights after step
``max(0, t − k)`` (:mod:`dppo_oat.rollout.background`). The trainer calls :meth:`RolloutSchedule.rollout` at the
start of a step, :meth:`~RolloutSchedule.after_update` after its update, :meth:`~RolloutSchedule.checkpoint_state`
and :meth:`~RolloutSchedule.restore` with its checkpoint, and :meth:`~RolloutSchedule.cancel` on the way out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dppo_oat.rollout.background import (
    BackgroundRollout,
    CancellableGenerator,
    behavior_version,
    staleness_metrics,
    versions_to_keep,
)
from dppo_oat.rollout.episodes import Rollout
from dppo_oat.rollout.rollout_copy import rollout_state_dict

RolloutPlan = Callable[[int], Callable[[object], Rollout]]
"""``plan(step)`` fixes step's seeds and sampling stream now and returns ``collect(generator) -> Rollout``."""
Weights = dict[str, torch.Tensor]


class RolloutSchedule:
    """The rollouts of a run with bounded staleness ``max_staleness`` (0: synchronous)."""

    def __init__(self, max_staleness: int, plan: RolloutPlan, generator, *, stale_generator=None,
                 rollout_dtype: str = "float32", initial_weights: Weights | None = None):
        if max_staleness and (stale_generator is None or initial_weights is None):
            raise ValueError("stale rollouts need a sampler of their own and the initial weights")
        self.max_staleness, self.plan, self.generator = max_staleness, plan, generator
        self.stale_generator, self.rollout_dtype = stale_generator, rollout_dtype
        self.weight_versions: dict[int, Weights] = {0: initial_weights} if max_staleness else {}
        self.pending: BackgroundRollout | None = None
        self.pending_step = 0

    def rollout(self, step: int, last_step: int) -> tuple[Rollout, float, float]:
        """The rollout of ``step``: ``(rollout, seconds it sampled, seconds the step waited for it)``; with staleness,
        the next step's is launched before this returns (none past ``last_step``)."""
        if not self.max_staleness:
            started = time.perf_counter()
            rollout = self.plan(step)(self.generator)
            seconds = time.perf_counter() - started
            return rollout, seconds, seconds
        waiting = time.perf_counter()
        if self.pending is None or self.pending_step != step:  # the first step, or the first after a resume
            self._launch(step)
        rollout, seconds = self.pending.result()
        waited = time.perf_counter() - waiting
        self.pending = None
        if step < last_step:
            self._launch(step + 1)
        return rollout, seconds, waited

    def _launch(self, step: int) -> None:
        """Sample the rollout of ``step`` in the background with the weights version :func:`behavior_version` gives
        (loaded now, so that the update may change the learner's weights meanwhile); every sample records it."""
        version = behavior_version(step, self.max_staleness)
        self.stale_generator.update_weights(rollout_state_dict(self.weight_versions[version], self.rollout_dtype))
        collect, threads = self.plan(step), torch.get_num_threads()

        def sample(cancelled) -> tuple[Rollout, float]:
            torch.set_num_threads(threads)  # a new thread's own thread count would otherwise be the default
            started = time.perf_counter()
            rollout = collect(CancellableGenerator(self.stale_generator, cancelled))
            for turn_sample in rollout.samples:
                turn_sample.weights_version = version
            return rollout, time.perf_counter() - started

        self.pending, self.pending_step = BackgroundRollout(sample), step
        self.pending.start()

    def after_update(self, step: int, snapshot: Callable[[], Weights]) -> None:
        """After ``step``'s update: keep its weights (``snapshot()``), and only the versions later rollouts sample
        with (nothing when synchronous)."""
        if not self.max_staleness:
            return
        self.weight_versions[step] = snapshot()
        needed = versions_to_keep(step, self.max_staleness)
        self.weight_versions = {v: w for v, w in self.weight_versions.items() if v in needed}

    def metrics(self, rollout: Rollout, step: int, waited: float) -> dict[str, float]:
        """The staleness of ``step``'s samples and the seconds the step waited for them (none when synchronous)."""
        if not self.max_staleness:
            return {}
        return {**staleness_metrics([sample.weights_version for sample in rollout.samples], step),
                "time/rollout_wait": waited}

    def wait(self) -> None:
        """Until the background rollout in flight, if any, is done (nothing else may sample meanwhile)."""
        if self.pending is not None:
            self.pending.wait()

    def cancel(self) -> None:
        """Stop a background rollout at its next generator call (Ctrl-C, a failure, the end of the run)."""
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None

    def checkpoint_state(self, step: int) -> dict:
        """What a checkpoint at ``step`` keeps: the older weights the next rollouts sample with (the current ones are
        the checkpoint's model); nothing when synchronous."""
        if not self.max_staleness:
            return {}
        return {"weight_versions": {v: w for v, w in self.weight_versions.items() if v != step}}

    def restore(self, state: dict, current: Weights) -> None:
        """The weights versions of a checkpoint (``current``: its model's); a KeyError when one that the next
        rollouts sample with is missing."""
        if not self.max_staleness:
            return
        step = int(state["step"])
        versions = {int(v): weights for v, weights in state.get("weight_versions", {}).items()}
        versions[step] = current
        missing = [v for v in versions_to_keep(step, self.max_staleness) if v not in versions]
        if missing:
            raise KeyError(f"no weights of version(s) {missing} for the next rollouts")
        self.weight_versions = versions
