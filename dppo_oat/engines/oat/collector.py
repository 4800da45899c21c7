"""The actor steps of the oat engine's asynchronous loop (``--max_staleness k > 0``): played ahead of the learners,
each with the weights its learning round's schedule names, and handed to the learners when they reach it.

The schedule is the local engine's (:func:`~dppo_oat.rollout.background.behavior_version`): learning round ``t``
is sampled with the weights after round ``max(0, t − 1 − k)`` (weight version ``v``: the policy after ``v``
learning rounds, the actors' weights after the learner's ``v``-th broadcast). Actor step ``s`` belongs to
round ``⌈s / update_interval⌉`` (oat's ``LearnerBase.update_interval`` actor steps make one learning round).

:class:`ActorStepPipeline` replaces oat's ``FeedbackCollector.collect_feedback`` (oat/collectors/base.py:91-177)
on each learner: the learners of one actor (oat's ``same_actor_group``) gather their prompts to the group's rank 0,
which hands the actor's step to a one-worker executor (steps run one at a time, in the order submitted: an actor's
vLLM engine generates one step at a time) and later scatters the step's samples back, a real list for every rank
(oat's ``AsyncFeedbackCollector`` scatters None from the source rank at its first step,
oat/collectors/asynchronous.py:88-121, which ``scatter_object_list`` refuses). vLLM is not safe against a weight
update during a generate call (its CPU backend runs ``collective_rpc`` in the calling thread, and launchpad's courier
serves calls from a thread pool), so the learner calls :meth:`ActorStepPipeline.wait_all` before every broadcast
and evaluation, and the actor refuses a weight load while it plays (``DPPOGemActor.update_weight``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate

import torch.distributed as dist

from dppo_oat.rollout.background import behavior_version


def round_of_step(step: int, update_interval: int) -> int:
    """The learning round actor step ``step`` (from 1) belongs to: ``update_interval`` steps make one round."""
    if step < 1 or update_interval < 1:
        raise ValueError(f"actor steps count from 1 and a round has >= 1 of them, got {step} and {update_interval}")
    return (step - 1) // update_interval + 1


def steps_of_round(learning_round: int, update_interval: int) -> range:
    """The actor steps of learning round ``learning_round`` (from 1)."""
    return range((learning_round - 1) * update_interval + 1, learning_round * update_interval + 1)


def step_version(step: int, update_interval: int, max_staleness: int) -> int:
    """The weight version actor step ``step`` plays with: its round's :func:`behavior_version`."""
    return behavior_version(round_of_step(step, update_interval), max_staleness)


def split_by_rank(samples: Sequence, rank_lengths: Sequence[int]) -> list[list]:
    """``samples`` cut into consecutive lists of ``rank_lengths`` (every list real, empty ones too), as oat cuts an
    actor's samples between the learners that asked for them (oat/collectors/base.py:152-163)."""
    if len(samples) != sum(rank_lengths):
        raise ValueError(f"the actor sent {len(samples)} samples for {sum(rank_lengths)} prompts")
    ends = list(accumulate(rank_lengths))
    return [list(samples[end - length:end]) for end, length in zip(ends, rank_lengths, strict=True)]


@dataclass
class PlayedStep:
    """One actor step handed to the executor: its weight version, the prompts each learner of the group asked for,
    and the future of ``(the actor's IPC handle, seconds the step took)``; once read back from the actor
    (:meth:`ActorStepPipeline.played_steps`), its samples and seconds instead of the future."""

    version: int
    rank_lengths: list[int]
    future: Future | None
    samples: list | None = None
    seconds: float = 0.0

    def result(self, deserialize: Callable) -> tuple[list, float]:
        """``(samples, seconds)``: read back once from the actor's shared memory, then kept."""
        if self.samples is None:
            handle, self.seconds = self.future.result()
            self.samples, self.future = deserialize(handle), None
        return self.samples, self.seconds


def timed(call: Callable, *args) -> tuple[object, float]:
    """``call(*args)`` and the seconds it took."""
    start = time.time()
    result = call(*args)
    return result, time.time() - start


