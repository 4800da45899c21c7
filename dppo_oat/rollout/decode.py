"""The HF generator's own sampling loop over a Hugging Face causal LM with its KV cache: its fast path.

``model.generate`` spends a good part of each step of a small model on machinery a rollout does not use (logits
processors, stopping criteria, score bookkeeping). For untruncated sampling at a temperature > 0 — every training
rollout — the loop below does only what the rollout needs: one forward per token (:func:`direct_forward`, the
model's own layers on a preallocated :class:`KVBuffer`), ``log_softmax`` of ``logits / temperature`` (μ exactly,
the distribution the token is drawn from), one draw by inverting its cumulative sum at a uniform (:func:`sample_at`,
cheaper than ``torch.multinomial``; a decode's uniforms are drawn at once, :class:`StepUniforms`), and log μ(a_t);
when asked, μ's whole log-probs, from which the generator takes
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


def exact_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the cumulative sums and uniforms of a draw: float64 (float32 on MPS, which has no float64). In
    float32 both resolve only 2^-24 near 1, so with a large vocabulary the tokens of probability under about 6e-8
    would be drawn in lumps (many never, others at several times their μ) and the reported μ would not be the
    distribution drawn from."""
    return torch.float32 if device.type == "mps" else torch.float64


def sample_at(logprobs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token of each row of ``logprobs [B, V]`` at its uniform ``uniforms [B, 1]``: the inverse of the
    cumulative sum of ``exp(logprobs)`` (:func:`invert_cumulative`), in :func:`exact_dtype`."""
    cumulative = logprobs.exp().to(uniforms.dtype).cumsum(dim=-1)
    return invert_cumulative(cumulative, uniforms)


def draw_tokens(logits: torch.Tensor, uniforms: torch.Tensor, stopped: torch.Tensor, *, temperature: float,
                pad_id: int, stop_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step's draw from next-token ``logits [B, V]``: ``(log μ [B, V], tokens [B], log μ(a_t) [B])``, with
    log μ = ``log_softmax(logits / temperature)`` (μ exactly, the distribution drawn from) and each row's token at
    its uniform (:func:`sample_at`), the pad token for a row already ``stopped``; ``stopped [B]`` then also marks the
    rows whose token is one of ``stop_ids`` (in place). Every operation keeps its shapes and reads nothing back to the
    host, so a CUDA graph captures it (:class:`~dppo_oat.rollout.cuda_graphs.SamplingGraph`): the stop ids are
    compared directly, as ``torch.isin`` with many of them sorts and calls ``unique()``, which waits for the device."""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    tokens = sample_at(logprobs, uniforms).masked_fill(stopped, pad_id)
    stopped |= (tokens[:, None] == stop_ids).any(dim=-1)
    return logprobs, tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


class StepUniforms:
    """The uniforms of a whole decode, drawn in one call before its first step: ``draws [steps, B, 1]``, step ``t``'s
    row ``b`` being the ``draw_order[b]``-th uniform of the ``t``-th draw of ``B`` (default: the ``b``-th), from
    ``generator`` (default: torch's global RNG of the device). On the CPU one draw of ``steps × B`` is the ``steps``
    draws of ``B`` one after another, number for number. :meth:`give_back` leaves the generator where a decode that
    drew only the steps it kept would have: what a decode runs past its last stop is not drawn for the next caller."""

    def __init__(self, generator: torch.Generator | None, device: torch.device, steps: int, rows: int,
                 draw_order: torch.Tensor | None = None):
        self.generator, self.source = generator, draw_source(generator, device)
        self.rows, self.dtype, self.device = rows, exact_dtype(device), device
        self.before = self.source.get_state() if self.source is not None else None
        draws = self._draw(steps)
        self.draws = draws[:, draw_order] if draw_order is not None else draws

    def _draw(self, steps: int) -> torch.Tensor:
        return torch.rand((steps, self.rows, 1), generator=self.generator, dtype=self.dtype, device=self.device)

    def give_back(self, kept: int) -> None:
        """Put the generator where drawing only the first ``kept`` steps leaves it."""
        if kept < len(self.draws) and self.source is not None:
            self.source.set_state(self.before)
            self._draw(kept)


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
    global RNG), all drawn before the first step (:class:`StepUniforms`). ``temperature`` > 0 (the generator calls
    it only then: :func:`~dppo_oat.rollout.hf_generator.uses_sampling_loop`). ``step`` runs each forward on the
    state's buffer (default :class:`EagerStep`; :class:`StaticStep` or a CUDA graph of it compute the same).

    Whether every row has stopped is read on the host (a device synchronisation) only every ``stop_check_every``
    steps; the steps run past the last row's stop sample pad tokens and are then undone (:class:`StopChecks`): the
    result, the buffer's width and the generator's state are those of a check at every step."""
    buffer, logits, next_position = state.cache, state.logits, state.next_position
    forward = step if step is not None else EagerStep(model, buffer)
    uniforms = StepUniforms(generator, logits.device, max_new_tokens, logits.shape[0], draw_order)
    checks = StopChecks(stop_check_every)
    stopped = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    tokens, action_logprobs, all_logprobs = [], [], []
    for t in range(max_new_tokens):
        logprobs, token, action_logprob = draw_tokens(logits, uniforms.draws[t], stopped, temperature=temperature,
                                                      pad_id=pad_id, stop_ids=stop_ids)
        tokens.append(token)
        action_logprobs.append(action_logprob)
        if keep_logprobs:
            all_logprobs.append(logprobs)
        if checks.all_stopped(t, stopped) or t == max_new_tokens - 1:
            break
        logits = forward(token.unsqueeze(-1), next_position)
        next_position = next_position + 1
    length = checks.steps_to_keep(len(tokens))
    return kept_steps(buffer, forward, uniforms, len(tokens), length, tokens, action_logprobs,
                      all_logprobs if keep_logprobs else None)


def kept_steps(buffer: KVBuffer, step: DecodeStep, uniforms: StepUniforms, run: int, length: int,
               tokens: Sequence[torch.Tensor], action_logprobs: Sequence[torch.Tensor],
               all_logprobs: Sequence[torch.Tensor] | None) -> Decoded:
    """The :class:`Decoded` of the first ``length`` of the ``run`` steps a decode ran (each a ``[B]`` token and μ,
    ``[B, V]`` log μ): the forwards of the steps past the last stop are taken back from ``buffer``, the generator
    gets their uniforms back, and ``step`` finishes."""
    if length < run:
        undo_steps_past_stop(buffer, run - length)
    uniforms.give_back(length)
    step.finish()
    return Decoded(torch.stack(list(tokens[:length]), dim=1), torch.stack(list(action_logprobs[:length]), dim=1),
                   None if all_logprobs is None else torch.stack(list(all_logprobs[:length]), dim=1), buffer,
                   length - 1)


class StopChecks:
    """When :func:`decode` reads whether every row has stopped: after every step (``every`` 1), or after every
    ``every``-th only; between two reads it keeps each step's flag on the device, so that the steps run past the
    last stop can be found and taken back."""

    def __init__(self, every: int):
        self.every = every
        self.ended: list[torch.Tensor] = []

    def all_stopped(self, t: int, stopped: torch.Tensor) -> bool:
        """Whether the decode ends after step ``t``: every row has stopped, as read now if ``t`` is a check step."""
        if self.every == 1:
            return bool(stopped.all())
        self.ended.append(stopped.all())
        return (t + 1) % self.every == 0 and bool(self.ended[-1])

    def steps_to_keep(self, steps: int) -> int:
        """How many of the ``steps`` run a check at every step would have run."""
        return steps if self.every == 1 else first_stop_length(self.ended)


def first_stop_length(ended: Sequence[torch.Tensor]) -> int:
    """The number of steps a check at every step would have run: up to and including the first whose
    ``ended[t]`` (a 0-dim device bool: every row had stopped after step ``t``) is true, else all of them (one
    synchronisation)."""
    flags = torch.stack(list(ended)).tolist()
    return next((t + 1 for t, flag in enumerate(flags) if flag), len(flags))


RUN_AHEAD = 4
"""How many steps an in-graph decode's host may launch past the newest stop flag it has read (:class:`StopPoller`):
enough queued work that the device never waits for the host, few enough that little runs past the last stop."""


class StopPoller:
    """Reads the stop flags of :func:`decode_in_graph` without draining the device's queue. Behind each step the
    host queues a copy of the step's flag (``ended[t]``: every row had stopped after step ``t``) to pinned host memory
    and an event; before it launches a step it reads the flags of the steps whose events have completed, and it waits
    only for a step ``run_ahead`` behind the newest (the device has that many steps queued meanwhile). The steps
    launched past the first stop sample pad tokens and are taken back. Off CUDA each flag is read as it is written."""

    def __init__(self, ended: torch.Tensor, run_ahead: int = RUN_AHEAD):
        self.ended, self.run_ahead = ended, run_ahead
        self.cuda = ended.device.type == "cuda"
        self.host = torch.zeros(ended.shape, dtype=torch.bool, pin_memory=self.cuda)
        self.events: dict[int, torch.cuda.Event] = {}
        self.read = 0
        """The flags of steps ``[0, read)`` are read, and false."""

    def launched(self, t: int) -> None:
        """Step ``t``'s work is queued: queue its flag's copy to the host behind it."""
        self.host[t : t + 1].copy_(self.ended[t : t + 1], non_blocking=self.cuda)
        if self.cuda:  # on the flags' device's stream (a thread's current device may be another), where the replay
            # and the copy run; a blocking event lets a waiting host thread sleep rather than spin
            self.events[t] = torch.cuda.Event(blocking=True)
            self.events[t].record(torch.cuda.current_stream(self.ended.device))

    def done(self, t: int) -> bool:
        """Whether step ``t``'s flag is on the host (without waiting)."""
        return not self.cuda or self.events[t].query()

    def wait(self, t: int) -> None:
        """Wait until step ``t``'s flag is on the host."""
        if self.cuda:
            self.events[t].synchronize()

    def ended_before(self, launched: int) -> bool:
        """Whether a flag of the ``launched`` steps says every row had stopped: the flags on the host are read, and
        the host waits for the one ``run_ahead`` behind ``launched``."""
        while self.read < launched:
            t = self.read
            if launched - t > self.run_ahead:
                self.wait(t)
            elif not self.done(t):
                return False
            if bool(self.host[t]):
                return True
            self.read += 1
        return False

    def stop_length(self, launched: int) -> int:
        """How many of the ``launched`` steps a check at every step runs: up to and including the first whose flag
        is true, else all (one wait for the last step)."""
        self.wait(launched - 1)
        flags = self.host[:launched].tolist()
        return next((t + 1 for t, flag in enumerate(flags) if flag), launched)


