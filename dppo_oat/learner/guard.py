"""The blow-up guard: no non-finite value reaches the weights, and a run whose values blew up stops (not the
trust region's divergence, :mod:`dppo_oat.divergence`).

A minibatch whose loss or μ log-probs are non-finite is never applied (its backward is a zero-gradient surrogate,
:func:`zero_surrogate`, so engines that count micro-batches stay aligned, and the engine discards the step); an
engine whose gradient norm is non-finite skips its step and says so (:data:`SKIPPED`). A run that skips ``patience``
optimizer steps in a row (:class:`BlowUpGuard`), or whose own log-probs turn non-finite (:data:`NONFINITE_PI`,
:func:`check_policy_finite`), stops with :class:`~dppo_oat.errors.TrainingBlewUp`; :func:`check_weights_finite`
scans the weights before they are saved or sent to the rollout engine. With several learners every decision is
taken on the state they agree on (:data:`AnyLearner`). The update loop (:mod:`dppo_oat.learner.update`) applies the
guard to every minibatch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from dppo_oat.errors import TrainingBlewUp
from dppo_oat.learner.forward import ForwardFn
from dppo_oat.run.safe_io import nonfinite_tensors
from dppo_oat.trust_region import TopK
from dppo_oat.update_batch import UpdateBatch

SKIPPED = "guard/skipped"
"""1.0 for an optimizer step that was not applied (non-finite loss, μ log-probs or gradients), else 0.0."""
ALL_SKIPPED = "guard/all_skipped"
"""1.0 for a rollout batch none of whose optimizer steps was applied (each one :data:`SKIPPED`): nothing was learned
from it (:func:`every_step_skipped`), else 0.0."""
LOSS_SCALE_SKIPS = "guard/loss_scale_skips"
"""1.0 for an optimizer step that float16's loss scaler skipped because its scaled gradients overflowed (it then
lowers the scale: :func:`~dppo_oat.learner.update.scaled_clip_and_step`), else 0.0; summed over a rollout batch's
steps. Not a divergence: the guard neither counts it nor stops for it."""
NONFINITE_PI = "guard/nonfinite_pi"
"""π_θ's own log-probs non-finite: the weights diverged, and nothing later can recover."""
NONFINITE_ADVANTAGES = "guard/nonfinite_advantages"
"""The advantages non-finite: the rewards or the advantage estimator broke, and every later batch would too."""
NONFINITE_CAUSES = {"guard/nonfinite_loss": "the policy loss", "guard/nonfinite_mu": "μ's log-probs (the rollout's)",
                    "guard/nonfinite_grad": "the gradient norm", NONFINITE_PI: "π_θ's log-probs",
                    NONFINITE_ADVANTAGES: "the advantages"}
"""The guard's per-step metrics (1.0 when that value was non-finite) and what each names in an error."""

HEALTHY, SKIP, DIVERGED = 0, 1, 2
"""The state of a minibatch (or of the weights after an update), ordered so that the worst one wins."""

AnyLearner = Callable[[int], int]
"""The largest of one value over every learner (an all-reduce MAX over oat's ranks; one learner: the value itself).
Every decision that is followed by a collective or by the end of the run (step, skip, stop) is taken on the agreed
state, so that no learner goes on alone into a collective the others never reach, which would hang until the
communication timeout."""


def one_learner(state: int) -> int:
    """:data:`AnyLearner` of a single learner (the local engine)."""
    return state


def where(here: bool) -> str:
    """Where a learner's error happened, for its message: nothing for this learner, else on another one."""
    return "" if here else " on another learner"


def diverged_error(here: bool, cause: str = NONFINITE_PI) -> TrainingBlewUp:
    """The stop of a run whose weights (or, ``cause`` :data:`NONFINITE_ADVANTAGES`, advantages) diverged, on this
    learner or on another one."""
    if cause == NONFINITE_ADVANTAGES:
        return TrainingBlewUp(f"the advantages are non-finite{where(here)}: the rewards or the advantage estimator "
                                "broke (check the env's rewards and --advantage-mode), nothing was applied")
    return TrainingBlewUp(f"π_θ's log-probs are non-finite{where(here)}: the policy's weights diverged (lower --lr "
                            "and start a new run from the last checkpoint's settings)")


