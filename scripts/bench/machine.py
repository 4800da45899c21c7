"""What the machine itself can do, measured where the benchmarks run: memory bandwidth (a large copy) and the peak
matrix-product rate (a large matmul). The benchmarks state their results against these, not against a data sheet.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(run: Callable[[], object], device: torch.device | str, repeats: int, warmup: int = 1) -> float:
    """The median wall time of ``repeats`` calls of ``run`` after ``warmup`` calls, the device synchronized around
    each."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(device: torch.device | str, mib: int, repeats: int = 10) -> float:
    """Bytes per second of ``dst.copy_(src)`` on ``device`` for buffers of ``mib`` MiB, counting the bytes read and
    written (2 × size ÷ time): on a GPU a device-to-device copy in its memory (HBM), on the CPU a copy in RAM."""
    source = torch.empty(mib * 2**20, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device, repeats)
    return 2 * source.numel() / seconds


def matmul_flops(device: torch.device | str, dtype: torch.dtype, size: int, repeats: int = 10) -> float:
    """FLOP/s of one ``size``³ matrix product in ``dtype`` on random data (2·size³ FLOPs): the peak the model FLOP
    utilisation is stated against."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    seconds = median_seconds(lambda: a @ b, device, repeats, warmup=3)
    return 2 * size**3 / seconds
