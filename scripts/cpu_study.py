"""The paper's stability and efficiency findings at CPU scale (sec:stability, sec:training_efficiency), one command.

The paper's sanity test trains a policy on problems it can already solve sometimes, with several gradient steps
per rollout, so that a stable method climbs towards 100% training success while unconstrained ones (PG-IS, CISPO)
and the recompute-anchored MiniRL drift as the training-inference mismatch accumulates. Here, with the local engine:

- tasks: ``sudoku`` (``game:Sudoku-v0-easy``, compact observation with the last wrong move, the local engine's
  default) and ``countdown`` (``example:Countdown-v0``),
  each from one tiny policy warm-started to partial success (cached; every seed starts from it), trained on a fixed
  pool of puzzles (the sanity test's fixed problem set) and evaluated on held-out puzzles at the start and the end;
- methods: PG-IS, CISPO, GRPO-ClipHigher, MiniRL, mask-negative, DPPO-Binary-TV, DPPO-Binary-KL, DPPO-TopK-TV;
- mismatch: ``none`` (fp32 rollout and learner) and ``bf16`` (rollout from a bfloat16 copy, learner in fp32, as
  the paper's BFloat16 training exposes it);
- seeds 0, 1, 2; four minibatches (gradient steps) per rollout, as the paper's sanity test;
- every ``--probe-every`` steps, binary vs top-K vs exact divergence on the step's real batch.

Every run is an ordinary local-engine run (``runs/cpu_study/<task>/<method>-<mismatch>-s<seed>``), played by
``python -m dppo_oat.train`` in its own process, ``--workers`` at a time. The study is resumable: finished runs are
skipped and a killed run continues from its last checkpoint (``--resume``), so it can be completed in several
sittings; ``study.json`` records the plan, each run's state, wall time and log. The report is
``notebooks/cpu_study.ipynb``. Budget (2 cores): see README "CPU study".

    python scripts/cpu_study.py                   # the whole study (resumable: run it again after a kill)
    python scripts/cpu_study.py --dry-run         # the plan and the state of each run
    python scripts/cpu_study.py --tasks sudoku --seeds 0   # a part of it
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Literal, Optional, Tuple

import tyro
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from dppo_oat.runlog import CHECKPOINT_FILE, EVAL_FILE, atomic_write_bytes, read_jsonl
from dppo_oat.trust_region import PRESETS

METHODS = ("pg_is", "cispo", "grpo_clip_higher", "minirl", "mask_negative", "dppo_binary_tv", "dppo_binary_kl",
           "dppo_topk_tv")
"""The methods of the paper's sanity test (fig:sanity_test) and of its mask ablation, by preset name (the default
grid; ``--methods`` takes any preset, e.g. the mismatch fixes ``tis icepop seq_geo_mask dppo_binary_tv_kl``)."""
MISMATCH_ARGS = {"none": (), "bf16": ("--rollout-dtype", "bfloat16")}
"""Injected training-inference mismatch: none, or sampling from a bfloat16 copy of the fp32 learner."""


@dataclass(frozen=True)
class Task:
    """One task of the study: a Gem id and the local-engine flags that fit it."""

    env_id: str
    args: Tuple[str, ...] = ()


TASKS: Dict[str, Task] = {
    "sudoku": Task("game:Sudoku-v0-easy-compact-wrong", ("--max-new-tokens", "12")),
    "countdown": Task("example:Countdown-v0", ("--max-new-tokens", "16")),
}
TaskName = Literal[tuple(TASKS)]  # type: ignore[valid-type]
MethodName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
MismatchName = Literal[tuple(MISMATCH_ARGS)]  # type: ignore[valid-type]


@dataclass
class StudyConfig:
    """The CPU study's grid and the settings every run shares."""

    out_dir: str = "runs/cpu_study"
    tasks: Tuple[TaskName, ...] = tuple(TASKS)  # type: ignore[valid-type]
    methods: Tuple[MethodName, ...] = METHODS  # type: ignore[valid-type]
    mismatch: Tuple[MismatchName, ...] = tuple(MISMATCH_ARGS)  # type: ignore[valid-type]
    seeds: Tuple[int, ...] = (0, 1, 2)
    steps: int = 50
    """RL steps (rollout batches) per run."""
    groups_per_step: int = 8
    group_size: int = 4
    minibatches_per_rollout: int = 4
    """Gradient steps per rollout batch (the paper's sanity test: 4)."""
    lr: float = 5e-4
    """Above the local engine's default (3e-4): with four gradient steps per rollout, where a trust region matters."""
    train_pool: int = 64
    """Training puzzles come from this fixed pool of seeds (the sanity test's fixed problem set)."""
    probe_every: int = 10
    eval_episodes: int = 100
    """Held-out episodes at the start and at the end of each run."""
    warm_start_seed: int = 0
    """One warm-started policy per task, shared by every method and seed."""
    workers: int = 2
    """Runs played at once (one CPU thread each)."""
    extra_args: str = ""
    """More flags for every run, as one string: ``--extra-args="--warm-start.demo-episodes 200"``."""
    dry_run: bool = False
    """Print the plan and each run's state; train nothing."""

    def __post_init__(self) -> None:
        for name in ("steps", "groups_per_step", "minibatches_per_rollout", "train_pool", "eval_episodes", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not (self.tasks and self.methods and self.mismatch and self.seeds):
            raise ValueError("the study needs at least one task, method, mismatch setting and seed")


@dataclass(frozen=True)
class StudyRun:
    """One cell of the grid."""

    task: str
    method: str
    mismatch: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}-{self.mismatch}-s{self.seed}"

    def run_dir(self, config: StudyConfig) -> Path:
        return Path(config.out_dir) / self.task / self.name


