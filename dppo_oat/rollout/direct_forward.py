"""A decoder-only model's forward on a preallocated KV buffer, without the model's top-level wrapper.

Each ``model(...)`` call of Hugging Face builds a 4D mask from the 2D one, appends every layer's new keys and values
to its ``DynamicCache`` with a ``torch.cat`` (a copy of the whole past, per layer and per token) and wraps the
result in output dataclasses. A rollout turn of a compact game samples about eight tokens, one forward each, on
batches of a few to 64 rows, so that bookkeeping is a quarter of a decode step. As vLLM runs its own model executor
over a preallocated KV cache, :func:`direct_forward` runs the model's *own modules* (token embedding, rotary
embedding, decoder layers, final norm, LM head) on a :class:`KVBuffer`: every layer writes its new keys and values
in place into tensors sized for the whole call, and the mask is built once per forward from the buffer's valid
columns. The decoder layers, and with them all the attention and MLP arithmetic, are the model's; what this module
replaces is the wrapper around them. :func:`runs_direct` checks on a small batch, once per model, that the result
is the model's own forward (a model whose wrapper does more, e.g. caps its logits after the head, fails the check
and is sampled with ``generate``; Gemma's scaled embeddings pass, as its embedding module scales them itself).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch

MATCH_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
"""Largest relative logit difference :func:`runs_direct` accepts per parameter dtype (others: 2e-2, half precision)."""


class KVBuffer:
    """Keys and values of a batch in tensors ``[B, H, capacity, D]`` per layer, filled from the left: columns
    ``[0, width)`` hold the tokens seen so far, and ``valid [B, capacity]`` marks which of them a row attends to
    (False for left padding). The decoder layers call :meth:`update` as they would a Hugging Face cache."""

    def __init__(self, batch: int, capacity: int, device: torch.device):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.valid = torch.zeros((batch, capacity), dtype=torch.bool, device=device)
        self.width = 0
        self._is_view = False
        self.write_column: torch.Tensor | None = None
        """Set by :func:`decode_forward`: the one column (a one-element device tensor) a layer's new keys and values
        go to, and :meth:`update` then returns every column (static shapes, for a CUDA graph)."""

    @classmethod
    def allocate(cls, batch: int, capacity: int, keys: Sequence[torch.Tensor],
                 values: Sequence[torch.Tensor] | None = None) -> KVBuffer:
        """An empty buffer whose layer ``l`` has the heads, head size and dtype of ``keys[l]`` and ``values[l]``
        (``[·, H, ·, D]``; ``values`` default to ``keys``). Under autocast the two differ: a layer that normalises its
        keys hands them back in fp32, its values in the autocast dtype."""
        buffer = cls(batch, capacity, keys[0].device)
        for keys_like, values_like in zip(keys, keys if values is None else values, strict=True):
            buffer.keys.append(buffer._columns_like(keys_like))
            buffer.values.append(buffer._columns_like(values_like))
        return buffer

    @classmethod
    def from_past(cls, past: Sequence[tuple[torch.Tensor, torch.Tensor]], past_mask: torch.Tensor,
                  capacity: int) -> KVBuffer:
        """A buffer whose first columns are ``past`` (per layer ``(keys, values)`` of ``[B, H, R, D]``), valid where
        ``past_mask [B, R]`` is, with room for ``capacity`` columns in all."""
        buffer = cls.allocate(past_mask.shape[0], capacity, [keys for keys, _ in past],
                              [values for _, values in past]) if past else cls(
            past_mask.shape[0], capacity, past_mask.device)
        buffer.fill(past, past_mask)
        return buffer

    def fill(self, past: Sequence[tuple[torch.Tensor, torch.Tensor]], past_mask: torch.Tensor) -> None:
        """Write ``past`` (per layer ``[B, H, R, D]``, valid where ``past_mask [B, R]`` is) into the first ``R``
        columns of this empty buffer."""
        width = past_mask.shape[1]
        for layer, (keys, values) in enumerate(past):
            self.keys[layer][:, :, :width] = keys
            self.values[layer][:, :, :width] = values
        self.valid[:, :width] = past_mask.bool()
        self.width = width

    def rows(self, start: int, stop: int, first_column: int) -> KVBuffer:
        """An empty buffer on rows ``[start, stop)`` and columns ``first_column …`` of this one (views: what it is
        filled with lands here). The columns before ``first_column`` become zeros, masked, so that batches of
        different widths end together, right-aligned, and decode as one."""
        view = KVBuffer.__new__(KVBuffer)
        view.keys, view.values, view.write_column = [], [], None
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[start:stop, :, :first_column] = 0
            values[start:stop, :, :first_column] = 0
            view.keys.append(keys[start:stop, :, first_column:])
            view.values.append(values[start:stop, :, first_column:])
        self.valid[start:stop, :first_column] = False
        view.valid, view.width, view._is_view = self.valid[start:stop, first_column:], 0, True
        return view

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def _columns_like(self, tensor: torch.Tensor) -> torch.Tensor:
        """Uninitialised ``[B, H, capacity, D]`` storage for a layer whose keys look like ``tensor`` (a column is
        written before :meth:`update` first returns it)."""
        return tensor.new_empty((self.valid.shape[0], tensor.shape[1], self.capacity, tensor.shape[3]))

    def filled(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(keys, values)`` of the filled columns (views)."""
        return [(keys[:, :, : self.width], values[:, :, : self.width])
                for keys, values in zip(self.keys, self.values, strict=True)]

    def reserve(self, columns: int) -> None:
        """Make room for ``columns`` more tokens (a copy into larger tensors, only when the room runs out)."""
        if self.width + columns <= self.capacity:
            return
        if self._is_view:
            raise RuntimeError("a view of a KVBuffer's rows cannot grow: allocate the buffer with room for them")
        capacity = max(self.width + columns, 2 * self.capacity)
        grown = KVBuffer.from_past(self.filled(), self.valid[:, : self.width], capacity)
        self.keys, self.values, self.valid = grown.keys, grown.values, grown.valid

    def zero_room(self) -> None:
        """Zero the columns after the filled ones (their storage is uninitialised until written, and may hold
        non-finite values), for :func:`decode_forward`, which reads them masked."""
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[:, :, self.width :].zero_()
            values[:, :, self.width :].zero_()

    def repeat_rows(self, batch: int, capacity: int) -> KVBuffer:
        """A buffer of ``batch`` rows, each a copy of this one-row buffer's filled columns."""
        past = [(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1)) for keys, values in self.filled()]
        return KVBuffer.from_past(past, self.valid[:, : self.width].expand(batch, -1), capacity)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write a layer's new keys and values after the filled columns; return the layer's keys and values up to
        them (the Hugging Face cache interface, whose further arguments differ between versions and are not needed
        here; the width moves on in :func:`direct_forward`, after every layer)."""
        if layer_idx == len(self.keys):
            self.keys.append(self._columns_like(keys))
            self.values.append(self._columns_like(values))
        if self.write_column is not None:  # decode_forward: one token, written where the column tensor says
            self.keys[layer_idx].index_copy_(2, self.write_column, keys)
            self.values[layer_idx].index_copy_(2, self.write_column, values)
            return self.keys[layer_idx], self.values[layer_idx]
        end = self.width + keys.shape[2]
        self.keys[layer_idx][:, :, self.width : end] = keys
        self.values[layer_idx][:, :, self.width : end] = values
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]


def model_device(model) -> torch.device:
    """The device of ``model``'s parameters: where its KV buffer and every input of :func:`direct_forward` live."""
    return next(model.parameters()).device


