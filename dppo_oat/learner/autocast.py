"""``--dtype``: the compute dtype of the learner's and the rollout's forward passes, under autocast over fp32 master
weights (the rollout copy's own precision, ``--rollout-dtype``, is :mod:`dppo_oat.rollout.rollout_copy`'s).

The weights, the gradients and the optimizer state stay fp32 whatever the compute dtype: an AdamW step at a small
learning rate changes a weight by far less than a bfloat16 ulp (2^-8 of its size), so updates applied to bfloat16
weights would mostly round away. Each forward pass runs under ``torch.autocast(device_type, dtype)``: its matrix
products in ``dtype``, its softmaxes, norms and the log-probs fp32. The rollout sampler runs the same weights under the
same autocast, so μ and π_θ are one computation and their mismatch stays the one a run injects on purpose
(``--rollout-dtype``, ``--logprob-noise``).

On a CUDA device, :func:`use_shape_agnostic_attention` takes cuDNN out of the attention backends for the whole
process: under half precision torch prefers cuDNN's attention, which builds an execution graph for every new tensor
shape (many milliseconds of host time each), and every decode step of a rollout, like every minibatch of the learner,
attends over a new length. Flash and memory-efficient attention have no such per-shape cost.

float16 also scales the loss (``torch.amp.GradScaler``): its gradients would otherwise underflow. The scaler skips
the steps whose scaled gradients overflowed and lowers the scale; :func:`~dppo_oat.learner.update.scaled_clip_and_step`
tells those skips (:data:`~dppo_oat.learner.guard.LOSS_SCALE_SKIPS`, the scaler's own search for a scale) apart from a
gradient that is non-finite at a scale of 1 or below (the blow-up guard's skip,
:data:`~dppo_oat.learner.guard.SKIPPED`).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from dppo_oat.learner.forward import ForwardFn

ComputeDtype = Literal["float32", "bfloat16", "float16"]
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
HALF_ROLLOUT_DTYPES = ("bfloat16", "float16")
"""``--rollout-dtype`` values whose rollout copy holds half-precision weights and computes in them throughout."""


def torch_dtype(name: str) -> torch.dtype:
    """``torch.float32`` etc. for a :data:`ComputeDtype` name."""
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"unknown compute dtype {name!r}; choose one of: {', '.join(COMPUTE_DTYPES)}")
    return getattr(torch, name)


def autocast(device: torch.device | str, dtype: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type; no context at all for float32 (the fp32 computation, bit
    for bit)."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch_dtype(dtype))


def use_shape_agnostic_attention(device: torch.device | str) -> None:
    """On a CUDA ``device``, turn cuDNN's attention off for the process (``torch.backends.cuda.enable_cudnn_sdp``),
    leaving scaled-dot-product attention to the flash, memory-efficient and math kernels; elsewhere nothing. A
    process-wide flag and not a context: the background rollout samples in a thread beside the update, and a
    context entered and left by two threads would restore the other's setting. On an H100 (torch 2.11,
    bfloat16) a default-run rollout with cuDNN's attention on takes 5.88 s, 4.95 s of it in cuDNN's attention; 0.72 s
    with it off."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def autocast_forward(forward: ForwardFn, device: torch.device | str, dtype: str) -> ForwardFn:
    """``forward`` run under :func:`autocast`, one context per call: autocast caches its low-precision copies of
    the weights for the length of a context, so a context that outlived an optimizer step would compute with the
    weights before it. The log-probs it returns are fp32 either way (:mod:`dppo_oat.learner.forward`)."""
    if dtype == "float32":
        return forward

    def forward_under_autocast(batch, with_topk: bool):
        with autocast(device, dtype):
            return forward(batch, with_topk)

    return forward_under_autocast


def rollout_compute_dtype(dtype: str, rollout_dtype: str) -> str:
    """The compute dtype of the HF rollout sampler: the learner's ``dtype`` (its copy holds fp32 weights: the
    model itself, or a weight-quantised copy), or float32 for a half-precision copy (``--rollout-dtype bfloat16`` /
    ``float16``), which computes in its own dtype throughout, as an engine serving in that dtype does."""
    return "float32" if rollout_dtype in HALF_ROLLOUT_DTYPES else dtype


def check_compute_dtype(device: str, dtype: str) -> None:
    """``dtype`` runs on ``device``: autocast computes a matrix product there in ``dtype`` (torch disables an autocast
    it does not support, with a warning, and computes in fp32), a CUDA device has native bfloat16 (compute capability
    8.0 or later), and float16 has a loss scaler there. Raises ``ValueError`` with what to pass instead."""
    if dtype == "float32":
        return
    target = torch_dtype(dtype)
    kind = torch.device(device).type
    if kind == "cuda" and dtype == "bfloat16" and not _native_cuda_bf16(device):
        raise ValueError(f"--dtype bfloat16: {device} has no native bfloat16 (compute capability < 8.0): use "
                         "--dtype float16 (loss-scaled) or float32")
    if not _autocast_computes_in(device, target):
        raise ValueError(f"--dtype {dtype}: torch {torch.__version__} cannot autocast to {dtype} on {kind}: use "
                         "--dtype float32" + (" or bfloat16" if dtype == "float16" and kind == "cpu" else ""))
    if dtype == "float16":
        try:
            torch.amp.GradScaler(kind)
        except (RuntimeError, ValueError, TypeError, AssertionError):
            raise ValueError(f"--dtype float16 needs a loss scaler, which torch {torch.__version__} lacks on {kind}: "
                             "use --dtype bfloat16 or float32") from None


def _native_cuda_bf16(device: str) -> bool:
    """Whether the CUDA ``device`` computes in bfloat16 natively (not by emulation)."""
    major, _ = torch.cuda.get_device_capability(torch.device(device))
    return major >= 8


def _autocast_computes_in(device: str, dtype: torch.dtype) -> bool:
    """Whether a matrix product under ``torch.autocast`` on ``device`` comes out in ``dtype``."""
    kind = torch.device(device).type
    if not torch.amp.is_autocast_available(kind):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unsupported dtype: torch warns and computes in fp32, seen below
        try:
            with torch.autocast(kind, dtype=dtype), torch.no_grad():
                product = torch.nn.functional.linear(torch.ones(2, 2, device=device), torch.ones(2, 2, device=device))
        except RuntimeError:
            return False
    return product.dtype == dtype


def loss_scaler(device: torch.device | str, dtype: str) -> torch.amp.GradScaler | None:
    """A ``GradScaler`` for float16, None otherwise (bfloat16 has fp32's exponent range: nothing underflows)."""
    return torch.amp.GradScaler(torch.device(device).type) if dtype == "float16" else None
