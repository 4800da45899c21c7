"""The decode step captured in a CUDA graph: one replay launches the whole forward of a step.

A small policy's decode step is hundreds of small kernels, each launched by the host at a fixed cost of microseconds
(about 12 µs each on the H100 host the GPU check measured), so the step takes far longer than the GPU computes. As
vLLM does for its decode batches, :class:`GraphedStep` records the step's kernels once, in a CUDA graph, and each
step then replays them with new inputs in one launch. A graph replays fixed shapes and fixed host-side values, so
the captured step is :class:`~dppo_oat.rollout.decode.StaticStep` (attention over the buffer's whole capacity, the
column to write given by a device tensor); one graph serves the decode of one generator call, on that call's
buffer. A capture first runs the step eagerly :data:`WARMUP_STEPS` times and then records it, so a call with fewer
than :data:`MIN_GRAPH_STEPS` tokens to sample decodes eagerly; a capture that fails warns and decodes eagerly. Not
yet measured on a GPU: the GPU check's ``rollout`` step times it.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch

from dppo_oat.rollout.decode import DecodeStep, EagerStep, StaticStep
from dppo_oat.rollout.direct_forward import KVBuffer, decode_forward

MIN_GRAPH_STEPS = 16
"""The fewest tokens to sample for which a call captures its decode step."""
WARMUP_STEPS = 2
"""Eager runs of the step on a side stream before the capture (lazy initialisation stays out of the graph); the
capture then runs on that stream, whose library handles exist."""
CAPTURE_ERROR_MODE = "thread_local"
"""What a capture forbids (``cudaStreamCaptureMode``): unsafe calls of its own thread only. A background rollout
(``--max-staleness``) captures while the learner's thread updates, and under the default ``global`` mode the
learner's next ``cudaMalloc`` would fail the update and the capture both (PyTorch's compiled graphs capture in this
mode too, beside autograd's threads)."""


class GraphedStep:
    """:class:`~dppo_oat.rollout.decode.StaticStep` on ``buffer`` captured in a CUDA graph for ``batch`` rows: each
    call copies the tokens and positions into the graph's inputs, points the column at the buffer's next one and
    replays. The logits it returns are the graph's own output tensor, overwritten by the next call."""

    def __init__(self, model, buffer: KVBuffer, batch: int):
        self.static = StaticStep(model, buffer)
        self.buffer = buffer
        device = buffer.valid.device
        self.token_ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.graph = torch.cuda.CUDAGraph()
        with uncached_autocast(device):
            self.static.point_at_next_column()  # the warm-up writes where the first real step will write again
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    decode_forward(model, buffer, self.token_ids, self.positions, self.static.column)
            torch.cuda.current_stream(device).wait_stream(side)
            with captured_on(self.graph, side):
                self.logits = decode_forward(model, buffer, self.token_ids, self.positions, self.static.column)

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.token_ids.copy_(token_ids)
        self.positions.copy_(positions)
        self.static.point_at_next_column()
        self.graph.replay()
        self.buffer.width += 1
        return self.logits


@contextlib.contextmanager
def captured_on(graph: "torch.cuda.CUDAGraph", stream: "torch.cuda.Stream") -> Iterator[None]:
    """Capture the block's work on ``stream`` into ``graph``, in :data:`CAPTURE_ERROR_MODE`. ``torch.cuda.graph``
    does the same after a device-wide synchronize and an ``empty_cache``, to free memory for the graph: in a
    background rollout, at every generator call, those would stall the learner's thread and drop its cached blocks.
    A capture the block fails is ended before its error propagates (its own end-of-capture error is dropped)."""
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode=CAPTURE_ERROR_MODE)
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


def decode_step(model, buffer: KVBuffer, batch: int, max_new_tokens: int, cuda_graphs: bool) -> DecodeStep:
    """The step :func:`~dppo_oat.rollout.decode.decode` runs: a :class:`GraphedStep` on a CUDA device when
    ``cuda_graphs`` and at least :data:`MIN_GRAPH_STEPS` tokens are to be sampled (the eager step if the capture
    fails, with a warning), else :class:`~dppo_oat.rollout.decode.EagerStep`."""
    if not (cuda_graphs and buffer.valid.device.type == "cuda" and max_new_tokens >= MIN_GRAPH_STEPS):
        return EagerStep(model, buffer)
    try:
        return GraphedStep(model, buffer, batch)
    except (RuntimeError, TypeError, ValueError) as error:
        warnings.warn(f"capturing the decode step in a CUDA graph failed ({error}); decoding eagerly", stacklevel=2)
        return EagerStep(model, buffer)
