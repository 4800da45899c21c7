"""The committed form of a CPU study: one Parquet file per task, read back as the long table of its runs.

``<data>/<task>.parquet`` holds every run of one task, sorted by run name, as rows of the columns of
:data:`SCHEMA`:

- one ``config`` row per run: its ``config.json`` as written (column ``config``);
- then one row per logged number, ``log`` ``metrics`` or ``eval``, with its ``step``, ``metric`` and ``value``
  (float64): log by log, metric by metric in the order the log first wrote them, each at every step of the log
  (:func:`dppo_oat.analysis.runs.read_log`: sorted, a step logged twice kept once) where it has a number. A metric
  with no number at all keeps its steps, without a value, so the run still logs it.

:func:`load_packed` reads them as the long table that :func:`~dppo_oat.analysis.runs.load_runs` makes of the runs'
folders, row for row: each run's ``path`` is ``<data>/<task>/<run>``, the folder it was packed from, which does not
exist, and :func:`run_config` reads its config from the task's file. Library functions that read a config from a
run's folder find none for a packed run: the study's report reads configs with :func:`run_config`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dppo_oat.analysis.run_checks import read_config, skipped_message
from dppo_oat.analysis.runs import PathLike, Run, label_runs, normalize_trust_region, unique_run_names, variant_name
from dppo_oat.analysis.runs import is_copy as runs_is_copy
from dppo_oat.run.directory import CONFIG_FILE

SUFFIX = ".parquet"
LOGS = ("metrics", "eval")
"""A run's logs as the ``log`` column names them (``metrics.jsonl``, ``eval.jsonl``), in the order they are kept."""
SCHEMA = pa.schema([
    ("run", pa.dictionary(pa.int32(), pa.string())),
    ("log", pa.dictionary(pa.int8(), pa.string())),
    ("step", pa.int64()),
    ("metric", pa.dictionary(pa.int32(), pa.string())),
    ("value", pa.float64()),
    ("config", pa.string()),
])
"""The columns of a task's file."""
WRITE_OPTIONS = {"compression": "brotli", "compression_level": 11, "use_dictionary": ["run", "log", "metric"],
                 "use_byte_stream_split": ["value"], "write_statistics": False}
"""How a task's file is written: each value's bytes split into streams (the high bytes of nearby values repeat),
brotli at its highest level (smaller than zstd's highest; about a minute for a task of 3.5 million rows), one row
group."""


def is_packed(study: PathLike) -> bool:
    """Whether ``study`` holds packed tasks (``*.parquet``) rather than run folders."""
    return any(Path(study).glob(f"*{SUFFIX}"))


def task_files(study: PathLike) -> list[Path]:
    """The packed files of ``study``, one per task, sorted by task."""
    return sorted(Path(study).glob(f"*{SUFFIX}"))


def number(value) -> float:
    """A logged value as the packed form keeps it: a float (a bool as 0/1, the trainers' ``"nan"``/``"inf"`` as
    those floats, a missing one as NaN); ``ValueError`` for anything else."""
    if value is None:
        return math.nan
    if isinstance(value, bool | int | float | np.number):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a number")


def numbers(column: pd.Series, where: str) -> np.ndarray:
    """A log's column as floats (:func:`number`); ``ValueError`` naming ``where`` (the log and the metric) for a
    value that is not a number."""
    if column.dtype.kind in "iuf":
        return column.to_numpy(dtype=np.float64)
    try:
        return np.array([number(value) for value in column], dtype=np.float64)
    except ValueError as error:
        raise ValueError(f"{where}: {error} (a packed run keeps numbers)") from None


