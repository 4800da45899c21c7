"""--dtype: fp32 master weights with the learner and the sampler under one autocast. The log-probs stay fp32, the
fused head agrees with the logits path under autocast and keeps float16's small gradients, the loss scaler's skips
never stop a run while real divergence still does, and short bfloat16 / float16 runs finish on the CPU."""

import copy
import json
import math

import pytest
import torch
from test_faults import one_error

import dppo_oat.learner.autocast as mixed_precision
from dppo_oat.errors import TrainingBlewUp
from dppo_oat.learner.autocast import (
    autocast,
    autocast_forward,
    check_compute_dtype,
    loss_scaler,
    rollout_compute_dtype,
)
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.fused_head import fused_head_logprobs
from dppo_oat.learner.guard import LOSS_SCALE_SKIPS, SKIPPED, BlowUpGuard
from dppo_oat.learner.update import clip_and_step, minibatch_step, scaled_clip_and_step, summarize_steps
from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
from dppo_oat.rollout.direct_forward import KVBuffer
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import SamplingSettings, UpdateSettings
from dppo_oat.train import main
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update_batch import TurnSample, build_update_batch

HALF = ["bfloat16", "float16"]


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)


def sampled_batch(policy, compute_dtype="float32", n=6):
    """Samples of the policy by the HF sampler at ``compute_dtype`` (μ as it reports it), advantages ±1."""
    model, tokenizer = policy
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][:12] for t in toy_corpus(n, seed=3)]
    completions = HFGenerator(model, tokenizer, compute_dtype=compute_dtype).generate(
        prompts, SamplingSettings(8, temperature=1.0, seed=1))
    samples = [TurnSample(p, c.token_ids, c.logprobs, 0.0, True, False, 0, "toy", i, str(i), c.finish_reason)
               for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    return build_update_batch(samples, [1.0 if i % 2 else -1.0 for i in range(n)], tokenizer.pad_token_id)


# ----------------------------------------------------------------------------------------- the learner's forward


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("lm_head", ["fused", "logits"])
def test_log_probs_stay_fp32_under_autocast_and_mu_agrees_with_pi(policy, dtype, lm_head):
    """The sampler and the learner at one --dtype: π_θ's log-probs are fp32, and on the sampler's own tokens they
    match the μ it reported to within that dtype's rounding (not exactly: another batch shape, other kernels)."""
    model = policy[0]
    batch = sampled_batch(policy, dtype)
    forward = autocast_forward(causal_lm_forward(model, lm_head=lm_head), "cpu", dtype)
    with torch.no_grad():
        out = forward(batch, False)
    assert out.logp.dtype == torch.float32 and out.entropy.dtype == torch.float32
    gap = (out.logp - batch.behavior_logp)[batch.response_mask].abs()
    assert 0 < float(gap.max()) < 0.1 and float(gap.mean()) < 0.01


def test_float32_is_no_autocast_at_all(policy):
    """--dtype float32 (the default) wraps nothing: the computation of every earlier run, bit for bit."""
    model = policy[0]
    forward = causal_lm_forward(model)
    assert autocast_forward(forward, "cpu", "float32") is forward
    assert not torch.is_autocast_enabled("cpu")
    with autocast("cpu", "float32"):
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("dtype", HALF)
def test_the_fused_head_matches_the_logits_path_under_autocast(policy, dtype):
    """Fused vs logits path, both under autocast: the same fp32
    log-probs and the same gradients of DPPO's loss, up to the half-precision products."""
    batch = sampled_batch(policy)
    tr = TrustRegion.preset("dppo_binary_tv")
    settings = UpdateSettings(aggregation="seq-mean-token-sum-norm", norm_constant=8.0)
    results = {}
    for lm_head in ("fused", "logits"):
        model = copy.deepcopy(policy[0]).train()
        forward = autocast_forward(causal_lm_forward(model, settings=settings, lm_head=lm_head),
                                   "cpu", dtype)
        minibatch_step(batch, torch.arange(len(batch)), tr, forward, lambda loss: loss.backward(), settings)
        results[lm_head] = (forward(batch, False).logp.detach(),
                            torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    (fused_logp, fused_grad), (logits_logp, logits_grad) = results["fused"], results["logits"]
    assert fused_logp.dtype == torch.float32
    torch.testing.assert_close(fused_logp, logits_logp, atol=2e-2, rtol=0)
    cosine = torch.nn.functional.cosine_similarity(fused_grad, logits_grad, dim=0)
    assert float(cosine) > 0.99 and 0.9 < float(fused_grad.norm() / logits_grad.norm()) < 1.1


def test_the_fused_heads_float16_gradients_keep_the_small_probabilities():
    """A sharp distribution over a large vocabulary: the tail's terms of ∂L/∂h (g_t · π(v), far below float16's
    smallest number) are as large together as the chosen token's. Under float16 autocast the fused head computes
    them in fp32, chunk by chunk of the vocabulary."""
    gen = torch.Generator().manual_seed(0)
    vocab, width, rows, g = 4096, 16, 8, 1e-3
    weight = torch.randn(vocab, width, generator=gen)
    ids = torch.arange(rows)
    hidden = 0.8 * weight[ids] + 0.1 * torch.randn(rows, width, generator=gen)  # π(a_t) near 1, a thin tail

    reference = hidden.double().requires_grad_()
    (g * torch.log_softmax(reference @ weight.double().T, -1)[ids, ids].sum()).backward()

    leaf = hidden.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16):
        logp, _, _ = fused_head_logprobs(leaf, weight, ids, chunk_size=3)
    assert logp.dtype == torch.float32
    (g * logp.sum()).backward()
    error = (leaf.grad.double() - reference.grad).norm() / reference.grad.norm()
    assert float(error) < 0.05, float(error)


@pytest.mark.parametrize("dtype", HALF)
def test_the_backward_recomputes_the_forwards_half_precision_logits(dtype):
    """The backward recomputes the logits under the forward's autocast (the backward itself runs under none): the
    gradients are those of the half-precision logits the forward's log-probs come from."""
    gen = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(10, 16, generator=gen), torch.randn(300, 16, generator=gen)
    ids, g = torch.randint(0, 300, (10,), generator=gen), torch.linspace(-1, 1, 10)
    half_logits = torch.nn.functional.linear(hidden.to(getattr(torch, dtype)), weight.to(getattr(torch, dtype)))
    reference = half_logits.double().requires_grad_()
    (g.double() * torch.log_softmax(reference, -1)[torch.arange(10), ids]).sum().backward()
    leaf = hidden.clone().requires_grad_()
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        logp, _, _ = fused_head_logprobs(leaf, weight, ids, chunk_size=4)
    (g * logp).sum().backward()
    expected = reference.grad @ weight.double()  # ∂L/∂h of those logits, the head's product in full precision
    torch.testing.assert_close(leaf.grad.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_kv_buffer_keeps_the_keys_and_values_dtypes_apart():
    """Under autocast Qwen3 hands its cache fp32 keys (normalised) and half-precision values: a buffer rebuilt from a
    past (the prefix cache's, a grown one) keeps each in its own dtype, not both in the keys'."""
    keys, values = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4).to(torch.bfloat16)
    buffer = KVBuffer.from_past([(keys, values)], torch.ones(2, 3, dtype=torch.bool), capacity=8)
    assert buffer.keys[0].dtype == torch.float32 and buffer.values[0].dtype == torch.bfloat16
    assert torch.equal(buffer.filled()[0][1], values)


# ----------------------------------------------------------------------------------------- the loss scaler


def parameters_with_grads(value: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    parameters = [torch.nn.Parameter(torch.randn(5, 3, generator=gen)),
                  torch.nn.Parameter(torch.randn(4, generator=gen))]
    for parameter in parameters:
        parameter.grad = torch.full_like(parameter, value)
    return parameters


def started_scaler():
    """A GradScaler that has scaled a loss (as the trainer's backward does before every step)."""
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    return scaler


def test_a_scaled_gradient_steps_as_the_unscaled_one_would():
    """Unscaled before the clip: the step and the reported norm are those of the plain fp32 gradient."""
    scaled, plain = parameters_with_grads(0.0), parameters_with_grads(0.0)
    gen = torch.Generator().manual_seed(1)
    for s, p in zip(scaled, plain, strict=True):
        p.grad = torch.randn(p.shape, generator=gen)
        s.grad = p.grad * 65536.0  # the scaler's initial scale, a power of two: unscaling is exact
    scaler = started_scaler()
    metrics = scaled_clip_and_step(scaled, torch.optim.SGD(scaled, lr=0.1), scaler, 1.0)
    expected = clip_and_step(plain, torch.optim.SGD(plain, lr=0.1), 1.0)
    assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"]) and metrics[LOSS_SCALE_SKIPS] == 0.0
    assert SKIPPED not in metrics and metrics["loss_scale"] == 65536.0
    for s, p in zip(scaled, plain, strict=True):
        torch.testing.assert_close(s.data, p.data)
        assert s.grad is None


@pytest.mark.fault("a float16 run (`--dtype float16`) whose scaled gradients overflow",
                   "the loss scaler skips the step and halves its scale, counted in `guard/loss_scale_skips`: never a "
                   "reason to stop; at a scale of 1 or below a non-finite gradient is the guard's skip "
                   "(`guard/skipped`)")
def test_loss_scale_overflows_never_stop_a_run_until_the_scale_reaches_one():
    """Overflowing steps at a scale above 1 are the scaler's: skipped, counted, the scale halved, the guard's run of
    skips untouched however long they go on. At a scale of 1 the gradient itself is non-finite: the guard's skip,
    and ``patience`` of them stop the run."""
    parameters = parameters_with_grads(0.0)
    before = [p.detach().clone() for p in parameters]
    optimizer = torch.optim.SGD(parameters, lr=0.1)
    scaler, guard, history = started_scaler(), BlowUpGuard(patience=3), []
    while scaler.get_scale() > 1.0:
        for parameter in parameters:
            parameter.grad = torch.full_like(parameter, float("inf"))
        metrics = scaled_clip_and_step(parameters, optimizer, scaler, 1.0)
        assert metrics[LOSS_SCALE_SKIPS] == 1.0 and SKIPPED not in metrics and "grad_norm" not in metrics
        guard.observe(metrics)
        history.append(metrics)
    assert len(history) == 16 and guard.loss_scale_skips == 16 and guard.skipped_in_a_row == 0
    assert summarize_steps(history)[LOSS_SCALE_SKIPS] == 16.0 and "grad_norm" not in summarize_steps(history)
    assert all(torch.equal(p.data, b) for p, b in zip(parameters, before, strict=True))
    with pytest.raises(TrainingBlewUp, match="the gradient norm non-finite in 3 optimizer steps in a row"):
        for _ in range(3):
            for parameter in parameters:
                parameter.grad = torch.full_like(parameter, float("nan"))
            metrics = scaled_clip_and_step(parameters, optimizer, scaler, 1.0)
            assert metrics[SKIPPED] == 1.0 and metrics["guard/nonfinite_grad"] == 1.0
            assert scaler.get_scale() == 1.0  # the guard's skips leave the scale where it is
            guard.observe(metrics)


def test_only_float16_gets_a_loss_scaler():
    assert loss_scaler("cpu", "float32") is None and loss_scaler("cpu", "bfloat16") is None
    assert isinstance(loss_scaler("cpu", "float16"), torch.amp.GradScaler)


# ----------------------------------------------------------------------------------------- settings


def test_a_half_precision_rollout_copy_computes_in_its_own_dtype():
    """--rollout-dtype bfloat16/float16 holds half weights and computes in them throughout, whatever --dtype; the
    model itself and a weight-quantised copy (fp32 weights) compute at --dtype."""
    assert rollout_compute_dtype("bfloat16", "float32") == "bfloat16"
    assert rollout_compute_dtype("bfloat16", "int4") == "bfloat16"
    assert rollout_compute_dtype("bfloat16", "float16") == "float32"
    assert rollout_compute_dtype("float32", "bfloat16") == "float32"


def test_a_dtype_the_device_cannot_run_is_one_clear_error(monkeypatch):
    check_compute_dtype("cpu", "bfloat16")  # this torch autocasts both on a CPU
    check_compute_dtype("cpu", "float16")
    monkeypatch.setattr(mixed_precision, "_autocast_computes_in", lambda device, dtype: False)
    with pytest.raises(ValueError, match="--dtype float16: torch .* cannot autocast to float16 on cpu"):
        check_compute_dtype("cpu", "float16")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    with pytest.raises(ValueError, match="--dtype bfloat16: cuda has no native bfloat16 .*--dtype float16"):
        check_compute_dtype("cuda", "bfloat16")


@pytest.mark.fault("a `--dtype` the device cannot run (bfloat16 on a GPU of compute capability < 8.0, or one this "
                   "torch cannot autocast there)",
                   "one line naming the flag and what to pass instead, before any model")
def test_an_unsupported_dtype_is_one_line_before_any_model(tmp_path, capsys, no_model, monkeypatch):
    monkeypatch.setattr(mixed_precision, "_autocast_computes_in", lambda device, dtype: False)
    one_error(capsys, ["--runs-dir", str(tmp_path), "--dtype", "bfloat16"], 2, "--dtype bfloat16: torch",
              "cannot autocast to bfloat16 on cpu: use --dtype float32")
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------- runs


RUN = ["--groups-per-step", "4", "--group-size", "4", "--minibatch-size", "32", "--eval-episodes", "8",
       "--eval-every", "2"]
"""Short runs from the shipped warm-started policy."""


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_bfloat16_run_finishes_with_mu_and_pi_close_at_the_first_minibatch(tmp_path):
    """μ (the sampler) and π_θ (the learner) under the same bfloat16 autocast: before any update they differ only by
    rounding (float32: exactly 0), far below what a half-precision rollout copy injects."""
    main(["--steps", "2", "--dtype", "bfloat16", "--runs-dir", str(tmp_path), "--run-name", "bf16", *RUN])
    run = tmp_path / "bf16"
    assert json.loads((run / "config.json").read_text())["dtype"] == "bfloat16"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(math.isfinite(v) for row in rows for v in row.values() if isinstance(v, float))
    assert 0 < rows[0]["mismatch/first_abs_diff_mean"] < 1e-3
    assert "loss_scale" not in rows[0] and LOSS_SCALE_SKIPS not in rows[0]
    assert [row["step"] for row in read_jsonl(run / "eval.jsonl")] == [0, 2]


@pytest.mark.slow
def test_a_float16_run_scales_its_loss_and_checkpoints_the_scale(tmp_path):
    main(["--steps", "1", "--dtype", "float16", "--runs-dir", str(tmp_path), "--run-name", "fp16", *RUN,
          "--groups-per-step", "2"])
    run = tmp_path / "fp16"
    row, = read_jsonl(run / "metrics.jsonl")
    assert row["loss_scale"] == 65536.0 and row[LOSS_SCALE_SKIPS] == 0.0 and row["guard/skipped"] == 0.0
    assert math.isfinite(row["grad_norm"]) and math.isfinite(row["loss"])
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    assert state["loss_scaler"]["scale"] == 65536.0
    assert all(tensor.dtype == torch.float32 for tensor in state["model"].values() if tensor.is_floating_point())


@pytest.fixture
def cudnn_attention_flag():
    """The process-wide cuDNN attention flag, restored after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_cuda_turns_cudnn_attention_off_for_the_process_and_other_devices_leave_it(cudnn_attention_flag):
    torch.backends.cuda.enable_cudnn_sdp(True)
    mixed_precision.use_shape_agnostic_attention("cpu")
    assert torch.backends.cuda.cudnn_sdp_enabled()
    mixed_precision.use_shape_agnostic_attention("cuda:0")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()


def test_a_generator_on_cuda_turns_cudnn_attention_off(cudnn_attention_flag, monkeypatch):
    """The HF generator asks for it with its model's device (a CPU model here, its device reported as CUDA)."""
    from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
    from dppo_oat.rollout import hf_generator

    torch.backends.cuda.enable_cudnn_sdp(True)
    model, tokenizer = build_tiny_policy(toy_corpus(20), seed=0, vocab_size=64)
    asked = []
    monkeypatch.setattr(hf_generator, "use_shape_agnostic_attention",
                        lambda device: asked.append(str(device)) or mixed_precision.use_shape_agnostic_attention(
                            "cuda" if str(device) == "cpu" else device))
    hf_generator.HFGenerator(model, tokenizer)
    assert asked == ["cpu"] and not torch.backends.cuda.cudnn_sdp_enabled()
