"""π_θ's log-probs, and their gradients, straight from the last hidden states: the LM head is applied chunk by chunk
and the ``[N, V]`` logits are never held.

Every quantity of the update is per token: π_θ(a_t|s_t), π_θ on the top-K set (sec:method_topk), the entropy metric,
and the loss of eq:unified_grad, whose gradient reaches the logits only through log π_θ(a_t|s_t) (the mask M_t and
the IS weight min(r_t, C) are constants of the gradient). With ``z_t = W h_t / T`` (head weight ``W [V, H]``,
temperature T) and ``g_t = ∂L/∂ log π_θ(a_t|s_t)``::

    ∂L/∂z_t = g_t · (e_{a_t} − softmax(z_t)),   ∂L/∂h_t = Wᵀ ∂L/∂z_t / T,   ∂L/∂W = Σ_t ∂L/∂z_t h_tᵀ / T

The forward pass goes over the tokens, a chunk of rows at a time: each chunk's logits give log π_θ(a_t), the
log-normaliser, the top-K log-probs and the entropy, and only those O(N · K) numbers are kept. The backward pass goes
over the vocabulary, a chunk of the head's rows at a time, for the tokens whose ``g_t`` is not zero only (a prompt
token, or one the trust region blocks, costs no backward): a chunk's logits again, from the saved log-normalisers
its ``∂L/∂z``, then its slice of ``∂L/∂W``, written once by one product over all the tokens (no ``[V, H]``
accumulator: the head's gradient is as exact, and as large, as the logits path's), and its share of ``∂L/∂h``,
summed in fp32 over the chunks (``[N, H]``). A chunk holds about :data:`CHUNK_ELEMENTS` fp32 logits in either pass
(220 token rows at V = 151,936; at 16,384 tokens, 2,040 vocabulary rows), and a backward chunk at most as many
weights (:func:`vocab_rows_per_chunk`).

Under ``torch.autocast`` the head's product ``W h`` runs in the autocast dtype, as the model's own head would (the
rollout samples from those logits), in the backward pass too; the statistics are fp32, and the gradients' products
run in the weight's dtype (:func:`vocab_chunk_grads`). The head's gradient reaches the weight through ordinary
autograd: a tied head adds it to the embedding's gradient, and DeepSpeed ZeRO-1/2 reduce it as any other gradient.
ZeRO-3 partitions the weight outside its module's forward: there :func:`head_of` refuses, and the learner keeps the
logits path (``lm_head="logits"``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK_ELEMENTS = 1 << 25
"""fp32 logits per chunk (128 MiB): ``CHUNK_ELEMENTS // V`` token rows in the forward pass, ``CHUNK_ELEMENTS // N``
vocabulary rows in the backward pass (and at most ``CHUNK_ELEMENTS // H``: as many weights)."""


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


def vocab_rows_per_chunk(tokens: int, vocab: int, width: int, chunk_size: int | None = None) -> int:
    """Vocabulary rows per backward chunk over ``tokens`` token rows of a head of ``width`` columns: as many logits as
    a forward chunk of :func:`rows_per_chunk` token rows holds, and no more than :data:`CHUNK_ELEMENTS` weights (a
    chunk of the weight is cast whole under autocast, and few tokens would otherwise make it the whole head)."""
    rows = max(1, rows_per_chunk(vocab, chunk_size) * vocab // max(1, tokens))
    return min(rows, max(1, CHUNK_ELEMENTS // width))


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``z = W h / T`` in fp32 (fp64 stays fp64) for rows ``hidden [c, H]`` (``weight``: the head's rows, all of them
    or a chunk's); the matmul runs in the weight's dtype, as the model's own head does."""
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
                     temperature: float, first_id: int = 0) -> torch.Tensor:
    """``∂L/∂(W h) = g · (e_a − softmax(z)) / T`` on the vocabulary rows ``first_id …`` that ``z [c, v]`` holds (a
    token whose ``a_t`` lies outside them gets only the softmax's term), computed in place of ``z``."""
    scale = (grad_logp.to(z.dtype) / temperature).unsqueeze(-1)
    dz = z.sub_(lse.unsqueeze(-1)).exp_().mul_(-scale)
    local = ids - first_id
    inside = ((local >= 0) & (local < z.shape[1])).unsqueeze(-1)
    return dz.scatter_add_(-1, local.clamp(0, z.shape[1] - 1).unsqueeze(-1), scale * inside)


# --------------------------------------------------------------------------------------------- all rows


@dataclass
class HeadPass:
    """What the forward pass keeps, per token row: fp32 ``[N]`` (``topk_logp``: ``[N, K']``)."""

    logp: torch.Tensor
    lse: torch.Tensor
    entropy: torch.Tensor | None = None
    topk_logp: torch.Tensor | None = None


@torch.no_grad()
def head_forward(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                 topk_ids: torch.Tensor | None = None, with_entropy: bool = True,
                 chunk_size: int | None = None) -> HeadPass:
    """:func:`chunk_statistics` of every row of ``hidden [N, H]``, one chunk of token rows' logits at a time."""
    num, dtype = hidden.shape[0], statistics_dtype(weight.dtype)
    out = HeadPass(logp=hidden.new_empty(num, dtype=dtype), lse=hidden.new_empty(num, dtype=dtype),
                   entropy=hidden.new_empty(num, dtype=dtype) if with_entropy else None,
                   topk_logp=None if topk_ids is None else hidden.new_empty(topk_ids.shape, dtype=dtype))
    for part in row_slices(num, rows_per_chunk(weight.shape[0], chunk_size)):
        z = chunk_logits(hidden[part], weight, temperature)
        chunk_topk = None if topk_ids is None else topk_ids[part]
        out.lse[part], out.logp[part], topk, entropy = chunk_statistics(z, ids[part], chunk_topk, with_entropy)
        if with_entropy:
            out.entropy[part] = entropy
        if topk is not None:
            out.topk_logp[part] = topk
    return out


def row_slices(num_rows: int, rows: int) -> list[slice]:
    """``0 .. num_rows`` in slices of ``rows``."""
    return [slice(start, min(start + rows, num_rows)) for start in range(0, num_rows, rows)]


@dataclass
class ActiveRows:
    """The token rows the backward computes gradients for (``g ≠ 0``): their hidden states in the weight's dtype,
    the same as the head's product reads them (cast once under autocast, where the product would cast them at every
    chunk), and their ids, log-normalisers and ``g``."""

    hidden: torch.Tensor
    logits_input: torch.Tensor
    ids: torch.Tensor
    lse: torch.Tensor
    grad_logp: torch.Tensor


@torch.no_grad()
def head_grads(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor,
               grad_logp: torch.Tensor, *, temperature: float, chunk_size: int | None = None,
               grads_for: tuple[bool, bool] = (True, True)) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(∂L/∂h [N, H], ∂L/∂W [V, H])`` from ``g = ∂L/∂ log π(a_t)`` (module docstring), recomputing the logits of
    the rows with ``g ≠ 0``, one chunk of vocabulary rows at a time (:func:`vocab_chunk_grads`)."""
    rows = grad_logp.nonzero().squeeze(-1)
    every_row = len(rows) == hidden.shape[0]
    grad_rows = torch.zeros((len(rows), hidden.shape[1]), dtype=statistics_dtype(weight.dtype),
                            device=hidden.device) if grads_for[0] else None
    grad_weight = (torch.empty_like(weight) if len(rows) else torch.zeros_like(weight)) if grads_for[1] else None
    if len(rows):  # every vocabulary row of the head's gradient is written once
        active = active_rows(hidden, weight, ids, lse, grad_logp, None if every_row else rows)
        step = vocab_rows_per_chunk(len(rows), *weight.shape, chunk_size)
        for part in row_slices(weight.shape[0], step):
            vocab_chunk_grads(part, active, weight, temperature, grad_rows, grad_weight)
        del active
    return scattered(grad_rows, rows, hidden, every_row), grad_weight


def active_rows(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor,
                grad_logp: torch.Tensor, rows: torch.Tensor | None) -> ActiveRows:
    """:class:`ActiveRows` of ``rows`` (None: every row, with no copy)."""
    pick = (lambda tensor: tensor) if rows is None else (lambda tensor: tensor[rows])
    active = pick(hidden).to(weight.dtype)
    kind = active.device.type
    cast = torch.is_autocast_enabled(kind) and active.dtype == torch.float32
    return ActiveRows(active, active.to(torch.get_autocast_dtype(kind)) if cast else active, pick(ids), pick(lse),
                      pick(grad_logp))


def scattered(grad_rows: torch.Tensor | None, rows: torch.Tensor, hidden: torch.Tensor,
              every_row: bool) -> torch.Tensor | None:
    """``∂L/∂h`` shaped and typed like ``hidden``: the active rows' gradients in their rows, zeros elsewhere."""
    if grad_rows is None:
        return None
    if every_row:
        return grad_rows.to(hidden.dtype)
    grad_hidden = torch.zeros_like(hidden)
    grad_hidden[rows] = grad_rows.to(hidden.dtype)
    return grad_hidden


def vocab_chunk_grads(part: slice, rows: ActiveRows, weight: torch.Tensor, temperature: float,
                      grad_hidden: torch.Tensor | None, grad_weight: torch.Tensor | None) -> None:
    """The vocabulary rows ``part``'s share of the gradients (its logits are freed before the products): their slice
    of ``∂L/∂W = dzᵀ h`` written in place, and ``∂L/∂h += dz W[part]``, summed in fp32 (each chunk's product is
    rounded to the weight's dtype first). The two products run in the weight's dtype even under autocast: ``dz`` of
    a token is ``g_t`` times probabilities (down to 1e-7 and below at a large V), which float16 would flush to zero
    before any loss scale could lift them."""
    z = chunk_logits(rows.logits_input, weight[part], temperature)
    dz = chunk_logit_grad(z, rows.lse, rows.ids, rows.grad_logp, temperature, first_id=part.start)
    del z
    with autocast_like((dz.device.type, False, None)):
        dz = dz.to(weight.dtype)
        if grad_weight is not None:
            torch.mm(dz.T, rows.hidden, out=grad_weight[part])
        if grad_hidden is not None and grad_hidden.dtype == weight.dtype:
            grad_hidden.addmm_(dz, weight[part])
        elif grad_hidden is not None:
            grad_hidden.add_(dz @ weight[part])


class _FusedHeadLogprobs(torch.autograd.Function):
    """``log π(a_t)`` (differentiable) plus entropy and top-K log-probs (constants) from hidden states and the head
    weight; the backward is :func:`head_grads`, under the forward's autocast."""

    @staticmethod
    def forward(ctx, hidden, weight, ids, topk_ids, temperature, chunk_size, with_entropy):
        out = head_forward(hidden, weight, ids, temperature=temperature, topk_ids=topk_ids, with_entropy=with_entropy,
                           chunk_size=chunk_size)
        ctx.save_for_backward(hidden, weight, ids, out.lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.autocast = autocast_state(hidden.device.type)
        empty = out.logp.new_empty(0)
        entropy = out.entropy if out.entropy is not None else empty
        topk = out.topk_logp if out.topk_logp is not None else empty
        ctx.mark_non_differentiable(entropy, topk)
        ctx.set_materialize_grads(False)
        return out.logp, entropy, topk

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy, _grad_topk):
        if grad_logp is None:
            return (None,) * 7
        hidden, weight, ids, lse = ctx.saved_tensors
        with autocast_like(ctx.autocast):  # the logits of the forward, again
            grad_hidden, grad_weight = head_grads(hidden, weight, ids, lse, grad_logp, temperature=ctx.temperature,
                                                  chunk_size=ctx.chunk_size, grads_for=tuple(ctx.needs_input_grad[:2]))
        return grad_hidden, grad_weight, None, None, None, None, None


AutocastState = tuple[str, bool, torch.dtype | None]
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


def fused_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                        topk_ids: torch.Tensor | None = None, with_entropy: bool = True,
                        chunk_size: int | None = None):
    """``(log π(a_t), entropy, log π on topk_ids)`` of ``softmax(W h / T)``, fp32, shaped like ``ids`` (top-K: like
    ``topk_ids``), without the ``[N, V]`` logits. Only ``log π(a_t)`` carries gradient (to ``hidden [..., H]`` and
    ``weight [V, H]``); entropy and top-K log-probs are constants (None when not asked for). ``chunk_size``: token
    rows per forward chunk (default: :data:`CHUNK_ELEMENTS` logits), and as many logits per backward chunk. ``T`` > 0
    (:class:`~dppo_oat.settings.spec.UpdateSettings` checks the learner's)."""
    rows = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
    flat_ids = ids.reshape(-1)
    flat_topk = None if topk_ids is None else topk_ids.reshape(-1, topk_ids.shape[-1])
    if rows.shape[0] != flat_ids.shape[0]:
        raise ValueError(f"hidden states have {rows.shape[0]} rows but ids have {flat_ids.shape[0]}")
    logp, entropy, topk = _FusedHeadLogprobs.apply(rows, weight, flat_ids, flat_topk, float(temperature), chunk_size,
                                                   with_entropy)
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