class InGraphStep(Protocol):
    """A decode step that samples on the device (:class:`~dppo_oat.rollout.cuda_graphs.SampledStep`): ``ended``
    holds each step's stop flag there."""

    ended: torch.Tensor

    def start(self, token: torch.Tensor, positions: torch.Tensor, stopped: torch.Tensor,
              uniforms: torch.Tensor) -> None:
        """Take step 0's tokens ``[B]``, the next positions ``[B, 1]``, the stop flags ``[B]`` and every step's
        uniforms ``[steps, B, 1]``."""

    def replay(self) -> torch.Tensor:
        """Run one step: the last tokens' forward, then the next token's draw; return its log μ ``[B, V]``."""

    def sampled(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens and their log μ ``[B, length - 1]`` of steps ``1 … length - 1``."""

    def finish(self) -> None:
        """See :meth:`DecodeStep.finish`."""


@torch.inference_mode()
def decode_in_graph(state: Prefilled, step: InGraphStep, *, max_new_tokens: int, temperature: float,
                    stop_ids: torch.Tensor, pad_id: int, keep_logprobs: bool, draw_order: torch.Tensor | None = None,
                    generator: torch.Generator | None = None, poller: type[StopPoller] = StopPoller) -> Decoded:
    """:func:`decode` with a ``step`` that samples on the device: the host draws step 0's token from the prefill, as
    :func:`decode` does, then only launches steps (one replay each) and reads the stop flags behind them
    (:class:`StopPoller`); the steps run past the last stop are taken back, so the result, the buffer and the
    generator's state are :func:`decode`'s. The step's graph bakes in the temperature, the stop ids and the pad id
    (``temperature``, ``stop_ids`` and ``pad_id`` here serve step 0's draw, on the host). ``poller``: how the flags are
    read
    (:class:`StopPoller`)."""
    logits = state.logits
    uniforms = StepUniforms(generator, logits.device, max_new_tokens, logits.shape[0], draw_order)
    stopped = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    logprobs, first, first_logprob = draw_tokens(logits, uniforms.draws[0], stopped, temperature=temperature,
                                                 pad_id=pad_id, stop_ids=stop_ids)
    step.start(first, state.next_position, stopped, uniforms.draws)
    flags, all_logprobs, run = poller(step.ended), [logprobs], 1
    flags.launched(0)
    while run < max_new_tokens and not flags.ended_before(run):
        later = step.replay()
        if keep_logprobs:
            all_logprobs.append(later.clone())
        flags.launched(run)
        run += 1
    length = flags.stop_length(run)
    tokens, action_logprobs = step.sampled(length)
    return kept_steps(state.cache, step, uniforms, run, length, [first, *tokens.unbind(1)],
                      [first_logprob, *action_logprobs.unbind(1)], all_logprobs if keep_logprobs else None)


def undo_steps_past_stop(buffer: KVBuffer, steps: int) -> None:
    """Take back the last ``steps`` fed columns of ``buffer`` (the forwards of the steps past the last row's stop):
    its width returns to where a check at every step leaves it, and the columns are no longer valid."""
    buffer.width -= steps
    buffer.valid[:, buffer.width : buffer.width + steps] = False


def draw_source(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """The generator the uniforms of a decode come from on ``device``: ``generator``, else torch's default generator
    of that device (None on a device other than the CPU and CUDA: its global RNG, whose state is not put back)."""
    if generator is not None:
        return generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator if device.type == "cpu" else None
