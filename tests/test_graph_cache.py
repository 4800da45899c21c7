"""The decode graphs kept across generator calls (``--cuda-graphs``), on the CPU through their logic: the buckets a
call pads up to, the keys, when the cache drops its graphs (the weights' storage, not their values), and the whole
generator decoding through the cache, with the graph's replay being the eager forward of its static step. The CUDA
capture itself: ``tests/test_gpu_local.py``."""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_generators import small_model

from dppo_oat.models import build_tiny_policy, toy_corpus
from dppo_oat.rollout.cuda_graphs import (
    MIN_CAPACITY,
    STOP_CHECK_EVERY,
    GraphCache,
    GraphedStep,
    batch_bucket,
    capacity_bucket,
    decode_step,
    graph_key,
    stop_check_interval,
    storage_key,
)
from dppo_oat.rollout.decode import EagerStep, decode, prefill
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import SamplingSettings


def eager_replay(graph):
    """A graph's replay on the CPU: its step run eagerly on its own tensors."""
    return graph.forward


def cpu_cache(**kwargs) -> GraphCache:
    return GraphCache(capture=eager_replay, device_types=("cpu",), **kwargs)


@given(st.integers(1, 5000))
def test_a_batch_pads_up_to_the_next_power_of_two(rows):
    bucket = batch_bucket(rows)
    assert bucket >= rows and bucket & (bucket - 1) == 0 and (bucket == 1 or bucket // 2 < rows)


@given(st.integers(1, 100_000))
def test_a_buffer_pads_up_to_the_next_step_of_the_ladder_and_at_most_a_third_is_room(columns):
    bucket = capacity_bucket(columns)
    ladder = [size for k in range(6, 20) for size in (2 ** k, 3 * 2 ** (k - 1))]
    assert bucket == min(size for size in ladder if size >= max(columns, MIN_CAPACITY))
    if columns >= MIN_CAPACITY:
        assert bucket - columns < bucket / 3


def test_batch_buckets_refuse_an_empty_batch():
    with pytest.raises(ValueError, match="at least one row"):
        batch_bucket(0)


def prefilled(model, rows, width=7, room=6, seed=2):
    """``rows`` left-padded prompts of ``width`` tokens prefilled with ``room`` columns to sample into."""
    input_ids = torch.randint(0, 50, (rows, width), generator=torch.Generator().manual_seed(seed))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, :3] = 0
    return prefill(model, input_ids, attention_mask, room=room)


def test_calls_of_one_bucket_share_a_key_and_autocast_or_another_bucket_does_not():
    model = small_model("Qwen3")
    with torch.inference_mode():
        three, four, five = (prefilled(model, rows).cache for rows in (3, 4, 5))
        wider = prefilled(model, 4, width=7, room=200).cache
        assert graph_key(three) == graph_key(four) != graph_key(five)
        assert graph_key(four).batch == 4 and graph_key(four).capacity == MIN_CAPACITY
        assert graph_key(wider).capacity == capacity_bucket(207) != graph_key(four).capacity
        plain = graph_key(four)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert graph_key(four).autocast == torch.bfloat16 and graph_key(four) != plain
    assert plain.autocast is None


def test_the_storage_key_survives_in_place_updates_and_not_a_new_tensor():
    model = small_model("Qwen3")
    key = storage_key(model)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # an optimizer step
    model.load_state_dict(copy.deepcopy(model.state_dict()))  # the generator's update_weights
    assert storage_key(model) == key
    model.load_state_dict(copy.deepcopy(model.state_dict()), assign=True)
    assert storage_key(model) != key
    key = storage_key(model)
    model.to(torch.bfloat16)
    assert storage_key(model) != key


def decode_once(model, cache, rows, seed=3, max_new_tokens=6, room=None):
    """One call's decode through ``cache`` (tokens, μ, the buffer at the end); ``room``: columns to sample into
    (default ``max_new_tokens``)."""
    state = prefilled(model, rows, room=max_new_tokens if room is None else room)
    step = decode_step(model, state.cache, max_new_tokens, cache)
    decoded = decode(model, state, max_new_tokens=max_new_tokens, temperature=1.0, stop_ids=torch.tensor([49]),
                     pad_id=0, keep_logprobs=True, generator=torch.Generator().manual_seed(seed), step=step,
                     stop_check_every=stop_check_interval(step))
    return step, decoded, state.cache


def test_the_cache_captures_once_per_bucket_and_reuses_the_graph_across_calls():
    model, cache = small_model("Qwen3"), cpu_cache()
    with torch.inference_mode():
        first, *_ = decode_once(model, cache, rows=3)
        second, *_ = decode_once(model, cache, rows=4)
        assert isinstance(first, GraphedStep) and first.graph is second.graph and cache.captures == 1
        decode_once(model, cache, rows=5)
    assert cache.captures == 2 and len(cache.graphs) == 2


