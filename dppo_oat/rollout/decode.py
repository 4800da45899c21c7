"""The HF generator's own sampling loop over a Hugging Face causal LM with its KV cache: its fast path.

``model.generate`` spends a good part of each step of a small model on machinery a rollout does not use (logits
processors, stopping criteria, score bookkeeping). For untruncated sampling at a temperature > 0 — every training
rollout — the loop below does only what the rollout needs: one forward per token (:func:`direct_forward`, the
model's own layers on a preallocated :class:`KVBuffer`), ``log_softmax`` of ``logits / temperature`` (μ exactly,
the distribution the token is drawn from), one draw by inverting its cumulative sum (:func:`inverse_cdf_sample`,
cheaper than ``torch.multinomial``), and log μ(a_t); when asked, μ's whole log-probs, from which the generator takes
``TopK(μ, K) ∪ {a_t}``. Left-padded prompts get position ids from their attention mask, as ``generate`` gives them;
rows that have stopped receive the pad token.

The prefill spares two kinds of work, as vLLM's does: the tokens every prompt of the batch starts with (a chat
template's system prompt, a game's header) go through the model once and their keys and values are copied to every
row (:func:`shared_prefix_length`), and only the last position, the one sampled from, goes through the LM head.
Across calls, :func:`prefill_after_past` starts each row after a past of its own (the cached prefix of
:mod:`dppo_oat.rollout.prefix_cache`); batches of rows prefilled apart (length buckets) share one buffer, each in
its own rows, and decode together. Every function here needs a model that
:func:`~dppo_oat.rollout.direct_forward.runs_direct` accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from dppo_oat.rollout.direct_forward import KVBuffer, decode_forward, direct_forward, model_device


class DecodeStep(Protocol):
    """One decode step: ``(token_ids [B, 1], positions [B, 1]) -> next-token logits [B, V]``, the tokens' keys and
    values appended to the batch's buffer (its ``width`` moves on by one)."""

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def finish(self) -> None:
        """Called once after the last step: the keys and values of the buffer's filled columns are then in the
        buffer (a step that computed them elsewhere, in a CUDA graph's own buffer, copies them back)."""


class EagerStep:
    """A decode step as :func:`direct_forward` runs it: attention over the columns filled so far."""

    def __init__(self, model, buffer: KVBuffer):
        self.model, self.buffer = model, buffer
        self.valid: torch.Tensor | None = None

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.valid is None:
            self.valid = torch.ones_like(token_ids, dtype=torch.bool)
        return direct_forward(self.model, self.buffer, token_ids, positions, self.valid)

    def finish(self) -> None:
        """Nothing to copy: every step wrote into the buffer."""


class StaticStep:
    """A decode step as :func:`decode_forward` runs it: the same shapes at every step (attention over the buffer's
    whole capacity), the column given by a device tensor; the form a CUDA graph captures."""

    def __init__(self, model, buffer: KVBuffer):
        self.model, self.buffer = model, buffer
        buffer.zero_room()
        self.column = torch.zeros(1, dtype=torch.long, device=buffer.valid.device)

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.point_at_next_column()
        logits = decode_forward(self.model, self.buffer, token_ids, positions, self.column)
        self.buffer.width += 1
        return logits

    def point_at_next_column(self) -> None:
        """Set the column tensor to the buffer's next free column (no host synchronisation)."""
        if self.buffer.width >= self.buffer.capacity:
            raise RuntimeError("the KV buffer is full: allocate it with room for every token to sample")
        self.column.fill_(self.buffer.width)

    def finish(self) -> None:
        """Nothing to copy: every step wrote into the buffer."""


