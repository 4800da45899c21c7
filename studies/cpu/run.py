"""The paper's stability and efficiency findings at CPU scale (sec:stability, sec:training_efficiency), one command.

The paper's premise is a training-inference mismatch: the rollout engine's μ differs from the learner's π_θ
because the engines compute differently, and the gap accumulates without a trust region anchored on μ. With
several gradient steps per rollout, policy drift across minibatches (staleness) adds to it, so this study keeps the
two causes apart (see ``CONDITIONS``): one gradient step per rollout with a genuinely lower-precision rollout copy
(bf16, fp16, int8 weights) or noise on the reported log μ, against four gradient steps per rollout at two learning
rates. The arms are grouped into ``EXPERIMENTS``; the claims each is scored on, with their margins, were written down
before the runs in :data:`studies.cpu.claims.CONTRASTS`.

- task: ``sudoku`` (``game:Sudoku-v0-easy``, compact observation with the last wrong move, the local engine's
  default), from one tiny policy warm-started to partial success (:data:`STUDY_WARM_START`; every run starts from
  it), trained on a fixed pool of puzzles (the sanity test's fixed problem set) and evaluated on held-out puzzles at
  the start and the end;
- task: ``guess`` (``game:GuessTheNumber-v0-easy-compact``, the ``guess`` experiment), from its own tiny policy,
  warm-started once on binary-search moves, with the flags of ``TASKS["guess"]`` (they override the study's);
- every arm on the same seeds (0–4 by default): paired comparisons;
- every ``--probe-every`` steps, binary vs top-K vs exact divergence on the step's real batch.

Every run is an ordinary local-engine run (``runs/cpu_study/<task>/<method>-<condition>-s<seed>``), played by
``python -m dppo_oat.train`` in its own process, ``--workers`` at a time. The study is resumable: finished runs are
skipped and a killed run continues from its last checkpoint (``--resume``), so it can be completed in several
sittings; ``study.json`` records the plan, each run's state, wall time and log. ``python -m studies.cpu.pack``
packs the runs' logs into ``studies/cpu/data`` (one Parquet file per task), which the report
``studies/cpu/cpu_study.ipynb`` reads.
Budget (2 cores): see docs/cpu-study.md. From the repository's root:

    python -m studies.cpu.run                     # the plan by experiment: plays nothing
    python -m studies.cpu.run --all-experiments   # the whole study (resumable: run it again after a kill)
    python -m studies.cpu.run --dry-run           # the plan and the state of each run
    python -m studies.cpu.run --experiments mismatch --seeds 0   # a part of it
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import tyro
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from dppo_oat.engines.local.progress import line_console
from dppo_oat.run.directory import CHECKPOINT_FILE, EVAL_FILE
from dppo_oat.run.safe_io import atomic_write_bytes, read_jsonl
from dppo_oat.settings.usage import one_line_usage_errors
from studies.cpu.claims import HELD_ARMS, MATCHED_ARMS, MATCHED_MORE_ARMS, SWEEP_ARMS
from studies.cpu.placebo import STUDY_PRESETS


@dataclass(frozen=True)
class Condition:
    """Where μ and π part in a run: the rollout engine's precision (a real engine mismatch), noise on the reported
    log μ, and staleness (gradient steps per rollout batch, at a learning rate; or rollouts sampled by weights
    ``max_staleness`` updates old, the local engine's asynchronous rollouts)."""

    precision: str = "float32"
    minibatches: int = 1
    lr: float = 5e-4
    logprob_noise: float = 0.0
    max_staleness: int = 0
    dtype: str = "float32"
    """The learner's and the sampler's compute dtype (``--dtype``; float16 scales the loss)."""
    epochs: int = 1
    """Passes over each rollout batch (``--num-epochs``): every pass after the first is off-policy."""
    redraw: bool = False
    """An int-quantised copy rounded on a grid redrawn at every re-sync (``--rollout-redraw``)."""

    def args(self) -> tuple[str, ...]:
        flags = ("--rollout-dtype", self.precision, "--minibatches-per-rollout", str(self.minibatches),
                 "--num-epochs", str(self.epochs), "--lr", str(self.lr), "--logprob-noise", str(self.logprob_noise),
                 "--dtype", self.dtype)
        if self.redraw:
            flags += ("--rollout-redraw",)
        if self.max_staleness:  # asynchronous rollouts run without the divergence probe (the engine refuses both)
            flags += ("--max-staleness", str(self.max_staleness), "--probe-every", "0")
        return flags


MATCHED_NOISE = 0.013
"""σ of the ``mech-noise`` condition's noise on log μ: on the study's Sudoku policy, DPPO-Binary-KL's mask then
blocks about as large a share of the tokens as it does under the int4 copy (4-step calibration runs on pilot seeds
100 and 101, before the runs; CHANGELOG.md)."""

CONDITIONS: dict[str, Condition] = {
    "mb1-fp32": Condition(),
    "mb1-bf16": Condition(precision="bfloat16"),
    "mb1-fp16": Condition(precision="float16"),
    "mb1-int8": Condition(precision="int8"),
    "mb1-noise0.1": Condition(logprob_noise=0.1),
    "mb1-noise0.5": Condition(logprob_noise=0.5),
    "mb4-fp32": Condition(minibatches=4),
    "mb4-fp32-lr1e-4": Condition(minibatches=4, lr=1e-4),
    "mb4-bf16": Condition(precision="bfloat16", minibatches=4),
    "mb1-int4": Condition(precision="int4"),
    "mb1-fp32-k2": Condition(max_staleness=2),
    "mb1-fp16-train": Condition(dtype="float16"),
    "steps-mb1": Condition(),
    "steps-mb4": Condition(minibatches=4),
    "steps-ep4": Condition(epochs=4),
    "steps-lr2e-3": Condition(lr=2e-3),
    "mb4-int4": Condition(precision="int4", minibatches=4),
    "mech-int4": Condition(precision="int4"),
    "mech-int4-redraw": Condition(precision="int4", redraw=True),
    "mech-noise": Condition(logprob_noise=MATCHED_NOISE),
    "field-mb4": Condition(minibatches=4),
    "v5-fp32": Condition(),
    "v5-int4": Condition(precision="int4"),
    "mb4-int4-lr1e-4": Condition(precision="int4", minibatches=4, lr=1e-4),
}
"""``mb1-*``: one gradient step per rollout (no staleness: π_θ' = π_θ at the step), so |π − μ| is the engine's
mismatch alone (fp32 < fp16 < int8 < bf16 on the shipped policy: about 2e-7, 2e-4, 5e-4, 1.3e-3 per token).
``mb1-noise*``: Gaussian noise of that σ on every reported log μ (the sampled token's and its top-K), a mismatch far
larger than the precision ones (at σ 0.1 a token with μ near 1 differs from π by more than δ_TV 0.15 one time in
seven). ``mb4-*``: four gradient steps per rollout, as the paper's sanity test: the later minibatches add policy
drift. ``mb1-int4``: a 4-bit weight-only rollout copy, the coarsest level at which the pilot
(``studies/cpu/mismatch_pilot.py``) saw DPPO's mask bind without training falling apart. ``*-k2``: one gradient step per
rollout, but each rollout sampled by the weights of two updates before (``--max-staleness 2``, from step 3 on):
staleness between rollout batches rather than within one.
``mb1-fp16-train``: the learner and the sampler both compute in float16 (fp32 master weights, loss scaling), as
FP16 training does on a GPU: μ and π_θ stay one computation, so this arm asks what the precision itself costs.
``steps-*``: staleness apart from the number of steps, on the policy of the later sittings (``steps-mb1`` and
``steps-mb4`` repeat the flags of ``mb1-fp32`` and ``mb4-fp32`` under their own names, so that the experiment
compares runs of one policy): four quarter-batch steps per rollout (``steps-mb4``), four full-batch passes
(``steps-ep4``: as many steps, as stale, on the whole batch), one step (``steps-mb1``) and one step at four times the
lr (``steps-lr2e-3``: about as far per rollout, never stale).
``mb4-int4``: the paper's regime, engine mismatch and staleness together: the int4 copy samples, and the learner
takes four quarter-batch steps per rollout, so π_θ (after the first step), the recomputed π_θ' and μ all differ.
``mech-*``: the ``takeaway2`` setting (one step per rollout) for the mechanism experiments, under names of their
own so that their claims score only runs played after them: ``mech-int4`` repeats ``mb1-int4``'s flags,
``mech-int4-redraw`` rounds the int4 copy on a grid redrawn at every re-sync (as large an error, not the same one
twice), and ``mech-noise`` samples with the fp32 learner and reports log μ with noise of σ :data:`MATCHED_NOISE`.
``field-mb4``: staleness alone for the field presets (``frontier_stale``): the flags of ``mb4-fp32`` on the v4
policy, under a name of its own so that its claims score only runs played after them.
``v5-fp32``: the flags of ``mb1-fp32`` for the mechanism's sign-matched placebo (``placebo``), and ``v5-int4`` those
of ``mech-int4`` for the sign claim's new seeds (``signs``), each under a name of its own. ``mb4-int4-lr1e-4``:
``mb4-int4`` at lr 1e-4, where four quarter-batch steps per rollout were harmless on an fp32 copy (``lr``), for
Takeaway 2 where training survives (``regime_lr``)."""


@dataclass(frozen=True)
class Experiment:
    """Methods × conditions, each run for every seed. A method is a preset, or ``preset@name=value,...``: the preset
    with ``--tr-<name> value`` overrides (e.g. ``mask_negative@delta=0.8``)."""

    methods: tuple[str, ...]
    conditions: tuple[str, ...]
    question: str
    tasks: tuple[str, ...] = ("sudoku",)
    """The tasks (``TASKS``) it runs on."""


EXPERIMENTS: dict[str, Experiment] = {
    "mismatch": Experiment(("pg_is", "minirl", "grpo_clip_higher", "dppo_binary_tv"), ("mb1-fp32", "mb1-bf16"),
                           "engine mismatch without staleness: does it hurt, and does anchoring on μ help "
                           "(Takeaways 1 and 2)?"),
    "int8": Experiment(("pg_is", "dppo_binary_tv"), ("mb1-int8",),
                       "the same with another genuine mismatch: a weight-quantised rollout copy"),
    "staleness": Experiment(("pg_is", "minirl", "grpo_clip_higher", "dppo_binary_tv", "dppo_topk_tv"), ("mb4-fp32",),
                            "four gradient steps per rollout at lr 5e-4, the sanity test's regime; top-K against "
                            "binary TV"),
    "lr": Experiment(("pg_is", "minirl", "grpo_clip_higher", "dppo_binary_tv", "dppo_topk_tv"), ("mb4-fp32-lr1e-4",),
                     "the same at lr 1e-4, where staleness alone should be harmless"),
    "recompute": Experiment(("dppo_binary_kl", "dppo_binary_kl_recompute", "minirl_tis"), ("mb1-bf16", "mb4-fp32"),
                            "Takeaway 2 with its own variants: the DPPO-KL mask anchored on μ or on the recomputed "
                            "π_θ', and MiniRL with truncated IS"),
    "takeaway3": Experiment(("mask_negative", "mask_negative@delta=0.8", "pg_is", "dppo_binary_tv"), ("mb4-fp32",),
                            "Takeaway 3: masking only negative samples that fell far (δ 0.5 and 0.8)"),
    "noise": Experiment(("pg_is", "dppo_binary_tv"), ("mb1-fp16", "mb1-noise0.1", "mb1-noise0.5"),
                        "larger engine mismatch without staleness: an fp16 rollout copy, and noise on the reported "
                        "log μ at two levels; does it hurt PG-IS, and does the mask on μ help or cost?"),
    "guess": Experiment(("pg_is", "minirl", "grpo_clip_higher", "dppo_binary_tv", "dppo_topk_tv"), ("mb4-fp32",),
                        "the staleness findings on a second task: Guess The Number (1-10, 4 turns)", tasks=("guess",)),
    "efficiency": Experiment(("relax_low", "relax_high", "relax_both", "relax_both@alpha=0.3", "grpo_clip_higher",
                              "dppo_binary_tv"), ("mb4-fp32",),
                             "sec:training_efficiency: which side of the ratio clip on low-μ tokens slows learning"),
    "later": Experiment(("pg_is", "dppo_binary_tv", "dppo_topk_tv", "drpo", "cppo", "m2po"), ("mb4-fp32",),
                        "later trust regions under staleness: DRPO's smooth regularizer, CPPO's prefix budget on "
                        "top-K TV and M2PO's batch second-moment mask against DPPO and PG-IS"),
    "takeaway2": Experiment(("dppo_binary_kl", "dppo_binary_kl_recompute", "minirl", "minirl_tis", "pg_is"),
                            ("mb1-int4",),
                            "Takeaway 2 where the anchor matters: an int4 rollout copy, whose engine mismatch makes "
                            "the mask fire at one gradient step per rollout (the pilot's level); eight seeds"),
    "fp16": Experiment(("pg_is", "dppo_binary_tv"), ("mb1-fp16-train",),
                       "FP16 training (learner and sampler in float16, loss-scaled): does it change anything here?"),
    "steps": Experiment(("pg_is", "dppo_binary_tv"), ("steps-mb4", "steps-ep4"),
                        "staleness apart from step count: four stale steps per rollout on quarter batches or on the "
                        "whole batch, with and without DPPO's mask; eight seeds"),
    "steps_size": Experiment(("pg_is",), ("steps-mb1", "steps-lr2e-3"),
                             "the steps experiment's on-policy references: one step per rollout at the lr and at four "
                             "times it (DPPO equals PG-IS there); eight seeds"),
    "regime": Experiment(("dppo_binary_kl", "dppo_binary_kl_recompute", "dppo_binary_tv", "dppo_binary_tv_recompute",
                          "minirl", "pg_is"), ("mb4-int4",),
                         "Takeaway 2 in the paper's regime: an int4 rollout copy and four quarter-batch steps per "
                         "rollout, where μ, π_θ' and π_θ differ; each DPPO mask anchored on μ against its "
                         "recomputed-anchor twin, MiniRL and PG-IS; eight seeds"),
    "mechanism": Experiment(("dppo_binary_kl", "pg_is", "dppo_binary_kl_neg", "dppo_binary_kl_pos"), ("mech-int4",),
                            "why the μ-anchored mask cost learning under int4 (takeaway2): the mask's two halves "
                            "apart, against the whole mask and no mask; eight seeds"),
    "mechanism_noise": Experiment(("dppo_binary_kl", "pg_is"), ("mech-noise",),
                                  "the mechanism's noise control: random noise on log μ that makes the mask block "
                                  "about as many tokens as int4 does; eight seeds"),
    "mechanism_grid": Experiment(("dppo_binary_kl",), ("mech-int4-redraw",),
                                 "the mechanism's quantiser control: the int4 grid redrawn at every re-sync against "
                                 "the fixed one; eight seeds"),
    "frontier": Experiment(("ipo", "trm_max", "gspo", "sapo", "dppo_binary_kl", "pg_is"), ("mech-int4",),
                           "the field after DPPO (the symmetric band, a sequence mask, a sequence ratio, a soft gate) "
                           "under the mechanism's int4 condition, against its DPPO-Binary-KL and PG-IS runs; eight "
                           "seeds"),
    "frontier_more": Experiment(("trm_avg", "opsm", "vaco", "minpro", "dppo_binary_kl", "pg_is"), ("mech-int4",),
                                "the field's other four presets (TRM-Avg, DeepSeek-V3.2's sequence mask, VACO, "
                                "MinPRO) under the frontier experiment's condition and references; eight seeds"),
    "frontier_stale": Experiment(("ipo", "trm_max", "gspo", "sapo", "trm_avg", "opsm", "vaco", "minpro",
                                  "dppo_binary_kl", "pg_is"), ("field-mb4",),
                                 "the eight field presets under staleness alone (an fp32 copy, four quarter-batch "
                                 "steps per rollout), against DPPO-Binary-KL and PG-IS played beside them; eight "
                                 "seeds"),
    "later_async": Experiment(("dppo_binary_tv", "drpo", "cppo", "m2po"), ("mb1-fp32-k2",),
                              "the later trust regions under asynchronous rollouts two updates stale (exploratory)"),
    "matched": Experiment(tuple(method for method, _ in MATCHED_ARMS), ("mech-int4",),
                          "GSPO, VACO, DPPO-Binary-TV and GRPO-ClipHigher at DPPO-Binary-KL's strength under the int4 "
                          "condition (each band calibrated per run on step 1 to block as many tokens), against the "
                          "mechanism experiment's DPPO-Binary-KL and PG-IS runs; eight seeds"),
    "matched_more": Experiment(tuple(method for method, _ in MATCHED_MORE_ARMS), ("mech-int4",),
                               "the symmetric band, TRM-Max, TRM-Avg and DeepSeek-V3.2's mask the same way; eight "
                               "seeds"),
    "matched_stale": Experiment(tuple(method for method, _ in MATCHED_ARMS + MATCHED_MORE_ARMS), ("field-mb4",),
                                "the eight calibrated rules under staleness alone, against frontier_stale's "
                                "DPPO-Binary-KL and PG-IS runs; eight seeds"),
    "placebo": Experiment(("placebo_neg", "placebo_pos", "pg_is"), ("v5-fp32",),
                          "the mechanism's sign-matched placebo: an fp32 sampler, a random set of one half's tokens "
                          "blocked at the rate int4's mask blocked that half, against PG-IS; eight seeds"),
    "signs": Experiment(("pg_is",), ("v5-int4",),
                        "the sign claim on new data: PG-IS under the int4 condition on seeds 8-15"),
    "regime_lr": Experiment(("dppo_binary_kl", "dppo_binary_kl_recompute", "dppo_binary_tv",
                             "dppo_binary_tv_recompute", "minirl", "pg_is"), ("mb4-int4-lr1e-4",),
                            "Takeaway 2 where training survives: the regime experiment's arms at lr 1e-4; eight "
                            "seeds"),
    "band_sweep": Experiment(tuple(method for method, _ in SWEEP_ARMS), ("mech-int4",),
                             "strength against outcome: GSPO, VACO and TRM-Avg with bands calibrated to block 2% and "
                             "8% of step 1's tokens, beside their matched runs; eight seeds"),
    "held": Experiment(tuple(method for method, _ in HELD_ARMS), ("mech-int4",),
                       "v6: the eight matched rules with their bands held at DPPO-Binary-KL's strength at every step "
                       "(--tr-calibrate-every 1) under the int4 condition, against the mechanism experiment's "
                       "DPPO-Binary-KL and PG-IS runs; eight seeds"),
    "held_stale": Experiment(tuple(method for method, _ in HELD_ARMS), ("field-mb4",),
                             "v6: the same under staleness alone, against frontier_stale's DPPO-Binary-KL and PG-IS "
                             "runs; eight seeds"),
    "placebo_cells": Experiment(("placebo_cells", "placebo_cells_other"), ("mech-int4",),
                                "v6: random tokens of int4's own cells at its mask's rates, and of the other two "
                                "cells (the control), under the int4 copy, against the mechanism experiment's runs; "
                                "eight seeds"),
    "halves": Experiment(("dppo_binary_kl_neg", "dppo_binary_kl_pos"), ("field-mb4",),
                         "v6: Takeaway 3 where the mask helps: each half of DPPO-Binary-KL's mask alone under "
                         "staleness, against frontier_stale's whole mask and PG-IS; eight seeds"),
}
"""The study's experiments (``--experiments``); a run shared by two experiments is played once."""
ExperimentName = Literal[tuple(EXPERIMENTS)]  # type: ignore[valid-type]


@dataclass(frozen=True)
class Task:
    """One task of the study: a Gem id and the local-engine flags that fit it (they override the study's)."""

    env_id: str
    args: tuple[str, ...] = ()


TASKS: dict[str, Task] = {
    "sudoku": Task("game:Sudoku-v0-easy-compact-wrong", ("--max-new-tokens", "12")),
    "guess": Task("game:GuessTheNumber-v0-easy-compact", ("--max-new-tokens", "12", "--gamma", "1.0",
                                                          "--groups-per-step", "32")),
}
"""``sudoku`` rewards every correct cell, so each turn is credited with its own reward (γ 0). ``guess`` (1-10 in
4 turns) rewards only a win, so a turn is credited with the episode's outcome (γ 1), and an episode is about 3
turns against Sudoku's 13, so 32 groups per step give each minibatch a similar number of turn samples (with 8, a
four-way split left about 20 per Adam step and DPPO-Binary-TV fell from 0.47 to 0.21 held-out success)."""
TaskName = Literal[tuple(TASKS)]  # type: ignore[valid-type]


@dataclass
class StudyConfig:
    """The CPU study's grid and the settings every run shares."""

    out_dir: str = "runs/cpu_study"
    """Where the runs go (a folder per task, a run folder per method, condition and seed) with ``study.json``."""
    tasks: tuple[TaskName, ...] = tuple(TASKS)
    """The tasks to play (each with its own warm-started policy)."""
    experiments: tuple[ExperimentName, ...] = tuple(EXPERIMENTS)
    """The experiments to play; their arms and conditions are in ``EXPERIMENTS``, their claims in
    ``studies.cpu.claims``."""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Paired seeds: every arm shares each seed's puzzles and sampling streams (the v4 and v5 sittings use 0–7)."""
    steps: int = 50
    """RL steps (rollout batches) per run."""
    groups_per_step: int = 8
    """Groups per rollout batch; each group plays one puzzle --group-size times."""
    group_size: int = 4
    """Episodes per group (GRPO's group, for the advantages)."""
    train_pool: int = 64
    """Training puzzles come from this fixed pool of seeds (the sanity test's fixed problem set)."""
    probe_every: int = 10
    """Every N steps, binary vs top-K vs exact divergence between μ and the updated π on the step's batch."""
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
    all_experiments: bool = False
    """Play every experiment of ``--experiments``' default (a command that names no experiment prints the plan by
    experiment and plays nothing: the whole study is hundreds of runs)."""

    def __post_init__(self) -> None:
        for name in ("steps", "groups_per_step", "train_pool", "eval_episodes", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not (self.tasks and self.experiments and self.seeds):
            raise ValueError("the study needs at least one task, experiment and seed")
        if not any(task in self.tasks for name in self.experiments for task in EXPERIMENTS[name].tasks):
            raise ValueError(f"none of the experiments {list(self.experiments)} runs on the tasks {list(self.tasks)}")


@dataclass(frozen=True)
class StudyRun:
    """One cell of the grid."""

    task: str
    method: str
    condition: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}-{self.condition}-s{self.seed}"

    def run_dir(self, config: StudyConfig) -> Path:
        return Path(config.out_dir) / self.task / self.name


def plan(config: StudyConfig) -> list[StudyRun]:
    """Every run of the study, task by task, seed-major (so a partial study has whole seeds of every arm), each
    (task, method, condition) once however many experiments share it; an experiment runs on its own tasks."""
    arms = dict.fromkeys((task, method, condition) for name in config.experiments
                         for task in EXPERIMENTS[name].tasks if task in config.tasks
                         for condition in EXPERIMENTS[name].conditions for method in EXPERIMENTS[name].methods)
    return [StudyRun(task, method, condition, seed) for task in config.tasks for seed in config.seeds
            for arm_task, method, condition in arms if arm_task == task]


STUDY_WARM_START = ("--warm-start.target-success", "0.25", "--warm-start.check-episodes", "48",
                    "--warm-start.check-every", "40", "--warm-start.max-steps", "4000")
"""The study's policies stop their warm start at partial success, as the paper's sanity test starts (sec:stability),
whatever the default run's warm start is. The committed runs started from a Sudoku policy warm-started on
random-cell demonstrations; the oracle's demonstrations fill a most-constrained cell
(``envs.oracles.sudoku_oracle_action``), so a new run builds its own policy to the same 0.25 first (CHANGELOG.md)."""


def shared_args(task: str, config: StudyConfig) -> list[str]:
    """Flags every run of ``task`` shares (and the warm start of its policy)."""
    return ["--env-ids", TASKS[task].env_id, "--steps", str(config.steps),
            "--groups-per-step", str(config.groups_per_step), "--group-size", str(config.group_size),
            "--train-pool", str(config.train_pool), "--probe-every", str(config.probe_every),
            "--eval-every", str(config.steps), "--eval-episodes", str(config.eval_episodes),
            "--lr-schedule", "constant", "--warm-start.seed", str(config.warm_start_seed), *STUDY_WARM_START,
            *TASKS[task].args, *shlex.split(config.extra_args)]


def method_args(method: str) -> list[str]:
    """``preset`` or ``preset@name=value,...`` (a preset with its ``--tr-*`` overrides) as trainer flags."""
    preset, _, overrides = method.partition("@")
    flags = ["--trust-region", preset]
    for override in filter(None, overrides.split(",")):
        name, _, value = override.partition("=")
        flags += [f"--tr-{name.replace('_', '-')}", value]
    return flags


def train_args(run: StudyRun, config: StudyConfig, resume: bool) -> list[str]:
    """The ``python -m dppo_oat.train`` flags of ``run``."""
    return [*shared_args(run.task, config), *method_args(run.method), *CONDITIONS[run.condition].args(),
            "--seed", str(run.seed), "--threads", "1", "--runs-dir", str(Path(config.out_dir) / run.task),
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

    for task in dict.fromkeys(run.task for run in plan(config)):
        train_config = tyro.cli(TrainConfig, args=shared_args(task, config))
        load_or_build_tiny_policy(train_config, console)


def trainer_module(method: str) -> str:
    """The module that trains ``method``: ``dppo_oat.train``, or for the study's own placebo presets
    ``studies.cpu.placebo`` (the same trainer with them registered)."""
    return "studies.cpu.placebo" if method.partition("@")[0] in STUDY_PRESETS else "dppo_oat.train"


def play(run: StudyRun, config: StudyConfig) -> dict:
    """Train ``run`` in its own process (resuming it if it was interrupted); its output goes to a log file."""
    run_dir = run.run_dir(config)
    log_path = Path(config.out_dir) / "logs" / f"{run.task}-{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    state = run_state(run_dir, config.steps)
    if state == "new" and run_dir.exists():  # killed before its first checkpoint: nothing to resume from
        shutil.rmtree(run_dir)
    resume = state == "partial"
    command = [sys.executable, "-m", trainer_module(run.method), *train_args(run, config, resume)]
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    with open(log_path, "a") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return {"run": f"{run.task}/{run.name}", "returncode": code, "seconds": time.perf_counter() - started,
            "resumed": resume, "log": str(log_path), "state": run_state(run_dir, config.steps)}


def write_manifest(config: StudyConfig, runs: list[StudyRun], results: dict) -> None:
    """``study.json``: the settings, and per run its state and how its last sitting went. Runs of earlier sittings
    that this one does not plan (other experiments or seeds) keep their entries, and the settings name the
    experiments of every sitting, so a study played in parts has one manifest."""
    path = Path(config.out_dir) / "study.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {"config": {}, "runs": []}
    entries = {f"{entry['task']}/{entry['name']}": entry for entry in manifest["runs"]}
    played = list(dict.fromkeys([*manifest["config"].get("experiments", []), *config.experiments]))
    for run in runs:
        key = f"{run.task}/{run.name}"
        entries[key] = {**entries.get(key, {}), **asdict(run), "name": run.name, "dir": str(run.run_dir(config)),
                        "state": run_state(run.run_dir(config), config.steps), **results.get(key, {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = {**asdict(config), "experiments": played}
    atomic_write_bytes(path, json.dumps({"config": settings, "runs": list(entries.values())}, indent=1).encode())


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


PROG = "python -m studies.cpu.run"


def names_experiments(argv: list[str]) -> bool:
    """Whether the command line names the experiments to play."""
    return any(arg == "--experiments" or arg.startswith("--experiments=") for arg in argv)


def print_plan_by_experiment(config: StudyConfig, states: dict, console: Console) -> None:
    """The runs of each experiment of ``config`` and how many are left, and how to play them."""
    for experiment in config.experiments:
        one = plan(replace(config, experiments=(experiment,)))
        left = sum(1 for run in one if states.get(run, "new") != "done")
        console.print(f"  {experiment}: {len(one)} runs, {left} to play")
    console.print(f"nothing played: name what to play ({PROG} --experiments mismatch), or play every experiment "
                  f"with --all-experiments; --dry-run lists each run")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    with one_line_usage_errors(PROG):  # a mistyped value or flag, or a bad setting: one error: line, exit 2
        config = tyro.cli(StudyConfig, args=argv, prog=PROG, description=__doc__)
    console = line_console()
    runs = plan(config)
    states = {run: run_state(run.run_dir(config), config.steps) for run in runs}
    todo = [run for run in runs if states[run] != "done"]
    counts = {state: sum(1 for s in states.values() if s == state) for state in ("done", "partial", "new")}
    console.print(f"CPU study in {config.out_dir}: {len(runs)} runs ({counts['done']} done, "
                  f"{counts['partial']} to resume, {counts['new']} new)")
    if not (config.dry_run or config.all_experiments or names_experiments(argv)):
        print_plan_by_experiment(config, states, console)
        return
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
    console.print(f"done: pack with python -m studies.cpu.pack --study {config.out_dir}, or read the runs in place: "
                  f"DPPO_STUDY={config.out_dir} make notebooks NOTEBOOKS=cpu_study.ipynb")


if __name__ == "__main__":
    main()
