"""Pilot of the CPU study's engine mismatch: which rollout precisions make a mismatch that binds.

For each ``--rollout-dtype`` level, a short DPPO-Binary-KL run at one minibatch per rollout (no staleness: π_θ is
the learner's own fp32 policy, μ the quantised copy's) on pilot seeds kept apart from the study's, and its per-step
engine mismatch |π−μ| (``mismatch/abs_diff_mean``), the share of tokens DPPO's mask blocks (``mask/fraction``) and
training success. A level binds when |π−μ| ≥ 5e-3 and the mask fires on ≥ 0.5% of tokens. One JSON row per level on
stdout, and appended to ``--out``.

    python -m studies.cpu.mismatch_pilot                       # int8 int6 int5 int4 int3, seed 900, 6 steps
    python -m studies.cpu.mismatch_pilot --levels int4 int3 --seeds 900 901
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file (python studies/cpu/mismatch_pilot.py): the root is importable
    sys.path.insert(0, str(ROOT))

from dppo_oat.run.log import code_commit  # noqa: E402
from dppo_oat.run.safe_io import read_jsonl  # noqa: E402

BINDS = {"abs_diff_mean": 5e-3, "mask_fraction": 5e-3}
"""The levels a mismatch arm must reach at one minibatch per rollout (the study's design)."""


def pilot_run(level: str, seed: int, steps: int, runs_dir: Path) -> list[dict]:
    """One short run at ``level``; its metrics rows."""
    name = f"{level}-s{seed}"
    subprocess.run([sys.executable, "-m", "dppo_oat.train", "--trust-region", "dppo_binary_kl",
                    "--rollout-dtype", level,
                    "--minibatches-per-rollout", "1", "--steps", str(steps), "--eval-every", str(steps + 1),
                    "--eval-episodes", "8", "--seed", str(seed), "--threads", "2", "--runs-dir", str(runs_dir),
                    "--run-name", name], check=True, capture_output=True, cwd=ROOT)
    return read_jsonl(runs_dir / name / "metrics.jsonl")


def level_row(level: str, rows: list[dict], seeds: list[int], steps: int) -> dict:
    """What one level did over its runs: means over every step of every seed, and whether it binds."""
    def mean(key):
        return statistics.fmean(row[key] for row in rows)

    row = {"level": level, "seeds": seeds, "steps": steps, "abs_diff_mean": mean("mismatch/abs_diff_mean"),
           "mask_fraction": mean("mask/fraction"), "success_first": statistics.fmean(
               r["success"] for r in rows if r["step"] == 1), "success_last": statistics.fmean(
               r["success"] for r in rows if r["step"] == steps)}
    row["binds"] = all(row[key] >= floor for key, floor in BINDS.items())
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", nargs="+", default=["int8", "int6", "int5", "int4", "int3"],
                        help="--rollout-dtype levels to try")
    parser.add_argument("--seeds", nargs="+", type=int, default=[900], help="pilot seeds, apart from the study's")
    parser.add_argument("--steps", type=int, default=6, help="RL steps per level")
    parser.add_argument("--out", type=Path, default=ROOT / "studies" / "cpu" / "pilots" / "mismatch_pilot_cpu.jsonl",
                        help="the JSONL file the rows are appended to")
    args = parser.parse_args(argv)
    provenance = {"code_commit": code_commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory() as runs_dir:
        for level in args.levels:
            rows = [r for seed in args.seeds for r in pilot_run(level, seed, args.steps, Path(runs_dir))]
            row = {**level_row(level, rows, args.seeds, args.steps), **provenance}
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as handle:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
