"""LoRA on the oat engine (``--lora_rank`` > 0): the learner trains PEFT adapters, the actors sample from whole weights.

oat wraps the policy in PEFT's LoRA (``oat.model.LLM``) and, for every weight broadcast, merges the adapters into the
base weights (W + s·BA), sends the merged state dict to vLLM and subtracts the adapters again. In bf16 or fp16,
``(W + s·BA) − s·BA`` is rounded twice and is not W: each broadcast would move the frozen base weights by a rounding
error, round after round, so the learner's π_θ would drift from the policy being trained (and from what vLLM's μ was
sampled with two broadcasts later). :func:`base_weights_restored` keeps a copy of every adapted base weight for the
duration of the broadcast and writes it back afterwards, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def adapted_base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights (and biases) of every LoRA-adapted layer of ``model``: the tensors a merge writes into."""
    weights = {}
    for name, module in model.named_modules():
        base = getattr(module, "base_layer", None)
        if base is None or not hasattr(module, "lora_A"):
            continue
        for tensor_name, tensor in base.named_parameters(recurse=False):
            weights[f"{name}.base_layer.{tensor_name}"] = tensor
    return weights


@contextlib.contextmanager
def base_weights_restored(model: torch.nn.Module | None) -> Iterator[None]:
    """Within the block the adapters may be merged and unmerged; afterwards every adapted base weight holds exactly
    what it held before (a copy in host memory, written back). ``model`` None: nothing to keep."""
    if model is None:
        yield
        return
    weights = adapted_base_weights(model)
    saved = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, tensor in weights.items():
                tensor.copy_(saved[name])


def match_scheduler_to_groups(scheduler) -> None:
    """Drop the learning-rate schedule's entries of the optimizer's parameter groups DeepSpeed removed.

    oat builds its optimizer with two groups (with and without weight decay) and its schedule on both; under LoRA no
    trainable parameter is a bias or a norm, the second group is empty, and DeepSpeed (0.16) removes empty groups
    from the optimizer after the schedule was made, whose first step then fails (``zip() argument 2 is longer than
    argument 1``). oat gives both groups the same learning rate and schedule, so the entries left equal the ones
    dropped, which is checked."""
    groups = len(scheduler.optimizer.param_groups)
    if len(scheduler.base_lrs) <= groups:
        return
    lambdas = getattr(scheduler, "lr_lambdas", [])
    if len(set(scheduler.base_lrs)) > 1 or any(f is not lambdas[0] for f in lambdas):
        raise RuntimeError("DeepSpeed removed an empty parameter group whose learning-rate schedule differs from the "
                           "others': the schedule cannot be matched to the optimizer")
    scheduler.base_lrs = scheduler.base_lrs[:groups]
    if lambdas:
        scheduler.lr_lambdas = lambdas[:groups]
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = scheduler._last_lr[:groups]
