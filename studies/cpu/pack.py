"""Pack a CPU study's run logs into the repository, one Parquet file per task, so its report re-executes from a fresh
clone.

For every finished run of ``--study`` (``python -m studies.cpu.run``'s output, or a study folder whose logs are
gzip-compressed), writes its ``config.json`` and its ``metrics.jsonl`` and ``eval.jsonl`` into
``<out>/<task>.parquet`` (``studies/cpu/data`` by default; :mod:`studies.cpu.packed` describes the file), and the
study's manifest into ``<out>/study.json``; checkpoints, token samples and logs stay behind. Packing the same runs
twice gives the same bytes. :func:`studies.cpu.report.load_study` reads the packed study as it reads a study
folder.

With ``--readme docs/cpu-study.md`` it also rewrites the summary of the study in that page (between the
``<!-- cpu-study:summary -->`` markers) from the packed runs: the pre-registered claims, each with its paired
difference, 95% CI and verdict, as the report notebook prints them; and, where the page has one, its opening
section on what this scale can and cannot say (between ``<!-- cpu-study:scale -->`` markers).

From the repository's root:

    python -m studies.cpu.pack                         # runs/cpu_study → studies/cpu/data
    python -m studies.cpu.pack --merge                 # add a sitting played elsewhere to the packed runs
    python -m studies.cpu.pack --study other/study --out other/data
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file (python studies/cpu/pack.py): the checkout's root is importable
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from dppo_oat.analysis.run_checks import DamagedRun, read_config  # noqa: E402
from dppo_oat.analysis.runs import read_log  # noqa: E402
from dppo_oat.run.directory import CONFIG_FILE, RunDir  # noqa: E402
from dppo_oat.settings.usage import one_line_usage_errors  # noqa: E402
from studies.cpu.packed import read_task, run_rows, task_files, write_task  # noqa: E402
from studies.cpu.page import rewrite_page  # noqa: E402

MAX_BYTES = 12 * 2**20
"""The packed data of one study stays under 12 MiB, so that the checkout (about 21 MiB with it) travels to a GPU
machine with room for every step's wheels (docs/gpu.md: 64 MiB for both)."""
MANIFEST_KEYS = ("task", "method", "condition", "seed", "name", "state", "seconds")


@dataclass
class PackConfig:
    study: str = "runs/cpu_study"
    """The study folder (``python -m studies.cpu.run --out-dir``)."""
    out: str = "studies/cpu/data"
    """Where the packed runs go; replaced as a whole, unless --merge."""
    merge: bool = False
    """Keep the runs already packed in --out and add (or replace) the study's finished runs: for a study played in
    sittings on machines that do not share its folder. The manifest lists both, and its settings name every
    experiment either played."""
    readme: str | None = None
    """A Markdown file whose ``<!-- cpu-study:summary -->`` block is rewritten from the packed runs."""


def finished_runs(study: Path) -> list[Path]:
    """The run folders of ``study`` whose manifest state is ``done``."""
    manifest = json.loads((study / "study.json").read_text())
    return [study / run["task"] / run["name"] for run in manifest["runs"] if run["state"] == "done"]


def pack_run(run_dir: Path) -> pd.DataFrame:
    """One run's rows (:func:`~studies.cpu.packed.run_rows`): its ``config.json`` as written, once the analysis
    reads it, and its logs as the analysis reads them (:func:`~dppo_oat.analysis.runs.read_log`: a ``*.jsonl.gz``
    where the plain log is absent). ``DamagedRun`` when one cannot be read."""
    read_config(run_dir)
    logs = {"metrics": read_log(RunDir(run_dir).metrics), "eval": read_log(RunDir(run_dir).eval)}
    return run_rows(run_dir.name, (run_dir / CONFIG_FILE).read_text(encoding="utf-8"), logs)


