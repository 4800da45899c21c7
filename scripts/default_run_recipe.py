"""Choose the default run's RL recipe on puzzles and seeds apart from the held-out evaluation.

Each trial is a set of overrides of the local engine's flags, run from the shipped warm-started policy for RL seeds
that the default run does not use (100, 101, ...), and scored on 200 *selection* puzzles (seeds from
``SELECTION_SEED``), disjoint from the held-out 200 that ``make train`` reports and from the warm start's checks.
Every trial appends one JSON line to ``--out``: its overrides, seed, wall time and the selection success curve.

Usage: ``python scripts/default_run_recipe.py --trial base --trial lr1e-3 --seeds 100 101 --out recipe.jsonl``
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from rich.console import Console

import dppo_oat.engines.local.trainer as trainer_module
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import policy_cache_key
from dppo_oat.engines.local.seeds import VALIDATION_SEED
from dppo_oat.run.safe_io import read_jsonl

SELECTION_SEED = VALIDATION_SEED + 100_000
"""Selection puzzles: seeds [SELECTION_SEED, SELECTION_SEED + 200), apart from held-out and warm-start checks."""

TRIALS: dict[str, dict] = {
    "base": {},
    "lr1e-3": {"lr": 1e-3},
    "lr2e-3": {"lr": 2e-3},
    "lr1e-3-t0.7": {"lr": 1e-3, "temperature": 0.7},
    "lr1e-3-g8x4": {"lr": 1e-3, "groups_per_step": 8},
    "turn": {"turn_baseline": True},
    "t0.7": {"temperature": 0.7},
    "lr5e-4": {"lr": 5e-4},
    "g32x4": {"groups_per_step": 32},
    "gamma0.5-turn": {"gamma": 0.5, "turn_baseline": True},
    "epochs2": {"num_epochs": 2},
    "turn-g8x8": {"turn_baseline": True, "groups_per_step": 8, "group_size": 8},
    "turn-epochs2": {"turn_baseline": True, "num_epochs": 2},
    "turn-lr5e-4": {"turn_baseline": True, "lr": 5e-4},
    "gamma1-turn": {"gamma": 1.0, "turn_baseline": True},
    "linear": {"lr_schedule": "linear"},
}

TRIAL_BASE = {"lr_schedule": "constant"}
"""What every trial starts from, under its overrides: a constant learning rate (the default run's decays linearly;
the ``linear`` trial is that), so that ``base`` and each trial's row measure one change against the same base."""


def run_trial(name: str, seed: int, steps: int, eval_every: int) -> dict:
    """One trial from the shipped policy; held-out evaluation replaced by the selection puzzles."""
    trainer_module.EVAL_SEED = SELECTION_SEED  # the trainer's evaluate() reads this module constant
    with tempfile.TemporaryDirectory() as runs_dir:
        settings = {**TRIAL_BASE, **TRIALS[name]}  # every seed starts from the shipped policy (warm-start seed 0)
        config = TrainConfig(runs_dir=runs_dir, seed=seed, steps=steps, eval_every=eval_every, token_samples=0,
                             **settings)
        started = time.perf_counter()
        trainer = trainer_module.LocalTrainer(config, Console(stderr=True, quiet=True))
        trainer.run()
        seconds = time.perf_counter() - started
        curve = [(row["step"], row["eval/success"]) for row in read_jsonl(config.run_directory().eval)]
    policy = policy_cache_key(config.env_ids[0], config.template, config.warm_start, config.warm_start_seed)
    return {"trial": name, "overrides": TRIALS[name], "policy": policy, "seed": seed, "steps": steps,
            "seconds": seconds, "threads": torch.get_num_threads(), "selection_success": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial", action="append", choices=sorted(TRIALS), required=True,
                        help="a trial to run (repeat for more)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100], help="RL seeds, apart from the held-out ones")
    parser.add_argument("--steps", type=int, default=60, help="RL steps per trial")
    parser.add_argument("--eval-every", type=int, default=20, help="steps between evaluations on the selection puzzles")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of each run (default: torch's)")
    parser.add_argument("--out", required=True, help="the JSONL file the rows are appended to")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in args.trial:
        for seed in args.seeds:
            row = run_trial(name, seed, args.steps, args.eval_every)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as out:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
