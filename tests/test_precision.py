"""The rollout copy's precision (a real training-inference mismatch): int8 weight rounding, the copies each
precision makes and keeps in sync, and the first-minibatch |π − μ| that measures it without staleness."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dppo_oat.learner.update import summarize_steps
from dppo_oat.models import build_tiny_policy, toy_corpus
from dppo_oat.models.scoring import teacher_forced_logprobs
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.rollout_copy import (
    INT8_LEVELS,
    autocast_weights_copy,
    quantize,
    quantize_int8,
    rollout_copy,
    rollout_model,
    rollout_state_dict,
)


@settings(max_examples=50, deadline=None)
@given(arrays("float32", st.tuples(st.integers(1, 6), st.integers(1, 40)),
              elements=st.floats(-10, 10, width=32, allow_subnormal=False)))
def test_int8_rounding_keeps_each_row_on_255_levels_within_half_a_step(weight):
    weight = torch.from_numpy(weight)
    quantized = quantize_int8(weight)
    step = weight.abs().amax(dim=-1, keepdim=True) / INT8_LEVELS
    assert ((quantized - weight).abs() <= step / 2 + 1e-6).all()
    for row, row_step in zip(quantized, step.squeeze(-1), strict=True):
        if row_step > 0:
            levels = torch.round(row / row_step)
            assert torch.allclose(levels * row_step, row, atol=1e-5) and levels.abs().max() <= INT8_LEVELS
        else:
            assert (row == 0).all()
    assert torch.allclose(quantize_int8(quantized), quantized, atol=1e-6)  # idempotent


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(), seed=0)


def test_each_precision_makes_its_own_copy_and_leaves_the_learner_alone(policy):
    model, _ = policy
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert rollout_copy(model, "float32") is model
    for precision, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16), ("int8", torch.float32)):
        copy = rollout_copy(model, precision)
        assert copy is not model and next(copy.parameters()).dtype == dtype
    int8 = rollout_copy(model, "int8").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name])
        if tensor.dim() >= 2:
            assert torch.equal(int8[name], quantize_int8(tensor)) and not torch.equal(int8[name], tensor)
        else:  # norms and biases keep full precision
            assert torch.equal(int8[name], tensor)


def test_a_synced_int8_copy_holds_the_learners_new_weights_rounded(policy):
    model, tokenizer = policy
    learner = rollout_copy(model, "bfloat16").float()  # a learner to change without touching the fixture
    generator = HFGenerator(rollout_copy(learner, "int8"), tokenizer)
    with torch.no_grad():
        for parameter in learner.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    generator.update_weights(rollout_state_dict(learner.state_dict(), "int8"))
    for name, tensor in learner.state_dict().items():
        expected = quantize_int8(tensor) if tensor.dim() >= 2 else tensor
        assert torch.equal(generator.model.state_dict()[name], expected), name


def test_lower_precision_copies_sample_from_a_measurably_different_mu(policy):
    """fp32 ≪ fp16 < bf16 on the same tokens; int8 weights more than fp16."""
    model, tokenizer = policy
    ids = tokenizer("the cat sat on the mat and the dog ran to the cat")["input_ids"]
    prompt, completion = ids[:3], ids[3:]
    reference = teacher_forced_logprobs(model, prompt, completion).exp()
    gaps = {p: (teacher_forced_logprobs(rollout_copy(model, p), prompt, completion).exp() - reference).abs().mean()
            .item() for p in ("float32", "float16", "bfloat16", "int8")}
    assert gaps["float32"] == 0 and 0 < gaps["float16"] < gaps["bfloat16"] and gaps["int8"] > gaps["float16"], gaps


def test_the_first_minibatch_mismatch_is_reported_apart():
    history = [{"mismatch/abs_diff_mean": 0.001, "mismatch/abs_diff_max": 0.01, "loss": 1.0},
               {"mismatch/abs_diff_mean": 0.005, "mismatch/abs_diff_max": 0.2, "loss": 3.0}]
    summary = summarize_steps(history)
    assert summary["mismatch/abs_diff_mean"] == pytest.approx(0.003) and summary["mismatch/abs_diff_max"] == 0.2
    assert summary["mismatch/first_abs_diff_mean"] == 0.001 and summary["mismatch/first_abs_diff_max"] == 0.01
    assert "first_loss" not in str(summary) and summarize_steps([]) == {}


@pytest.mark.parametrize("bits", [8, 6, 4])
def test_quantising_keeps_each_row_on_its_levels_within_half_a_step(bits):
    weight = torch.randn(16, 32, generator=torch.Generator().manual_seed(bits))
    quantized = quantize(weight, bits)
    top = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=-1, keepdim=True) / top
    steps = quantized / scale
    assert torch.allclose(steps, steps.round(), atol=1e-4) and steps.abs().max() <= top + 1e-4
    assert ((quantized - weight).abs() <= scale / 2 + 1e-6).all()
    assert len(torch.unique(steps[0].round())) <= 2 * top + 1


def test_coarser_weights_give_a_larger_mismatch(policy):
    """int4 rounds the weights more than int8, so the copy's token log-probs move further from the learner's."""
    learner, tokenizer = policy
    ids = tokenizer("9 . 2 . 1 7 . 3 8 . . 6", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        reference = torch.log_softmax(learner(ids).logits, -1)
        gaps = {precision: (torch.log_softmax(rollout_copy(learner, precision)(ids).logits, -1)
                            - reference).abs().mean()
                for precision in ("int8", "int6", "int4")}
    assert 0 < gaps["int8"] < gaps["int6"] < gaps["int4"]


def test_the_mismatch_pilot_says_which_levels_bind():
    """A level binds when |π−μ| ≥ 5e-3 and the mask fires on ≥ 0.5% of tokens (studies/cpu/mismatch_pilot.py)."""
    from studies.cpu import mismatch_pilot as pilot

    def rows(diff, mask):
        return [{"step": s, "mismatch/abs_diff_mean": diff, "mask/fraction": mask, "success": 0.5} for s in (1, 2)]

    assert pilot.level_row("int4", rows(7e-3, 6e-3), [900], 2)["binds"]
    assert not pilot.level_row("int5", rows(2.4e-3, 6e-4), [900], 2)["binds"]
    assert not pilot.level_row("x", rows(7e-3, 4e-3), [900], 2)["binds"]


def linear_weights(model) -> dict[str, torch.Tensor]:
    return {name: module.weight for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_autocast_weights_copy_computes_bit_for_bit_what_autocast_on_fp32_weights_does(policy, dtype):
    """Linear weights held in the autocast dtype, the rest fp32 (the tied LM head gets its own matrix): under the
    autocast the logits are the fp32 model's exactly, and the learner is left alone."""
    model, tokenizer = policy
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    held = autocast_weights_copy(model, dtype)
    assert held is not model and all(weight.dtype == getattr(torch, dtype) for weight in linear_weights(held).values())
    assert held.model.embed_tokens.weight.dtype == torch.float32 and held.model.norm.weight.dtype == torch.float32
    ids = tokenizer("9 . 2 . 1 7 . 3 8 . . 6", return_tensors="pt")["input_ids"]
    with torch.no_grad(), torch.autocast("cpu", dtype=getattr(torch, dtype)):
        assert torch.equal(held(ids).logits, model(ids).logits)
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())


