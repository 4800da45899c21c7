"""How many operations one rollout of the local engine dispatches; prints ONE JSON object.

On a GPU each tensor operation is a kernel launch with a fixed host cost of microseconds, whatever its size; a small
policy's rollout does little arithmetic per operation, so its time on a GPU follows the number of operations, not
the FLOPs. This counts them on any device (the CPU too) with ``torch.profiler`` over one rollout batch of the default
run (the trainer's own collector, generator and settings), after one untimed rollout:

- ``sampled_tokens``: tokens the rollout sampled; ``forwards``: model forward passes (one embedding lookup each);
- ``kernel_ops``: leaf ``aten`` operations that compute (a CUDA run launches about one kernel for each), leaving out
  views and allocations (:data:`NO_KERNEL`); ``kernel_ops_per_token`` and ``kernel_ops_per_forward``;
- ``dispatched_ops``: every ``aten`` call, nested ones included; ``scalar_reads``: ``.item()``-style reads (a host
  sync each on a GPU);
- ``seconds``: the rollout's wall time here, unprofiled (median of ``--repeats``); ``runs_direct``: whether the
  generator samples with its own loop (:func:`~dppo_oat.rollout.direct_forward.runs_direct`) or ``generate``;
- ``op_microseconds``: the host's cost of one small operation on the device (a loop of in-place adds, then one
  synchronisation), the floor under every kernel op above;
- where the host's time goes, for a rollout slower than its operations explain: ``top_self_ms``, the profiler's
  entries with the most time of their own (on a GPU these include ``cudaLaunchKernel``, ``cudaStreamSynchronize``
  and ``cudaMemcpyAsync``), ``device_busy_ms``, the time the GPU spent in kernels, ``top_python_s``, the Python
  functions with the most time of their own, and ``top_project_cumulative_s``, the project's functions with the most
  time under them (cProfile, a separate rollout).

    python scripts/bench/rollout_ops.py [--repeats 3] [-- TrainConfig flags, e.g. --device cuda --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tyro

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.progress import line_console
from dppo_oat.engines.local.seeds import step_seed, train_group_seeds
from dppo_oat.engines.local.trainer import LocalTrainer

NO_KERNEL = frozenset({
    "aten::view", "aten::as_strided", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view", "aten::t",
    "aten::transpose", "aten::slice", "aten::select", "aten::narrow", "aten::unsqueeze", "aten::squeeze",
    "aten::expand", "aten::permute", "aten::alias", "aten::detach", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::result_type", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::resize_", "aten::item", "aten::_local_scalar_dense", "aten::split", "aten::unbind", "aten::chunk",
    "aten::to",
})
"""aten operations that launch no kernel as leaves: views, allocations, scalar reads, a ``to`` that changes nothing
(one that converts calls ``aten::_to_copy``, and so is no leaf)."""


TOP = 10
"""Entries in each list of where the time goes."""


def collect(trainer: LocalTrainer, step: int):
    """One rollout batch of ``step``, as the trainer's synchronous step samples it."""
    c = trainer.config
    seeds = train_group_seeds(c.seed, step, c.groups_per_step, c.train_pool)
    return trainer.collector.collect(trainer.generator, trainer._sampling(step_seed(c.seed, step, 1)), seeds)


def leaf_counts(events) -> Counter:
    """Calls of each ``aten`` operation that called no other ``aten`` operation."""
    return Counter(event.name for event in events if event.name.startswith("aten::")
                   and not any(child.name.startswith("aten::") for child in event.cpu_children))