@dataclass
class Decoded:
    """The sampled continuation of a batch: ``new_ids [B, T]`` (pad after a row's stop token), ``logprobs [B, T, V]``
    of μ at every step (only when ``keep_logprobs``) and ``action_logprobs [B, T]``."""

    new_ids: torch.Tensor
    action_logprobs: torch.Tensor
    logprobs: torch.Tensor | None
    cache: KVBuffer | None = None
    """The keys and values at the end: the prompts' columns, then one column per fed token (``fed`` of them)."""
    fed: int = 0


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (pads get 1, as ``generate`` does)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 1)


MIN_SHARED_PREFIX = 2
"""A common prefix shorter than this is prefilled with each row (a separate forward would cost more than it saves)."""


def shared_prefix_length(prompts: Sequence[Sequence[int]], minimum: int = MIN_SHARED_PREFIX) -> int:
    """The number of leading tokens all ``prompts`` share, leaving each at least one token of its own (its last
    position's logits come from the row's own prefill); 0 when that is under ``minimum`` or there is one prompt."""
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(prompt) for prompt in prompts) - 1
    length = 0
    while length < limit and all(prompt[length] == first[length] for prompt in prompts):
        length += 1
    return length if length >= minimum else 0


def inverse_cdf_sample(logprobs: torch.Tensor, draw_order: torch.Tensor | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logprobs [B, V]``, drawn from ``exp(logprobs)`` by inverting its cumulative sum at a
    uniform draw (:func:`invert_cumulative`). The same distribution as ``torch.multinomial``, at a fraction of its
    cost on a CPU. Row ``b`` takes the ``draw_order[b]``-th uniform of the step (default: the ``b``-th), drawn from
    ``generator`` (default: torch's global RNG).

    The cumulative sum and the uniforms are float64 (float32 on MPS, which has no float64): in float32 both resolve
    only 2^-24 near 1, so with a large vocabulary the tokens of probability under about 6e-8 would be drawn in lumps
    (many never, others at several times their μ) and the reported μ would not be the distribution drawn from."""
    exact = torch.float32 if logprobs.device.type == "mps" else torch.float64
    cumulative = logprobs.exp().to(exact).cumsum(dim=-1)
    draws = torch.rand((len(cumulative), 1), generator=generator, dtype=exact, device=cumulative.device)
    if draw_order is not None:
        draws = draws[draw_order]
    return invert_cumulative(cumulative, draws)


def invert_cumulative(cumulative: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each row of ``cumulative [B, V]`` (an unnormalised cumulative sum) and its uniform ``uniforms [B, 1]`` in
    [0, 1), the first token whose cumulative probability exceeds ``u`` times the row's total: token ``i`` is drawn
    for ``u`` in ``[c_{i-1}, c_i) / c_V``, and a token of probability 0 never is."""
    total = cumulative[:, -1:]
    threshold = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, threshold, right=True).squeeze(-1)


@dataclass
class Prefilled:
    """The state after a prefill: the last position's ``logits [B, V]``, the :class:`KVBuffer` of the prompts, the
    ``attention_mask [B, W]`` of their columns and each row's ``next_position [B, 1]``."""

    logits: torch.Tensor
    cache: KVBuffer
    attention_mask: torch.Tensor
    next_position: torch.Tensor


def prefill(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_ids: torch.Tensor | None = None,
            room: int = 0) -> Prefilled:
    """Run the prompts (``prefix_ids`` [P] shared by every row, then each row's left-padded rest) through the model,
    leaving ``room`` columns for the tokens to sample. The shared prefix is one forward of batch 1 whose keys and
    values are copied to every row; the rows' padding then sits between the prefix and their own tokens, masked,
    and positions continue from P. The buffer, and every tensor of the decode after it, lives on the model's device
    (the prompts are moved there once, here)."""
    device = model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    batch, width = input_ids.shape
    prefix_length = 0 if prefix_ids is None else int(prefix_ids.numel())
    capacity = prefix_length + width + room
    if prefix_length:
        one_row = KVBuffer(1, prefix_length, device)
        prefix_positions = torch.arange(prefix_length, device=device).view(1, -1)
        direct_forward(model, one_row, prefix_ids.to(device).view(1, -1), prefix_positions, prefix_positions >= 0)
        buffer = one_row.repeat_rows(batch, capacity)
    else:
        buffer = KVBuffer(batch, capacity, device)
    positions = prefix_length + left_padded_positions(attention_mask)
    logits = direct_forward(model, buffer, input_ids, positions, attention_mask.bool())
    return Prefilled(logits, buffer, buffer.valid[:, : buffer.width], positions[:, -1:] + 1)


def prefill_after_past(model, buffer: KVBuffer, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       past_lengths: torch.Tensor) -> Prefilled:
    """Run each row's left-padded rest ``input_ids`` through the model after the past already in ``buffer`` (row
    ``b``'s ``past_lengths[b]`` tokens, right-aligned in the filled columns). The rest's positions continue from
    ``past_lengths``, so a row is computed as if prefilled whole."""
    positions = past_lengths[:, None] + left_padded_positions(attention_mask)
    logits = direct_forward(model, buffer, input_ids, positions, attention_mask.bool())
    return Prefilled(logits, buffer, buffer.valid[:, : buffer.width], positions[:, -1:] + 1)


@torch.inference_mode()
def sample_with_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                      temperature: float, stop_ids: torch.Tensor, pad_id: int, keep_logprobs: bool,
                      prefix_ids: torch.Tensor | None = None) -> Decoded:
    """Sample up to ``max_new_tokens`` tokens per row from ``softmax(logits / temperature)``; a row stops after its
    first token in ``stop_ids``. Each row's prompt is ``prefix_ids`` (shared, optional) followed by its row of the
    left-padded ``input_ids``. The caller seeds torch's RNG, and checks :func:`runs_direct` for the model."""
    state = prefill(model, input_ids, attention_mask, prefix_ids, room=max_new_tokens)
    return decode(model, state, max_new_tokens=max_new_tokens, temperature=temperature, stop_ids=stop_ids,
                  pad_id=pad_id, keep_logprobs=keep_logprobs)