def test_a_call_takes_the_smallest_cached_graph_that_serves_it_and_captures_only_when_none_does():
    model, cache = small_model("Qwen3"), cpu_cache()
    with torch.inference_mode():
        four, *_ = decode_once(model, cache, rows=4)
        eight, *_ = decode_once(model, cache, rows=6)
        two, *_ = decode_once(model, cache, rows=2)
        wide, *_ = decode_once(model, cache, rows=2, room=120)
    assert (four.graph.key.batch, eight.graph.key.batch) == (4, 8) and two.graph is four.graph
    assert wide.graph.key.capacity > four.graph.key.capacity and cache.captures == 3


def test_the_oldest_graphs_go_when_their_kv_buffers_would_pass_the_memory_limit():
    model = small_model("Qwen3")
    with torch.inference_mode():
        one = graph_key(prefilled(model, 4).cache).buffer_bytes
        cache = cpu_cache(max_bytes=3 * one)  # a 4-row graph, then an 8-row one (twice its bytes)
        decode_once(model, cache, rows=4)
        decode_once(model, cache, rows=8)
        assert [key.batch for key in cache.graphs] == [4, 8]
        decode_once(model, cache, rows=16)  # 4x: alone over the limit, it still replaces every other graph
    assert [key.batch for key in cache.graphs] == [16] and cache.captures == 3


def test_a_failed_capture_warns_once_and_the_generator_decodes_eagerly_from_then_on():
    attempts = []

    def failing(graph):
        attempts.append(graph.key)
        raise RuntimeError("operation not permitted when stream is capturing")

    model, cache = small_model("Qwen3"), GraphCache(capture=failing, device_types=("cpu",))
    with torch.inference_mode():
        state = prefilled(model, 3)
        with pytest.warns(UserWarning, match="decodes eagerly from now on"):
            first = decode_step(model, state.cache, 6, cache)
        second = decode_step(model, prefilled(model, 3).cache, 6, cache)
    assert isinstance(first, EagerStep) and isinstance(second, EagerStep) and len(attempts) == 1
    assert "operation not permitted" in cache.failure and not cache.serves(torch.device("cpu"))


def test_a_padded_graph_decodes_what_the_eager_step_does_and_leaves_the_keys_in_the_calls_buffer():
    """Three rows in a graph of four, after a call of four that left other keys in it: the same tokens, μ to float
    rounding, and the call's own buffer ends with the keys and values the eager decode leaves."""
    model, cache = small_model("Qwen3"), cpu_cache()
    with torch.inference_mode():
        decode_once(model, cache, rows=4, seed=9)
        step, graphed, graphed_buffer = decode_once(model, cache, rows=3)
        assert isinstance(step, GraphedStep) and step.graph.key.batch == 4
        _, eager, eager_buffer = decode_once(model, None, rows=3)
    assert torch.equal(graphed.new_ids, eager.new_ids) and graphed.fed == eager.fed
    torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-5, rtol=1e-5)
    assert graphed_buffer.width == eager_buffer.width
    assert torch.equal(graphed_buffer.valid[:, : graphed_buffer.width], eager_buffer.valid[:, : eager_buffer.width])
    layers = zip(eager_buffer.filled(), graphed_buffer.filled(), strict=True)
    for (keys, values), (graphed_keys, graphed_values) in layers:
        torch.testing.assert_close(graphed_keys, keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(graphed_values, values, atol=1e-5, rtol=1e-5)


def test_a_graph_reads_weights_updated_in_place_and_a_swapped_tensor_recaptures():
    model, cache = small_model("Qwen3"), cpu_cache()
    with torch.inference_mode():
        _, before, _ = decode_once(model, cache, rows=2)
        graph = next(iter(cache.graphs.values()))
        with torch.no_grad():
            model.lm_head.weight.mul_(3.0)  # in place, as an optimizer step
        _, after, _ = decode_once(model, cache, rows=2)
        assert cache.captures == 1 and next(iter(cache.graphs.values())) is graph
        assert not torch.allclose(after.logprobs[:, 1:], before.logprobs[:, 1:])
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())
        decode_once(model, cache, rows=2)
        assert cache.captures == 2 and next(iter(cache.graphs.values())) is not graph
        decode_once(small_model("Qwen3"), cache, rows=2)  # another model
    assert cache.captures == 3 and len(cache.graphs) == 1


def test_a_cleared_cache_captures_again():
    model, cache = small_model("Qwen3"), cpu_cache()
    with torch.inference_mode():
        decode_once(model, cache, rows=2)
        cache.clear()
        decode_once(model, cache, rows=2)
    assert cache.captures == 2 and len(cache.graphs) == 1


def test_the_graph_replayed_longest_ago_goes_first():
    model, cache = small_model("Qwen3"), cpu_cache(max_graphs=2)
    with torch.inference_mode():
        for rows in (1, 2, 1, 4):  # 2 is then the least recently used
            decode_once(model, cache, rows=rows)
    assert [key.batch for key in cache.graphs] == [1, 4] and cache.captures == 3


def test_a_replayed_graph_checks_the_stop_flags_every_few_steps_and_the_eager_step_every_step():
    model = small_model("Qwen3")
    with torch.inference_mode():
        state = prefilled(model, 2)
        assert stop_check_interval(EagerStep(model, state.cache)) == 1
        assert stop_check_interval(cpu_cache().step(model, state.cache)) == STOP_CHECK_EVERY > 1


