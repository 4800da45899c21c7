"""The oat engine's layouts (``--dry_run``): the run priced collocated and split, which is faster and by how much.
Arithmetic on the arguments and the price: no oat, GPU or model needed, so these run in the main suite."""

import math
import re
from pathlib import Path

import pytest
from test_oat_price import sudoku

from dppo_oat.engines.oat.layout import best_split, layouts_of, render_with_layouts, scaled_seconds
from dppo_oat.engines.oat.plan import priced_plan
from dppo_oat.engines.oat.price import GPUS, duration, overlapped, run_time

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30


def dry_run(args) -> str:
    """What ``--dry_run`` prints of the run's plan, price and layouts."""
    return render_with_layouts(args, priced_plan(args))


def layout_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("layout"))
    return [lines[start], *[line for line in lines[start + 1:] if line.startswith("  ")]]


def test_a_round_is_the_sum_synchronous_and_the_larger_ahead_by_hand():
    """Actors 100 s and learners 50 s on 8 GPUs collocated: 150 s a round. Split 4 + 4, each side has half the GPUs,
    so twice the time: 200 s and 100 s, 300 s a round synchronous, 200 s ahead (collocated 1.33× faster)."""
    assert overlapped(100, 50, 0) == 150
    actor, learner = scaled_seconds(100, 8, 4), scaled_seconds(50, 8, 4)
    assert (actor, learner) == (200, 100)
    assert overlapped(actor, learner, 0) == 300
    assert overlapped(actor, learner, 1) == overlapped(actor, learner, 3) == 200
    assert overlapped(scaled_seconds(60, 8, 4), scaled_seconds(60, 8, 4), 1) == overlapped(60, 60, 0) == 120


def test_a_run_ahead_is_rounds_times_the_larger_plus_the_smaller_by_hand():
    """The first round's actors play with no learner beside them, the last round's learner with no actor."""
    assert run_time(200, 100, 10, 0) == 3000
    assert run_time(200, 100, 10, 1) == 10 * 200 + 100
    assert run_time(100, 200, 1, 1) == 300  # one round: nothing to overlap


def test_the_best_split_matches_the_gpus_to_the_times_by_hand():
    """100 s of actors and 50 s of learners on 8 GPUs: A = 5 gives 160 s and 133 s (160 s a round), A = 6 gives
    133 s and 200 s, oat's 4 + 4 200 s; none beats collocation's 150 s (max(100·8/A, 50·8/L) ≥ 150)."""
    assert best_split(100, 8, 50, 8, 8) == (5, 3, 160)
    assert best_split(200, 4, 100, 4, 8) == (5, 3, 160)  # the same from oat's split
    assert best_split(100, 8, 50, 8, 8, gpus_per_actor=2)[:2] == (4, 4)  # A ∈ {2, 4, 6}: 400, 200, 200 s
    assert best_split(100, 8, 100, 8, 8) == (4, 4, 200)
    assert best_split(100, 1, 50, 1, 1) is None
    for actor, learner, gpus in [(100, 50, 8), (30, 90, 8), (7, 5, 6), (1, 1000, 4)]:
        assert best_split(actor, gpus, learner, gpus, gpus)[2] >= actor + learner


def test_the_split_is_the_same_run_priced_on_half_the_gpus():
    """Sudoku on 8 H200s: the split's 4 actors play twice the actor steps (the same calls each) and its 4 learners
    learn twice the samples (the no-grad check of 4 rows stays one per learner, so a little under twice); the split
    learner holds ZeRO-2's states over 4 learners on its whole GPU."""
    args = sudoku(8)
    plan = priced_plan(args)
    layouts = layouts_of(args, plan)
    collocated, split = layouts.collocated, layouts.split
    assert (collocated.actor_gpus, collocated.learner_gpus, split.actor_gpus, split.learner_gpus) == (8, 8, 4, 4)
    assert collocated.actor_seconds == plan.price.actor_seconds and collocated.price.memory == plan.price.memory
    assert math.isclose(split.actor_seconds, 2 * collocated.actor_seconds, rel_tol=1e-12)
    assert math.isclose(split.price.actor_expected_seconds, 2 * collocated.price.actor_expected_seconds,
                        rel_tol=1e-12)
    assert 1.9 * collocated.learner_seconds < split.learner_seconds < 2 * collocated.learner_seconds
    assert split.price.memory.available_gib == GPUS["h200"].memory_gib
    assert split.price.memory.states > collocated.price.memory.states
    assert split.price.rounds == collocated.price.rounds == 507
    assert layouts.max_staleness == 1
    assert layouts.split_flags == ("without --collocate, without --vllm_sleep, --pi_buffer_maxlen_per_device 32, "
                                        "--max_staleness 1")


def test_the_dry_run_prints_both_layouts_and_which_is_faster():
    args = sudoku(8)
    plan = priced_plan(args)
    layouts = layouts_of(args, plan)
    collocated, split = layouts.collocated, layouts.split
    block = layout_block(render_with_layouts(args, plan))
    assert block[0].startswith("layout of the 8 GPUs, each priced as above (weight broadcasts not counted")
    assert block[1].startswith(f"  collocated, actors and learners taking turns on all 8 GPUs: at most "
                               f"{duration(plan.price.round_seconds)} a round")
    assert block[2].startswith(f"  split, 4 actor + 4 learner GPUs: synchronous at most "
                               f"{duration(split.round(0))} a round")
    assert f"; with --max_staleness 1 at most {duration(split.actor_seconds)} a round" in block[2]
    ratio = split.actor_seconds / (collocated.actor_seconds + collocated.learner_seconds)
    assert block[3].startswith(f"  faster: collocated, {ratio:.2f}× the split with --max_staleness 1 (")
    assert block[3].endswith("; the layout of this run")
    assert block[4].startswith("  best split by this price: 6 actor + 2 learner GPUs")
    assert len(block) == 5


