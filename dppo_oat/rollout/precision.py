"""The rollout engine's numeric precision: a genuine source of training-inference mismatch (sec:introduction).

The paper's mismatch is that the inference engine computes μ with other kernels and precisions than the learner's
π_θ. On one CPU, with one model, the local engine reproduces it by sampling from a lower-precision copy of the fp32
learner, synced after every update:

- ``bfloat16`` / ``float16``: the copy's weights and its whole forward pass in that dtype (an engine serving in
  half precision);
- ``int8``: weight-only int8 quantisation (W8A32), each output row of every weight matrix rounded to 255 levels of
  its absolute maximum, the forward pass in fp32 (an engine serving a weight-quantised model).

The mismatch is then real (μ is the copy's own sampling distribution), not noise added to reported log-probs.
"""

from __future__ import annotations

import copy
from typing import Literal, Mapping

import torch

RolloutPrecision = Literal["float32", "bfloat16", "float16", "int8"]
INT8_LEVELS = 127
"""Symmetric int8: integers in [−127, 127], one scale per output row."""


def quantize_int8(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` rounded to symmetric per-row int8 and scaled back (``round(w / s) · s``, ``s = max|w_row| / 127``):
    what a W8 engine computes with, in the weight's dtype."""
    scale = weight.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(weight.dtype).tiny) / INT8_LEVELS
    return torch.round(weight / scale).clamp(-INT8_LEVELS, INT8_LEVELS) * scale


def rollout_state_dict(state_dict: Mapping[str, torch.Tensor], precision: RolloutPrecision) -> dict:
    """The learner's weights as the rollout copy holds them: int8 rounds every floating matrix (embeddings, linear
    layers, the LM head); the half dtypes are cast when loaded; fp32 is unchanged."""
    if precision != "int8":
        return dict(state_dict)
    return {name: quantize_int8(tensor) if tensor.is_floating_point() and tensor.dim() >= 2 else tensor
            for name, tensor in state_dict.items()}


def rollout_copy(model: torch.nn.Module, precision: RolloutPrecision) -> torch.nn.Module:
    """The rollout engine's own copy of ``model`` at ``precision`` (``model`` itself for float32: no mismatch)."""
    if precision == "float32":
        return model
    if precision == "int8":
        quantized = copy.deepcopy(model)
        quantized.load_state_dict(rollout_state_dict(model.state_dict(), precision))
        return quantized
    return copy.deepcopy(model).to(getattr(torch, precision))
