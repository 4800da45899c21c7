"""The decode loop reads whether every row has stopped only every few steps (a host synchronisation on a GPU): the
steps it runs past the last stop are undone, so its tokens, μ, buffer and generator state are those of the loop that
checks at every step, token for token."""

import pytest
import torch
from test_generators import small_model

from dppo_oat.rollout.decode import StepUniforms, decode, first_stop_length, prefill

STOP_IDS = torch.arange(40, 50)
"""A fifth of the small models' vocabulary: rows stop after a few tokens, at different steps."""


def prefilled(model, rows, seed):
    """``rows`` left-padded prompts prefilled with room for 24 tokens."""
    input_ids = torch.randint(0, 40, (rows, 7), generator=torch.Generator().manual_seed(seed))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    return prefill(model, input_ids, attention_mask, room=24)


def decoded_batches(model, every, generator, batches=4, max_new_tokens=24):
    """Several batches decoded one after another from one generator (as a generator call's batches are), with
    every result, the buffers and the generator's state after."""
    results = []
    for batch in range(batches):
        state = prefilled(model, rows=2 + batch, seed=batch)
        decoded = decode(model, state, max_new_tokens=max_new_tokens, temperature=1.0, stop_ids=STOP_IDS, pad_id=0,
                         keep_logprobs=True, generator=generator, stop_check_every=every)
        results.append((decoded, state.cache.width, state.cache.valid.clone()))
    source = generator if generator is not None else torch.default_generator
    return results, source.get_state()


@pytest.mark.parametrize("every", [2, 3, 5, 8, 64])
@pytest.mark.parametrize("seeded", [True, False])
def test_checking_every_few_steps_returns_what_checking_every_step_does(every, seeded):
    model = small_model("Qwen3")
    outcomes = []
    with torch.inference_mode():
        for interval in (1, every):
            torch.manual_seed(11)  # the global RNG, when the decode draws from it
            generator = torch.Generator().manual_seed(5) if seeded else None
            outcomes.append(decoded_batches(model, interval, generator))
    (per_step, per_step_rng), (batched, batched_rng) = outcomes
    lengths = []
    for (expected, width, valid), (decoded, batched_width, batched_valid) in zip(per_step, batched, strict=True):
        assert torch.equal(decoded.new_ids, expected.new_ids)
        assert torch.equal(decoded.action_logprobs, expected.action_logprobs)
        assert torch.equal(decoded.logprobs, expected.logprobs)
        assert decoded.fed == expected.fed and batched_width == width and torch.equal(batched_valid, valid)
        lengths.append(expected.new_ids.shape[1])
    assert torch.equal(batched_rng, per_step_rng)  # the draws of the undone steps were given back
    assert any(length < 24 and length % every for length in lengths), "no batch stopped between two checks"


def test_the_first_stop_length_is_the_step_after_which_every_row_had_stopped():
    flags = [torch.tensor(value) for value in (False, False, True, True)]
    assert first_stop_length(flags) == 3
    assert first_stop_length(flags[:2]) == 2  # no stop: every step counts


def test_uniforms_drawn_at_once_are_the_per_step_draws_and_give_back_the_steps_not_kept():
    """On the CPU one draw of ``steps × rows`` is the per-step draws one after another; ``draw_order`` permutes the
    rows of every step; after ``give_back(k)`` the generator continues as after ``k`` per-step draws."""
    generator = torch.Generator().manual_seed(0)
    per_step = [torch.rand((3, 1), generator=generator, dtype=torch.float64) for _ in range(5)]
    after_two = torch.Generator().manual_seed(0)
    for _ in range(2):
        torch.rand((3, 1), generator=after_two, dtype=torch.float64)
    generator.manual_seed(0)
    uniforms = StepUniforms(generator, torch.device("cpu"), 5, 3, draw_order=torch.tensor([2, 0, 1]))
    for t in range(5):
        assert torch.equal(uniforms.draws[t], per_step[t][[2, 0, 1]])
    uniforms.give_back(2)
    assert torch.equal(generator.get_state(), after_two.get_state())


def test_a_decode_leaves_the_generator_where_drawing_only_its_kept_steps_does():
    """The uniforms of a whole decode are drawn before its first step; a batch that stops early gives back those of
    the steps it did not run: the next batch draws what a draw per step would have given it."""
    model = small_model("Qwen3")
    with torch.inference_mode():
        generator = torch.Generator().manual_seed(5)
        decoded = decode(model, prefilled(model, rows=3, seed=0), max_new_tokens=24, temperature=1.0,
                         stop_ids=STOP_IDS, pad_id=0, keep_logprobs=False, generator=generator)
    length = decoded.new_ids.shape[1]
    assert length < 24, "the batch did not stop early"
    per_step = torch.Generator().manual_seed(5)
    for _ in range(length):
        torch.rand((3, 1), generator=per_step, dtype=torch.float64)
    assert torch.equal(generator.get_state(), per_step.get_state())
