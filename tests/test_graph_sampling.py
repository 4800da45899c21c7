"""The decode step that samples in its CUDA graph (``--cuda-graphs``' default), on the CPU through its logic: the
graph's replay is its step run eagerly on its own tensors. Its draw, μ, stop flags and next inputs stay on the device;
the host reads the stop flags behind the device (:class:`StopPoller`), here made to lag as a GPU's queue would, and
the steps it ran past the last stop are taken back: tokens, μ, the buffer and the generator's state are those of the
eager decode that checks at every step. The CUDA capture itself: ``tests/test_gpu_local.py``."""

import pytest
import torch
from test_generators import small_model

from dppo_oat.rollout.cuda_graphs import GraphCache, SampledStep, Sampling, decode_step, graph_key, run_decode
from dppo_oat.rollout.decode import StopPoller, decode, decode_in_graph, prefill

STOP_IDS = tuple(range(40, 50))
"""A fifth of the small models' vocabulary: rows stop after a few tokens, at different steps."""
SAMPLING = Sampling(temperature=1.0, stop_ids=STOP_IDS, pad_id=0)


def cpu_cache(**kwargs) -> GraphCache:
    """A cache whose graphs' replay is their step run eagerly (the CPU has no CUDA graphs)."""
    return GraphCache(capture=lambda graph: graph.forward, device_types=("cpu",), **kwargs)


def lagging_poller(lag: int, run_ahead: int, waits: list[int]):
    """A :class:`StopPoller` whose flags reach the host ``lag`` steps behind the newest launched step, as a device
    that runs behind the host's launches (on the CPU every flag is there at once); ``waits`` records each wait as
    ``(step waited for, newest step launched)``."""

    class Lagging(StopPoller):
        def __init__(self, ended):
            super().__init__(ended, run_ahead=run_ahead)
            self.newest = -1

        def launched(self, t):
            super().launched(t)
            self.newest = t

        def done(self, t):
            return t <= self.newest - lag

        def wait(self, t):
            waits.append((t, self.newest))

    return Lagging


def prefilled(model, rows, seed, room=24):
    """``rows`` left-padded prompts prefilled with ``room`` columns to sample into."""
    input_ids = torch.randint(0, 40, (rows, 7), generator=torch.Generator().manual_seed(seed))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    return prefill(model, input_ids, attention_mask, room=room)


def decoded_batches(model, generator, decode_one, batches=4):
    """Batches of 2–5 rows decoded one after another from one generator (as a generator call's batches are), with
    each result, its buffer's width and valid columns, and the generator's state after."""
    results = []
    for batch in range(batches):
        state = prefilled(model, rows=2 + batch, seed=batch)
        decoded = decode_one(state)
        results.append((decoded, state.cache.width, state.cache.valid.clone(), state.cache.filled()))
    source = generator if generator is not None else torch.default_generator
    return results, source.get_state()


SETTINGS = dict(max_new_tokens=24, temperature=1.0, stop_ids=torch.tensor(STOP_IDS), pad_id=SAMPLING.pad_id,
                keep_logprobs=True)


