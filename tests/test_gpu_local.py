"""The local engine on one CUDA GPU (``pytest -m gpu``; skipped without CUDA): short bfloat16 and float16 runs finish
and log held-out success, the fused head agrees with the logits path there, the qwen3-100m shape samples with the
direct loop and trains a minibatch under bfloat16, and ``--cuda-graphs``' decode graphs, kept across generator
calls, sample the eager decode's μ, are captured once per bucket and read the rollout copy refreshed after an
update."""

import copy
import json
import math

import pytest
import torch

from dppo_oat.learner.autocast import autocast_forward
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.update import minibatch_step
from dppo_oat.models.scoring import max_logprob_error
from dppo_oat.models.tiny import build_shaped_policy, build_tiny_policy, toy_corpus
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.rollout_copy import rollout_model, rollout_state_dict
from dppo_oat.settings.spec import SamplingSettings, UpdateSettings
from dppo_oat.train import main
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update_batch import TurnSample, build_update_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RUN = ["--device", "cuda", "--groups-per-step", "8", "--group-size", "4", "--minibatch-size", "32",
       "--eval-episodes", "32", "--eval-every", "3"]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def finished_run(tmp_path, name, flags):
    main(["--steps", "3", "--runs-dir", str(tmp_path), "--run-name", name, *RUN, *flags])
    run = tmp_path / name
    rows, evals = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "eval.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3] and [e["step"] for e in evals] == [0, 3]
    assert all(0 <= e["eval/success"] <= 1 and e["eval/episodes"] == 32 for e in evals)
    assert all(math.isfinite(v) for row in rows for v in row.values() if isinstance(v, float))
    return rows


def test_a_bfloat16_run_on_cuda_finishes_and_logs_held_out_success(tmp_path):
    rows = finished_run(tmp_path, "bf16", ["--dtype", "bfloat16"])
    assert not torch.backends.cuda.cudnn_sdp_enabled()  # its per-shape graphs cost seconds a rollout
    assert 0 < rows[0]["mismatch/first_abs_diff_mean"] < 1e-3  # μ and π_θ under one autocast


def test_a_float16_run_on_cuda_scales_its_loss(tmp_path):
    rows = finished_run(tmp_path, "fp16", ["--dtype", "float16"])
    assert all(row["loss_scale"] >= 1.0 and row["guard/skipped"] == 0.0 for row in rows)
    assert rows[0]["mismatch/first_abs_diff_mean"] < 1e-3


def sampled_batch(model, tokenizer, compute_dtype, n=16):
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][:12] for t in toy_corpus(n, seed=3)]
    generator = HFGenerator(model, tokenizer, compute_dtype=compute_dtype)
    assert generator.runs_direct
    completions = generator.generate(prompts, SamplingSettings(8, temperature=1.0, seed=1))
    samples = [TurnSample(p, c.token_ids, c.logprobs, 0.0, True, False, 0, "toy", i, str(i), c.finish_reason)
               for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    return build_update_batch(samples, [1.0 if i % 2 else -1.0 for i in range(n)],
                              tokenizer.pad_token_id).to("cuda")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_head_matches_the_logits_path_on_cuda(dtype):
    model, tokenizer = build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)
    model.to("cuda")
    batch = sampled_batch(model, tokenizer, dtype)
    tr, settings = TrustRegion.preset("dppo_binary_tv"), UpdateSettings(norm_constant=8.0)
    results = {}
    for lm_head in ("fused", "logits"):
        learner = copy.deepcopy(model).train()
        forward = autocast_forward(causal_lm_forward(learner, settings=settings, lm_head=lm_head),
                                   "cuda", dtype)
        minibatch_step(batch, torch.arange(len(batch)), tr, forward, lambda loss: loss.backward(), settings)
        results[lm_head] = (forward(batch, False).logp.detach(),
                            torch.cat([p.grad.reshape(-1) for p in learner.parameters()]))
    (fused_logp, fused_grad), (logits_logp, logits_grad) = results["fused"], results["logits"]
    assert fused_logp.dtype == torch.float32 and fused_logp.device.type == "cuda"
    torch.testing.assert_close(fused_logp, logits_logp, atol=1e-4 if dtype == "float32" else 2e-2, rtol=0)
    cosine = torch.nn.functional.cosine_similarity(fused_grad, logits_grad, dim=0)
    assert float(cosine) > (0.9999 if dtype == "float32" else 0.99)


