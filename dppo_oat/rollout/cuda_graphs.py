"""The decode step captured in CUDA graphs kept across generator calls: one replay launches the whole step.

A small policy's decode step is hundreds of small kernels, each launched by the host at a fixed cost of microseconds
(about 12 µs each on the H100 host the GPU check measured), so the step takes far longer than the GPU computes. As
inference engines do for their decode batches, a :class:`GraphCache` records the step's kernels once per shape, in a
CUDA graph, and each step then replays them with new inputs in one launch. A graph replays fixed shapes, fixed
host-side values and fixed memory, so each graph (:class:`DecodeGraph`) owns its tensors: a KV buffer of a bucket's
rows and columns (:func:`batch_bucket`, :func:`capacity_bucket`), the token and position inputs and the column to
write; the captured forward is :class:`~dppo_oat.rollout.decode.StaticStep`'s (attention over the buffer's whole
capacity, the column given by a device tensor). A call of ``B`` rows loads its prefilled keys and values into the
first ``B`` rows of the graph of its :class:`GraphKey` (the other rows decode padding, never returned) and copies the
columns it decoded back into its own buffer at the end.

Two kinds of graph: by default (:class:`SamplingGraph`, :class:`SampledStep`) the graph samples too — μ, the draw at
the step's uniform (all of a call's uniforms drawn before its first step), the stop flags and the next step's
inputs stay on the device, so a step is one replay, and the host reads the stop flags behind the device without
draining its queue (:class:`~dppo_oat.rollout.decode.StopPoller`); or the graph runs the forward alone
(:class:`GraphedStep`), the host sampling between replays and reading the stop flags every
:data:`STOP_CHECK_EVERY` steps. Both decode the eager loop's tokens from the same uniforms.

The graphs read the weights where they are: an in-place change (an optimizer step, ``load_state_dict``, the rollout
copy's refresh) is seen by the next replay, while a weight that is a new tensor (``p.data = ...``,
``load_state_dict(..., assign=True)``, ``model.to(...)``) is not, so the cache drops every graph when a parameter's or
buffer's storage, dtype or shape changes, or the generator's model is another one (:func:`storage_key`). A capture
first runs the step eagerly :data:`WARMUP_STEPS` times; a capture that fails warns and the call decodes eagerly. The
GPU check's ``rollout`` step times each kind against ``generate`` and the decode roofline.
"""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from dppo_oat.rollout.decode import (
    Decoded,
    DecodeStep,
    EagerStep,
    Prefilled,
    StaticStep,
    decode,
    decode_in_graph,
    draw_tokens,
    exact_dtype,
)
from dppo_oat.rollout.direct_forward import KVBuffer, decode_forward

MIN_GRAPH_STEPS = 2
"""The fewest tokens a call samples for it to decode with a graph (a call of one token runs no decode step)."""
WARMUP_STEPS = 2
"""Eager runs of the step on a side stream before the capture (lazy initialisation stays out of the graph); the
capture then runs on that stream, whose library handles exist."""
CAPTURE_ERROR_MODE = "thread_local"
"""What a capture forbids (``cudaStreamCaptureMode``): unsafe calls of its own thread only. A background rollout
(``--max-staleness``) captures while the learner's thread updates, and under the default ``global`` mode the
learner's next ``cudaMalloc`` would fail the update and the capture both (PyTorch's compiled graphs capture in this
mode too, beside autograd's threads)."""
STOP_CHECK_EVERY = 8
"""A replayed decode reads whether every row has stopped every this many steps (a synchronisation with the device;
:func:`~dppo_oat.rollout.decode.decode` undoes the steps run past the last stop)."""
MIN_CAPACITY = 64
"""The fewest columns a graph's KV buffer has."""
MAX_GRAPHS = 8
"""The most graphs a cache keeps (each with its KV buffer); the one replayed longest ago goes first."""
MAX_GRAPH_MEMORY_FRACTION = 0.25
"""The most of the device's memory a cache's graphs' KV buffers may hold together; the oldest go first."""

Layout = tuple[tuple[int, int, torch.dtype], ...]
"""Per layer, keys then values: ``(heads, head size, dtype)``."""


def batch_bucket(rows: int) -> int:
    """The rows of the graph that decodes a batch of ``rows``: the next power of two."""
    if rows < 1:
        raise ValueError(f"a decode batch has at least one row, got {rows}")
    return 1 << (rows - 1).bit_length()