@pytest.mark.parametrize("sample_in_graph, step_name", [(False, "GraphedStep"), (True, "SampledStep")])
def test_the_generator_decodes_through_its_graphs_as_it_does_eagerly_call_after_call(sample_in_graph, step_name):
    """Three turns of seven prompts (batches of three and one per call, the prefix cache across calls; a stop
    token in every eleventh, so that whole batches stop between two stop checks): the graphed generator samples
    the eager one's tokens, μ to float rounding, and captures once per bucket, whether its graphs run the forward
    alone or sample too."""
    model, tokenizer = build_tiny_policy(toy_corpus(), seed=0)
    texts = toy_corpus(7, seed=11)
    first_turn = [tokenizer.encode(text)[: 6 + 3 * i] for i, text in enumerate(texts)]
    results = []
    for graphs in (False, True):
        generator = HFGenerator(model, tokenizer, batch_size=3, eos_token_ids=list(range(3, len(tokenizer), 11)))
        if graphs:
            generator.graphs = cpu_cache(sample_in_graph=sample_in_graph)
        calls, prompts = [], first_turn
        for seed in range(3):
            completions = generator.generate(prompts, SamplingSettings(max_new_tokens=12, seed=seed))
            calls.append(completions)
            prompts = [list(p) + list(c.token_ids) + [5, 6] for p, c in zip(prompts, completions, strict=True)]
        results.append((calls, generator))
    (eager_calls, eager), (graphed_calls, graphed) = results
    for eager_call, graphed_call in zip(eager_calls, graphed_calls, strict=True):
        assert [c.token_ids for c in graphed_call] == [c.token_ids for c in eager_call]
        for e, g in zip(eager_call, graphed_call, strict=True):
            assert max((abs(a - b) for a, b in zip(e.logprobs, g.logprobs, strict=True)), default=0.0) < 1e-4
    assert eager.decode_steps == {"EagerStep": 9} and graphed.decode_steps == {step_name: 9}
    assert graphed.graph_captures == 1 and eager.graph_captures == 0  # batches of 4 and 1 row: the 4-row graph
    assert any(len(c.token_ids) < 12 for call in graphed_calls for c in call)


def test_the_engines_rollout_copy_is_refreshed_in_place_after_each_update(tmp_path, monkeypatch):
    """``--dtype bfloat16 --cuda-graphs`` through the local engine (on the CPU: the CUDA-only check lifted, the cache
    replaying the eager step): the generator samples from a copy whose linear weights are bf16, synced into the same
    storage after each update, so its graphs stay and every step's first-minibatch |π − μ| is bf16 rounding (a copy
    left stale measures about 1e-2 at step 2)."""
    import tyro
    from rich.console import Console

    from dppo_oat.engines.local import trainer as trainer_module
    from dppo_oat.engines.local.config import TrainConfig
    from dppo_oat.rollout import hf_generator

    def validate_without_the_device_check(config):
        config.cuda_graphs = False
        try:
            return real_validate(config)
        finally:
            config.cuda_graphs = True

    real_validate = trainer_module.validate_config
    monkeypatch.setattr(trainer_module, "validate_config", validate_without_the_device_check)
    monkeypatch.setattr(hf_generator, "GraphCache", cpu_cache)
    config = tyro.cli(TrainConfig, args=["--steps", "2", "--groups-per-step", "4", "--group-size", "2",
                                         "--eval-episodes", "4", "--dtype", "bfloat16", "--cuda-graphs",
                                         "--runs-dir", str(tmp_path), "--run-name", "graphs"])
    trainer = trainer_module.LocalTrainer(config, Console(quiet=True))
    try:
        generator = trainer.generator
        assert generator.model is not trainer.model and generator.model.lm_head.weight.dtype == torch.bfloat16
        storage = storage_key(generator.model)
        rows = [trainer.rl_step() for _ in range(2)]
    finally:
        trainer.close(failed=True)
    assert storage_key(generator.model) == storage == generator.graphs.storage and generator.graph_captures > 0
    assert all(row["mismatch/first_abs_diff_mean"] < 1e-3 for row in rows), rows
    assert set(generator.decode_steps) == {"SampledStep"}  # --cuda-graphs samples in its graphs


def test_an_update_without_the_head_is_refused_when_the_rollout_copys_head_is_its_own():
    """The bf16 copy of the decode graphs holds its LM head apart from the embedding: an update that leaves the head
    out would leave it stale, so it is refused; the tied model takes the same update."""
    from dppo_oat.rollout.rollout_copy import autocast_weights_copy

    model, tokenizer = build_tiny_policy(toy_corpus(50), seed=0, vocab_size=120)
    update = {name: tensor for name, tensor in model.state_dict().items() if name != "lm_head.weight"}
    HFGenerator(model, tokenizer).update_weights(update)  # tied: the head is the embedding
    copy_generator = HFGenerator(autocast_weights_copy(model, "bfloat16"), tokenizer, compute_dtype="bfloat16")
    with pytest.raises(KeyError, match="lm_head.weight"):
        copy_generator.update_weights(update)