def test_qwen3_100m_samples_directly_and_trains_a_minibatch_under_bfloat16():
    model, tokenizer = build_shaped_policy(toy_corpus(300), 0, "qwen3-100m", vocab_size=512, hidden_size=128,
                                           num_layers=2)
    model.to("cuda")
    batch = sampled_batch(model, tokenizer, "bfloat16", n=64)
    tr, settings = TrustRegion.preset("dppo_binary_tv"), UpdateSettings(norm_constant=8.0)
    forward = autocast_forward(causal_lm_forward(model.train(), settings=settings), "cuda",
                               "bfloat16")
    metrics = minibatch_step(batch, torch.arange(len(batch)), tr, forward, lambda loss: loss.backward(), settings)
    assert math.isfinite(metrics["loss"]) and metrics["mismatch/abs_diff_mean"] < 1e-2
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.dtype == torch.float32
               for p in model.parameters())


def graph_policy(shape):
    """A small policy on CUDA (fp32 master weights): the tiny one, or the qwen3-100m architecture at a small size."""
    if shape == "tiny":
        model, tokenizer = build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)
    else:
        model, tokenizer = build_shaped_policy(toy_corpus(300), 0, "qwen3-100m", vocab_size=512, hidden_size=128,
                                               num_layers=2)
    return model.to("cuda"), tokenizer


def toy_prompts(tokenizer, n=16, seed=3):
    return [tokenizer(t, add_special_tokens=False)["input_ids"][:12] for t in toy_corpus(n, seed=seed)]


def graphed_generator(model, tokenizer, graph_sampling=True):
    """The local engine's --dtype bfloat16 --cuda-graphs sampler: the rollout copy with bf16 linear weights, under
    bf16 autocast, decoding with the graphs kept across calls (sampling in them, or the forward alone)."""
    return HFGenerator(rollout_model(model, "float32", "bfloat16", cuda_graphs=True), tokenizer,
                       compute_dtype="bfloat16", cuda_graphs=True, graph_sampling=graph_sampling)