@pytest.mark.parametrize("lag, run_ahead", [(0, 4), (2, 4), (9, 4), (9, 1), (30, 6)])
@pytest.mark.parametrize("seeded", [True, False])
def test_sampling_in_the_graph_returns_the_eager_decode_whatever_the_flags_lag(lag, run_ahead, seeded):
    model, cache, waits = small_model("Qwen3"), cpu_cache(), []
    poller = lagging_poller(lag, run_ahead, waits)
    outcomes, wasted = [], []

    def in_graph(state):
        step = decode_step(model, state.cache, 24, cache, SAMPLING)
        assert isinstance(step, SampledStep)
        decoded = decode_in_graph(state, step, generator=generator, poller=poller, **SETTINGS)
        wasted.append(step.graph.buffer.width - state.cache.width)  # columns the graph ran past the kept ones
        return decoded

    def eager(state):
        return decode(model, state, generator=generator, **SETTINGS)

    with torch.inference_mode():
        for decode_one in (eager, in_graph):
            torch.manual_seed(11)  # the global RNG, when the decode draws from it
            generator = torch.Generator().manual_seed(5) if seeded else None
            outcomes.append(decoded_batches(model, generator, decode_one))
    (expected_batches, expected_rng), (batches, rng) = outcomes
    lengths = []
    for expected, got in zip(expected_batches, batches, strict=True):
        (want, width, valid, filled), (decoded, got_width, got_valid, got_filled) = expected, got
        assert torch.equal(decoded.new_ids, want.new_ids) and decoded.fed == want.fed
        torch.testing.assert_close(decoded.action_logprobs, want.action_logprobs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(decoded.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)
        assert got_width == width and torch.equal(got_valid, valid)
        for (keys, values), (got_keys, got_values) in zip(filled, got_filled, strict=True):
            torch.testing.assert_close(got_keys, keys, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_values, values, atol=1e-5, rtol=1e-5)
        lengths.append(want.new_ids.shape[1])
    assert torch.equal(rng, expected_rng)  # the draws of the steps taken back were given back
    assert any(length < 24 for length in lengths), "no batch stopped before its last token"
    stopped_early = [w for w, length in zip(wasted, lengths, strict=True) if length < 24]
    assert max(stopped_early) <= min(lag, run_ahead)  # a step past the stop only while its flag was on its way
    assert (max(stopped_early) > 0) == (lag > 0)
    # the host waits for a step run_ahead behind its newest launch, or for the last step once the decode ended
    assert all(newest - t == run_ahead or t == newest for t, newest in waits)
    assert any(newest - t == run_ahead for t, newest in waits) == (lag > run_ahead)


def test_a_graph_that_samples_is_keyed_by_its_sampling_and_one_of_the_forward_alone_by_none():
    model, cache = small_model("Qwen3"), cpu_cache()
    other = Sampling(temperature=0.7, stop_ids=STOP_IDS, pad_id=0)
    with torch.inference_mode():
        buffer = prefilled(model, 3, seed=0).cache
        assert graph_key(buffer, SAMPLING) != graph_key(buffer, other) != graph_key(buffer)
        first = decode_step(model, buffer, 24, cache, SAMPLING)
        assert decode_step(model, prefilled(model, 3, seed=1).cache, 24, cache, SAMPLING).graph is first.graph
        decode_step(model, prefilled(model, 3, seed=2).cache, 24, cache, other)
        assert cache.captures == 2
        forward_alone = decode_step(model, prefilled(model, 3, seed=3).cache, 24, cpu_cache(sample_in_graph=False),
                                    SAMPLING)
        assert forward_alone.graph.key.sampling is None and not isinstance(forward_alone, SampledStep)


@pytest.mark.parametrize("temperature", [0.6, 1.3])
def test_run_decode_samples_in_the_graph_at_the_graphs_temperature_what_the_eager_decode_samples(temperature):
    """Through :func:`run_decode` (the generator's call), at a temperature other than 1, without μ's whole rows."""
    model, cache = small_model("Qwen3"), cpu_cache()
    sampling = Sampling(temperature=temperature, stop_ids=STOP_IDS, pad_id=0)
    settings = dict(max_new_tokens=24, stop_ids=torch.tensor(STOP_IDS), keep_logprobs=False)
    results = []
    with torch.inference_mode():
        for graphs in (None, cache):
            state = prefilled(model, 5, seed=4)
            step = decode_step(model, state.cache, 24, graphs, sampling)
            results.append(run_decode(model, state, step, sampling, generator=torch.Generator().manual_seed(2),
                                      **settings))
        state = prefilled(model, 5, seed=4)
        step = decode_step(model, state.cache, 24, cache, sampling)
        with pytest.raises(ValueError, match="the call asks"):  # a graph never samples otherwise than it was captured
            run_decode(model, state, step, SAMPLING, **settings)
    (eager, graphed) = results
    assert cache.captures == 1 and graphed.logprobs is None
    assert torch.equal(graphed.new_ids, eager.new_ids)
    torch.testing.assert_close(graphed.action_logprobs, eager.action_logprobs, atol=1e-5, rtol=1e-5)


def test_a_full_buffer_is_one_clear_error_in_the_graph_too():
    model, cache = small_model("Qwen3"), cpu_cache()
    with torch.inference_mode():
        state = prefilled(model, 2, seed=0, room=3)
        step = decode_step(model, state.cache, 3, cache, SAMPLING)
        state.cache.width = state.cache.capacity
        with pytest.raises(RuntimeError, match="KV buffer is full"):
            step.replay()


def test_an_unseeded_generator_call_draws_from_its_own_generator_seeded_from_torchs_rng():
    """Without a seed the sampling loop still has a generator of its own (a decode rewinds it to give back the steps
    it did not run; rewinding the shared default generator would take back what another thread drew): seeded by
    one draw of torch's RNG, so ``torch.manual_seed`` fixes the tokens, and the global RNG moves by that one draw."""
    from dppo_oat.models import build_tiny_policy, toy_corpus
    from dppo_oat.rollout.hf_generator import HFGenerator
    from dppo_oat.settings.spec import SamplingSettings

    model, tokenizer = build_tiny_policy(toy_corpus(), seed=0)
    prompts = [tokenizer.encode(text)[:8] for text in toy_corpus(5, seed=1)]
    settings = SamplingSettings(max_new_tokens=12)
    calls = []
    for _ in range(2):
        torch.manual_seed(3)
        completions = HFGenerator(model, tokenizer).generate(prompts, settings)
        calls.append(([c.token_ids for c in completions], torch.get_rng_state()))
    torch.manual_seed(3)
    torch.randint(2**62, (1,))
    (tokens, state), (again, state_again) = calls
    assert tokens == again and torch.equal(state, state_again)
    assert torch.equal(state, torch.get_rng_state())
