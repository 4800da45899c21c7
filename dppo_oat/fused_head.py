"""π_θ's log-probs, and the policy loss's gradients, straight from the last hidden states: the LM head is applied
chunk by chunk over the tokens and the ``[N, V]`` logits are never held.

Every quantity of the update is per token: π_θ(a_t|s_t), π_θ on the top-K set (sec:method_topk), the entropy metric,
and the loss of eq:unified_grad, whose gradient reaches the logits only through log π_θ(a_t|s_t) (the mask M_t and
the IS weight min(r_t, C) are constants of the gradient). With ``z_t = W h_t / T`` (head weight ``W [V, H]``,
temperature T) and ``g_t = ∂L/∂ log π_θ(a_t|s_t)``::

    ∂L/∂z_t = g_t · (e_{a_t} − softmax(z_t)),   ∂L/∂h_t = Wᵀ ∂L/∂z_t / T,   ∂L/∂W = Σ_t ∂L/∂z_t h_tᵀ / T

Under ``torch.autocast`` the head's product ``W h`` runs in the autocast dtype, as the model's own head would (the
rollout samples from those logits); the statistics and the gradients' products stay fp32 (:func:`accumulate_grads`).

A chunk holds about :data:`CHUNK_ELEMENTS` fp32 logits (220 tokens at V = 151,936). Per chunk the forward pass
computes log π_θ(a_t), the log-normaliser, the top-K log-probs and the entropy, and keeps only those O(N · K) numbers.
The gradients come one of two ways:

- *in the forward pass* (the learner's case): the caller announces its loss (``token_grad``: ``g_t`` of a chunk's
  tokens from their log-probs, known as soon as the chunk's log-normaliser is), so each chunk's softmax turns into
  ``∂L/∂h`` and ``∂L/∂W`` at once; the backward pass checks that the loss it receives is the announced one (its
  ``g`` is the announced ``g`` times one factor: gradient accumulation, micro-batch shares) and scales them;
- *recomputed in the backward pass* otherwise (no loss announced, or another one): each chunk's logits again, for the
  tokens whose ``g_t`` is not zero only (a prompt token, or one the trust region blocks, costs no backward).

``∂L/∂W`` accumulates in fp32 and reaches the head weight through ordinary autograd: a tied head adds it to the
embedding's gradient, and DeepSpeed ZeRO-1/2 reduce it as any other gradient. ZeRO-3 partitions the weight outside
its module's forward: there :func:`head_of` refuses, and the learner keeps the logits path (``lm_head="logits"``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

CHUNK_ELEMENTS = 1 << 25
"""fp32 logits per chunk (128 MiB): the token rows of a chunk are ``CHUNK_ELEMENTS // V``."""
ANNOUNCED_RTOL = 1e-4
"""How closely the backward's ``g`` must match the announced one, up to a factor, to use the forward's gradients."""

