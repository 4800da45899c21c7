"""Failures of a run that a user can act on. The command line prints each as one line (never a traceback) that
says what happened and what to do; anything else is a bug and keeps its traceback."""

from __future__ import annotations


class RunError(RuntimeError):
    """A run cannot go on for a reason the user can fix (data, settings, a damaged file)."""


class TrainingBlewUp(RunError):
    """Values went non-finite and did not recover: the policy's log-probs, the loss, or the gradients."""


class CheckpointFailed(RunError):
    """A resumable checkpoint could not be written (a full disk, a folder that cannot be written): the run stops,
    and the newest whole checkpoint stays."""