def count_ops(trainer: LocalTrainer, step: int) -> dict:
    """The operation counts of the rollout of ``step`` (see the module docstring); on a GPU the profiler also
    records the CUDA runtime's calls (launches, synchronisations, copies)."""
    on_gpu = trainer.config.device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=activities) as prof:
        rollout = collect(trainer, step)
    events = prof.events()
    leaves = leaf_counts(events)
    kernel_ops = sum(count for name, count in leaves.items() if name not in NO_KERNEL)
    tokens = int(rollout.stats()["generated_tokens"])
    forwards = sum(1 for event in events if event.name == "aten::embedding")  # one lookup per forward
    return {"sampled_tokens": tokens, "turn_samples": len(rollout.samples), "forwards": forwards,
            "kernel_ops": kernel_ops, "kernel_ops_per_token": round(kernel_ops / max(tokens, 1), 1),
            "kernel_ops_per_forward": round(kernel_ops / max(forwards, 1), 1),
            "dispatched_ops": sum(1 for event in events if event.name.startswith("aten::")),
            "scalar_reads": leaves["aten::_local_scalar_dense"],
            "top_kernel_ops": dict(Counter({n: c for n, c in leaves.items() if n not in NO_KERNEL}).most_common(8)),
            "top_self_ms": {entry.key: round(entry.self_cpu_time_total / 1e3, 1) for entry in
                            sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:TOP]},
            "device_busy_ms": round(sum(device_self_us(entry) for entry in prof.key_averages()) / 1e3, 1)
            if on_gpu else None}


def device_self_us(entry) -> float:
    """An entry's own time on the device (the attribute's name differs between torch versions)."""
    return float(getattr(entry, "self_device_time_total", getattr(entry, "self_cuda_time_total", 0.0)) or 0.0)


def op_microseconds(device: str, ops: int = 2000) -> float:
    """The host's cost of one tiny operation on ``device``: ``ops`` in-place adds on a one-element tensor, then one
    synchronisation (after a warm-up)."""
    x = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(100):
        x.add_(1)
    sync()
    started = time.perf_counter()
    for _ in range(ops):
        x.add_(1)
    sync()
    return round((time.perf_counter() - started) / ops * 1e6, 2)


def python_hotspots(trainer: LocalTrainer, step: int) -> dict:
    """The :data:`TOP` Python functions with the most time of their own in the rollout of ``step``, and the project's
    :data:`TOP` with the most time under them (cProfile)."""
    profiler = cProfile.Profile()
    profiler.runcall(collect, trainer, step)
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive, own, cumulative, callers)}
    top = sorted(stats.items(), key=lambda item: -item[1][2])[:TOP]
    project = sorted(((key, cumulative) for key, (_, _, _, cumulative, _) in stats.items()
                      if "dppo_oat" in Path(key[0]).parts), key=lambda item: -item[1])[:TOP]
    return {"top_python_s": {f"{Path(file).name}:{line}:{name}": round(own, 3)
                             for (file, line, name), (_, _, own, _, _) in top},
            "top_project_cumulative_s": {f"{Path(file).name}:{line}:{name}": round(cumulative, 3)
                                         for (file, line, name), cumulative in project}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts (the median is reported)")
    parser.add_argument("flags", nargs="*", help="TrainConfig flags (after --), e.g. --dtype bfloat16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs_dir:
        config = tyro.cli(TrainConfig, args=["--runs-dir", runs_dir, *args.flags])
        trainer = LocalTrainer(config, line_console(stderr=True))
        try:
            collect(trainer, 1)  # untimed: first-call costs stay out
            seconds = []
            for repeat in range(args.repeats):
                started = time.perf_counter()
                collect(trainer, 2 + repeat)
                seconds.append(time.perf_counter() - started)
            fresh = 2 + args.repeats  # a step none of the timed rollouts sampled
            report = count_ops(trainer, fresh)
            report.update(python_hotspots(trainer, fresh + 1))
            report["runs_direct"] = getattr(trainer.generator, "runs_direct", None)
        finally:
            trainer.close()
    print(json.dumps({"device": config.device, "dtype": config.dtype, "flags": args.flags, **report,
                      "seconds": round(statistics.median(seconds), 3), "threads": torch.get_num_threads(),
                      "op_microseconds": op_microseconds(config.device)}))


if __name__ == "__main__":
    main()