def run_rows(name: str, config: str, logs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The rows of one run (:data:`SCHEMA`'s columns): its ``config.json`` text ``config``, then each log of
    ``logs`` (:data:`LOGS`, tables as :func:`~dppo_oat.analysis.runs.read_log` gives them) metric by metric."""
    parts = [pd.DataFrame({"log": ["config"], "step": [None], "metric": [None], "value": [math.nan],
                           "config": [config]})]
    for log in LOGS:
        step, metric, value = log_rows(logs[log], f"{name}: its {log} log")
        parts.append(pd.DataFrame({"log": log, "step": step, "metric": metric, "value": value, "config": None}))
    rows = pd.concat(parts, ignore_index=True).astype({"step": "Int64"})
    return rows.assign(run=name)[SCHEMA.names]


def log_rows(table: pd.DataFrame, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A log's table as rows: steps, metric names and values, metric by metric in the order of its columns, each
    at the steps where it has a number (all of its steps, as NaN, when it has none). ``where`` names the log in
    the error for a value that is not a number."""
    metrics = [column for column in table.columns if column != "step"]
    values = np.array([numbers(table[metric], f"{where}'s {metric!r}") for metric in metrics], dtype=np.float64)
    values = values.reshape(len(metrics), len(table))
    keep = ~np.isnan(values) | np.isnan(values).all(axis=1, keepdims=True)
    steps = np.broadcast_to(table["step"].to_numpy(dtype=np.int64), values.shape)
    names = np.broadcast_to(np.array(metrics, dtype=object)[:, None], values.shape)
    return steps[keep], names[keep], values[keep]


def write_task(runs: dict[str, pd.DataFrame], path: Path) -> None:
    """Write the rows of a task's runs (:func:`run_rows`, by run name) into ``path``, sorted by name; the same runs
    give the same bytes (with the same pyarrow)."""
    rows = pd.concat([runs[name] for name in sorted(runs)], ignore_index=True)
    table = pa.Table.from_pandas(rows, schema=SCHEMA, preserve_index=False).replace_schema_metadata(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=max(1, len(table)), **WRITE_OPTIONS)


def read_task(path: Path) -> dict[str, pd.DataFrame]:
    """The rows of each run of one task's file, by run name (what :func:`write_task` wrote)."""
    rows = pq.read_table(path).to_pandas()
    rows = rows.astype({"run": str, "log": str, "step": "Int64"})
    rows["metric"] = rows["metric"].astype(object).where(rows["metric"].notna(), None)
    return {str(name): part.reset_index(drop=True) for name, part in rows.groupby("run", sort=True)}


@functools.lru_cache(maxsize=8)
def _configs(path: str, mtime_ns: int) -> dict[str, str]:
    table = pq.read_table(path, columns=["run", "config"])
    table = table.filter(pc.is_valid(table["config"]))
    return dict(zip(table["run"].to_pylist(), table["config"].to_pylist(), strict=True))


def packed_configs(path: Path) -> dict[str, dict]:
    """The configs of the runs of one task's file, by run name, as their ``config.json`` held them."""
    return {run: json.loads(text) for run, text in _configs(str(path), path.stat().st_mtime_ns).items()}


def run_config(path: PathLike) -> dict:
    """The config of the run at ``path``: its folder's ``config.json``
    (:func:`~dppo_oat.analysis.run_checks.read_config`), else, for a packed run (``<data>/<task>/<run>``), its
    config in ``<data>/<task>.parquet``; ``{}`` when neither has one."""
    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        return read_config(path)
    packed = path.parent.parent / f"{path.parent.name}{SUFFIX}"
    if not packed.is_file():
        return {}
    text = _configs(str(packed), packed.stat().st_mtime_ns).get(path.name)
    return {} if text is None else json.loads(text)


def packed_run(folder: Path, config: dict) -> Run:
    """The run at ``folder`` with ``config`` (its trust-region numbers as floats, as
    :func:`~dppo_oat.analysis.runs.load_run` reads them) and no log: what names it in the long table."""
    if "trust_region" in config:
        config = {**config, "trust_region": normalize_trust_region(config["trust_region"] or {})}
    return Run(path=folder, config=config, metrics=pd.DataFrame(), eval=pd.DataFrame())


def load_packed(study: PathLike) -> pd.DataFrame:
    """The long table of the packed study ``study`` (:mod:`dppo_oat.analysis.runs`), as
    :func:`~dppo_oat.analysis.runs.load_runs` makes it of the runs' folders, tasks in order: its rows are each
    log's finite numbers; a run without any is skipped with a warning, and so is a copy of an earlier run (the same
    run id, or the same metrics)."""
    runs, parts, nonfinite, seen = [], [], [], {}
    for path in task_files(study):
        rows = pq.read_table(path, columns=["run", "log", "step", "metric", "value"]).to_pandas()
        rows = rows[rows["log"] != "config"]
        finite = np.isfinite(rows["value"].to_numpy())
        without = ~pd.Series(finite, index=rows.index).groupby([rows["run"], rows["log"], rows["metric"]], sort=False,
                                                                observed=True).any()
        configs = packed_configs(path)
        groups = dict(list(rows.groupby("run", sort=False, observed=True)))
        for name in sorted(map(str, groups)):
            run, own = packed_run(Path(study) / path.stem / name, configs[name]), groups[name]
            kept = own[finite[rows.index.get_indexer(own.index)]]
            if kept.empty:
                warnings.warn(skipped_message(run.path, "it logged no number"), stacklevel=2)
            elif not is_copy(run, own, seen):
                runs.append(run)
                parts.append(kept)
                nonfinite.append([str(metric) for metric in without.loc[name][without.loc[name]].index
                                  .get_level_values("metric")])
    if not runs:
        raise ValueError(f"{study}: no packed run logged a number")
    names = unique_run_names(runs)
    df = pd.concat([long_rows(run, name, part) for run, name, part in zip(runs, names, parts, strict=True)],
                   ignore_index=True)
    df = label_runs(df)
    df.attrs["nonfinite"] = nonfinite_metrics(names, nonfinite)
    return df


def long_rows(run: Run, name: str, rows: pd.DataFrame) -> pd.DataFrame:
    """A run's finite ``rows`` as :func:`~dppo_oat.analysis.runs.run_table` gives them: ``step``, ``metric``,
    ``value`` and the run columns."""
    long = pd.DataFrame({"step": rows["step"].to_numpy(dtype=np.int64), "metric": rows["metric"].astype(str),
                         "value": rows["value"].to_numpy(dtype=np.float64)}).astype({"metric": object})
    long["run"] = name
    long["variant"] = variant_name(run.algo, run.trust_region)
    long["algo"], long["env"], long["path"] = run.algo, run.env, str(run.path)
    long["seed"] = pd.Series([run.seed] * len(long), index=long.index, dtype="Int64")
    return long


def is_copy(run: Run, rows: pd.DataFrame, seen: dict) -> bool:
    """Whether ``run`` (its logged ``rows``) is a run of ``seen`` again, as
    :func:`~dppo_oat.analysis.runs.is_copy` tells it from its config's run id or its metrics, here the digest of its
    long metric rows."""
    metrics = rows[rows["log"] == "metrics"][["step", "metric", "value"]]
    digest = hashlib.sha256(pd.util.hash_pandas_object(metrics.astype({"metric": str}), index=False).to_numpy()
                            .tobytes()).hexdigest() if len(metrics) else ""
    return runs_is_copy(run, seen, metrics_digest=digest)


def nonfinite_metrics(names: list[str], nonfinite: list[list[str]]) -> dict[str, list[str]]:
    """The metrics some run logged with no finite value, each with the names of those runs
    (:func:`~dppo_oat.analysis.runs.nonfinite_metrics`), from each run's list of them."""
    found: dict[str, list[str]] = {}
    for name, metrics in zip(names, nonfinite, strict=True):
        for metric in metrics:
            found.setdefault(metric, []).append(name)
    return found