class ActorStepPipeline:
    """The actor steps one group of learners has asked for and not yet taken, played in order by one worker.

    Every method but :meth:`pending_steps` is collective over ``group`` (each learner of the group calls it in the
    same order); only the group's rank 0 talks to the actor. ``play(version, prompts, formatted_prompts,
    references)`` runs one actor step (a blocking call to the actor) and returns its IPC handle, which
    ``deserialize`` turns into the step's samples.
    """

    def __init__(self, play: Callable, deserialize: Callable, group) -> None:
        self.play, self.deserialize, self.group = play, deserialize, group
        self.is_source = dist.get_rank(group) == 0
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="actor-steps") if self.is_source else None
        self.played: dict[int, PlayedStep] = {}  # in the order submitted: the executor's order

    def pending_steps(self) -> list[int]:
        """The actor steps submitted and not yet taken, in order."""
        return list(self.played)

    def submit(self, step: int, version: int, prompts: list, formatted_prompts: list, references: list) -> None:
        """Ask the actor for step ``step`` with weight version ``version``: the group's prompts, gathered to rank 0,
        queued behind the steps before it."""
        if step in self.played:
            raise ValueError(f"actor step {step} was submitted already")
        gathered = [self._gather(items) for items in (prompts, formatted_prompts, references)]
        future: Future | None = None
        lengths: list[int] = []
        if self.is_source:
            lengths = [len(items) for items in gathered[0]]
            flat = [[item for items in per_rank for item in items] for per_rank in gathered]
            future = self.executor.submit(timed, self.play, version, *flat)
        self.played[step] = PlayedStep(version, lengths, future)

    def take(self, step: int) -> tuple[list, float]:
        """This learner's samples of actor step ``step`` (the oldest one submitted; waits for it) and the seconds
        the actor took to play it."""
        if not self.played or next(iter(self.played)) != step:
            raise ValueError(f"actor step {step} is not the next one submitted (pending: {self.pending_steps()})")
        played = self.played.pop(step)
        shares: list[list] | None = None
        if self.is_source:
            samples, seconds = played.result(self.deserialize)
            shares = [[share, seconds] for share in split_by_rank(samples, played.rank_lengths)]
        received: list = [None]
        dist.scatter_object_list(received, shares, group=self.group, group_src=0)
        share, seconds = received[0]
        return share, float(seconds)

    def wait_all(self) -> None:
        """Return once every submitted step has been played (its samples wait to be taken): the actor's weights may
        change then. Raises what a step raised."""
        if self.is_source:
            for played in self.played.values():
                if played.future is not None:
                    played.future.result()
        dist.barrier(group=self.group)

    def played_steps(self) -> list[dict]:
        """The steps submitted and not yet taken, each played (waited for), for a checkpoint: ``step`` and
        ``version`` on every learner, with ``rank_lengths``, ``samples`` and ``seconds`` on the group's rank 0 (the
        samples are read back from the actor's shared memory and kept until taken)."""
        saved = []
        for step, played in self.played.items():
            record = {"step": step, "version": played.version}
            if self.is_source:
                samples, seconds = played.result(self.deserialize)
                record.update(rank_lengths=played.rank_lengths, samples=samples, seconds=seconds)
            saved.append(record)
        return saved

    def restore(self, saved: list[dict]) -> None:
        """Undo :meth:`played_steps` in a resumed run: those steps wait to be taken, played already."""
        if self.played:
            raise ValueError(f"actor steps {self.pending_steps()} are pending: restore before submitting any")
        for record in saved:
            self.played[int(record["step"])] = PlayedStep(
                int(record["version"]), list(record.get("rank_lengths", [])), None,
                record.get("samples") if self.is_source else None, float(record.get("seconds", 0.0)))

    def drop(self, collective: bool = True) -> None:
        """Abandon every step not yet taken: the queued ones are cancelled, the one playing is waited for (its
        samples are freed unread), and the worker ends. ``collective`` False (after a failure, when another learner
        of the group may be gone): nothing is waited for."""
        if self.is_source:
            futures = [played.future for played in self.played.values() if played.future is not None]
            started = [future for future in futures if not future.cancel()]
            for future in started if collective else ():  # cancelled first: no queued step starts meanwhile
                handle, _ = future.result()
                self.deserialize(handle)  # frees the actor's shared-memory copy
            self.executor.shutdown(wait=collective)
        self.played.clear()
        if collective:
            dist.barrier(group=self.group)

    def _gather(self, items: list) -> list[list] | None:
        """Every group member's ``items``, on rank 0 (None elsewhere)."""
        gathered = [None] * dist.get_world_size(self.group) if self.is_source else None
        dist.gather_object(list(items) if items is not None else [], gathered, group=self.group, group_dst=0)
        return gathered
