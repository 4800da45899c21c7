"""What ``--token-export all`` costs on the default run; prints one JSON object.

Two local trainers of the default configuration (``python -m dppo_oat.train`` with no arguments) and the same seed
take the same RL steps in turn, one with ``--token-export all`` and one without: their rollouts and updates are the
same, so each step's pair differs only by the export. They alternate which goes first (ABBA), and after each pair
the bench waits for the step's file, so the writer thread never overlaps the other trainer's step. Reported:

- ``step_seconds_off`` / ``step_seconds_on``: median wall time of one RL step (rollout + update + hand-off);
- ``on_vs_off`` / ``update_on_vs_off``: the median over steps of each step's ratio on ÷ off, of the whole step and of
  its update (``time/update``: the loss calls the exporter observes, and ``write``'s hand-off). On a shared machine
  the rollout's wall time varies by more than the export costs, so these are noisy;
- ``main_thread_seconds_per_step``: the median time the training thread spends in the exporter (``observe`` of every
  micro-batch and ``write``'s hand-off), and its share of the off step (``main_thread_share``);
- ``writer_seconds_per_step``: the median time the writer thread takes for a step's file (during the next step's
  rollout in a run), its share of the off step (``writer_share``), and ``bytes_per_step``;
- ``cost_upper_bound``: ``main_thread_share + writer_share``, the export's cost as a share of a step were the writer
  on the hot path (target ≤ 0.10);
- off: the exporter is never built (``trainer.exporter is None``): nothing is observed or written.

Usage: ``python scripts/bench/token_export.py [--steps 20] [--cache-dir DIR] [--version TEXT]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import tyro

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.trainer import LocalTrainer
from dppo_oat.run.token_export import TokenExporter


class TimedExporter(TokenExporter):
    """The exporter, with the seconds each step spends in it on the training thread and in the writer thread."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.main_seconds, self.writer_seconds = [0.0], []

    def observe(self, *args) -> None:
        start = time.perf_counter()
        super().observe(*args)
        self.main_seconds[-1] += time.perf_counter() - start

    def write(self, *args, **kwargs) -> None:
        start = time.perf_counter()
        super().write(*args, **kwargs)
        self.main_seconds[-1] += time.perf_counter() - start
        self.main_seconds.append(0.0)

    def _write_step(self, *args) -> None:
        start = time.perf_counter()
        super()._write_step(*args)
        self.writer_seconds.append(time.perf_counter() - start)


def trainer(runs_dir: str, name: str, cache_dir: str | None, export: bool) -> LocalTrainer:
    args = ["--runs-dir", runs_dir, "--run-name", name, "--token-export", "all" if export else "none"]
    config = tyro.cli(TrainConfig, args=args + (["--cache-dir", cache_dir] if cache_dir else []))
    built = LocalTrainer(config)
    if export:
        built.exporter = TimedExporter(built.run_dir)
    return built


def timed_step(run: LocalTrainer) -> tuple[float, float]:
    """One RL step's wall seconds and its update's (``time/update``)."""
    run.step_in_progress = run.step + 1
    start = time.perf_counter()
    metrics = run.rl_step()
    return time.perf_counter() - start, metrics["time/update"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="RL steps each trainer takes")
    parser.add_argument("--cache-dir", default=None, help="the tokenizer/policy cache (default: the run's)")
    parser.add_argument("--version", default="", help="what the row measures, recorded in it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs_dir:
        off, on = trainer(runs_dir, "off", args.cache_dir, False), trainer(runs_dir, "on", args.cache_dir, True)
        assert off.exporter is None
        off_steps, on_steps = [], []
        for step in range(args.steps):
            for run, times in ((off, off_steps), (on, on_steps))[:: 1 if step % 2 == 0 else -1]:
                times.append(timed_step(run))
            on.exporter.wait()
        on.exporter.close()
        sizes = [on.run_dir.export(step).stat().st_size for step in range(1, args.steps + 1)]
        exported = not off.run_dir.token_exports.exists()
        main_seconds = statistics.median(on.exporter.main_seconds[:-1])
        writer = statistics.median(on.exporter.writer_seconds)
        off_step = statistics.median(w for w, _ in off_steps)
        off.close(), on.close()
    row = {
        "version": args.version, "device": f"cpu ({torch.get_num_threads()} threads)", "steps": args.steps,
        "step_seconds_off": statistics.median(w for w, _ in off_steps),
        "step_seconds_on": statistics.median(w for w, _ in on_steps),
        "on_vs_off": statistics.median(b[0] / a[0] for a, b in zip(off_steps, on_steps, strict=True)),
        "update_on_vs_off": statistics.median(b[1] / a[1] for a, b in zip(off_steps, on_steps, strict=True)),
        "main_thread_seconds_per_step": main_seconds, "main_thread_share": main_seconds / off_step,
        "writer_seconds_per_step": writer, "writer_share": writer / off_step,
        "cost_upper_bound": (main_seconds + writer) / off_step, "target": 0.10,
        "bytes_per_step": statistics.median(sizes), "off_writes_nothing": exported,
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
