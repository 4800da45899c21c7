"""Prefix caching across generator calls: a turn's prompt starts after the cached keys and values of the last call's
rows, μ stays the model's own distribution (teacher forcing), and no row is reused under other weights."""

import itertools

import numpy as np
import pytest
import torch
from forward_probe import recording_forward
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from dppo_oat.models import build_tiny_policy, toy_corpus
from dppo_oat.models.scoring import max_logprob_error
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.prefix_cache import (
    MAX_BUCKETS,
    MIN_REUSE,
    SPLIT_SAVING,
    PrefixCache,
    length_buckets,
    padded_costs,
)
from dppo_oat.settings.spec import SamplingSettings

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
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        if i % 3 == 0:
            turn.append(prompt + completion.token_ids + observation)
        elif i % 3 == 1:
            turn.append(prompt[: len(prompt) // 2] + observation + prompt[len(prompt) // 2:])
        else:
            turn.append(observation + prompt)
    return turn


def test_a_turn_prefills_only_what_its_cached_prefix_does_not_cover(policy, monkeypatch):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=6, temperature=1.0, seed=1, top_k_logprobs=3)
    generator = HFGenerator(model, tokenizer)
    prompts = first_turn(tokenizer)
    turn = next_turn(prompts, generator.generate(prompts, settings), tokenizer)
    shapes = recording_forward(model, monkeypatch)
    reused = generator.generate(turn, settings)
    prefills = [shape for shape in shapes if shape[1] > 1]
    assert sum(rows for rows, _ in prefills) == len(turn)  # a few length buckets, every row once
    assert max(width for _, width in prefills) < max(map(len, turn))
    assert max_logprob_error(model, turn, reused) <= TOLERANCE

    monkeypatch.undo()
    fresh = HFGenerator(model, tokenizer, reuse_prefixes=False).generate(turn, settings)
    assert [c.token_ids for c in reused] == [c.token_ids for c in fresh]
    for a, b in zip(reused, fresh, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)


@pytest.mark.parametrize("layout", [[[0], [1, 2, 3, 4, 5, 6, 7]], [[6, 1], [0, 3, 5, 7], [2, 4]]])
def test_length_buckets_change_neither_draws_nor_mu(policy, monkeypatch, layout):
    """Rows prefilled in buckets (consecutive rows of one buffer, each right-aligned after masked columns) draw
    the tokens and log-probs of one bucket in prompt order. The buffer's storage starts as NaN here: a column
    read before it is written (even masked: 0 x NaN) would show."""
    import dppo_oat.rollout.hf_generator as hf_generator
    from dppo_oat.rollout.direct_forward import KVBuffer

    columns_like = KVBuffer._columns_like
    monkeypatch.setattr(KVBuffer, "_columns_like", lambda self, tensor: columns_like(self, tensor).fill_(float("nan")))

    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=6, temperature=1.0, seed=5, top_k_logprobs=3)
    prompts = first_turn(tokenizer)
    assert len(prompts) == 8
    results = []
    for buckets in ([list(range(8))], layout):
        generator = HFGenerator(model, tokenizer)
        turn = next_turn(prompts, generator.generate(prompts, settings), tokenizer)
        with monkeypatch.context() as patched:
            patched.setattr(hf_generator, "length_buckets", lambda lengths, buckets=buckets: buckets)
            results.append(generator.generate(turn, settings))
    assert max_logprob_error(model, turn, results[1]) <= TOLERANCE
    assert [c.token_ids for c in results[0]] == [c.token_ids for c in results[1]]
    for a, b in zip(*results, strict=True):
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
    turn = [p + c.token_ids + observation for p, c in zip(prompts, completions, strict=True)]
    shapes = recording_forward(model, monkeypatch)
    grown = generator.generate(turn, settings)
    prefill_width = max(width for _, width in shapes[:2] if width > 1)
    assert prefill_width <= len(observation) + 1  # the observation (+ the last response token if never fed)
    assert max_logprob_error(model, turn, grown) <= TOLERANCE