def causal_mask(valid: torch.Tensor, start: int) -> torch.Tensor:
    """The boolean mask ``[B, 1, S, K]`` of ``S`` new tokens at columns ``start …`` over keys ``valid [B, K]``: a
    query sees the valid keys up to its own column, and always itself (so that a padding query has a key, and no
    row of the softmax is empty; padding is never a key of a real token)."""
    new = valid.shape[1] - start
    query_columns = start + torch.arange(new, device=valid.device)[:, None]
    key_columns = torch.arange(valid.shape[1], device=valid.device)[None, :]
    allowed = valid[:, None, :] & (key_columns <= query_columns)[None]
    return (allowed | (key_columns == query_columns)[None])[:, None]


def direct_forward(model, buffer: KVBuffer, input_ids: torch.Tensor, positions: torch.Tensor,
                   valid: torch.Tensor) -> torch.Tensor:
    """The next-token logits ``[B, V]`` (last position) of ``input_ids [B, S]`` at ``positions [B, S]`` after the
    buffer's columns; their keys and values join the buffer, valid where ``valid [B, S]`` is."""
    new = input_ids.shape[1]
    buffer.reserve(new)
    start = buffer.width
    buffer.valid[:, start : start + new] = valid
    logits = last_logits(model, buffer, input_ids, positions, causal_mask(buffer.valid[:, : start + new], start))
    buffer.width = start + new
    return logits