def read_runs(runs: list[Path]) -> dict[str, dict[str, pd.DataFrame]]:
    """The rows of ``runs`` (:func:`pack_run`), by task and run name."""
    tasks: dict[str, dict[str, pd.DataFrame]] = {}
    for run in runs:
        tasks.setdefault(run.parent.name, {})[run.name] = pack_run(run)
    return tasks


def write_tasks(tasks: dict[str, dict[str, pd.DataFrame]], out: Path, merge: bool) -> None:
    """One file per task of ``tasks`` in ``out``; with ``merge``, beside the runs already packed there (a run of the
    same task and name replaced)."""
    for task, runs in tasks.items():
        path = out / f"{task}.parquet"
        kept = read_task(path) if merge and path.is_file() else {}
        write_task({**kept, **runs}, path)


def pack_manifest(study: Path, out: Path, packed: dict | None = None) -> None:
    """``study.json`` without machine-specific fields (log paths, timings of a sitting are kept as seconds); with
    ``packed`` (the manifest already in ``out``), its runs first, each replaced by the study's run of the same task
    and name, and its settings with the experiments of both."""
    manifest = json.loads((study / "study.json").read_text())
    runs = [{key: run[key] for key in MANIFEST_KEYS if key in run} for run in manifest["runs"]]
    settings = {key: value for key, value in manifest["config"].items() if key not in ("out_dir", "dry_run")}
    if packed is not None:  # the study's finished runs replace or join the packed ones (those were packed: done)
        new = {(run["task"], run["name"]): run for run in runs if run.get("state") == "done"}
        runs = [new.pop((run["task"], run["name"]), run) for run in packed["runs"]] + list(new.values())
        experiments = list(dict.fromkeys([*packed["config"]["experiments"], *settings["experiments"]]))
        settings = {**packed["config"], "experiments": experiments}
    (out / "study.json").write_text(json.dumps({"config": settings, "runs": runs}, indent=1) + "\n")


def packed_bytes(out: Path) -> int:
    """Bytes of the packed runs in ``out`` (its task files)."""
    return sum(path.stat().st_size for path in task_files(out))


def main(argv=None) -> None:
    with one_line_usage_errors("python -m studies.cpu.pack"):  # a mistyped value or flag: one error: line, exit 2
        config = tyro.cli(PackConfig, args=argv, prog="python -m studies.cpu.pack", description=__doc__)
    study, out = Path(config.study), Path(config.out)
    if not (study / "study.json").is_file():
        raise SystemExit(f"error: {study} has no study.json: run python -m studies.cpu.run --out-dir {study} first")
    runs = finished_runs(study)
    if not runs:
        raise SystemExit(f"error: {study} has no finished run yet: nothing to pack")
    try:
        tasks = read_runs(runs)
    except (DamagedRun, ValueError) as error:
        raise SystemExit(f"error: {error}: nothing packed") from None
    packed = None
    if config.merge and (out / "study.json").is_file():
        try:
            packed = json.loads((out / "study.json").read_text())
            if not isinstance(packed["runs"], list) or not isinstance(packed["config"]["experiments"], list):
                raise TypeError("runs and config.experiments must be lists")
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"error: --merge: {out / 'study.json'} is not a packed study's manifest ({error!r}); "
                             "pack without --merge to replace it") from None
    elif out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_tasks(tasks, out, merge=packed is not None)
    total = packed_bytes(out)
    pack_manifest(study, out, packed)
    if total > MAX_BYTES:
        raise SystemExit(f"error: the packed study is {total / 2**20:.1f} MiB, over {MAX_BYTES / 2**20:.0f} MiB")
    print(f"packed {len(runs)} finished runs into {out}{' (merged)' if packed else ''} ({total / 2**20:.2f} MiB)")
    if config.readme:
        readme = Path(config.readme)
        try:
            readme.write_text(rewrite_page(readme.read_text(), out))
        except (OSError, ValueError) as error:
            raise SystemExit(f"error: --readme {readme}: {error} (the runs are packed in {out})") from None
        print(f"{readme}: the study's summary rewritten from {out}")


if __name__ == "__main__":
    main()