@torch.inference_mode()
def decode(model, state: Prefilled, *, max_new_tokens: int, temperature: float, stop_ids: torch.Tensor, pad_id: int,
           keep_logprobs: bool, draw_order: torch.Tensor | None = None,
           generator: torch.Generator | None = None, step: DecodeStep | None = None,
           stop_check_every: int = 1) -> Decoded:
    """Sample from a prefilled batch, one forward per token on its buffer (see :func:`sample_with_cache`). With
    ``draw_order``, row ``b`` takes each step's ``draw_order[b]``-th uniform: a batch laid out in another row order
    (length buckets) draws what the caller's order would; the uniforms come from ``generator`` (default: torch's
    global RNG). ``temperature`` > 0 (the generator calls it only then:
    :func:`~dppo_oat.rollout.hf_generator.uses_sampling_loop`). ``step`` runs each forward on the state's buffer
    (default :class:`EagerStep`; :class:`StaticStep` or a CUDA graph of it compute the same).

    Whether every row has stopped is read on the host (a device synchronisation) only every ``stop_check_every``
    steps; the steps run past the last row's stop sample pad tokens and are then undone (:class:`StopChecks`): the
    result, the buffer's width and the generator's state are those of a check at every step."""
    buffer, logits, next_position = state.cache, state.logits, state.next_position
    forward = step if step is not None else EagerStep(model, buffer)
    checks = StopChecks(stop_check_every, generator, logits.device)
    stopped = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    tokens, action_logprobs, all_logprobs = [], [], []
    for t in range(max_new_tokens):
        checks.before_step(t)
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        token = inverse_cdf_sample(logprobs, draw_order, generator)
        token = torch.where(stopped, torch.full_like(token, pad_id), token)
        tokens.append(token)
        action_logprobs.append(logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1))
        if keep_logprobs:
            all_logprobs.append(logprobs)
        stopped |= torch.isin(token, stop_ids)
        if checks.all_stopped(t, stopped) or t == max_new_tokens - 1:
            break
        logits = forward(token.unsqueeze(-1), next_position)
        next_position = next_position + 1
    length = checks.steps_to_keep(len(tokens))
    if length < len(tokens):
        undo_steps_past_stop(buffer, len(tokens) - length)
    forward.finish()
    return Decoded(torch.stack(tokens[:length], dim=1), torch.stack(action_logprobs[:length], dim=1),
                   torch.stack(all_logprobs[:length], dim=1) if keep_logprobs else None, buffer, length - 1)