def capacity_bucket(columns: int) -> int:
    """The columns of the graph that decodes a buffer of ``columns``: the next of 64, 96, 128, 192, 256, 384, …
    (powers of two and one and a half times them; each step attends over them all, so at most a third is masked
    room)."""
    size = MIN_CAPACITY
    while size < columns:
        size = size * 3 // 2 if size & (size - 1) == 0 else size // 3 * 4
    return size


@dataclass(frozen=True)
class Sampling:
    """What a graph that samples bakes in: the temperature, the stop ids and the pad token id."""

    temperature: float
    stop_ids: tuple[int, ...]
    pad_id: int


@dataclass(frozen=True)
class GraphKey:
    """What a graph is captured for: its rows and columns, its KV buffer's layout, the autocast in force (None:
    none) and, for a graph that samples too (:class:`SamplingGraph`), its :class:`Sampling`."""

    batch: int
    capacity: int
    layout: Layout
    autocast: torch.dtype | None
    sampling: Sampling | None = None

    @property
    def buffer_bytes(self) -> int:
        """What the graph's KV buffer holds: every layer's keys and values for its rows and columns."""
        per_column = sum(heads * size * torch.empty((), dtype=dtype).element_size()
                         for heads, size, dtype in self.layout)
        return self.batch * self.capacity * per_column

    def serves(self, needed: GraphKey) -> bool:
        """Whether this graph can decode a call of ``needed``: the same layout and autocast, at least its rows and
        columns (the extra rows decode padding, the extra columns are masked)."""
        return (self.layout == needed.layout and self.autocast == needed.autocast and self.sampling == needed.sampling
                and self.batch >= needed.batch and self.capacity >= needed.capacity)


def buffer_layout(buffer: KVBuffer) -> Layout:
    """``buffer``'s layers as :data:`Layout` (keys and values may differ in dtype under autocast)."""
    return tuple((tensor.shape[1], tensor.shape[3], tensor.dtype)
                 for pair in zip(buffer.keys, buffer.values, strict=True) for tensor in pair)


def graph_key(buffer: KVBuffer, sampling: Sampling | None = None) -> GraphKey:
    """The key of the graph that decodes ``buffer`` (a call's prefilled buffer, with room for every token to sample)
    under the autocast in force, sampling as ``sampling`` says (None: the graph of the forward alone)."""
    kind = buffer.valid.device.type
    autocast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    return GraphKey(batch_bucket(buffer.valid.shape[0]), capacity_bucket(buffer.capacity), buffer_layout(buffer),
                    autocast, sampling)


def storage_key(model) -> tuple:
    """Where ``model``'s parameters and buffers live and what they are (address, dtype, shape): the same after an
    in-place update, another after a tensor is swapped in. The version counters are left out: an in-place update
    keeps a graph valid."""
    tensors = [*model.parameters(), *model.buffers()]
    return tuple((tensor.data_ptr(), tensor.dtype, tuple(tensor.shape)) for tensor in tensors)


