"""The static decode step (the form a CUDA graph captures): attention over the buffer's whole capacity, the column
given by a device tensor, computes what the eager step does, for every architecture the sampling loop runs; the
generator picks the eager step off CUDA, and ``--cuda-graphs`` is refused where it cannot apply. The capture itself
needs CUDA: ``tests/test_gpu_local.py``."""

import pytest
import torch
from test_faults import one_error
from test_generators import small_model

from dppo_oat.rollout.cuda_graphs import MIN_GRAPH_STEPS, GraphCache, decode_step
from dppo_oat.rollout.decode import EagerStep, StaticStep, decode, prefill
from dppo_oat.rollout.direct_forward import KVBuffer, decode_forward


def prefilled(model, room=6):
    """Two left-padded rows (one three tokens shorter) prefilled with ``room`` columns to sample into."""
    input_ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    return prefill(model, input_ids, attention_mask, room=room)


@pytest.mark.parametrize("name", ["Qwen3", "Llama", "Gemma"])
def test_the_static_step_samples_what_the_eager_step_samples(name):
    """Same seed, same draws: the tokens are equal and μ's log-probs equal to float rounding; the buffer ends with
    the same width and the same keys in its filled columns."""
    model = small_model(name)
    results = []
    with torch.inference_mode():
        for make_step in (EagerStep, StaticStep):
            state = prefilled(model)
            state.cache.keys[0][:, :, state.cache.width :] = float("nan")  # unwritten storage: NaN must not leak
            decoded = decode(model, state, max_new_tokens=6, temperature=1.0, stop_ids=torch.tensor([49]),
                             pad_id=0, keep_logprobs=True, generator=torch.Generator().manual_seed(3),
                             step=make_step(model, state.cache))
            results.append((decoded, state.cache))
    (eager, eager_cache), (static, static_cache) = results
    assert torch.equal(eager.new_ids, static.new_ids)
    torch.testing.assert_close(static.logprobs, eager.logprobs, atol=1e-5, rtol=1e-5)
    assert eager_cache.width == static_cache.width == 7 + eager.fed
    for (keys, values), (static_keys, static_values) in zip(eager_cache.filled(), static_cache.filled(), strict=True):
        torch.testing.assert_close(static_keys, keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(static_values, values, atol=1e-5, rtol=1e-5)


def test_decode_forward_writes_one_column_and_attends_to_the_filled_ones_only():
    """A token written at column c sees columns ≤ c that are valid, whatever the later columns hold."""
    model = small_model("Qwen3")
    with torch.inference_mode():
        state = prefilled(model, room=3)
        buffer = state.cache
        buffer.zero_room()
        token, position = torch.tensor([[5], [6]]), state.next_position
        expected = EagerStep(model, KVBuffer.from_past(buffer.filled(), buffer.valid[:, : buffer.width], 10))(
            token, position)
        for keys in buffer.keys:
            keys[:, :, buffer.width + 1 :] = 1e4  # beyond the written column: masked
        logits = decode_forward(model, buffer, token, position, torch.tensor([buffer.width]))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert buffer.valid[:, 7].all() and not buffer.valid[:, 8:].any()


def test_a_full_buffer_is_one_clear_error():
    model = small_model("Qwen3")
    with torch.inference_mode():
        state = prefilled(model, room=0)
        with pytest.raises(RuntimeError, match="KV buffer is full"):
            StaticStep(model, state.cache)(torch.tensor([[1], [2]]), state.next_position)


def test_off_cuda_or_for_short_calls_the_generator_decodes_eagerly():
    model = small_model("Qwen3")
    buffer = KVBuffer(2, 8, torch.device("cpu"))
    assert isinstance(decode_step(model, buffer, MIN_GRAPH_STEPS, GraphCache()), EagerStep)
    assert isinstance(decode_step(model, buffer, MIN_GRAPH_STEPS, None), EagerStep)
    on_the_cpu = GraphCache(capture=lambda graph: graph.forward, device_types=("cpu",))
    assert isinstance(decode_step(model, buffer, MIN_GRAPH_STEPS - 1, on_the_cpu), EagerStep)
    assert on_the_cpu.captures == 0


def test_cuda_graphs_off_cuda_is_refused_before_any_model_loads(capsys, no_model, tmp_path):
    one_error(capsys, ["--cuda-graphs", "--device", "cpu", "--runs-dir", str(tmp_path)], 2,
              "--cuda-graphs captures the HF generator's decode on a CUDA device")


def test_the_generator_counts_its_calls_by_the_step_that_decoded_them():
    """Off CUDA ``--cuda-graphs`` decodes eagerly, and the count says so (a bench row of the graphs refuses such
    calls); ``generate``'s own path takes no step."""
    from dppo_oat.models import build_tiny_policy, toy_corpus
    from dppo_oat.rollout.hf_generator import HFGenerator
    from dppo_oat.settings.spec import SamplingSettings

    model, tokenizer = build_tiny_policy(toy_corpus(50), seed=0, vocab_size=200)
    prompts = [tokenizer.encode(text)[:8] for text in toy_corpus(5, seed=1)]
    generator = HFGenerator(model, tokenizer, batch_size=2, cuda_graphs=True)
    generator.generate(prompts, SamplingSettings(max_new_tokens=MIN_GRAPH_STEPS, temperature=1.0, seed=0))
    assert generator.decode_steps == {"EagerStep": 3}
    generator.generate(prompts, SamplingSettings(max_new_tokens=4, temperature=0.0, seed=0))  # greedy: generate
    assert generator.decode_steps == {"EagerStep": 3}


@pytest.mark.parametrize("flags, message", [
    (["--device", "cpu"], "--cuda-graphs needs --device cuda"),
    (["--device", "cuda", "--new-tokens", str(MIN_GRAPH_STEPS - 1)], f"give --new-tokens {MIN_GRAPH_STEPS} or more"),
])
def test_the_rollout_bench_refuses_a_graphs_row_it_could_not_measure(flags, message):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts/bench/rollout.py"
    result = subprocess.run([sys.executable, str(script), "--cuda-graphs", *flags], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_the_rollout_bench_refuses_graphs_of_the_forward_alone_without_graphs():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts/bench/rollout.py"
    result = subprocess.run([sys.executable, str(script), "--graph-forward-only"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "--graph-forward-only is a kind of --cuda-graphs" in result.stderr


def test_the_rollout_bench_holds_the_1_7b_shape_to_half_its_roofline_and_the_100m_one_to_both_targets():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts/bench/rollout.py"
    spec = importlib.util.spec_from_file_location("rollout_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    multi, roofline = {"ratio": 6.0}, {"generator_vs_roofline": 0.3}
    assert bench.targets_met(bench.model_targets("qwen3-100m"), multi, roofline, 64) == {
        "multi_turn_vs_generate": True, "vs_roofline_at_batch_64": True}
    assert bench.targets_met(bench.model_targets("qwen3-1.7b"), multi, roofline, 64) == {
        "vs_roofline_at_batch_64": False}
    assert bench.targets_met(bench.model_targets("qwen3-1.7b"), multi, roofline, 32) == {
        "vs_roofline_at_batch_64": None}
