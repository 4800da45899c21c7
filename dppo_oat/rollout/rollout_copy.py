"""The rollout's copy of the learner's weights at ``--rollout-dtype``: the rollout engine's numeric precision, a
genuine source of training-inference mismatch (sec:introduction). The compute dtype both run their forward passes in,
``--dtype``, is :mod:`dppo_oat.learner.autocast`'s.

The paper's mismatch is that the inference engine computes μ with other kernels and precisions than the learner's
π_θ. On one CPU, with one model, the local engine reproduces it by sampling from a lower-precision copy of the fp32
learner, synced after every update:

- ``bfloat16`` / ``float16``: the copy's weights and its whole forward pass in that dtype (an engine serving in
  half precision);
- ``int8`` / ``int6`` / ``int4``: weight-only quantisation (W8A32, W6A32, W4A32), each output row of every weight
  matrix rounded to 255, 63 or 15 levels of its absolute maximum, the forward pass in fp32 (an engine serving a
  weight-quantised model; 4-bit weights are what GPTQ/AWQ serving uses, and the coarsest mismatch here).

The mismatch is then real (μ is the copy's own sampling distribution), not noise added to reported log-probs.

Apart from the mismatch, :func:`rollout_model` gives the decode graphs of ``--cuda-graphs`` a copy whose linear layers
hold their weights in the autocast dtype (:func:`autocast_weights_copy`): a graph is captured without autocast's
cache, so without it every replay would cast every fp32 weight matrix again; under autocast the copy computes bit for
bit what the fp32 weights do, and the engine refreshes it in place after each update (the graphs keep reading it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Literal

import torch

from dppo_oat.learner.autocast import torch_dtype

RolloutPrecision = Literal["float32", "bfloat16", "float16", "int8", "int6", "int5", "int4", "int3"]
QUANTIZED_BITS = {"int8": 8, "int6": 6, "int5": 5, "int4": 4, "int3": 3}
"""The weight-only quantised precisions and their bits."""
INT8_LEVELS = 127
"""Symmetric int8: integers in [−127, 127], one scale per output row."""


def quantize(weight: torch.Tensor, bits: int, redraw: torch.Generator | None = None) -> torch.Tensor:
    """``weight`` rounded to symmetric per-row ``bits``-bit integers and scaled back (``round(w / s) · s``,
    ``s = max|w_row| / (2^(bits−1) − 1)``): what a W``bits`` engine computes with, in the weight's dtype.

    With ``redraw`` (a seeded generator), each weight is rounded on its own grid shifted by an offset u ~ U(−½, ½)
    drawn from it (subtractive dither: ``(round(w / s + u) − u) · s``): the rounding error stays within ±s/2, as
    nearest rounding's does, but a new draw gives a new error, where nearest rounding gives the same error for the
    same weights at every re-sync."""
    top = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(weight.dtype).tiny) / top
    if redraw is not None:
        offset = torch.rand(weight.shape, generator=redraw, dtype=weight.dtype).to(weight.device) - 0.5
        return (torch.round(weight / scale + offset) - offset) * scale
    return torch.round(weight / scale).clamp(-top, top) * scale


def quantize_int8(weight: torch.Tensor) -> torch.Tensor:
    """:func:`quantize` at 8 bits (:data:`INT8_LEVELS`)."""
    return quantize(weight, 8)


def rollout_state_dict(state_dict: Mapping[str, torch.Tensor], precision: RolloutPrecision,
                       redraw: torch.Generator | None = None) -> dict:
    """The learner's weights as the rollout copy holds them: a quantised precision rounds every floating matrix
    (embeddings, linear layers, the LM head; on grids redrawn from ``redraw`` when given, :func:`quantize`); the
    half dtypes are cast when loaded; fp32 is unchanged."""
    bits = QUANTIZED_BITS.get(precision)
    if bits is None:
        return dict(state_dict)
    return {name: quantize(tensor, bits, redraw) if tensor.is_floating_point() and tensor.dim() >= 2 else tensor
            for name, tensor in state_dict.items()}


def rollout_copy(model: torch.nn.Module, precision: RolloutPrecision) -> torch.nn.Module:
    """The rollout engine's own copy of ``model`` at ``precision`` (``model`` itself for float32: no mismatch)."""
    if precision == "float32":
        return model
    if precision in QUANTIZED_BITS:
        quantized = copy.deepcopy(model)
        quantized.load_state_dict(rollout_state_dict(model.state_dict(), precision))
        return quantized
    return copy.deepcopy(model).to(getattr(torch, precision))


def autocast_weights_copy(model: torch.nn.Module, compute_dtype: str) -> torch.nn.Module:
    """A copy of ``model`` whose linear layers (the LM head included) hold their weights and biases in
    ``compute_dtype``, every other tensor as ``model`` holds it: autocast casts exactly those to that dtype for each
    product, so under that autocast the copy computes bit for bit what ``model`` does, without the casts (a tied
    LM head gets a matrix of its own; the embedding stays). ``model`` itself for float32 (no autocast) or when none
    of its linear weights is fp32 (a half-precision copy already computes in its own dtype)."""
    linear = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    if compute_dtype == "float32" or not any(module.weight.dtype == torch.float32 for module in linear):
        return model
    held = copy.deepcopy(model)
    dtype = torch_dtype(compute_dtype)
    for module in held.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight = torch.nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
            if module.bias is not None:
                module.bias = torch.nn.Parameter(module.bias.detach().to(dtype), requires_grad=False)
    return held


def rollout_model(model: torch.nn.Module, precision: RolloutPrecision, compute_dtype: str,
                  cuda_graphs: bool) -> torch.nn.Module:
    """The model the local engine's rollout samples from: :func:`rollout_copy` at ``precision``, computing under
    ``compute_dtype``'s autocast; for the decode graphs (``cuda_graphs``) its linear weights held in that dtype
    (:func:`autocast_weights_copy`). Without graphs autocast casts each weight once per generator call (its cache),
    and a copy would only hold the memory."""
    copied = rollout_copy(model, precision)
    return autocast_weights_copy(copied, compute_dtype) if cuda_graphs else copied