def test_a_synced_autocast_weights_copy_is_refreshed_in_place(policy):
    """The learner's new weights reach the copy cast, into the same storage (a decode graph keeps reading them)."""
    model, tokenizer = policy
    learner = copy.deepcopy(model)
    generator = HFGenerator(autocast_weights_copy(learner, "bfloat16"), tokenizer, compute_dtype="bfloat16")
    addresses = {name: tensor.data_ptr() for name, tensor in generator.model.state_dict().items()}
    with torch.no_grad():
        for parameter in learner.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    generator.update_weights(rollout_state_dict(learner.state_dict(), "float32"))
    held = generator.model.state_dict()
    for name, tensor in learner.state_dict().items():
        assert torch.equal(held[name], tensor.to(held[name].dtype)), name
        assert held[name].data_ptr() == addresses[name], name


def test_the_rollout_model_holds_linear_weights_in_the_compute_dtype_only_for_the_decode_graphs(policy):
    model, _ = policy
    assert rollout_model(model, "float32", "bfloat16", cuda_graphs=False) is model
    assert rollout_model(model, "float32", "float32", cuda_graphs=True) is model  # no autocast: nothing cast
    graphed = rollout_model(model, "float32", "bfloat16", cuda_graphs=True)
    assert {weight.dtype for weight in linear_weights(graphed).values()} == {torch.bfloat16}
    int8 = rollout_model(model, "int8", "bfloat16", cuda_graphs=True)
    assert torch.equal(int8.lm_head.weight, quantize_int8(model.lm_head.weight).to(torch.bfloat16))
    half = rollout_model(model, "bfloat16", "float32", cuda_graphs=True)  # computes in bf16 already
    assert next(half.parameters()).dtype == torch.bfloat16


def test_a_redrawn_grid_rounds_within_half_a_step_and_differently_each_draw():
    """--rollout-redraw: each weight on its grid shifted by its own offset; the error stays within ±s/2 as nearest
    rounding's does, a new draw gives a new error and the same seed the same one (a resumed run redraws alike)."""
    weight = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    scale = weight.abs().amax(dim=-1, keepdim=True) / 7
    first, again = (quantize(weight, 4, torch.Generator().manual_seed(1)) for _ in range(2))
    other = quantize(weight, 4, torch.Generator().manual_seed(2))
    assert ((first - weight).abs() <= scale / 2 + 1e-6).all() and ((other - weight).abs() <= scale / 2 + 1e-6).all()
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(quantize(weight, 4), quantize(weight, 4))  # nearest rounding: the same error every re-sync
    assert (first - weight).mean().abs() < scale.mean() / 10  # no bias of its own