def last_logits(model, buffer: KVBuffer, input_ids: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
    """The model's own modules on ``input_ids`` under the boolean attention ``mask`` (``[B, 1, S, K]``), every
    layer's keys and values going to ``buffer``: the next-token logits ``[B, V]`` of the last position (only it goes
    through the LM head)."""
    body = model.model
    hidden = body.embed_tokens(input_ids)
    position_embeddings = body.rotary_emb(hidden, positions)
    for layer in body.layers:
        hidden = layer(hidden, attention_mask=mask, position_ids=positions, use_cache=True,
                       position_embeddings=position_embeddings, **{cache_keyword(type(layer)): buffer})
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return model.lm_head(body.norm(hidden[:, -1:]))[:, -1]


def decode_forward(model, buffer: KVBuffer, input_ids: torch.Tensor, positions: torch.Tensor,
                   column: torch.Tensor) -> torch.Tensor:
    """:func:`direct_forward` for one new token per row (``input_ids``, ``positions`` ``[B, 1]``) written at the
    buffer's ``column`` (a one-element device tensor) and attending over the buffer's whole capacity, the columns
    after ``column`` masked: every shape and every host-side value is the same from one step to the next, so the call
    can be captured once in a CUDA graph and replayed with new inputs (:mod:`dppo_oat.rollout.cuda_graphs`). The
    columns not yet written must hold finite values (:meth:`KVBuffer.zero_room`): a masked key still enters the
    products with weight 0. The caller moves ``buffer.width`` on."""
    buffer.valid.index_fill_(1, column, True)
    key_columns = torch.arange(buffer.capacity, device=column.device)
    mask = (buffer.valid & (key_columns <= column))[:, None, None, :]
    buffer.write_column = column
    try:
        return last_logits(model, buffer, input_ids, positions, mask)
    finally:
        buffer.write_column = None


@functools.cache
def cache_keyword(layer_class: type) -> str:
    """The name under which a decoder layer takes its KV cache: ``cache`` from transformers 5.24 on (where
    ``past_key_values`` still works, through a deprecation wrapper on every call), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(layer_class.forward).parameters else "past_key_values"


def _has_plain_structure(model) -> bool:
    """The modules :func:`direct_forward` calls, SDPA attention, and full attention in every layer (a sliding
    window or attention chunks would need their own masks)."""
    body, config = getattr(model, "model", None), getattr(model, "config", None)
    if body is None or config is None or not hasattr(model, "lm_head"):
        return False
    if not all(hasattr(body, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        full_attention = all(kind == "full_attention" for kind in layer_types)
    else:
        full_attention = getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window",
                                                                                       True)
    return (full_attention and not getattr(config, "attention_chunk_size", None)
            and getattr(config, "_attn_implementation", None) == "sdpa")


@torch.inference_mode()
def runs_direct(model) -> bool:
    """Whether :func:`direct_forward` computes ``model``'s own forward: the plain structure, and the same next-token
    logits as ``model(...)`` on two left-padded rows, prefilled in two calls (a past, then the rest). A layer that
    refuses the call (another library version's signature) counts as a no."""
    if not _has_plain_structure(model):
        return False
    device, vocab = model_device(model), model.config.vocab_size
    input_ids = (torch.arange(12, device=device).view(2, 6) * 7 + 3) % vocab
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    expected = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits[:, -1]
    buffer = KVBuffer(2, 6, device)
    try:
        direct_forward(model, buffer, input_ids[:, :3], positions[:, :3], attention_mask[:, :3].bool())
        logits = direct_forward(model, buffer, input_ids[:, 3:], positions[:, 3:], attention_mask[:, 3:].bool())
    except (TypeError, ValueError, RuntimeError, AttributeError, IndexError):
        return False
    tolerance = MATCH_TOLERANCE.get(logits.dtype, 2e-2)
    scale = float(expected.abs().max()) + 1.0
    return bool((logits.float() - expected.float()).abs().max() <= tolerance * scale)
