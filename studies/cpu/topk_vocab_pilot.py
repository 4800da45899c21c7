"""Pilot of the CPU study's top-K question: does a realistic vocabulary separate top-K from the exact divergence?

With a few-hundred-token vocabulary DPPO's top-K divergence (K = 20) is the exact one, so the study cannot say what
top-K gives up at a real model's vocabulary. This runs one study run on ``--warm-start.shape tiny-8k`` (the tiny
policy over 8,192 entries) at four minibatches per rollout, so that π moves away from μ, with the divergence probe
every ``--probe-every`` steps (binary, top-K and exact TV and KL between μ and the updated π on the step's batch, and
the share of tokens each puts above δ), on a pilot seed kept apart from the study's. It prints one JSON row and
appends it to ``--out``: the probe per step, and the largest gap between top-K and exact, and between binary and
exact. A top-K gap near 0 says that this task's policy keeps almost no mass outside its K most likely tokens, at this
vocabulary as at the small one: the study cannot tell top-K from exact here.

    python -m studies.cpu.topk_vocab_pilot [--seed 900] [--steps 20] [--runs-dir runs/topk_vocab_pilot]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file (python studies/cpu/topk_vocab_pilot.py): the root is importable
    sys.path.insert(0, str(ROOT))

from dppo_oat.run.directory import RunDir  # noqa: E402
from dppo_oat.run.log import code_commit  # noqa: E402
from dppo_oat.run.safe_io import read_jsonl  # noqa: E402
from studies.cpu import run as cpu_study  # noqa: E402

ESTIMATES = ("tv_mean", "tv_above_delta", "kl_mean", "kl_above_delta")
"""The probe's statistics compared between the binary, top-K and exact divergences."""


def pilot_args(seed: int, steps: int, probe_every: int, runs_dir: Path, name: str) -> list[str]:
    """The study's Sudoku flags on the tiny-8k policy, DPPO-TopK-TV at ``mb4-fp32``."""
    config = cpu_study.StudyConfig(steps=steps, probe_every=probe_every, extra_args="--warm-start.shape tiny-8k")
    return [*cpu_study.shared_args("sudoku", config), *cpu_study.method_args("dppo_topk_tv"),
            *cpu_study.CONDITIONS["mb4-fp32"].args(), "--seed", str(seed), "--threads", "2",
            "--runs-dir", str(runs_dir), "--run-name", name]


def probe_rows(metrics: list[dict]) -> list[dict]:
    """Per probed step: each estimator's statistics (``binary_tv_mean`` ...)."""
    return [{"step": row["step"], **{key.removeprefix("probe/"): round(value, 6) for key, value in row.items()
                                     if key.startswith("probe/")}}
            for row in metrics if any(key.startswith("probe/") for key in row)]


def largest_gap(probes: list[dict], estimator: str) -> float:
    """The largest |estimator − exact| over the probed steps and :data:`ESTIMATES`."""
    return max(abs(row[f"{estimator}_{kind}"] - row[f"exact_{kind}"]) for row in probes for kind in ESTIMATES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=900, help="the pilot's seed, apart from the study's")
    parser.add_argument("--steps", type=int, default=20, help="RL steps")
    parser.add_argument("--probe-every", type=int, default=5, help="steps between two probes")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "topk_vocab_pilot",
                        help="the folder the run goes into (a finished run there is read, not played again)")
    parser.add_argument("--out", type=Path, default=ROOT / "studies" / "cpu" / "pilots" / "topk_vocab_pilot_cpu.jsonl",
                        help="the JSONL file the row is appended to")
    args = parser.parse_args(argv)
    name = f"tiny-8k-dppo_topk_tv-mb4-s{args.seed}"
    run = args.runs_dir / name
    if cpu_study.run_state(run, args.steps) != "done":
        resume = ["--resume"] if cpu_study.run_state(run, args.steps) == "partial" else []
        subprocess.run([sys.executable, "-m", "dppo_oat.train",
                        *pilot_args(args.seed, args.steps, args.probe_every, args.runs_dir, name), *resume],
                       check=True, cwd=ROOT)
    files = RunDir(run)
    probes = probe_rows(read_jsonl(files.metrics))
    evals = read_jsonl(files.eval)
    config = files.read_config()
    row = {"shape": "tiny-8k", "vocab_size": 8192, "method": "dppo_topk_tv", "condition": "mb4-fp32",
           "seed": args.seed, "steps": args.steps, "k": 20,
           "held_out": [evals[0]["eval/success"], evals[-1]["eval/success"]], "probes": probes,
           "topk_vs_exact_largest_gap": largest_gap(probes, "topk"),
           "binary_vs_exact_largest_gap": largest_gap(probes, "binary"),
           "run_commit": config.get("code_commit"), "code_commit": code_commit(),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    print(json.dumps(row), flush=True)
    with open(args.out, "a") as handle:
        handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