@dataclass
class BlowUpGuard:
    """Counts optimizer steps skipped in a row; ``patience`` of them stop the run (it will not recover). The loss
    scaler's skips (:data:`LOSS_SCALE_SKIPS`) are counted apart and leave the run of skips as it was."""

    patience: int = 8
    skipped_in_a_row: int = 0
    skipped_total: int = 0
    loss_scale_skips: int = 0

    def observe(self, metrics: dict[str, float]) -> None:
        """Record one optimizer step's metrics; raise :class:`TrainingBlewUp` after ``patience`` skips in a row."""
        if metrics.get(LOSS_SCALE_SKIPS) and not metrics.get(SKIPPED):
            self.loss_scale_skips += 1
            return
        if not metrics.get(SKIPPED):
            self.skipped_in_a_row = 0
            return
        self.skipped_in_a_row += 1
        self.skipped_total += 1
        if self.skipped_in_a_row >= self.patience:
            causes = [name for key, name in NONFINITE_CAUSES.items() if metrics.get(key)] or ["a value"]
            raise TrainingBlewUp(
                f"{' and '.join(causes)} non-finite in {self.skipped_in_a_row} optimizer steps in a row (none was "
                "applied): lower --lr, check the rollout's log-probs (--logprob-noise?) and start a new run")


def every_step_skipped(history: Sequence[dict[str, float]]) -> bool:
    """True when a rollout batch had optimizer steps and the guard skipped each of them (:data:`ALL_SKIPPED`)."""
    return bool(history) and all(step.get(SKIPPED) for step in history)


def skip_causes(summary: dict[str, float]) -> list[str]:
    """What made the guard skip (:data:`NONFINITE_CAUSES`), from a rollout batch's summarised metrics."""
    return [name for key, name in NONFINITE_CAUSES.items() if summary.get(key)] or ["a value"]


def nonfinite_cause(logp: torch.Tensor, behavior_logp: torch.Tensor, loss: torch.Tensor,
                    response_mask: torch.Tensor, topk: TopK | None = None,
                    advantages: torch.Tensor | None = None) -> str | None:
    """Which guard metric a micro-batch trips (None: all finite). Non-finite π_θ log-probs (:data:`NONFINITE_PI`)
    mean the weights themselves diverged, non-finite advantages (:data:`NONFINITE_ADVANTAGES`) that the rewards or
    their estimator did: either minibatch ends the run once every learner has finished it (see
    :func:`~dppo_oat.learner.update.finish_minibatch`); ``policy_loss`` would only mask such tokens. μ on the top-K set
    may be −inf (its padding slots, an underflowed tail token), never NaN."""
    mask = response_mask.bool()
    if not torch.isfinite(logp.detach()[mask]).all():
        return NONFINITE_PI
    if advantages is not None and not torch.isfinite(advantages.expand_as(mask)[mask]).all():
        return NONFINITE_ADVANTAGES
    if not torch.isfinite(behavior_logp[mask]).all():
        return "guard/nonfinite_mu"
    if topk is not None and torch.isnan(topk.behavior_logp[mask]).any():
        return "guard/nonfinite_mu"
    if not torch.isfinite(loss.detach()).all():
        return "guard/nonfinite_loss"
    return None


def zero_surrogate(logp: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient is exactly zero but which runs the same backward, collectives included (with
    non-finite π_θ log-probs the gradient is not finite either: the minibatch is discarded all the same)."""
    return (logp * response_mask).sum() * 0.0


STOPPING_CAUSES = (NONFINITE_PI, NONFINITE_ADVANTAGES)
"""The guard metrics no skip recovers from: the run stops at the first minibatch that shows one."""


def minibatch_state(poisoned: Sequence[str]) -> int:
    """:data:`DIVERGED` when π_θ itself or the advantages are non-finite (:data:`STOPPING_CAUSES`), :data:`SKIP` for
    any other guard metric, else :data:`HEALTHY`."""
    if any(cause in poisoned for cause in STOPPING_CAUSES):
        return DIVERGED
    return SKIP if poisoned else HEALTHY


@torch.no_grad()
def check_policy_finite(batch: UpdateBatch, forward: ForwardFn, rows: int = 4,
                        any_learner: AnyLearner = one_learner) -> None:
    """After an update: π_θ's log-probs on the first ``rows`` samples are finite on every learner, or the weights
    diverged (every learner raises), before any checkpoint of them is written."""
    first = batch.select(torch.arange(min(rows, len(batch)), device=batch.input_ids.device))
    logp = forward(first, False).logp
    here = not torch.isfinite(logp[first.response_mask.bool()]).all()
    if any_learner(DIVERGED if here else HEALTHY) == DIVERGED:
        raise TrainingBlewUp(f"the update left π_θ's log-probs non-finite{where(here)}: the weights diverged (lower "
                               "--lr and start a new run)")


def check_weights_finite(named_weights: Iterable[tuple[str, torch.Tensor]],
                         any_learner: AnyLearner = one_learner) -> None:
    """Every weight (each learner's own shard of it) is finite on every learner, or every learner raises: run
    before weights are saved or sent to the rollout engine, so that neither ever holds a NaN."""
    broken = nonfinite_tensors(dict(named_weights))
    if any_learner(DIVERGED if broken else HEALTHY) == DIVERGED:
        named = f" (e.g. {broken[0]})" if broken else where(False)
        raise TrainingBlewUp(f"weights are non-finite{named}: the update diverged (lower --lr and start a new run)")