def test_a_split_run_is_told_the_flags_that_collocate_it():
    split_flags = dict(collocate=False, vllm_sleep=False, pi_buffer_maxlen_per_device=32, max_staleness=1)
    block = layout_block(dry_run(sudoku(8, **split_flags)))
    assert re.search(r"faster: collocated, [\d.]+× .*; its flags: --collocate, --pi_buffer_maxlen_per_device 16, "
                     r"--max_staleness 0$", block[3])
    assert "learner memory about 8.2 of 77 GiB a GPU" in block[1]  # vLLM keeps --vllm_gpu_ratio 0.45 beside it


def test_where_the_actors_cannot_play_ahead_the_split_is_synchronous_and_says_why():
    recompute = layout_block(dry_run(sudoku(8, trust_region="dppo_binary_tv_recompute")))
    assert ("not priced ahead: --max_staleness is refused with --trust_region dppo_binary_tv_recompute, which "
            "recomputes π_θ'") in recompute[2]
    assert re.search(r"faster: collocated, [\d.]+× the synchronous split", recompute[3])
    assert len(recompute) == 4  # no best split ahead


def odd(gpus: int, rollout: int, per_device: int):
    """Sudoku's flags on an odd number of GPUs, a buffer of one collocated round."""
    args = sudoku(8, rollout_batch_size=rollout, rollout_batch_size_per_device=per_device, train_batch_size=rollout,
                  pi_buffer_maxlen_per_device=rollout // gpus)
    args.gpus = gpus
    return args


def test_an_odd_gpu_count_prices_its_split_synchronous_only():
    """oat's split of 3 GPUs gives the actors 2 and the learners 2, one GPU holding both, where they cannot
    overlap."""
    args = odd(3, 192, 32)
    plan = priced_plan(args)
    layouts = layouts_of(args, plan)
    assert (layouts.split.actor_gpus, layouts.split.learner_gpus, layouts.max_staleness) == (2, 2, 0)
    block = layout_block(render_with_layouts(args, plan))
    assert "not priced ahead: oat puts an actor and a learner on one of an odd number of GPUs" in block[2]
    assert re.search(r"faster: collocated, [\d.]+× the synchronous split .*; the layout of this run$", block[3])


def test_a_layout_whose_plan_is_refused_says_why_and_compares_nothing():
    block = layout_block(dry_run(odd(3, 96, 32)))
    assert block[2] == ("  split (without --collocate): its plan is refused: --rollout_batch_size 96 is not a "
                        "multiple of 2 learner(s) × --rollout_batch_size_per_device 32")
    assert len(block) == 3


def test_one_gpu_has_no_split_and_says_so_in_one_line():
    text = dry_run(sudoku(1))
    assert layout_block(text) == [
        "layout: 1 GPU, so no split (oat puts the actor and the learner on it either way): collocated only"]


@pytest.mark.parametrize("changes", [dict(zero_stage=3), dict(vllm_gpu_ratio=0.01)])
def test_a_run_without_a_round_price_compares_no_layout(changes):
    """A learner setting never measured, or a vLLM share that holds no sequence: the price has no round time."""
    [line] = layout_block(dry_run(sudoku(8, **changes)))
    assert line == "layout: neither collocated nor split is priced (the price above says why)"


def test_the_docs_layout_numbers_are_what_the_layouts_compute():
    """docs/engines/oat.md's section on the layouts quotes Sudoku on 8 H200s."""
    args = sudoku(8)
    plan = priced_plan(args)
    layouts = layouts_of(args, plan)
    collocated, split = layouts.collocated, layouts.split
    expected = split.round(1, expected=True) / collocated.round(0, expected=True)
    quoted = (f"For Sudoku on 8 H200s collocated takes at most {duration(collocated.round(0))} a round (actors "
              f"{duration(collocated.actor_seconds)}, learner {duration(collocated.learner_seconds)}), the split "
              f"ahead {duration(split.round(1))} (actors {duration(split.actor_seconds)} beside the learners' "
              f"{duration(split.learner_seconds)}): collocated is {split.round(1) / collocated.round(0):.2f}× faster "
              f"({expected:.2f}× at the measured mean turns)")
    page = " ".join((REPO / "docs" / "engines" / "oat.md").read_text().split())
    assert quoted in page


def test_a_run_played_ahead_is_priced_with_the_overlap():
    """The run's own price: with --max_staleness 1 (split) a round is the longer of actors and learner, and the run
    adds the shorter once; the same flags synchronous pay both every round."""
    split = dict(collocate=False, vllm_sleep=False, pi_buffer_maxlen_per_device=32)
    ahead = priced_plan(sudoku(8, **split, max_staleness=1)).price
    synchronous = priced_plan(sudoku(8, **split, max_staleness=0)).price
    actor, learner = synchronous.actor_seconds, synchronous.learner_seconds
    assert (ahead.actor_seconds, ahead.learner_seconds) == (actor, learner)
    assert synchronous.round_seconds == actor + learner
    assert synchronous.run_seconds == synchronous.rounds * (actor + learner)
    assert ahead.round_seconds == max(actor, learner)
    assert ahead.run_seconds == ahead.rounds * max(actor, learner) + min(actor, learner)
    text = dry_run(sudoku(8, **split, max_staleness=1))
    assert f"× {duration(max(actor, learner))} (actors a round ahead, --max_staleness 1" in text