class StopChecks:
    """When :func:`decode` reads whether every row has stopped: after every step (``every`` 1), or after every
    ``every``-th only; between two reads it keeps each step's flag on the device and the state of the uniforms'
    generator (:class:`DrawHistory`), so that the steps run past the last stop can be taken back."""

    def __init__(self, every: int, generator: torch.Generator | None, device: torch.device):
        self.every = every
        self.history = DrawHistory(generator, device) if every > 1 else None
        self.ended: list[torch.Tensor] = []

    def before_step(self, t: int) -> None:
        """Step ``t`` is about to draw."""
        if self.history is not None:
            self.history.before_step(t)

    def all_stopped(self, t: int, stopped: torch.Tensor) -> bool:
        """Whether the decode ends after step ``t``: every row has stopped, as read now if ``t`` is a check step."""
        if self.history is None:
            return bool(stopped.all())
        self.ended.append(stopped.all())
        if (t + 1) % self.every:
            return False
        if bool(self.ended[-1]):
            return True
        self.history.forget()  # a row runs on: the steps so far, and their draws, are kept
        return False

    def steps_to_keep(self, steps: int) -> int:
        """How many of the ``steps`` run a check at every step would have run; the generator is put back to where
        that decode leaves it."""
        if self.history is None:
            return steps
        length = first_stop_length(self.ended)
        if length < steps:
            self.history.rewind_to(length)
        return length


def first_stop_length(ended: Sequence[torch.Tensor]) -> int:
    """The number of steps a check at every step would have run: up to and including the first whose
    ``ended[t]`` (a 0-dim device bool: every row had stopped after step ``t``) is true, else all of them (one
    synchronisation)."""
    flags = torch.stack(list(ended)).tolist()
    return next((t + 1 for t, flag in enumerate(flags) if flag), len(flags))


def undo_steps_past_stop(buffer: KVBuffer, steps: int) -> None:
    """Take back the last ``steps`` fed columns of ``buffer`` (the forwards of the steps past the last row's stop):
    its width returns to where a check at every step leaves it, and the columns are no longer valid."""
    buffer.width -= steps
    buffer.valid[:, buffer.width : buffer.width + steps] = False


def draw_source(generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    """The generator the uniforms of :func:`inverse_cdf_sample` come from on ``device``: ``generator``, else torch's
    default generator of that device."""
    if generator is not None:
        return generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


class DrawHistory:
    """The state of the uniforms' generator before each step since the last stop check (a host-side copy, no
    device synchronisation), so that a decode that ran past its last row's stop can give back the draws of the steps
    it undoes: the next batch of the call, or the next caller of the global RNG, then draws what it would have."""

    def __init__(self, generator: torch.Generator | None, device: torch.device):
        self.source = draw_source(generator, device)
        self.states: dict[int, torch.Tensor] = {}

    def before_step(self, t: int) -> None:
        """Keep the state before step ``t``'s draw."""
        self.states[t] = self.source.get_state()

    def forget(self) -> None:
        """Drop the states kept so far (a stop check found a row running: those steps stay)."""
        self.states.clear()

    def rewind_to(self, t: int) -> None:
        """Put the generator back to its state before step ``t``'s draw."""
        self.source.set_state(self.states[t])
