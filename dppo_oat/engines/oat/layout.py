"""Which layout of the node's GPUs a run is faster in, by the price (:mod:`~dppo_oat.engines.oat.price`): the
actors and learners *collocated* (``--collocate``: every GPU runs an actor and a learner, which take turns), or
*split* (actors on A GPUs, learners on L, A + L = G), synchronous (``--max_staleness 0``) or with the actors a round
ahead (``--max_staleness`` k ≥ 1).

Each layout is priced by the price itself: the plan of the same flags in that layout (oat's ``get_program`` gives
the actors and the learners half the GPUs each when they are not collocated) priced as any plan is, so an actor
plays the round's actor steps its actors share and a learner learns the samples its learners share, and the split
learner has its whole GPU (:func:`~dppo_oat.engines.oat.price.learner_memory`). A round then costs:

- synchronous, either layout: the actors' seconds plus the learner's (:func:`~dppo_oat.engines.oat.price.overlapped`);
- ``--max_staleness`` k ≥ 1 (split only): the larger of the two, the actors playing round t + 1 while the learners
  train round t; a run of R rounds ``R · max + min``, the first round's actors and the last round's learner alone
  (:func:`~dppo_oat.engines.oat.price.run_time`).

The price does not count weight broadcasts, so no broadcast term is added. :func:`best_split` prices any
other A + L = G by scaling (:func:`scaled_seconds`), which oat's program cannot place.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

from dppo_oat.engines.oat.plan import check_plan, plan_of, render_plan, round_samples
from dppo_oat.engines.oat.price import Price, duration, overlapped, price_of, run_time

GiB = 2**30
NOT_PRICED = "not priced (the price above says why)"


# --------------------------------------------------------------------------------------------- the arithmetic


def scaled_seconds(seconds: float, priced_gpus: int, gpus: int) -> float:
    """``seconds`` priced on ``priced_gpus`` GPUs taken to ``gpus``: the price's actors share a round's actor steps
    and its learners a round's samples, so each one's time goes as 1 / their number."""
    return seconds * priced_gpus / gpus


def best_split(actor: float, actor_gpus: int, learner: float, learner_gpus: int, gpus: int,
               gpus_per_actor: int = 1) -> tuple[int, int, float] | None:
    """The split ``(A, L, seconds a round)`` of ``gpus`` GPUs with the actors a round ahead that takes least time,
    from the actors' ``actor`` seconds on ``actor_gpus`` and the learners' ``learner`` on ``learner_gpus``
    (:func:`scaled_seconds`); A a multiple of ``gpus_per_actor``, L at least 1. None when no split exists."""
    splits = [(a, gpus - a, overlapped(scaled_seconds(actor, actor_gpus, a),
                                          scaled_seconds(learner, learner_gpus, gpus - a), 1))
              for a in range(gpus_per_actor, gpus, gpus_per_actor)]
    return min(splits, key=lambda split: split[2], default=None)


def times_faster(slow: float, fast: float) -> float:
    return slow / fast


# ----------------------------------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """One layout: its actor and learner GPUs and its plan's :class:`~dppo_oat.engines.oat.price.Price` (the
    actors' seconds a round at most and at the measured mean turns, the learner's, the rounds, the memory), timed
    with the actors up to any ``max_staleness`` ahead."""

    actor_gpus: int
    learner_gpus: int
    price: Price

    @property
    def actor_seconds(self) -> float:
        return self.price.actor_seconds

    @property
    def learner_seconds(self) -> float:
        return self.price.learner_seconds

    def round(self, max_staleness: int, expected: bool = False) -> float | None:
        """Seconds a round (at the measured mean turns with ``expected``; None without them)."""
        actor = self.price.actor_expected_seconds if expected else self.actor_seconds
        return overlapped(actor, self.learner_seconds, max_staleness)

    def run(self, max_staleness: int, expected: bool = False) -> float | None:
        actor = self.price.actor_expected_seconds if expected else self.actor_seconds
        return run_time(actor, self.learner_seconds, self.price.rounds, max_staleness)


def layout_of(price: Price | None, plan) -> Layout | None:
    """``plan``'s layout priced by its ``price``, None where the price has no round time."""
    if price is None or price.round_seconds is None:
        return None
    return Layout(plan.actors * plan.gpus_per_actor, plan.learners // plan.num_groups, price)


@dataclass(frozen=True)
class Layouts:
    """The run's layouts side by side: collocated and oat's split (None, with why, where not priced), the staleness
    the split is priced ahead with (0 where it is not: ``async_note`` says why), and the flags that take the run to
    each ("" for the run's own)."""

    gpus: int
    collocated: Layout | None
    collocated_note: str
    split: Layout | None
    split_note: str
    max_staleness: int
    async_note: str
    collocated_flags: str
    split_flags: str
    gpus_per_actor: int = 1


# ------------------------------------------------------------------------------------ the other layout's flags


def not_ahead(args, plan) -> str:
    """Why the split is not priced with the actors ahead: the engine refuses ``--max_staleness`` k > 0 whatever the
    layout with a trust region that recomputes π_θ' or ``--sync_params_every`` > 1; a resume (``--resume_dir``)
    keeps its run's settings; and an odd ``--gpus`` puts an actor and a learner on one GPU, where they would not
    overlap. "" where nothing stops it."""
    refused = "--max_staleness is refused with "
    if plan.trust_region is not None and plan.trust_region.needs_recompute:
        return f"{refused}--trust_region {plan.trust_region.name}, which recomputes π_θ'"
    if getattr(args, "resume_dir", None):
        return "a resume goes on with its run's own --max_staleness and layout"
    if getattr(args, "sync_params_every", 1) != 1:
        return f"{refused}--sync_params_every {args.sync_params_every}"
    if plan.gpus % 2:
        return "oat puts an actor and a learner on one of an odd number of GPUs, where they cannot overlap"
    return ""


def layout_args(args, collocate: bool, max_staleness: int):
    """``args`` in a layout: ``--collocate`` or not (then no ``--vllm_sleep``), ``--max_staleness`` k, and a
    ``--pi_buffer_maxlen_per_device`` of one round's samples made one round's of that layout's learners."""
    other = copy.copy(args)
    other.collocate, other.max_staleness = collocate, max_staleness
    if not collocate:
        other.vllm_sleep = False
    if args.pi_buffer_maxlen_per_device in (None, round_samples(args)):
        other.pi_buffer_maxlen_per_device = round_samples(other)
    return other


def flags_text(args, other) -> str:
    """The flags that take ``args`` to ``other``: ``--name value``, a switch as ``--name`` or ``without --name``."""
    words = []
    for name in ("collocate", "vllm_sleep", "pi_buffer_maxlen_per_device", "max_staleness"):
        old, new = getattr(args, name, None), getattr(other, name, None)
        if new == old or (not new and old is None):
            continue
        if isinstance(new, bool):
            words.append(f"--{name}" if new else f"without --{name}")
        else:
            words.append(f"--{name} {new}")
    return ", ".join(words)


def priced_layout(args, plan, smi_name: str | None) -> tuple[Layout | None, str]:
    """``args``'s plan (with ``plan``'s episode turns, which no layout changes) priced; None and why where its
    plan is refused or not priced."""
    try:
        other = replace(plan_of(args), slot_turns=plan.slot_turns)
        check_plan(other)
    except ValueError as error:
        return None, f"its plan is refused: {error}"
    layout = layout_of(price_of(other, args, plan.shape, plan.shape_note, smi_name), other)
    return layout, "" if layout is not None else NOT_PRICED


def layouts_of(args, plan) -> Layouts | None:
    """The run's layout (``plan``, a :func:`~dppo_oat.engines.oat.plan.priced_plan`) beside the other one, with the
    flags that take the run to each; None without a price."""
    if plan.price is None:
        return None
    smi_name = plan.smi_name
    own = layout_of(plan.price, plan)
    own_note = "" if own is not None else NOT_PRICED
    if plan.gpus == 1:  # oat's split of one GPU is the GPU shared
        return Layouts(1, own, own_note, None, "one GPU", 0, "", "", "", plan.gpus_per_actor)
    other, other_note = priced_layout(layout_args(args, not plan.collocate, 0), plan, smi_name)
    collocated, split = (own, other) if plan.collocate else (other, own)
    notes = (own_note, other_note) if plan.collocate else (other_note, own_note)
    why_not = not_ahead(args, plan)
    ahead = 0 if why_not else max(getattr(args, "max_staleness", 0) or 0, 1)
    return Layouts(plan.gpus, collocated, notes[0], split, notes[1], ahead, why_not,
                   flags_text(args, layout_args(args, True, 0)), flags_text(args, layout_args(args, False, ahead)),
                   plan.gpus_per_actor)


# --------------------------------------------------------------------------------------------------- rendering


def render_with_layouts(args, plan) -> str:
    """What ``--dry_run`` prints of the run: the plan with its price (:func:`~dppo_oat.engines.oat.plan.render_plan`),
    then its layouts (:func:`layout_lines`)."""
    return "\n".join([render_plan(plan), *layout_lines(layouts_of(args, plan))])


def layout_lines(layouts: Layouts | None) -> list[str]:
    """The lines ``--dry_run`` prints after the price: each layout's time, which is faster and by how much, and the
    flags that give it."""
    if layouts is None:
        return []
    if layouts.gpus == 1:
        return ["layout: 1 GPU, so no split (oat puts the actor and the learner on it either way): collocated only"]
    if layouts.collocated is None and layouts.split is None:
        if layouts.collocated_note == layouts.split_note == NOT_PRICED:
            return ["layout: neither collocated nor split is priced (the price above says why)"]
        return [f"layout: collocated {layouts.collocated_note}; split {layouts.split_note}"]
    header = (f"layout of the {layouts.gpus} GPUs, each priced as above (weight broadcasts not counted; "
              "docs/engines/oat.md#collocated-or-split):")
    return [header, f"  {collocated_line(layouts)}", f"  {split_line(layouts)}", *verdict_lines(layouts)]


def times(layout: Layout, max_staleness: int) -> str:
    """A layout's time a round and for the run, at most and at the measured mean turns where they differ."""
    text = (f"at most {duration(layout.round(max_staleness))} a round, "
            f"{duration(layout.run(max_staleness)).split(' (')[0]} the run")
    expected = layout.round(max_staleness, expected=True)
    if expected is None or math.isclose(expected, layout.round(max_staleness)):
        return text
    return (f"{text} (about {duration(expected)}, "
            f"{duration(layout.run(max_staleness, expected=True)).split(' (')[0]} at the measured mean turns)")


def memory_text(layout: Layout) -> str:
    memory = layout.price.memory
    if memory is None:
        return ""
    fits = "" if memory.peak <= memory.available_gib * GiB else ", more than it has"
    return f"; learner memory about {memory.peak / GiB:.1f} of {memory.available_gib:.0f} GiB a GPU{fits}"


def collocated_line(layouts: Layouts) -> str:
    layout = layouts.collocated
    if layout is None:
        return f"collocated (--collocate): {layouts.collocated_note}"
    return (f"collocated, actors and learners taking turns on all {layout.actor_gpus} GPUs: {times(layout, 0)}"
            f"{memory_text(layout)}")


def split_line(layouts: Layouts) -> str:
    layout, k = layouts.split, layouts.max_staleness
    if layout is None:
        return f"split (without --collocate): {layouts.split_note}"
    ahead = (f"; with --max_staleness {k} {times(layout, k)} (the actors' {duration(layout.actor_seconds)} beside "
             f"the learners' {duration(layout.learner_seconds)})" if k else
             f"; not priced ahead: {layouts.async_note}")
    return (f"split, {layout.actor_gpus} actor + {layout.learner_gpus} learner GPUs: synchronous "
            f"{times(layout, 0)}{ahead}{memory_text(layout)}")


def verdict_lines(layouts: Layouts) -> list[str]:
    """Which layout is faster and by how much (:func:`verdict`), with the flags that take the run there; and the best
    split of any A + L by this price where it beats oat's."""
    collocated, split, k = layouts.collocated, layouts.split, layouts.max_staleness
    if collocated is None or split is None:
        return []
    flags = layouts.collocated_flags if collocated.round(0) <= split.round(k) else layouts.split_flags
    where = f"its flags: {flags}" if flags else "the layout of this run"
    lines = [f"  faster: {verdict(collocated, split, k)}; {where}"]
    best = best_split(split.actor_seconds, split.actor_gpus, split.learner_seconds, split.learner_gpus,
                      layouts.gpus, layouts.gpus_per_actor)
    if k and best is not None and best[2] < split.round(k) * (1 - 1e-9):
        lines.append(f"  best split by this price: {best[0]} actor + {best[1]} learner GPUs, at most "
                     f"{duration(best[2])} a round with --max_staleness {k}; oat's program cannot place it (it gives "
                     "the actors half the GPUs)")
    return lines


def verdict(collocated: Layout, split: Layout, k: int) -> str:
    """``collocated, 1.58× the split with --max_staleness 1 (1.24× at the measured mean turns)``, or the other way
    round: at most, then at the measured mean turns where those figures differ (with their winner where it does)."""
    mode = f"split with --max_staleness {k}" if k else "synchronous split"

    def faster(together: float, apart: float) -> str:
        if together <= apart:
            return f"collocated, {times_faster(apart, together):.2f}× the {mode}"
        return f"the {mode}, {times_faster(together, apart):.2f}× collocated"

    bound = collocated.round(0), split.round(k)
    expected = collocated.round(0, expected=True), split.round(k, expected=True)
    if None in expected or all(map(math.isclose, expected, bound)):  # no measured mean, or single-turn episodes
        return faster(*bound)
    if (expected[0] <= expected[1]) == (bound[0] <= bound[1]):
        return f"{faster(*bound)} ({times_faster(max(expected), min(expected)):.2f}× at the measured mean turns)"
    return f"{faster(*bound)}; at the measured mean turns {faster(*expected)}"