TokenGrad = Callable[[slice, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]
"""``token_grad(rows, logp, topk_logp) -> g``: ``∂L/∂ log π(a_t)`` of the loss the caller will backpropagate, for the
token rows ``rows`` of the flattened batch, given their log-probs (and top-K log-probs), up to one common factor."""


class FusedHeadUnsupported(ValueError):
    """The model's LM head is not a plain linear map of the last hidden states (or ZeRO-3 partitions it)."""


# --------------------------------------------------------------------------------------------- one chunk (pure)


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32, or the weight's dtype when it is wider."""
    return torch.promote_types(dtype, torch.float32)


def rows_per_chunk(vocab: int, chunk_size: int | None = None) -> int:
    """``chunk_size`` token rows, by default as many as keep a chunk's logits near :data:`CHUNK_ELEMENTS`."""
    rows = chunk_size if chunk_size is not None else max(1, CHUNK_ELEMENTS // vocab)
    if rows < 1:
        raise ValueError(f"chunk_size must be >= 1, got {rows}")
    return rows


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``z = W h / T`` in fp32 (fp64 stays fp64) for rows ``hidden [c, H]``; the matmul runs in the weight's dtype,
    as the model's own head does."""
    z = F.linear(hidden, weight).to(statistics_dtype(weight.dtype))
    return z.div_(temperature) if temperature != 1.0 else z


def chunk_statistics(z: torch.Tensor, ids: torch.Tensor, topk_ids: torch.Tensor | None, with_entropy: bool):
    """``(logsumexp z, log π(a_t), log π on the top-K ids, entropy)`` of a chunk's logits ``z [c, V]``.

    ``log π(v) = z_v − logsumexp z``; entropy ``H = logsumexp z − Σ_v π(v) z_v``. Negative top-K ids (padding) give
    ``−inf``; absent parts are None. No other ``[c, V]`` tensor is made.
    """
    picked = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    picked_topk = None if topk_ids is None else z.gather(-1, topk_ids.clamp(min=0))
    peak = z.amax(-1)
    total, weighted = exp_sums(z, peak, with_entropy)
    lse = peak + total.log()
    topk = None
    if picked_topk is not None:
        topk = (picked_topk - lse.unsqueeze(-1)).masked_fill_(topk_ids < 0, float("-inf"))
    entropy = total.log() - weighted / total if with_entropy else None
    return lse, picked - lse, topk, entropy


def exp_sums(z: torch.Tensor, peak: torch.Tensor, with_entropy: bool, rows: int = 16):
    """``(Σ_v e^{x_v}, Σ_v e^{x_v} x_v)`` per row, ``x = z − peak``, a few rows at a time (temporaries stay small)."""
    total = z.new_empty(z.shape[0])
    weighted = z.new_empty(z.shape[0]) if with_entropy else None
    for part in row_slices(z.shape[0], rows):
        shifted = z[part] - peak[part].unsqueeze(-1)
        exp = shifted.exp()
        total[part] = exp.sum(-1)
        if with_entropy:
            weighted[part] = exp.mul_(shifted).sum(-1)
    return total, weighted


def chunk_logit_grad(z: torch.Tensor, lse: torch.Tensor, ids: torch.Tensor, grad_logp: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """``∂L/∂(W h) = g · (e_a − softmax(z)) / T`` for a chunk, computed in place of ``z``."""
    scale = (grad_logp.to(z.dtype) / temperature).unsqueeze(-1)
    dz = z.sub_(lse.unsqueeze(-1)).exp_().mul_(-scale)
    return dz.scatter_add_(-1, ids.unsqueeze(-1), scale)


def accumulate_grads(dz: torch.Tensor, rows_hidden: torch.Tensor, weight: torch.Tensor,
                     grad_hidden: torch.Tensor | None, grad_weight: torch.Tensor | None) -> torch.Tensor | None:
    """``∂L/∂h = dz W`` of the chunk (returned) and ``grad_weight += dzᵀ h`` (fp32, in place), in the weight's dtype
    even under autocast: ``dz`` of a token is ``g_t`` times probabilities (down to 1e-7 and below at a large V),
    which float16 would flush to zero before any loss scale could lift them."""
    with autocast_like((dz.device.type, False, None)):
        dz = dz.to(weight.dtype)
        if grad_weight is not None:
            if dz.dtype == grad_weight.dtype:
                grad_weight.addmm_(dz.T, rows_hidden)
            else:
                grad_weight.add_(dz.T @ rows_hidden)
        return None if grad_hidden is None else dz @ weight


# --------------------------------------------------------------------------------------------- all rows


@dataclass
class HeadPass:
    """What the forward pass keeps, per token row: fp32 ``[N]`` (``topk_logp``: ``[N, K']``), and the gradients of
    the announced loss when there was one (``grad_logp``: its ``g``)."""

    logp: torch.Tensor
    lse: torch.Tensor
    entropy: torch.Tensor | None = None
    topk_logp: torch.Tensor | None = None
    grad_logp: torch.Tensor | None = None
    grad_hidden: torch.Tensor | None = None
    grad_weight: torch.Tensor | None = None


@torch.no_grad()
def head_forward(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                 topk_ids: torch.Tensor | None = None, with_entropy: bool = True, chunk_size: int | None = None,
                 token_grad: TokenGrad | None = None, grads_for: tuple[bool, bool] = (True, True)) -> HeadPass:
    """:func:`chunk_statistics` of every row of ``hidden [N, H]``, one chunk of logits at a time; with ``token_grad``
    also ``∂L/∂h`` and ``∂L/∂W`` (those ``grads_for`` asks for) of the announced loss."""
    num, dtype = hidden.shape[0], statistics_dtype(weight.dtype)
    out = HeadPass(logp=hidden.new_empty(num, dtype=dtype), lse=hidden.new_empty(num, dtype=dtype),
                   entropy=hidden.new_empty(num, dtype=dtype) if with_entropy else None,
                   topk_logp=None if topk_ids is None else hidden.new_empty(topk_ids.shape, dtype=dtype))
    if token_grad is not None:
        out.grad_logp = hidden.new_zeros(num, dtype=dtype)
        out.grad_hidden = torch.zeros_like(hidden) if grads_for[0] else None
        out.grad_weight = torch.zeros_like(weight, dtype=dtype) if grads_for[1] else None
    for part in row_slices(num, rows_per_chunk(weight.shape[0], chunk_size)):
        _forward_chunk(out, part, hidden, weight, ids, topk_ids, temperature, with_entropy, token_grad)
    return out


def _forward_chunk(out: HeadPass, part: slice, hidden, weight, ids, topk_ids, temperature, with_entropy,
                   token_grad) -> None:
    """One chunk of :func:`head_forward`, written into ``out`` (its logits are freed on return)."""
    z = chunk_logits(hidden[part], weight, temperature)
    chunk_topk = None if topk_ids is None else topk_ids[part]
    out.lse[part], out.logp[part], topk, entropy = chunk_statistics(z, ids[part], chunk_topk, with_entropy)
    if with_entropy:
        out.entropy[part] = entropy
    if topk is not None:
        out.topk_logp[part] = topk
    if token_grad is not None:
        grad = out.grad_logp[part] = token_grad(part, out.logp[part], topk)
        dz = chunk_logit_grad(z, out.lse[part], ids[part], grad, temperature)
        rows_grad = accumulate_grads(dz, hidden[part], weight, out.grad_hidden, out.grad_weight)
        if rows_grad is not None:
            out.grad_hidden[part] = rows_grad


def row_slices(num_rows: int, rows: int) -> list[slice]:
    """``0 .. num_rows`` in slices of ``rows``."""
    return [slice(start, min(start + rows, num_rows)) for start in range(0, num_rows, rows)]


@torch.no_grad()
def head_grads(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor,
               grad_logp: torch.Tensor, *, temperature: float, chunk_size: int | None = None,
               grads_for: tuple[bool, bool] = (True, True)) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(∂L/∂h [N, H], ∂L/∂W [V, H])`` from ``g = ∂L/∂ log π(a_t)`` (module docstring), recomputing the logits chunk
    by chunk over the rows with ``g ≠ 0``; ``∂L/∂W`` accumulates in fp32 and is returned in the weight's dtype."""
    grad_hidden = torch.zeros_like(hidden) if grads_for[0] else None
    grad_weight = torch.zeros_like(weight, dtype=statistics_dtype(weight.dtype)) if grads_for[1] else None
    for rows in grad_logp.nonzero().squeeze(-1).split(rows_per_chunk(weight.shape[0], chunk_size)):
        _backward_chunk(rows, hidden, weight, ids, lse, grad_logp, temperature, grad_hidden, grad_weight)
    return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype)


def _backward_chunk(rows: torch.Tensor, hidden, weight, ids, lse, grad_logp, temperature, grad_hidden,
                    grad_weight) -> None:
    """One chunk of :func:`head_grads` (its logits are freed on return)."""
    rows_hidden = hidden[rows]
    z = chunk_logits(rows_hidden, weight, temperature)
    dz = chunk_logit_grad(z, lse[rows], ids[rows], grad_logp[rows], temperature)
    rows_grad = accumulate_grads(dz, rows_hidden, weight, grad_hidden, grad_weight)
    if rows_grad is not None:
        grad_hidden[rows] = rows_grad


def announced_scale(grad_logp: torch.Tensor, announced: torch.Tensor) -> float | None:
    """The factor ``s`` with ``grad_logp = s · announced`` (the loss backpropagated is the announced one, scaled),
    or None when there is none (another loss, or a non-finite announcement)."""
    if not bool(torch.isfinite(announced).all()):
        return None
    largest = announced.abs().argmax()
    if not bool(grad_logp.any()):
        return 0.0
    if announced[largest] == 0:
        return None
    scale = grad_logp[largest].to(announced.dtype) / announced[largest]
    tolerance = ANNOUNCED_RTOL * grad_logp.abs().max().to(announced.dtype)
    return float(scale) if bool(((grad_logp - scale * announced).abs() <= tolerance).all()) else None


class _FusedHeadLogprobs(torch.autograd.Function):
    """``log π(a_t)`` (differentiable) plus entropy and top-K log-probs (constants) from hidden states and the head
    weight. Backward: the forward's gradients of the announced loss, scaled (:func:`announced_scale`), else
    :func:`head_grads`."""

    @staticmethod
    def forward(ctx, hidden, weight, ids, topk_ids, temperature, chunk_size, with_entropy, token_grad):
        grads_for = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        out = head_forward(hidden, weight, ids, temperature=temperature, topk_ids=topk_ids, with_entropy=with_entropy,
                           chunk_size=chunk_size, token_grad=token_grad, grads_for=grads_for)
        ctx.save_for_backward(hidden, weight, ids, out.lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.autocast = autocast_state(hidden.device.type)
        # only the announced gradients: an output kept on ctx would make a reference cycle through its grad_fn
        ctx.announced = None if out.grad_logp is None else (out.grad_logp, out.grad_hidden, out.grad_weight)
        empty = out.logp.new_empty(0)
        entropy = out.entropy if out.entropy is not None else empty
        topk = out.topk_logp if out.topk_logp is not None else empty
        ctx.mark_non_differentiable(entropy, topk)
        ctx.set_materialize_grads(False)
        return out.logp, entropy, topk

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy, _grad_topk):
        announced, ctx.announced = ctx.announced, None  # used once: a second backward recomputes
        if grad_logp is None:
            return (None,) * 8
        scale = None if announced is None else announced_scale(grad_logp, announced[0])
        if scale is not None:
            grad_hidden, grad_weight = _scaled(announced[1], scale), _scaled(announced[2], scale)
            if grad_weight is not None:
                grad_weight = grad_weight.to(ctx.saved_tensors[1].dtype)
        else:
            hidden, weight, ids, lse = ctx.saved_tensors
            with autocast_like(ctx.autocast):  # the logits of the forward, again
                grad_hidden, grad_weight = head_grads(hidden, weight, ids, lse, grad_logp, temperature=ctx.temperature,
                                                      chunk_size=ctx.chunk_size,
                                                      grads_for=tuple(ctx.needs_input_grad[:2]))
        return grad_hidden, grad_weight, None, None, None, None, None, None


AutocastState = Tuple[str, bool, Optional[torch.dtype]]
"""``(device type, enabled, dtype)`` of an autocast (dtype None when it is off)."""


def autocast_state(device_type: str) -> AutocastState:
    """The autocast in force on ``device_type``: the backward recomputes the forward's logits under the same one,
    whatever autocast (usually none) the backward pass itself runs under."""
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return device_type, False, None
    return device_type, True, torch.get_autocast_dtype(device_type)


def autocast_like(state: AutocastState) -> contextlib.AbstractContextManager:
    """A context with the autocast ``state``: on, to its dtype; off (where autocast is on now); else nothing."""
    device_type, enabled, dtype = state
    if enabled:
        return torch.autocast(device_type, dtype=dtype)
    if autocast_state(device_type)[1]:
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _scaled(grad: torch.Tensor | None, scale: float) -> torch.Tensor | None:
    return None if grad is None else (grad if scale == 1.0 else grad.mul_(scale))


def fused_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                        topk_ids: torch.Tensor | None = None, with_entropy: bool = True,
                        chunk_size: int | None = None, token_grad: TokenGrad | None = None):
    """``(log π(a_t), entropy, log π on topk_ids)`` of ``softmax(W h / T)``, fp32, shaped like ``ids`` (top-K: like
    ``topk_ids``), without the ``[N, V]`` logits. Only ``log π(a_t)`` carries gradient (to ``hidden [..., H]`` and
    ``weight [V, H]``); entropy and top-K log-probs are constants (None when not asked for). ``token_grad`` announces
    the loss (rows index the flattened ``ids``), whose gradients are then computed in this forward pass. ``T`` > 0
    (:class:`~dppo_oat.spec.UpdateSettings` checks the learner's)."""
    rows = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
    flat_ids = ids.reshape(-1)
    flat_topk = None if topk_ids is None else topk_ids.reshape(-1, topk_ids.shape[-1])
    if rows.shape[0] != flat_ids.shape[0]:
        raise ValueError(f"hidden states have {rows.shape[0]} rows but ids have {flat_ids.shape[0]}")
    differentiable = torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad)
    logp, entropy, topk = _FusedHeadLogprobs.apply(rows, weight, flat_ids, flat_topk, float(temperature), chunk_size,
                                                   with_entropy, token_grad if differentiable else None)
    return (logp.reshape(ids.shape), entropy.reshape(ids.shape) if with_entropy else None,
            None if topk_ids is None else topk.reshape(topk_ids.shape))


