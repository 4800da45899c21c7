"""Rollouts with bounded staleness: wall time per RL step of the default configuration at ``--max-staleness`` 0
(synchronous), 1 and 2; prints one JSON object.

Every arm trains ``--steps`` RL steps of the default task from the same start (the shipped warm-started policy, the
default seed), in a fresh run directory, evaluation pushed past the run; the first step (a synchronous rollout in
every arm) is left out, and ``seconds_per_rl_step`` is the median of the others' wall times. ``speedup_k1`` and
``speedup_k2`` are the synchronous median over each asynchronous one. The arms run in turn, ``--rounds`` times
(A B C A B C …), so that a machine's drift falls on each alike; each arm of a round is a new trainer. On a CPU the
background rollout and the update share the cores, so the gain is bounded by how much of a step either leaves idle.

Usage: ``python scripts/bench/async_rollout.py [--steps 6] [--rounds 2] [--note TEXT]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.progress import line_console
from dppo_oat.engines.local.trainer import LocalTrainer

STALENESS = (0, 1, 2)
"""The arms: synchronous, one and two versions behind."""


def step_seconds(max_staleness: int, steps: int, runs_dir: str) -> list[float]:
    """Wall time of each RL step after the first, in a fresh run of the default configuration."""
    config = TrainConfig(max_staleness=max_staleness, steps=steps, eval_every=10 * steps, eval_episodes=1,
                         runs_dir=runs_dir, run_name=f"k{max_staleness}-{time.monotonic_ns()}")
    trainer = LocalTrainer(config, line_console(stderr=True))
    try:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.rl_step()
            times.append(time.perf_counter() - start)
        return times[1:]
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="RL steps of each timed run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of k = 0, 1, 2")
    parser.add_argument("--note", default="", help="a note stored in the row (the machine's state)")
    args = parser.parse_args()
    times: dict[int, list[float]] = {k: [] for k in STALENESS}
    with tempfile.TemporaryDirectory() as runs_dir:
        for _ in range(args.rounds):
            for k in STALENESS:
                times[k] += step_seconds(k, args.steps, runs_dir)
    median = {k: statistics.median(times[k]) for k in STALENESS}
    report = {"bench": "async_rollout", "device": f"cpu ({os.cpu_count()} cores)", "threads": torch.get_num_threads(),
              "steps": args.steps, "rounds": args.rounds,
              **{f"seconds_per_rl_step_k{k}": median[k] for k in STALENESS},
              **{f"speedup_k{k}": median[0] / median[k] for k in STALENESS[1:]}}
    if args.note:
        report["note"] = args.note
    print(json.dumps(report))


if __name__ == "__main__":
    main()
