"""Prefix caching across generator calls: a turn's prompt starts after the cached keys and values of the last call's
rows, μ stays the model's own distribution (teacher forcing), and no row is reused under other weights."""

import numpy as np
import pytest
import torch

from dppo_oat.models import build_tiny_policy, toy_corpus
from dppo_oat.models.scoring import max_logprob_error
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.prefix_cache import MIN_REUSE, PrefixCache, length_buckets
from dppo_oat.spec import SamplingSettings

TOLERANCE = 1e-4


@pytest.fixture()
def policy():
    return build_tiny_policy(toy_corpus(), seed=0)


def first_turn(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(text)[: 8 + 2 * i] for i, text in enumerate(toy_corpus(8, seed=5))]


def next_turn(prompts, completions, tokenizer) -> list[list[int]]:
    """Three kinds of next prompts: the history grows (prompt + response + observation), the state changes in the
    middle (a board cell), and a prompt never seen (a new episode)."""
    observation = tokenizer.encode(toy_corpus(1, seed=9)[0])[:5]
    turn = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        if i % 3 == 0:
            turn.append(prompt + completion.token_ids + observation)
        elif i % 3 == 1:
            turn.append(prompt[: len(prompt) // 2] + observation + prompt[len(prompt) // 2:])
        else:
            turn.append(observation + prompt)
    return turn


def recording_forward(model, monkeypatch) -> list[tuple[int, int]]:
    """The ``input_ids`` shapes of every forward of ``model`` from now on."""
    shapes, forward = [], model.forward
    monkeypatch.setattr(model, "forward",
                        lambda *a, **k: shapes.append(tuple(k.get("input_ids", a[0] if a else None).shape))
                        or forward(*a, **k))
    return shapes


def test_a_turn_prefills_only_what_its_cached_prefix_does_not_cover(policy, monkeypatch):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=6, temperature=1.0, seed=1, top_k_logprobs=3)
    generator = HFGenerator(model, tokenizer)
    prompts = first_turn(tokenizer)
    turn = next_turn(prompts, generator.generate(prompts, settings), tokenizer)
    shapes = recording_forward(model, monkeypatch)
    reused = generator.generate(turn, settings)
    prefills = [shape for shape in shapes if shape[1] > 1]
    assert sum(rows for rows, _ in prefills) == len(turn)  # one or two length buckets, every row once
    assert max(width for _, width in prefills) < max(map(len, turn))
    assert max_logprob_error(model, turn, reused) <= TOLERANCE

    monkeypatch.undo()
    fresh = HFGenerator(model, tokenizer, reuse_prefixes=False).generate(turn, settings)
    assert [c.token_ids for c in reused] == [c.token_ids for c in fresh]
    for a, b in zip(reused, fresh):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)


def test_a_grown_history_reuses_the_last_prompt_and_response(policy, monkeypatch):
    """Chat-style turns (the last prompt, its response, a new observation): only the observation is prefilled."""
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=5, temperature=1.0, seed=2)
    generator = HFGenerator(model, tokenizer)
    prompts = first_turn(tokenizer)
    completions = generator.generate(prompts, settings)
    observation = [7, 8, 9]
    turn = [p + c.token_ids + observation for p, c in zip(prompts, completions)]
    shapes = recording_forward(model, monkeypatch)
    grown = generator.generate(turn, settings)
    prefill_width = max(width for _, width in shapes[:2] if width > 1)
    assert prefill_width <= len(observation) + 1  # the observation (+ the last response token if never fed)
    assert max_logprob_error(model, turn, grown) <= TOLERANCE


@pytest.mark.parametrize("change", ["optimizer step", "load_state_dict"])
def test_rows_cached_under_other_weights_are_never_reused(policy, monkeypatch, change):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=4, temperature=1.0, seed=3)
    generator = HFGenerator(model, tokenizer)
    prompts = first_turn(tokenizer)
    generator.generate(prompts, settings)
    if change == "optimizer step":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model.train()
        model(input_ids=torch.tensor([prompts[0]]), labels=torch.tensor([prompts[0]])).loss.backward()
        optimizer.step()
        model.eval()
    else:
        model.load_state_dict({name: tensor + 0.01 for name, tensor in model.state_dict().items()})
    shapes = recording_forward(model, monkeypatch)
    again = generator.generate(prompts, settings)
    assert shapes[0] == (len(prompts), max(map(len, prompts))) or shapes[0][0] == 1  # whole (or shared header)
    assert max_logprob_error(model, prompts, again) <= TOLERANCE


def test_batches_split_over_calls_are_cached_together(policy):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=4, temperature=1.0, seed=4)
    generator = HFGenerator(model, tokenizer, batch_size=3)
    prompts = first_turn(tokenizer)
    turn = next_turn(prompts, generator.generate(prompts, settings), tokenizer)
    assert len(generator.prefix_cache.rows.tokens) == len(prompts)
    assert max_logprob_error(model, turn, generator.generate(turn, settings)) <= TOLERANCE


def test_lookup_leaves_a_token_to_prefill_and_ignores_short_or_stale_prefixes(policy):
    model, tokenizer = policy
    generator = HFGenerator(model, tokenizer)
    generator.generate([[5, 6, 7, 8, 9], [5, 6, 1, 2]], SamplingSettings(max_new_tokens=2, seed=0))
    cache, version = generator.prefix_cache, generator.prefix_cache._version
    assert cache.lookup([5, 6, 7, 8, 9], version)[1] == 4  # the whole prompt: its last token is prefilled again
    assert cache.lookup([5, 6, 7, 3], version)[1] == 3
    assert cache.lookup([5, 9, 9], version) == (-1, 0)  # one shared token is under MIN_REUSE
    assert MIN_REUSE == 2
    assert cache.lookup([5, 6, 7, 8, 9], version[:-1] + (version[-1] + 1,)) == (-1, 0)
    assert PrefixCache().lookup([5, 6, 7], version) == (-1, 0)


def test_length_buckets_split_only_when_it_spares_padding():
    assert length_buckets([8, 8, 8, 8]) == [[0, 1, 2, 3]]
    assert length_buckets([20, 2, 3, 2, 21]) == [[1, 2, 3], [0, 4]]
    assert length_buckets([8, 7, 9, 10]) == [[0, 1, 2, 3]]  # under a quarter of the padding spared
