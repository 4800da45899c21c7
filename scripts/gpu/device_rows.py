"""The rows of scripts/gpu/device_check.sh: each benchmark's JSON rows stamped with where and what they measured,
appended to ``<OUT_DIR>/<bench>_<gpu-slug>.jsonl``; and the two rows it makes itself (the GPU tests, the default run).

    python scripts/gpu/device_rows.py slug --device cuda                 # h100 (from "NVIDIA H100 80GB HBM3")
    BENCH | python scripts/gpu/device_rows.py stamp --bench rollout --device cuda --out-dir docs/bench
    python scripts/gpu/device_rows.py junit --xml report.xml --seconds 12.5   # the row of `pytest -m gpu`
    python scripts/gpu/device_rows.py default-run --run-dir DIR --seconds 301 -- FLAGS...
    python scripts/gpu/device_rows.py default-run --run-dir DIR --seconds 270 --stopped "the check's budget" -- FLAGS

Every row gets ``bench``, ``gpu`` (the device's name), ``torch``, ``cuda`` (torch's CUDA, null on a CPU build),
``commit`` (``DPPO_COMMIT`` when set, as on a copy of the checkout without git; else the checkout's, ``-dirty`` when
the package's code differs from it), ``date`` and ``smoke`` (``DPPO_SMOKE=1``: tiny sizes on any device).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ElementTree
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct", "intel"}


def gpu_slug(name: str) -> str:
    """A short file-name tag of a device name: its words up to the first with a digit, vendor words dropped
    ("NVIDIA H100 80GB HBM3" → ``h100``, "NVIDIA GeForce RTX 4090" → ``rtx-4090``, "cpu (2 cores)" → ``cpu``)."""
    words = [w for w in re.findall(r"[a-z0-9]+", name.lower()) if w not in VENDOR_WORDS]
    if not words or words[0] == "cpu":
        return "cpu"
    kept = []
    for word in words:
        kept.append(word)
        if any(c.isdigit() for c in word):
            break
    return "-".join(kept)


def device_name(device: str) -> str:
    """The device's name as torch reports it (``cpu (N cores)`` for the CPU)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({os.cpu_count()} cores)"