# --------------------------------------------------------------------------------------------- the model's head


def causal_lm_of(model):
    """The module that owns the LM head: ``model`` itself, or the one a wrapper holds (a DeepSpeed engine's or
    DDP's ``module``, oat's ``LLM.model``)."""
    current = model
    for _ in range(4):
        if callable(getattr(current, "get_output_embeddings", None)):
            return current
        current = getattr(current, "module", None) or getattr(current, "model", None)
        if current is None:
            break
    raise FusedHeadUnsupported(f"{type(model).__name__} has no get_output_embeddings(): not a causal LM")


def head_of(model) -> torch.nn.Linear:
    """The LM head of ``model`` when the fused path computes exactly what it does: a bias-free linear map of the last
    hidden states (no logit soft-capping or scaling) whose weight is not partitioned by ZeRO-3."""
    owner = causal_lm_of(model)
    head = owner.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise FusedHeadUnsupported(f"the LM head ({type(head).__name__}) is not a bias-free nn.Linear")
    config = getattr(owner, "config", None)
    for attribute in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, attribute, None) not in (None, 1, 1.0):
            raise FusedHeadUnsupported(f"the model post-processes its logits ({attribute})")
    if hasattr(head.weight, "ds_id"):
        raise FusedHeadUnsupported("DeepSpeed ZeRO-3 partitions the LM head's weight outside its forward")
    return head


@contextlib.contextmanager
def head_bypassed(model):
    """Within the block, ``model(...)`` returns the last hidden states where it returns logits: the LM head is an
    identity (the model's own forward runs otherwise unchanged, wrappers included)."""
    owner = causal_lm_of(model)
    head = owner.get_output_embeddings()
    owner.set_output_embeddings(torch.nn.Identity())
    try:
        yield head
    finally:
        owner.set_output_embeddings(head)


def last_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L, H]`` hidden states the LM head of ``model`` would read, by the model's own forward."""
    with head_bypassed(model):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