def mu_error(model, prompts, completions) -> float:
    """Largest |log μ a generator reported − log μ of ``model``'s own forward on the same tokens| (teacher forcing,
    under the bf16 autocast the generators sample in)."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return max_logprob_error(model, prompts, completions)


@pytest.mark.parametrize("graph_sampling, step_name", [(True, "SampledStep"), (False, "GraphedStep")])
@pytest.mark.parametrize("shape", ["tiny", "qwen3-100m"])
def test_graphs_kept_across_calls_sample_the_eager_decodes_mu_to_bf16_rounding(shape, graph_sampling, step_name):
    """--cuda-graphs: two calls (the second a turn after the first, through the prefix cache) decode in captured
    graphs (no fallback warning), and the μ they report for their tokens is the model's own (teacher-forced, under
    bf16 autocast on the fp32 weights) as closely as the eager decode's is: bf16 rounding. (Tokens are not compared:
    the random qwen3-100m-shaped policy is near uniform over 32,768 tokens, where rounding moves a draw.) The graphs
    sample in the graph, reading the stop flags behind the device, or run the forward alone."""
    import warnings

    model, tokenizer = graph_policy(shape)
    eager_generator = HFGenerator(model, tokenizer, compute_dtype="bfloat16")
    generator = graphed_generator(model, tokenizer, graph_sampling)
    eager_prompts = graphed_prompts = toy_prompts(tokenizer)
    for seed in (1, 2):
        settings = SamplingSettings(24, temperature=1.0, seed=seed)
        eager = eager_generator.generate(eager_prompts, settings)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*CUDA graph.*")  # a failed capture warns, decodes eagerly
            graphed = generator.generate(graphed_prompts, settings)
        bound = max(2 * mu_error(model, eager_prompts, eager), 1e-2)
        assert mu_error(model, graphed_prompts, graphed) <= bound
        # each generator's next turn continues its own tokens, so the graphed one reads its copied-back columns
        eager_prompts = [list(p) + list(c.token_ids) + [5, 6] for p, c in zip(eager_prompts, eager, strict=True)]
        graphed_prompts = [list(p) + list(c.token_ids) + [5, 6] for p, c in zip(graphed_prompts, graphed, strict=True)]
    assert eager_generator.decode_steps == {"EagerStep": 2} and generator.decode_steps == {step_name: 2}


def test_sampling_in_the_graph_draws_the_tokens_of_the_graph_of_the_forward_alone():
    """The same uniforms (one draw per decode, from the call's seed) and the same captured forward: the graph that
    samples, its stop flags read behind the device, returns the tokens and μ of the graph whose draws run on the
    host, call after call (stop tokens in every seventh id, so that batches stop before their last token)."""
    model, tokenizer = graph_policy("tiny")
    sampler = rollout_model(model, "float32", "bfloat16", cuda_graphs=True)  # one copy: the same weights, bit for bit
    generators = [HFGenerator(sampler, tokenizer, compute_dtype="bfloat16", cuda_graphs=True, graph_sampling=sampling,
                              eos_token_ids=list(range(3, len(tokenizer), 7))) for sampling in (True, False)]
    prompts = toy_prompts(tokenizer)
    for seed in (1, 2, 3):
        settings = SamplingSettings(24, temperature=1.0, seed=seed)
        in_graph, on_host = (generator.generate(prompts, settings) for generator in generators)
        assert [c.token_ids for c in in_graph] == [c.token_ids for c in on_host]
        assert max(abs(a - b) for x, y in zip(in_graph, on_host, strict=True)
                   for a, b in zip(x.logprobs, y.logprobs, strict=True)) < 1e-6
    assert any(len(c.token_ids) < 24 for c in in_graph), "no row stopped"
    assert [dict(g.decode_steps) for g in generators] == [{"SampledStep": 3}, {"GraphedStep": 3}]


def test_the_graph_of_a_bucket_is_captured_once_and_replayed_by_later_calls():
    """Calls of 16 and 13 rows (one batch bucket, one buffer bucket) replay the graph the first call captured; the
    13 rows padded to 16 report the model's μ."""
    model, tokenizer = graph_policy("tiny")
    generator = graphed_generator(model, tokenizer)
    prompts = toy_prompts(tokenizer)
    generator.generate(prompts, SamplingSettings(24, temperature=1.0, seed=1))
    assert generator.graph_captures == 1
    padded = generator.generate(prompts[:13], SamplingSettings(24, temperature=1.0, seed=2))
    eager = HFGenerator(model, tokenizer, compute_dtype="bfloat16").generate(prompts[:13], SamplingSettings(
        24, temperature=1.0, seed=2))
    assert mu_error(model, prompts[:13], padded) <= max(2 * mu_error(model, prompts[:13], eager), 1e-2)
    generator.generate(prompts, SamplingSettings(24, temperature=1.0, seed=3))
    assert generator.graph_captures == 1 and generator.decode_steps == {"SampledStep": 3}
    assert len(generator.graphs.graphs) == 1


def test_a_learner_update_between_calls_reaches_the_graph_through_the_refreshed_copy():
    """After an update of the fp32 learner and the engine's sync (update_weights: the bf16 copy refreshed in place),
    the same graph (no new capture) samples the updated policy's μ, far from the old one's."""
    learner, tokenizer = graph_policy("tiny")
    generator = graphed_generator(learner, tokenizer)
    prompts, settings = toy_prompts(tokenizer), SamplingSettings(24, temperature=1.0, seed=1)
    before = generator.generate(prompts, settings)
    old = copy.deepcopy(learner)
    addresses = [parameter.data_ptr() for parameter in generator.model.parameters()]
    optimizer = torch.optim.SGD(learner.parameters(), lr=1.0)
    with torch.no_grad():
        for parameter in learner.parameters():
            parameter.grad = 0.05 * torch.randn_like(parameter)
    optimizer.step()  # in place, as the engine's AdamW
    generator.update_weights(rollout_state_dict(learner.state_dict(), "float32"))
    assert [parameter.data_ptr() for parameter in generator.model.parameters()] == addresses
    after = generator.generate(prompts, settings)
    assert generator.graph_captures == 1 and generator.decode_steps == {"SampledStep": 2}
    bound = max(2 * mu_error(old, prompts, before), 1e-2)
    assert mu_error(learner, prompts, after) <= bound < 0.1 < mu_error(old, prompts, after)


def test_a_cuda_graphs_run_samples_every_step_from_the_refreshed_copy(tmp_path):
    """--dtype bfloat16 --cuda-graphs, synchronous: no capture fails, and every step's first-minibatch |π − μ| is
    bf16 rounding, as without graphs: the bf16 rollout copy the graphs read is refreshed after each update (on the
    CPU a copy left stale measures about 1e-2 from step 2: tests/test_graph_cache.py)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = finished_run(tmp_path, "graphs-sync", ["--dtype", "bfloat16", "--cuda-graphs"])
    assert not [w for w in caught if "CUDA graph" in str(w.message)]
    assert all(0 < row["mismatch/first_abs_diff_mean"] < 1e-3 for row in rows), rows


def cuda_runtime():
    """The CUDA runtime library torch loaded (ctypes), to call ``cudaMalloc`` past torch's caching allocator."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart" in line}
    if not paths:
        pytest.skip("torch's CUDA runtime is not a shared library here")
    return ctypes.CDLL(sorted(paths)[0])


def test_a_capture_in_a_background_rollout_lets_the_learners_thread_allocate(monkeypatch):
    """A background rollout (--max-staleness) captures its decode steps while the learner's thread allocates and
    frees device memory: neither fails (a capture in CUDA's global mode forbids every thread's cudaMalloc)."""
    import contextlib
    import ctypes
    import threading
    import warnings

    from dppo_oat.rollout import cuda_graphs

    capturing, real_capture = threading.Event(), cuda_graphs.captured_on

    @contextlib.contextmanager
    def flagged_capture(graph, stream, pool=None):
        with real_capture(graph, stream, pool):
            capturing.set()
            try:
                yield
            finally:
                capturing.clear()

    monkeypatch.setattr(cuda_graphs, "captured_on", flagged_capture)
    runtime = cuda_runtime()
    model, tokenizer = build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)
    model.to("cuda")
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][:12] for t in toy_corpus(16, seed=3)]
    generator = HFGenerator(model, tokenizer, compute_dtype="bfloat16", cuda_graphs=True)
    done, errors, statuses = threading.Event(), [], set()

    def rollouts():
        try:
            for seed in range(8):
                generator.graphs.clear()  # each call captures again: eight captures beside the allocations
                generator.generate(prompts, SamplingSettings(24, temperature=1.0, seed=seed))
        except BaseException as error:
            errors.append(error)
        finally:
            done.set()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=rollouts)
        thread.start()
        pointer, during_captures = ctypes.c_void_p(), 0
        while not done.is_set():  # the learner's allocations, as the caching allocator makes them
            during = capturing.is_set()
            statuses.add(runtime.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(1 << 20)))
            statuses.add(runtime.cudaFree(pointer))
            during_captures += during and capturing.is_set()
        thread.join()
    assert not errors, errors
    assert during_captures > 0, "no allocation overlapped a capture: the case was not exercised"
    assert statuses == {0}, f"cudaMalloc/cudaFree returned CUDA errors {sorted(statuses)} during the captures"
    assert not [w for w in caught if "CUDA graph" in str(w.message)]
    assert generator.decode_steps == {"SampledStep": 8} and generator.graph_captures == 8


def test_a_run_with_cuda_graphs_and_background_rollouts_finishes(tmp_path, monkeypatch):
    """--cuda-graphs with --max-staleness 1: the rollout thread captures while the learner updates."""
    import threading
    import warnings

    from dppo_oat.rollout import cuda_graphs, hf_generator

    built = []

    def recording(*args):
        step = cuda_graphs.decode_step(*args)
        built.append((threading.current_thread() is threading.main_thread(), type(step).__name__))
        return step

    monkeypatch.setattr(hf_generator, "decode_step", recording)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        finished_run(tmp_path, "graphs", ["--dtype", "bfloat16", "--cuda-graphs", "--max-new-tokens", "16",
                                          "--max-staleness", "1"])
    assert not [w for w in caught if "CUDA graph" in str(w.message)]
    assert (False, "SampledStep") in built, "no background rollout captured its decode step"
    assert {kind for _, kind in built} == {"SampledStep"}