class DecodeGraph:
    """The tensors one graph reads and writes, for a :class:`GraphKey`: a zeroed :class:`KVBuffer` of its rows and
    columns, the token and position inputs ``[rows, 1]`` and the :class:`StaticStep` that points the column; and
    ``replay``, which ``capture`` built from :meth:`forward` (a CUDA graph of it, :func:`capture_cuda_graph`)."""

    def __init__(self, model, key: GraphKey, device: torch.device,
                 capture: Callable[[DecodeGraph], Callable[[], torch.Tensor]]):
        self.model, self.key = model, key
        self.buffer = KVBuffer(key.batch, key.capacity, device)
        for keys, values in zip(key.layout[0::2], key.layout[1::2], strict=True):
            self.buffer.keys.append(self._zeros(keys, device))
            self.buffer.values.append(self._zeros(values, device))
        self.static = StaticStep(model, self.buffer)
        self.token_ids = torch.zeros((key.batch, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((key.batch, 1), dtype=torch.long, device=device)
        self.replay = capture(self)

    def _zeros(self, layout: tuple[int, int, torch.dtype], device: torch.device) -> torch.Tensor:
        """A layer's keys or values of ``layout`` (heads, head size, dtype): zeros ``[rows, H, columns, D]``."""
        heads, size, dtype = layout
        return torch.zeros((self.key.batch, heads, self.key.capacity, size), dtype=dtype, device=device)

    def forward(self) -> torch.Tensor:
        """The step on the graph's tensors: logits ``[rows, V]``, the keys and values written at the column."""
        return decode_forward(self.model, self.buffer, self.token_ids, self.positions, self.static.column)

    def load(self, source: KVBuffer) -> None:
        """Take a call's prefilled buffer: its filled columns into the first rows, zeros everywhere else (read
        masked, they must be finite), the same valid columns and width."""
        rows, width = source.valid.shape[0], source.width
        targets, sources = [*self.buffer.keys, *self.buffer.values], [*source.keys, *source.values]
        for target, filled in zip(targets, sources, strict=True):
            target[:rows, :, :width].copy_(filled[:, :, :width])
            target[:rows, :, width:].zero_()
            target[rows:].zero_()
        self.buffer.valid.zero_()
        self.buffer.valid[:rows, :width] = source.valid[:, :width]
        self.buffer.width = width

    def copy_back(self, target: KVBuffer, start: int) -> None:
        """Copy the columns ``[start, target.width)`` of ``target``'s rows (those the call decoded here) into
        ``target``."""
        rows, stop = target.valid.shape[0], target.width
        for mine, theirs in zip([*self.buffer.keys, *self.buffer.values], [*target.keys, *target.values], strict=True):
            theirs[:, :, start:stop].copy_(mine[:rows, :, start:stop])
        target.valid[:, start:stop] = self.buffer.valid[:rows, start:stop]


class GraphedStep:
    """One call's decode on a :class:`DecodeGraph`: the call's buffer is loaded into the graph's first rows; each
    step copies the tokens and positions into the graph's inputs, points the column at the next one and replays;
    :meth:`finish` copies the decoded columns back. The logits it returns are rows of the graph's own output tensor,
    overwritten by the next step."""

    def __init__(self, graph: DecodeGraph, buffer: KVBuffer):
        graph.load(buffer)
        self.graph, self.buffer = graph, buffer
        self.rows, self.start = buffer.valid.shape[0], buffer.width

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        graph = self.graph
        if self.buffer.width >= self.buffer.capacity:
            raise RuntimeError("the KV buffer is full: allocate it with room for every token to sample")
        graph.token_ids[: self.rows].copy_(token_ids)
        graph.positions[: self.rows].copy_(positions)
        graph.static.point_at_next_column()
        logits = graph.replay()
        graph.buffer.width += 1
        self.buffer.width += 1
        return logits[: self.rows]

    def finish(self) -> None:
        """Copy the columns this call decoded (up to its buffer's width, which the decode may have taken back)."""
        self.graph.copy_back(self.buffer, self.start)


class SamplingGraph(DecodeGraph):
    """A :class:`DecodeGraph` whose captured step samples too: after the forward of the last tokens, log μ =
    ``log_softmax(logits / temperature)``, the token at the step's uniform
    (:func:`~dppo_oat.rollout.decode.draw_tokens`), the pad token for a row that had stopped, the stop flags, and the
    next step's inputs (tokens, positions, column), all on the device, so that a decode step is one replay and the
    host copies nothing in. Its tensors besides the forward's: ``uniforms [columns, rows, 1]`` (a call's draws, step
    ``t`` at ``t``), ``draw_index`` (the step being sampled), ``stopped [rows]`` (the rows past their stop, and the
    padding rows), and per step the ``tokens`` and ``action_logprobs`` ``[columns, rows]`` and ``ended [columns]``
    (every row had stopped after it)."""

    def __init__(self, model, key: GraphKey, device: torch.device,
                 capture: Callable[[DecodeGraph], Callable[[], torch.Tensor]]):
        columns, rows = key.capacity, key.batch
        self.stop_ids = torch.tensor(key.sampling.stop_ids, dtype=torch.long, device=device)
        self.uniforms = torch.zeros((columns, rows, 1), dtype=exact_dtype(device), device=device)
        self.draw_index = torch.zeros(1, dtype=torch.long, device=device)
        self.stopped = torch.ones(rows, dtype=torch.bool, device=device)
        self.tokens = torch.zeros((columns, rows), dtype=torch.long, device=device)
        self.action_logprobs = torch.zeros((columns, rows), dtype=torch.float32, device=device)
        self.ended = torch.zeros(columns, dtype=torch.bool, device=device)
        super().__init__(model, key, device, capture)

    def forward(self) -> torch.Tensor:
        """One step: the forward of ``token_ids`` at the column, then the draw of the next tokens at
        ``uniforms[draw_index]``; returns log μ ``[rows, V]`` of the draw."""
        sampling, step = self.key.sampling, self.draw_index
        logprobs, token, action_logprob = draw_tokens(
            super().forward(), self.uniforms.index_select(0, step)[0], self.stopped,
            temperature=sampling.temperature, pad_id=sampling.pad_id, stop_ids=self.stop_ids)
        self.tokens.index_copy_(0, step, token[None])
        self.action_logprobs.index_copy_(0, step, action_logprob[None])
        self.ended.index_copy_(0, step, self.stopped.all()[None])
        self.token_ids.copy_(token[:, None])
        self.positions += 1
        self.static.column += 1
        self.draw_index += 1
        return logprobs


class SampledStep:
    """One call's decode on a :class:`SamplingGraph` (:func:`~dppo_oat.rollout.decode.decode_in_graph`): the call's
    buffer goes to the graph's first rows; :meth:`start` loads step 0's tokens, the positions, the stop flags (the
    padding rows stopped) and the uniforms; each :meth:`replay` forwards the last tokens and draws the next, on the
    device; :meth:`finish` copies the decoded columns back."""

    def __init__(self, graph: SamplingGraph, buffer: KVBuffer):
        graph.load(buffer)
        self.graph, self.buffer, self.ended = graph, buffer, graph.ended
        self.rows, self.start_width = buffer.valid.shape[0], buffer.width

    def start(self, token: torch.Tensor, positions: torch.Tensor, stopped: torch.Tensor,
              uniforms: torch.Tensor) -> None:
        graph, rows = self.graph, self.rows
        graph.token_ids.zero_()
        graph.token_ids[:rows, 0] = token
        graph.positions.zero_()
        graph.positions[:rows] = positions
        graph.stopped.fill_(True)
        graph.stopped[:rows] = stopped
        graph.uniforms[: len(uniforms), :rows] = uniforms
        graph.ended[:1] = stopped.all()
        graph.draw_index.fill_(1)
        graph.static.column.fill_(self.buffer.width)

    def replay(self) -> torch.Tensor:
        if self.buffer.width >= self.buffer.capacity:
            raise RuntimeError("the KV buffer is full: allocate it with room for every token to sample")
        logprobs = self.graph.replay()
        self.graph.buffer.width += 1
        self.buffer.width += 1
        return logprobs[: self.rows]

    def sampled(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        graph, rows = self.graph, self.rows
        return graph.tokens[1:length, :rows].T, graph.action_logprobs[1:length, :rows].T

    def finish(self) -> None:
        """Copy the columns this call decoded (up to its buffer's width, which the decode may have taken back)."""
        self.graph.copy_back(self.buffer, self.start_width)


class GraphCache:
    """The decode graphs of a generator, kept across its calls, all dropped when the model's storage changes
    (:func:`storage_key`) or the model is another. A call takes the smallest cached graph that serves its
    :class:`GraphKey` (:meth:`GraphKey.serves`), and captures one for its own key only when none does; past
    ``max_graphs`` graphs, or ``max_bytes`` of their KV buffers together (default: :data:`MAX_GRAPH_MEMORY_FRACTION`
    of the device's memory), the one used longest ago goes first. The graphs' captures share one memory pool and one
    side stream (a call replays one graph at a time, and each graph's output stays its own). A capture that fails
    turns the cache off (``failure`` says why; the generator decodes eagerly from then on, warned once). ``captures``
    counts the graphs captured. ``capture`` builds a graph's replay (:func:`capture_cuda_graph`; a test passes the
    eager forward to run the same logic on the CPU), on the devices of ``device_types``. ``sample_in_graph``: the
    graphs sample too (:class:`SamplingGraph`), else they run the forward alone (:class:`GraphedStep`)."""

    def __init__(self, capture: Callable[[DecodeGraph], Callable[[], torch.Tensor]] | None = None,
                 max_graphs: int = MAX_GRAPHS, device_types: tuple[str, ...] = ("cuda",),
                 max_bytes: int | None = None, sample_in_graph: bool = True):
        self.capture = capture if capture is not None else self._capture_on_cuda
        self.max_graphs, self.device_types, self.max_bytes = max_graphs, device_types, max_bytes
        self.sample_in_graph = sample_in_graph
        self.graphs: collections.OrderedDict[GraphKey, DecodeGraph] = collections.OrderedDict()
        self.model, self.storage, self.captures = None, None, 0
        self.failure: str | None = None
        self._pool, self._stream = None, None

    def serves(self, device: torch.device) -> bool:
        """Whether this cache captures on ``device`` (and no capture has failed)."""
        return device.type in self.device_types and self.failure is None

    def step(self, model, buffer: KVBuffer, sampling: Sampling | None = None) -> GraphedStep | SampledStep:
        """The step that decodes the prefilled ``buffer`` with ``model``, on a graph that serves it (captured now if
        the cache has none): one that samples as ``sampling`` says when given and the cache samples in its graphs,
        else one of the forward alone."""
        key = graph_key(buffer, sampling if self.sample_in_graph else None)
        graph = self.graph(model, key, buffer.valid.device)
        return SampledStep(graph, buffer) if key.sampling is not None else GraphedStep(graph, buffer)

    def graph(self, model, key: GraphKey, device: torch.device) -> DecodeGraph:
        """The smallest cached graph that serves ``key``, else a new capture for ``key`` (the graphs used longest
        ago dropped past the limits); a failed capture turns the cache off and raises."""
        self.check_storage(model)
        fitting = [cached for cached in self.graphs if cached.serves(key)]
        if fitting:
            best = min(fitting, key=lambda cached: (cached.batch * cached.capacity, cached.batch))
            self.graphs.move_to_end(best)
            return self.graphs[best]
        self.evict(room_for=key, device=device)
        try:
            graph = (SamplingGraph if key.sampling is not None else DecodeGraph)(model, key, device, self.capture)
        except (RuntimeError, TypeError, ValueError) as error:
            self.failure = f"{type(error).__name__}: {error}"
            raise
        self.captures += 1
        self.graphs[key] = graph
        return graph

    def evict(self, room_for: GraphKey, device: torch.device) -> None:
        """Drop the graphs used longest ago until one more graph (``room_for``) fits both limits."""
        limit = self.max_bytes if self.max_bytes is not None else default_graph_bytes(device)
        while self.graphs and (len(self.graphs) >= self.max_graphs
                               or sum(k.buffer_bytes for k in self.graphs) + room_for.buffer_bytes > limit):
            self.graphs.popitem(last=False)

    def clear(self) -> None:
        """Drop every graph (the next call of each bucket captures again)."""
        self.graphs.clear()

    def check_storage(self, model) -> None:
        """Drop every graph when ``model`` is another model or its weights' storage changed."""
        storage = storage_key(model)
        if model is not self.model or storage != self.storage:
            self.clear()
            self.model, self.storage = model, storage

    def _capture_on_cuda(self, graph: DecodeGraph) -> Callable[[], torch.Tensor]:
        """:func:`capture_cuda_graph` into this cache's memory pool, on its side stream (made at the first capture)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(graph.buffer.valid.device)
        return capture_cuda_graph(graph, pool=self._pool, side=self._stream)


def default_graph_bytes(device: torch.device) -> int:
    """:data:`MAX_GRAPH_MEMORY_FRACTION` of ``device``'s memory (no limit off a CUDA device)."""
    if device.type != "cuda":
        return 1 << 62
    return int(MAX_GRAPH_MEMORY_FRACTION * torch.cuda.get_device_properties(device).total_memory)


def capture_cuda_graph(graph: DecodeGraph, pool=None, side: torch.cuda.Stream | None = None
                       ) -> Callable[[], torch.Tensor]:
    """Record ``graph.forward()`` in a CUDA graph (after :data:`WARMUP_STEPS` eager runs on the ``side`` stream, a new
    one by default, under :func:`uncached_autocast`), its memory from ``pool`` (a ``graph_pool_handle``; default: a
    pool of its own), and return its replay, which gives the graph's logits tensor."""
    device = graph.buffer.valid.device
    cuda_graph = torch.cuda.CUDAGraph()
    with uncached_autocast(device):
        graph.static.point_at_next_column()
        side = side if side is not None else torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                graph.forward()
        torch.cuda.current_stream(device).wait_stream(side)
        with captured_on(cuda_graph, side, pool):
            logits = graph.forward()

    def replay() -> torch.Tensor:
        cuda_graph.replay()
        return logits

    return replay


@contextlib.contextmanager
def captured_on(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, pool=None) -> Iterator[None]:
    """Capture the block's work on ``stream`` into ``graph``, in :data:`CAPTURE_ERROR_MODE`, its memory from ``pool``
    (None: a pool of its own). ``torch.cuda.graph``
    does the same after a device-wide synchronize and an ``empty_cache``, to free memory for the graph: in a
    background rollout those would stall the learner's thread and drop its cached blocks. A capture the block fails
    is ended before its error propagates (its own end-of-capture error is dropped)."""
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode=CAPTURE_ERROR_MODE)
        try:
            yield
        except BaseException:
            with contextlib.suppress(RuntimeError):
                graph.capture_end()
            raise
        graph.capture_end()


def uncached_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast in force on ``device``'s type, without its cache of cast weights (a graph must not capture a
    cast it would read from a cache filled outside it: PyTorch's CUDA-graph notes); no context without autocast."""
    kind = device.type
    if not torch.is_autocast_enabled(kind):
        return contextlib.nullcontext()
    return torch.autocast(kind, dtype=torch.get_autocast_dtype(kind), cache_enabled=False)


def decode_step(model, buffer: KVBuffer, max_new_tokens: int, graphs: GraphCache | None,
                sampling: Sampling | None = None) -> DecodeStep | SampledStep:
    """The step :func:`run_decode` runs: one from ``graphs`` (:meth:`GraphCache.step`; sampling in the graph as
    ``sampling`` says, when given) on a device it serves when at least :data:`MIN_GRAPH_STEPS` tokens are to be
    sampled, else :class:`~dppo_oat.rollout.decode.EagerStep`. A capture that fails warns once and turns the graphs
    off: every later call decodes eagerly (a retried capture would cost a warm-up and a failed capture at every
    call)."""
    if graphs is None or not graphs.serves(buffer.valid.device) or max_new_tokens < MIN_GRAPH_STEPS:
        return EagerStep(model, buffer)
    try:
        return graphs.step(model, buffer, sampling)
    except (RuntimeError, TypeError, ValueError) as error:
        warnings.warn(f"capturing the decode step in a CUDA graph failed ({error}); this generator decodes eagerly "
                      "from now on", stacklevel=2)
        return EagerStep(model, buffer)


def stop_check_interval(step: DecodeStep) -> int:
    """How often :func:`~dppo_oat.rollout.decode.decode` reads the stop flags for ``step``: every
    :data:`STOP_CHECK_EVERY` steps for a replayed graph (a read waits for the device), every step otherwise (the
    host is the bottleneck there, and a step past the stop costs a whole eager forward)."""
    return STOP_CHECK_EVERY if isinstance(step, GraphedStep) else 1


def run_decode(model, state: Prefilled, step: DecodeStep | SampledStep, sampling: Sampling, *, max_new_tokens: int,
               stop_ids: torch.Tensor, keep_logprobs: bool, draw_order: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> Decoded:
    """Decode ``state`` with ``step`` (:func:`decode_step`) as ``sampling`` says (``stop_ids``: its stop ids, on the
    model's device): :func:`~dppo_oat.rollout.decode.decode_in_graph` for a step that samples in its graph (which
    must have been captured for ``sampling``), else :func:`~dppo_oat.rollout.decode.decode`, reading the stop flags
    every :func:`stop_check_interval` steps."""
    settings = dict(max_new_tokens=max_new_tokens, temperature=sampling.temperature, stop_ids=stop_ids,
                    pad_id=sampling.pad_id, keep_logprobs=keep_logprobs, draw_order=draw_order, generator=generator)
    if isinstance(step, SampledStep):
        if step.graph.key.sampling != sampling:
            raise ValueError(f"the step's graph samples as {step.graph.key.sampling}, the call asks {sampling}")
        return decode_in_graph(state, step, **settings)
    return decode(model, state, step=step, stop_check_every=stop_check_interval(step), **settings)
