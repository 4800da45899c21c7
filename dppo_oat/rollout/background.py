"""Rollouts with bounded staleness: the next rollout batch is sampled while the learner updates on the current one.

The behavior policy μ of step ``t`` is then the policy of an older weights version, at most ``k`` updates behind
(``--max-staleness k``). DPPO's trust region anchors on μ itself (eq:dppo_obj masks on the divergence between
μ and π_θ, sec:correct_ancher_for_truct_region), so a stale μ needs no correction of its own: the samples keep the
log-probabilities μ gave them and the mask bounds how far π_θ moves from it.

The schedule is fixed, whatever the threads' timing: the rollout of step ``t`` samples with the weights after step
:func:`behavior_version` ``(t, k) = max(0, t − 1 − k)`` (version 0: the initial policy), so a run is reproducible
and a resumed run continues exactly. One rollout runs in the background at a time (:class:`BackgroundRollout`); it
stops at its next generator call when cancelled (:class:`CancellableGenerator`), so Ctrl-C never waits for more than
one batch of sampling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


def behavior_version(step: int, max_staleness: int) -> int:
    """The weights version that samples the rollout of RL step ``step`` (1-based): the weights after step
    ``max(0, step − 1 − max_staleness)``; ``max_staleness = 0`` is the synchronous loop (version ``step − 1``)."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return max(0, step - 1 - max_staleness)


def versions_to_keep(step: int, max_staleness: int) -> range:
    """The weights versions a run after step ``step`` still needs: the behavior versions of the rollouts of steps
    ``step + 1 … step + 1 + k`` (the pending one and those after), the current weights (version ``step``) included."""
    return range(behavior_version(step + 1, max_staleness), step + 1)


def staleness_metrics(versions: Sequence[int], step: int) -> dict[str, float]:
    """``staleness/mean`` and ``staleness/max``: how many updates each sample's weights version is behind the
    weights the update of step ``step`` starts from (version ``step − 1``)."""
    behind = [step - 1 - version for version in versions]
    if not behind:
        return {"staleness/mean": 0.0, "staleness/max": 0.0}
    return {"staleness/mean": sum(behind) / len(behind), "staleness/max": float(max(behind))}


class RolloutCancelled(Exception):
    """Raised in the background thread at its next generator call once the rollout is cancelled."""


class CancellableGenerator:
    """A generator that raises :class:`RolloutCancelled` at its next ``generate`` once ``cancelled`` is set (every
    other attribute is the wrapped generator's)."""

    def __init__(self, generator, cancelled: threading.Event):
        self.generator, self.cancelled = generator, cancelled

    def generate(self, prompts, settings):
        if self.cancelled.is_set():
            raise RolloutCancelled()
        return self.generator.generate(prompts, settings)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.generator, name)


class BackgroundRollout:
    """``work(cancelled)`` in a daemon thread, from :meth:`start` on; :meth:`result` waits for it (interruptible by
    Ctrl-C) and returns its value or raises its exception in the caller's thread; :meth:`cancel` asks it to stop and
    waits a bounded time. The owner keeps the object before starting it, so a signal can never orphan the thread."""

    def __init__(self, work: Callable[[threading.Event], Any], *, name: str = "rollout"):
        self.cancelled = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=True)
        self._launched = False

    def start(self) -> BackgroundRollout:
        self._launched = True
        self._thread.start()
        return self

    def _run(self, work: Callable[[threading.Event], Any]) -> None:
        try:
            self._value = work(self.cancelled)
        except BaseException as error:
            self._error = error

    def wait(self) -> None:
        """Block until the work has ended (a signal in the main thread interrupts the wait)."""
        self._thread.join()

    def result(self) -> Any:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self, timeout: float = 60.0) -> bool:
        """Stop the work at its next generator call; True once the thread has ended (or never started)."""
        self.cancelled.set()
        if not self._launched:
            return True
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._thread.join(max(0.0, deadline - time.monotonic()))
                break
            except RuntimeError:  # a signal cut start() short: the thread reports itself started in a moment
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        return not self._thread.is_alive()