def provenance(device: str) -> dict:
    """Where and with what a row was measured (the fields of the module's docstring but ``bench``)."""
    import torch

    from dppo_oat.run.log import code_commit

    return {"gpu": device_name(device), "torch": torch.__version__, "cuda": torch.version.cuda,
            "commit": code_commit(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "smoke": os.environ.get("DPPO_SMOKE", "0") not in ("", "0")}


def stamp(lines: list[str], bench: str, device: str, out_dir: Path) -> Path:
    """Append each JSON object of ``lines`` (other lines are skipped), stamped, to ``out_dir/<bench>_<slug>.jsonl``;
    a ValueError when there is none."""
    rows = [json.loads(line) for line in lines if line.lstrip().startswith("{")]
    if not rows:
        raise ValueError(f"{bench}: no JSON row to record")
    stamped = provenance(device)
    path = out_dir / f"{bench}_{gpu_slug(stamped['gpu'])}.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for row in rows:
            out.write(json.dumps({"bench": bench, **stamped, **row}) + "\n")
    return path


def junit_row(xml_path: Path, seconds: float) -> dict:
    """The counts of a pytest JUnit report: passed, failed, errors, skipped, and the failing tests' ids."""
    root = ElementTree.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    failing = [f"{case.get('classname')}::{case.get('name')}" for case in root.iter("testcase")
               if case.find("failure") is not None or case.find("error") is not None]
    return {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"],
            "failing": failing, "seconds": round(seconds, 1)}


def default_run_row(run_dir: Path, seconds: float, flags: list[str], stopped: str | None = None) -> dict:
    """Wall time and held-out success before → after of the run in ``run_dir`` (its eval.jsonl), with the run's
    seed and its learning rate as resolved (its config.json: the default by shape when the command gives none); a
    ValueError when it holds no evaluation. A run ``stopped`` before its last step (``stopped``: why) has no success
    after; its row says at which step of how many it stopped and the median seconds of rollout and update per step
    (metrics.jsonl)."""
    from dppo_oat.run.directory import CONFIG_FILE, EVAL_FILE

    evals = [json.loads(line) for line in (run_dir / EVAL_FILE).read_text().splitlines() if line.strip()]
    if not evals:
        raise ValueError(f"{run_dir / EVAL_FILE} holds no evaluation")
    config = json.loads((run_dir / CONFIG_FILE).read_text()) if (run_dir / CONFIG_FILE).exists() else {}
    row = {"command": " ".join(["python -m dppo_oat.train", *without_folders(flags)]),
           "seed": config.get("seed"), "lr": config.get("lr"), "wall_seconds": round(seconds, 1),
           "success_before": evals[0]["eval/success"], "success_after": evals[-1]["eval/success"],
           "eval_episodes": evals[-1]["eval/episodes"], "steps": evals[-1]["step"],
           "success_by_step": {str(e["step"]): e["eval/success"] for e in evals}}
    return row if stopped is None else {**row, **stopped_fields(run_dir, flags, stopped)}


FOLDER_FLAGS = ("--cache-dir", "--runs-dir")
"""Flags whose values are folders of the machine that ran the check: not part of the command a row records."""


def without_folders(flags: list[str]) -> list[str]:
    """``flags`` without :data:`FOLDER_FLAGS` and their values."""
    kept = []
    for index, flag in enumerate(flags):
        if flag in FOLDER_FLAGS or (index and flags[index - 1] in FOLDER_FLAGS):
            continue
        kept.append(flag)
    return kept


def stopped_fields(run_dir: Path, flags: list[str], stopped: str) -> dict:
    """What a stopped run's row says instead of its success after: the last step logged, the steps planned
    (``--steps``), why it stopped, the median seconds of rollout and update per step and each step's rollout
    success."""
    import statistics

    from dppo_oat.run.directory import METRICS_FILE

    path = run_dir / METRICS_FILE
    metrics = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    planned = flags[flags.index("--steps") + 1] if "--steps" in flags[:-1] else None

    def median(key: str) -> float | None:
        values = [m[key] for m in metrics if key in m]
        return round(statistics.median(values), 3) if values else None

    last = metrics[-1]["step"] if metrics else 0
    return {"success_after": None, "wall_seconds": None, "steps": last,
            "steps_planned": int(planned) if planned else None,
            "stopped": f"after step {last} of {planned or '?'}, {stopped}",
            "median_rollout_seconds": median("time/rollout"), "median_update_seconds": median("time/update"),
            "rollout_success_by_step": {str(m["step"]): round(m["success"], 4) for m in metrics if "success" in m}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    slug = commands.add_parser("slug", help="print the file-name tag of the device")
    slug.add_argument("--device", default="cuda", help="the device to name")
    stamp_cmd = commands.add_parser("stamp", help="stamp the JSON rows on stdin and append them to OUT_DIR")
    stamp_cmd.add_argument("--bench", required=True, help="the benchmark's name (the file's first part)")
    stamp_cmd.add_argument("--device", default="cuda", help="the device the rows were measured on")
    stamp_cmd.add_argument("--out-dir", default=str(ROOT / "docs" / "bench"), help="where the .jsonl files are")
    junit = commands.add_parser("junit", help="print the row of a pytest JUnit report")
    junit.add_argument("--xml", required=True, help="the report (pytest --junitxml)")
    junit.add_argument("--seconds", type=float, required=True, help="how long pytest ran")
    run = commands.add_parser("default-run", help="print the row of a finished local-engine run")
    run.add_argument("--run-dir", required=True, help="the run's own directory (eval.jsonl)")
    run.add_argument("--seconds", type=float, required=True, help="the run's wall time")
    run.add_argument("--stopped", default=None, help="why the run stopped before its last step (a stopped run's row)")
    run.add_argument("flags", nargs="*", help="the run's flags (after --)")
    args = parser.parse_args(argv)
    try:
        if args.command == "slug":
            print(gpu_slug(device_name(args.device)))
        elif args.command == "stamp":
            print(stamp(sys.stdin.read().splitlines(), args.bench, args.device, Path(args.out_dir)))
        elif args.command == "junit":
            print(json.dumps(junit_row(Path(args.xml), args.seconds)))
        else:
            print(json.dumps(default_run_row(Path(args.run_dir), args.seconds, args.flags, args.stopped)))
    except (ValueError, OSError, ElementTree.ParseError) as error:
        print(f"device_rows {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
