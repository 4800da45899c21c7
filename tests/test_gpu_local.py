"""The local engine on one CUDA GPU (``pytest -m gpu``; skipped without CUDA): short bfloat16 and float16 runs finish
and log held-out success, the fused head agrees with the logits path there, and the qwen3-100m shape samples with
the direct loop and trains a minibatch under bfloat16."""

import copy
import json
import math

import pytest
import torch

from dppo_oat.learner_forward import causal_lm_forward
from dppo_oat.mixed_precision import autocast_forward
from dppo_oat.models.tiny import build_shaped_policy, build_tiny_policy, toy_corpus
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.samples import TurnSample, build_update_batch
from dppo_oat.spec import SamplingSettings, UpdateSettings
from dppo_oat.train import main
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update import minibatch_step

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RUN = ["--device", "cuda", "--groups-per-step", "8", "--group-size", "4", "--minibatch-size", "32",
       "--eval-episodes", "32", "--eval-every", "3"]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def finished_run(tmp_path, name, flags):
    main(["--steps", "3", "--run-dir", str(tmp_path), "--run-name", name, *RUN, *flags])
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
               for i, (p, c) in enumerate(zip(prompts, completions))]
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


def test_the_decode_step_captured_in_a_cuda_graph_samples_what_the_eager_step_samples():
    """--cuda-graphs: the generator captures its decode step (no fallback warning) and, seeded alike, samples the
    eager decode's tokens with its log μ, under bfloat16 autocast (rounding may flip a rare token)."""
    import warnings

    model, tokenizer = build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)
    model.to("cuda")
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][:12] for t in toy_corpus(16, seed=3)]
    settings = SamplingSettings(24, temperature=1.0, seed=1)
    eager_generator = HFGenerator(model, tokenizer, compute_dtype="bfloat16")
    eager = eager_generator.generate(prompts, settings)
    assert eager_generator.decode_steps == {"EagerStep": 1}
    generator = HFGenerator(model, tokenizer, compute_dtype="bfloat16", cuda_graphs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed capture warns and decodes eagerly
        graphed = generator.generate(prompts, settings)
    assert generator.decode_steps == {"GraphedStep": 1}
    same = [g for e, g in zip(eager, graphed) if list(e.token_ids) == list(g.token_ids)]
    assert len(same) >= 0.8 * len(prompts)
    for e, g in zip(eager, graphed):
        if list(e.token_ids) == list(g.token_ids):
            assert max(abs(a - b) for a, b in zip(e.logprobs, g.logprobs)) < 2e-2


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
    def flagged_capture(graph, stream):
        with real_capture(graph, stream):
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
                generator.generate(prompts, SamplingSettings(24, temperature=1.0, seed=seed))
        except BaseException as error:  # noqa: BLE001 - reported by the test
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
    assert generator.decode_steps == {"GraphedStep": 8}


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
    assert (False, "GraphedStep") in built, "no background rollout captured its decode step"
    assert {kind for _, kind in built} == {"GraphedStep"}