@pytest.mark.parametrize("change", ["optimizer step", "load_state_dict", "assign"])
def test_rows_cached_under_other_weights_are_never_reused(policy, monkeypatch, change):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=4, temperature=1.0, seed=3)
    if change == "assign":  # fresh tensors: their version counters start at 0, as those of the next swap will
        model.load_state_dict({name: tensor.clone() for name, tensor in model.state_dict().items()}, assign=True)
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
        weights = {name: tensor + 0.01 for name, tensor in model.state_dict().items()}
        model.load_state_dict(weights, assign=change == "assign")
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
    assert cache.lookup([5, 6, 7, 8, 9], version[:-1] + ((version[-1][0], version[-1][1] + 1),)) == (-1, 0)
    assert PrefixCache().lookup([5, 6, 7], version) == (-1, 0)


def test_length_buckets_split_only_when_it_spares_padding():
    assert SPLIT_SAVING == 0.1 and MAX_BUCKETS == 3
    assert length_buckets([8, 8, 8, 8]) == [[0, 1, 2, 3]]
    assert length_buckets([20, 2, 3, 2, 21]) == [[1, 2, 3], [0, 4]]
    assert length_buckets([8, 8, 9, 9]) == [[0, 1, 2, 3]]  # 36 -> 34 padded tokens: under a tenth spared
    assert length_buckets([8, 7, 9, 10]) == [[0, 1], [2, 3]]  # 40 -> 36: a tenth
    # 200 padded tokens in one bucket, 120 in two, 84 in three (each step spares more than a tenth of 200)
    assert length_buckets([10, 1, 20, 10, 1, 10, 1, 20, 10, 1]) == [[1, 4, 6, 9], [0, 3, 5, 8], [2, 7]]
    assert length_buckets([10, 1, 20, 10, 1, 10, 1, 20, 10, 1], max_buckets=2) == [[0, 1, 3, 4, 5, 6, 8, 9], [2, 7]]


@hypothesis_settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=24), st.integers(1, 4))
def test_padded_costs_are_the_best_cut_into_consecutive_buckets(lengths, max_buckets):
    """Against every way to cut the sorted lengths (brute force): each bucket count's fewest padded tokens."""
    ordered = sorted(lengths)
    costs = padded_costs(lengths, max_buckets)
    for buckets, (cost, ends) in enumerate(costs, start=1):
        brute = min(sum((end - start) * ordered[end - 1]
                        for start, end in zip((0, *cuts), (*cuts, len(ordered)), strict=True))
                    for k in range(buckets) for cuts in itertools.combinations(range(1, len(ordered)), k))
        assert cost == brute
        starts = [0] + ends[:-1]
        assert ends[-1] == len(ordered)
        assert sum((end - start) * ordered[end - 1] for start, end in zip(starts, ends, strict=True)) == cost
    buckets = length_buckets(lengths, max_buckets=max_buckets)
    assert sorted(i for bucket in buckets for i in bucket) == list(range(len(lengths))) and len(buckets) <= max_buckets


@hypothesis_settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=6),
       st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=9), min_size=1, max_size=6))
def test_lookup_all_finds_the_first_row_with_the_longest_shared_prefix(cached, prompts):
    """Against a brute force over every cached row (few symbols, so that prefixes are often shared)."""
    from dppo_oat.rollout.prefix_cache import CachedRows

    cache = PrefixCache()
    rows = CachedRows([tuple(tokens) for tokens in cached], [], [], torch.zeros(len(cached)), torch.zeros(0))
    cache.store(rows, (1,))
    for prompt, found in zip(prompts, cache.lookup_all(prompts, (1,)), strict=True):
        shared = [next((k for k in range(len(prompt) - 1) if k >= len(row) or row[k] != prompt[k]),
                       min(len(prompt) - 1, len(row))) for row in cached]
        best = max(shared)
        assert found == ((shared.index(best), best) if best >= MIN_REUSE else (-1, 0))
        assert found == cache.lookup(prompt, (1,))
    assert cache.lookup_all(prompts, (2,)) == [(-1, 0)] * len(prompts)