def plan(config: StudyConfig) -> list[StudyRun]:
    """Every run of the study, task by task, seed-major (so a partial study has whole seeds of every method)."""
    return [StudyRun(task, method, mismatch, seed) for task in config.tasks for seed in config.seeds
            for mismatch in config.mismatch for method in config.methods]


def shared_args(task: str, config: StudyConfig) -> list[str]:
    """Flags every run of ``task`` shares (and the warm start of its policy)."""
    return ["--env-ids", TASKS[task].env_id, *TASKS[task].args, "--steps", str(config.steps),
            "--groups-per-step", str(config.groups_per_step), "--group-size", str(config.group_size),
            "--minibatches-per-rollout", str(config.minibatches_per_rollout), "--lr", str(config.lr),
            "--train-pool", str(config.train_pool), "--probe-every", str(config.probe_every),
            "--eval-every", str(config.steps), "--eval-episodes", str(config.eval_episodes),
            "--warm-start.seed", str(config.warm_start_seed), *shlex.split(config.extra_args)]


def train_args(run: StudyRun, config: StudyConfig, resume: bool) -> list[str]:
    """The ``python -m dppo_oat.train`` flags of ``run``."""
    return [*shared_args(run.task, config), "--trust-region", run.method, *MISMATCH_ARGS[run.mismatch],
            "--seed", str(run.seed), "--threads", "1", "--run-dir", str(Path(config.out_dir) / run.task),
            "--run-name", run.name, *(["--resume"] if resume else [])]


def run_state(run_dir: Path, steps: int) -> str:
    """``done`` (its last evaluation is at the last step), ``partial`` (a checkpoint to resume) or ``new``."""
    evals = read_jsonl(run_dir / EVAL_FILE)
    if evals and evals[-1].get("step") == steps:
        return "done"
    return "partial" if (run_dir / CHECKPOINT_FILE).exists() else "new"


def prepare_policies(config: StudyConfig, console: Console) -> None:
    """Warm-start (or find cached) each task's tiny policy once, before runs share it."""
    from dppo_oat.engines.local.config import TrainConfig
    from dppo_oat.engines.local.policy import load_or_build_tiny_policy

    for task in config.tasks:
        train_config = tyro.cli(TrainConfig, args=shared_args(task, config))
        load_or_build_tiny_policy(train_config, console)


def play(run: StudyRun, config: StudyConfig) -> dict:
    """Train ``run`` in its own process (resuming it if it was interrupted); its output goes to a log file."""
    run_dir = run.run_dir(config)
    log_path = Path(config.out_dir) / "logs" / f"{run.task}-{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    state = run_state(run_dir, config.steps)
    if state == "new" and run_dir.exists():  # killed before its first checkpoint: nothing to resume from
        shutil.rmtree(run_dir)
    resume = state == "partial"
    command = [sys.executable, "-m", "dppo_oat.train", *train_args(run, config, resume)]
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    with open(log_path, "a") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return {"run": f"{run.task}/{run.name}", "returncode": code, "seconds": time.perf_counter() - started,
            "resumed": resume, "log": str(log_path), "state": run_state(run_dir, config.steps)}


def write_manifest(config: StudyConfig, runs: list[StudyRun], results: dict) -> None:
    """``study.json``: the settings, and per run its state and, when played in this sitting, how it went."""
    manifest = {"config": asdict(config), "runs": [
        {**asdict(run), "name": run.name, "dir": str(run.run_dir(config)), "state": run_state(run.run_dir(config),
                                                                                              config.steps),
         **results.get(f"{run.task}/{run.name}", {})} for run in runs]}
    path = Path(config.out_dir) / "study.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(manifest, indent=1).encode())


def play_all(config: StudyConfig, todo: list[StudyRun], runs: list[StudyRun], console: Console) -> dict:
    """Play ``todo`` with ``config.workers`` processes, updating ``study.json`` after every run."""
    results: dict = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console) as progress, ThreadPoolExecutor(config.workers) as pool:
        bar = progress.add_task("CPU study runs", total=len(todo))
        futures = {pool.submit(play, run, config): run for run in todo}
        for future in as_completed(futures):
            result = future.result()
            results[result["run"]] = result
            write_manifest(config, runs, results)
            status = "ok" if result["returncode"] == 0 else f"FAILED (exit {result['returncode']}, {result['log']})"
            progress.console.print(f"{result['run']}: {status}, {result['seconds']:.0f} s")
            progress.advance(bar)
    return results


def main(argv=None) -> None:
    config = tyro.cli(StudyConfig, args=argv, description=__doc__)  # bad settings: one message, exit code 2
    console = Console()
    runs = plan(config)
    states = {run: run_state(run.run_dir(config), config.steps) for run in runs}
    todo = [run for run in runs if states[run] != "done"]
    counts = {state: sum(1 for s in states.values() if s == state) for state in ("done", "partial", "new")}
    console.print(f"CPU study in {config.out_dir}: {len(runs)} runs ({counts['done']} done, "
                  f"{counts['partial']} to resume, {counts['new']} new)")
    if config.dry_run:
        for run in runs:
            console.print(f"  {states[run]:>7}  {run.task}/{run.name}")
        return
    prepare_policies(config, console)
    results = play_all(config, todo, runs, console)
    write_manifest(config, runs, results)
    failed = [name for name, result in results.items() if result["returncode"] != 0]
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed (see their logs): {', '.join(failed)}")
    console.print(f"done: report with notebooks/cpu_study.ipynb (STUDY_DIR={config.out_dir})")


if __name__ == "__main__":
    main()
