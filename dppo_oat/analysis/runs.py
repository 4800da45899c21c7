"""Run directories → tables: one :class:`Run` per directory, and a long (tidy) table of many runs.

A run directory is what the local and oat engines write (:class:`dppo_oat.run.directory.RunDir` names its files):
``config.json`` (run_name, engine, trust_region {name: the preset, ...}, env_ids, seed, ...), ``metrics.jsonl`` (one
object per RL step: "step", "reward", "mask/fraction", "shadow/ppo/...", ...), ``eval.jsonl`` (one per evaluation:
"step", "eval/success", "eval/return", ...) and optionally ``tokens.jsonl`` (see :mod:`dppo_oat.analysis.tokens`).

The long table has one row per (run, step, metric) with the columns of :data:`RUN_COLUMNS` plus ``step``,
``metric`` and ``value``, so runs that log different metrics (or none of some) sit in one table. A damaged run, or
one without a logged number yet, is skipped with a warning (the rules: :mod:`dppo_oat.analysis.run_checks`); a log
row whose step lies outside [0, 1e9] is left out with one, and a run that does not say what trained it (no
``config.json``, a null or unnamed trust region) is drawn with one.
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import warnings
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dppo_oat.analysis.run_checks import (
    CHOICE_FIELDS,
    MAX_STEP,
    DamagedRun,
    check_run_files,
    no_rows_reason,
    none_left_message,
    read_config,
    skipped_message,
    step_in_range,
    step_numbers,
)
from dppo_oat.run.directory import CONFIG_FILE, METRICS_FILE, RENAMED_KEYS, RunDir
from dppo_oat.run.log import PROVENANCE
from dppo_oat.run.safe_io import read_jsonl
from dppo_oat.settings.kinds import non_settings
from dppo_oat.settings.run_flags import RunFlags
from dppo_oat.settings.spec import DPPOFlags
from dppo_oat.trust_region import CHOICE_FIELDS as TR_CHOICE_FIELDS
from dppo_oat.trust_region import FIELD_SYMBOLS, PRESETS, REAL_FIELDS, TrustRegion, numeric_fields_read

RUN_COLUMNS = ("run", "label", "method", "variant", "algo", "env", "seed", "path")
"""Per-run columns of the long table. ``variant``: the preset's paper name with its non-default trust-region
settings; ``method``: the variant, plus the environment when the table spans several (the seeds of one method are
the curves :func:`~dppo_oat.analysis.curves.aggregate_seeds` pools); ``label``: one name per run; ``path``: its
directory."""

PRESET_NAMES = {name: preset.label or name for name, preset in PRESETS.items()}
"""The paper's (or the source framework's) name of each trust-region preset (legend entries): its
:attr:`~dppo_oat.trust_region.presets.Preset.label`."""

PathLike = str | Path


@dataclass(frozen=True, eq=False)
class Run:
    """One run directory: its config and its per-step and per-evaluation tables (sorted by ``step``)."""

    path: Path
    config: dict
    metrics: pd.DataFrame
    eval: pd.DataFrame

    @property
    def name(self) -> str:
        """The run's name: ``run_name`` of its config, else the directory name."""
        return str(self.config.get("run_name") or self.path.name)

    @property
    def algo(self) -> str:
        """The trust-region preset it trained with: the config's ``trust_region.name``, else its ``algo`` key, else
        ``custom``. An oat run's ``algo`` is not read: there it is oat's algorithm (PPO), not a preset (the oat engine
        records that as ``oat_algo``; earlier oat runs as ``algo``)."""
        trust_region = self.config.get("trust_region")
        name = trust_region.get("name") if isinstance(trust_region, dict) else None
        preset_key = None if self.config.get("engine") == "oat" else self.config.get("algo")
        return str(name or preset_key or "custom")

    @property
    def env(self) -> str:
        """Its environment id(s), joined with ``+`` (``env_ids`` may be a list or one id)."""
        env_ids = self.config.get("env_ids") or []
        env_ids = [env_ids] if isinstance(env_ids, str) else env_ids
        return "+".join(str(env_id) for env_id in env_ids) or "unknown"

    @property
    def seed(self) -> int | None:
        """Its seed (None when the config does not say)."""
        seed = self.config.get("seed")
        return None if seed is None else int(seed)

    @property
    def trust_region(self) -> dict:
        """Its trust-region fields, numbers as floats (``is_cap`` ``"inf"`` or null → ``math.inf``)."""
        return normalize_trust_region(self.config.get("trust_region") or {})


def is_run_dir(path: PathLike) -> bool:
    """True for a directory holding a run's ``config.json`` or ``metrics.jsonl``."""
    run_dir = RunDir(path)
    return run_dir.path.is_dir() and (run_dir.config.is_file() or run_dir.metrics.is_file())


def not_a_run_dir_message(path: PathLike) -> str:
    """Why ``path`` cannot be read as a run (for error messages)."""
    path = Path(path)
    if not path.exists():
        return f"{path}: no such file or directory"
    if not path.is_dir():
        return f"{path}: not a directory (a run directory holds {CONFIG_FILE} and {METRICS_FILE})"
    if any(is_run_dir(child) for child in path.iterdir()):
        return f"{path}: not a run directory but a folder of runs (pass '{path / '*'}' for all of them)"
    return f"{path}: not a run directory (no {CONFIG_FILE} or {METRICS_FILE} in it)"


def resolve_run_dirs(paths_or_globs: PathLike | Iterable[PathLike]) -> list[Path]:
    """The run directories named by paths and glob patterns, in the order given, without duplicates.

    A pattern keeps only the matches that are run directories; a plain path must be one (an empty directory is
    skipped with a warning). A pattern with no matching run directory and a plain path that is not a run directory
    raise ``ValueError``.
    """
    items = [paths_or_globs] if isinstance(paths_or_globs, (str, Path)) else list(paths_or_globs)
    found: list[Path] = []
    empty: list[str] = []
    for item in map(str, items):
        if glob.has_magic(item):
            matches = [Path(p) for p in sorted(glob.glob(item)) if is_run_dir(p)]
            if not matches:
                raise ValueError(f"{item}: no run directory matches this pattern")
        elif is_run_dir(item):
            matches = [Path(item)]
        elif Path(item).is_dir() and not any(Path(item).iterdir()):
            warnings.warn(f"{item}: an empty directory, skipped (not a run)", stacklevel=2)
            matches, empty = [], [*empty, item]
        else:
            raise ValueError(not_a_run_dir_message(item))
        found.extend(m for m in matches if m not in found)
    if not found and empty:
        what = "is an empty directory" if len(empty) == 1 else "are empty directories"
        raise ValueError(f"no run directory to read: {', '.join(empty)} {what} (a run directory holds {CONFIG_FILE} "
                         f"and {METRICS_FILE})")
    if not found:
        raise ValueError("no run directories given")
    return found


def read_table(path: PathLike) -> pd.DataFrame:
    """A run's JSONL file as a table sorted by ``step`` (see :func:`dppo_oat.run.safe_io.read_jsonl` for what is
    skipped); rows without a ``step`` that is a finite number within int64 are dropped
    (:func:`~dppo_oat.analysis.run_checks.step_numbers`)."""
    table = pd.DataFrame(read_jsonl(Path(path)))
    table["step"] = step_numbers(table["step"]) if "step" in table else pd.Series(dtype=float)
    table = table.dropna(subset=["step"]).astype({"step": "int64"})
    return table.sort_values("step", kind="stable").reset_index(drop=True)


def normalize_trust_region(trust_region: dict) -> dict:
    """A copy with the numeric fields as floats: ``"inf"``/``"Infinity"`` → ``math.inf``, ``is_cap`` null → ∞."""
    out = dict(trust_region)
    for key in set(REAL_FIELDS).intersection(out):
        if out[key] is None:
            out[key] = math.inf if key == "is_cap" else None
            continue
        try:
            out[key] = float(out[key])
        except (TypeError, ValueError):
            pass  # not a number: kept as written
    return out


def load_run(path: PathLike) -> Run:
    """Read one run directory (a missing ``eval.jsonl`` or ``metrics.jsonl`` gives an empty table).

    Raises:
        ValueError: ``path`` is not a run directory.
        DamagedRun: a run file is not a regular, readable file
            (:func:`~dppo_oat.analysis.run_checks.check_run_files`), its ``config.json`` is not a usable JSON object
            (:func:`~dppo_oat.analysis.run_checks.read_config`), or a log cannot be read.
    """
    path = Path(path)
    if not is_run_dir(path):
        raise ValueError(not_a_run_dir_message(path))
    check_run_files(path)
    config = read_config(path)
    unknown = unknown_method_reason(path, config)
    if "trust_region" in config:
        config["trust_region"] = normalize_trust_region(config["trust_region"] or {})
    run_dir = RunDir(path)
    run = Run(path=path, config=config, metrics=read_log(run_dir.metrics), eval=read_log(run_dir.eval))
    if unknown is not None:
        drawn_as = f"{run.algo!r}" if run.algo == "custom" else f"{run.algo!r} with the preset's own settings"
        if run.env == "unknown" and run.seed is None:
            drawn_as += ", with no environment or seed"
        warnings.warn(f"{path}: {unknown}: its curve is drawn as {drawn_as}", stacklevel=2)
    return run


def unknown_method_reason(path: Path, config: dict) -> str | None:
    """Why a run's ``config.json`` (as :func:`~dppo_oat.analysis.run_checks.read_config` read it: ``{}`` when there
    is none) does not say what trained it, None when it does: there is no ``config.json``, its ``trust_region`` is
    null, or it names no trust region (neither ``trust_region.name`` nor a preset ``algo``)."""
    if not RunDir(path).config.is_file():
        return f"no {CONFIG_FILE}"
    if "trust_region" in config and config["trust_region"] is None:
        return f'its {CONFIG_FILE} has "trust_region": null'
    named = isinstance(config.get("trust_region"), dict) and config["trust_region"].get("name")
    if not (named or (config.get("algo") and config.get("engine") != "oat")):
        return f"its {CONFIG_FILE} names no trust region"
    return None


def read_log(log: Path) -> pd.DataFrame:
    """:func:`read_table` of a run directory's log (``metrics.jsonl``, ``eval.jsonl``), a step logged twice kept
    once (:func:`without_repeated_steps`); ``DamagedRun`` when it cannot be read."""
    try:
        table = read_table(log)
    except (OSError, EOFError, zlib.error) as error:  # unreadable, or a damaged gzip copy
        packed = log.with_name(log.name + ".gz")
        shown = log.name if log.is_file() or not packed.is_file() else packed.name
        raise DamagedRun(log.parent, f"its {shown} cannot be read ({getattr(error, 'strerror', None) or error})") \
            from None
    return without_repeated_steps(without_steps_out_of_range(table, log), log)


def without_steps_out_of_range(table: pd.DataFrame, log: Path) -> pd.DataFrame:
    """``table`` without the rows whose step is below 0 or past
    :data:`~dppo_oat.analysis.run_checks.MAX_STEP` (a damaged or hand-edited log: no run logs them), with one warning
    naming the log, how many and the first (a curve would otherwise stretch its axis to them)."""
    outside = ~step_in_range(table["step"])
    if not outside.any():
        return table
    first = int(table.loc[outside, "step"].iloc[0])
    warnings.warn(f"{log}: {int(outside.sum())} row(s) with a step outside [0, {MAX_STEP:,}] left out (step {first} "
                  "first)", stacklevel=2)
    return table[~outside].reset_index(drop=True)


def without_repeated_steps(table: pd.DataFrame, log: Path) -> pd.DataFrame:
    """``table`` with each step once: where a log holds a step on several lines (two logs appended together, a copy
    of a run's lines), the last is kept, with one warning naming the log and the first repeated step (a curve would
    otherwise draw the step twice)."""
    repeated = table["step"].duplicated(keep="last")
    if not repeated.any():
        return table
    steps = sorted(set(table.loc[repeated, "step"]))
    warnings.warn(f"{log}: step {steps[0]} is logged more than once ({len(steps)} step(s) repeated): the last line "
                  "of each is kept", stacklevel=2)
    return table[~repeated].reset_index(drop=True)


def preset_name(algo: str) -> str:
    """The paper's name of preset ``algo`` (its label; the preset id itself for a custom one or one without a
    label), read when asked, so a preset registered after this module is named too."""
    preset = PRESETS.get(algo)
    return preset.label if preset is not None and preset.label else algo


def relevant_fields(trust_region: dict) -> frozenset[str]:
    """The fields that change what a run's rule does: its choices and the numeric fields they read (the others are
    ignored)."""
    choices = {key: trust_region[key] for key in ("rule", "relax", "is_weight", "mismatch_mask")}
    return frozenset(CHOICE_FIELDS) | frozenset(TR_CHOICE_FIELDS) | numeric_fields_read(**choices)


def trust_region_overrides(algo: str, trust_region: dict) -> dict:
    """The trust-region fields of a run that its rule uses and that differ from its preset's defaults.

    Empty for a preset this package does not know (a custom ``algo``).
    """
    if algo not in PRESETS:
        return {}
    defaults = normalize_trust_region(vars(TrustRegion.preset(algo)))
    actual = {**defaults, **{k: v for k, v in trust_region.items() if v is not None}}
    return {
        key: actual[key]
        for key in FIELD_SYMBOLS
        if key in relevant_fields(actual)
        and actual[key] != defaults[key]
    }


def variant_name(algo: str, trust_region: dict) -> str:
    """Legend name of a preset with its non-default settings, e.g. ``DPPO-Binary-TV (δ=0.2)``."""
    overrides = trust_region_overrides(algo, trust_region)
    settings = ", ".join(f"{FIELD_SYMBOLS[key]}={_format_value(value)}" for key, value in overrides.items())
    return f"{preset_name(algo)} ({settings})" if settings else preset_name(algo)


def _format_value(value) -> str:
    """A setting as a label shows it: ``0.2``, ``∞``, ``both``."""
    if isinstance(value, float):
        return "∞" if math.isinf(value) else f"{value:g}"
    return str(value)


def run_table(run: Run, name: str | None = None) -> pd.DataFrame:
    """One run's metrics and evaluations as long rows: the run columns, ``step``, ``metric``, ``value``.

    Only finite numbers are kept. ``name`` replaces the run's name.
    """
    frames = [_long_numeric(table) for table in (run.metrics, run.eval) if len(table)]
    long = pd.concat(frames, ignore_index=True) if frames else _long_numeric(pd.DataFrame({"step": []}))
    long["run"] = name or run.name
    long["variant"] = variant_name(run.algo, run.trust_region)
    long["algo"], long["env"], long["path"] = run.algo, run.env, str(run.path)
    long["seed"] = pd.Series([run.seed] * len(long), index=long.index, dtype="Int64")
    return long


def _long_numeric(table: pd.DataFrame) -> pd.DataFrame:
    """``step`` + every numeric column of ``table``, melted to (step, metric, value) rows; non-finite values
    (NaN, ±inf, as numbers or as the strings the trainers write) are left out, a curve cannot show them."""
    columns = [c for c in table.columns if c != "step"]
    numeric = pd.DataFrame({i: _finite_numbers(table[c]) for i, c in enumerate(columns)}, index=table.index)
    numeric = numeric.loc[:, numeric.notna().any()] if len(numeric.columns) else numeric
    numeric.insert(0, "step", table["step"].astype("int64"))
    long = numeric.melt(id_vars="step", var_name="metric", value_name="value").dropna(subset=["value"])
    long["metric"] = long["metric"].map(dict(enumerate(columns)))  # by position: a metric may be named "value"
    return long.astype({"metric": "object", "value": "float64"})


def _finite_numbers(column: pd.Series) -> pd.Series:
    """``column`` as floats, NaN where a value is not a finite number (bools count as 0/1)."""
    values = pd.to_numeric(column.map(lambda v: float(v) if isinstance(v, bool) else v), errors="coerce")
    return values.astype("float64").where(lambda v: np.isfinite(v))


def label_runs(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its ``method`` and ``label`` columns (re)computed from the runs it holds.

    ``method`` is the variant, with `` · <env>`` when ``df`` spans several environments; ``label`` adds
    `` · seed <s>`` when a method has several seeds, and the run name where that still leaves two runs alike.
    Call it again after selecting a subset of runs, so that the names say only what tells the runs apart.
    """
    runs = df.drop_duplicates("run")[["run", "variant", "env", "seed"]].copy()
    several_envs = runs["env"].nunique() > 1
    runs["method"] = runs["variant"] + (" · " + runs["env"] if several_envs else "")
    seeded = runs.groupby("method")["seed"].transform("nunique") > 1
    runs["label"] = runs["method"].where(~seeded, runs["method"] + " · seed " + runs["seed"].astype(str))
    alike = runs["label"].duplicated(keep=False)
    runs["label"] = runs["label"].where(~alike, runs["label"] + " · " + runs["run"])
    names = runs.set_index("run")[["method", "label"]]
    out = df.drop(columns=["method", "label"], errors="ignore")
    out = out.assign(method=out["run"].map(names["method"]), label=out["run"].map(names["label"]))
    return out[[*RUN_COLUMNS, *[c for c in out.columns if c not in RUN_COLUMNS]]]


def unique_run_names(runs: list[Run]) -> list[str]:
    """The runs' names, with the directory (then its path) appended where two runs share a ``run_name``."""
    names: list[str] = []
    for run in runs:
        name = run.name
        if name in names:
            name = f"{run.name} ({run.path.name})"
        if name in names:
            name = str(run.path)
        names.append(name)
    return names


def load_runs(paths_or_globs: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """Many runs as one long table (see the module docstring), in the order the paths and globs name them.

    A run that cannot be read, or that logged no number yet, is skipped with one warning naming it
    (:func:`load_or_skip`). Raises ``ValueError`` when no run is left (and as :func:`resolve_run_dirs` does).
    """
    paths, runs, seen = resolve_run_dirs(paths_or_globs), [], {}
    for path in paths:
        run = load_or_skip(path)
        if run is not None and not is_copy(run, seen):
            runs.append(run)
    if not runs:
        raise ValueError(none_left_message(len(paths)))
    names = unique_run_names(runs)
    df = label_runs(pd.concat([run_table(run, name) for run, name in zip(runs, names, strict=True)], ignore_index=True))
    df.attrs["nonfinite"] = nonfinite_metrics(runs, names)
    return df


def is_copy(run: Run, seen: dict[tuple[str, str], Run], metrics_digest: str | None = None) -> bool:
    """Whether ``run`` is a run of ``seen`` again (the same run id in its config, or the same metrics line for line:
    a backup copy, which averaged with it would count as another seed); one warning names both when it is. Else its
    identity is added to ``seen`` (keys ``("run id", id)`` and ``("metrics", digest)``). ``metrics_digest``: the
    digest of its metrics where they are not ``run.metrics`` (a packed study's long rows; "" for none)."""
    if metrics_digest is None:
        metrics_digest = hashlib.sha256(run.metrics.to_json().encode()).hexdigest() if len(run.metrics) else ""
    keys = [("metrics", metrics_digest)] if metrics_digest else []
    if run.config.get("run_id"):
        keys.insert(0, ("run id", str(run.config["run_id"])))
    for key in keys:
        if key in seen:
            why = f"its run id {key[1]} is that run's" if key[0] == "run id" else \
                f"its {METRICS_FILE} is that run's, line for line"
            warnings.warn(f"{run.path}: skipped, the same run as {seen[key].path} ({why}): a copy is not another seed",
                          stacklevel=3)
            return True
    seen.update({key: run for key in keys})
    return False


def nonfinite_metrics(runs: list[Run], names: list[str]) -> dict[str, list[str]]:
    """The metrics some run logged with no finite value (NaN or ±inf at every step, which the long table leaves
    out), each with the names of those runs: what a skipped panel's note names instead of "no run logs it"."""
    found: dict[str, list[str]] = {}
    for run, name in zip(runs, names, strict=True):
        for table in (run.metrics, run.eval):
            for column in table.columns:
                written = table[column][table[column].notna()]
                if column != "step" and all(map(_is_nonfinite_number, written)):
                    found.setdefault(column, []).append(name)
    return found


def _is_nonfinite_number(value) -> bool:
    """NaN or ±inf, as a number or as the text the trainers write (``"nan"``, ``"inf"``)."""
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def load_or_skip(path: Path) -> Run | None:
    """:func:`load_run`, or None with one warning (``<path>: skipped, <why>``) for a run that cannot be read or
    that gives no row of the long table. The warnings of a skipped run's logs (unreadable lines) are left out: its
    one warning says why it is skipped; those of a kept run are passed on."""
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        try:
            run = load_run(path)
            reason = None if has_rows(run) else no_rows_reason(path)
        except DamagedRun as error:
            run, reason = None, error.reason
    if reason is not None:
        warnings.warn(skipped_message(path, reason), stacklevel=3)  # the caller of load_runs
        return None
    for note in notes:
        warnings.warn_explicit(note.message, note.category, note.filename, note.lineno, source=note.source)
    return run


def has_rows(run: Run) -> bool:
    """Whether ``run`` logged a finite number at a step (it has rows in the long table)."""
    return any(_finite_numbers(table[column]).notna().any()
               for table in (run.metrics, run.eval) for column in table.columns if column != "step")


def run_patterns(spec: str) -> list[str]:
    """Run paths and glob patterns from one whitespace-separated string (as in the ``DPPO_RUNS`` variable of the
    notebooks); a directory that holds run directories stands for all of them (``runs`` → ``runs/*``)."""
    patterns = []
    for item in spec.split():
        path = Path(item)
        is_parent = not glob.has_magic(item) and path.is_dir() and not is_run_dir(path)
        patterns.append(str(path / "*") if is_parent else item)
    return patterns


def runs_from(spec: str, base: PathLike) -> str:
    """``spec`` (whitespace-separated run paths and glob patterns) with every relative item made absolute against
    ``base``, so that it names the same runs from any working directory."""
    return " ".join(item if Path(item).is_absolute() else str(Path(base) / item) for item in spec.split())


def notebook_runs(notebook_dir: PathLike = ".", environ: dict | None = None) -> tuple[str, str]:
    """Which runs a notebook reads, and a sentence saying so: ``DPPO_RUNS`` when set (its relative paths and globs
    start from ``DPPO_RUNS_BASE`` when that is set: ``make notebooks`` sets it to the folder it was run from; else
    from the notebook's folder), else ``../runs`` when it holds runs (what ``make train`` writes), else the example
    runs shipped in ``notebooks/example_runs``."""
    environ = os.environ if environ is None else environ
    if environ.get("DPPO_RUNS"):
        spec, base = environ["DPPO_RUNS"], environ.get("DPPO_RUNS_BASE")
        if not base:
            return spec, f"Reading DPPO_RUNS={spec}."
        return runs_from(spec, base), f"Reading DPPO_RUNS={spec} (relative to {base})."
    own = Path(notebook_dir) / ".." / "runs"
    if own.is_dir() and any(is_run_dir(path) for path in own.iterdir()):
        return str(own), f"Reading your runs in {own} (set DPPO_RUNS to read others)."
    examples = Path(notebook_dir) / "example_runs"
    return str(examples), (f"Reading the example runs in {examples}: no DPPO_RUNS is set and {own} holds no runs "
                           "(see example_runs/README.md for the command that made them).")


def summarize_runs(df: pd.DataFrame, metrics=("reward", "success", "eval/success"), tail: float = 0.1) -> pd.DataFrame:
    """One row per run: its run columns, its last step, and the final value of each metric (the mean over the last
    ``tail`` share of its logged points, at least one; NaN where the run does not log it)."""
    runs = df.drop_duplicates("run").set_index("run")[["label", "method", "algo", "env", "seed"]].copy()
    runs["steps"] = df.groupby("run")["step"].max()
    for metric in metrics:
        rows = df[df["metric"] == metric].sort_values("step", kind="stable")
        runs[metric] = rows.groupby("run")["value"].apply(lambda v: v.tail(max(1, round(tail * len(v)))).mean())
    return runs.reset_index()


RECORDS = frozenset({"run_id", "resumes", "trust_region", "calibration", *PROVENANCE})
"""What ``config.json`` records of a run besides its flags: its identity and provenance, its resumes, the trust region
its preset and ``tr_*`` overrides resolved to (the preset and overrides are the curve's method), and a
calibration's record (the band it measured on the run's own first batch; the request, ``tr_calibrate*``, is the
method)."""
POOLED_OVER = "seed"
"""The setting that runs averaged as seeds differ in."""
NOT_SETTINGS = non_settings(DPPOFlags, RunFlags) | RECORDS | {POOLED_OVER} | {
    old for old, new in RENAMED_KEYS.items() if new in non_settings(RunFlags)}
"""Config keys that do not change what a run trains: the flags that declare so (where a run writes and runs, what it
logs besides its metrics: :func:`~dppo_oat.settings.kinds.flag`), under their former names too (a config read other
than by :func:`~dppo_oat.analysis.run_checks.read_config`, a packed study's, keeps them), :data:`RECORDS` and the
seed."""


def is_setting(name: str) -> bool:
    """Whether config field ``name`` (dotted for nested fields, ``warm_start.lr``) changes what a run trains, so
    that runs averaged as seeds should agree on it: not :data:`NOT_SETTINGS`, a ``tr_*`` override, a path or a
    logging field (``*_dir``, ``*_path``, ``*_name``, ``wb_*``)."""
    top = name.split(".", 1)[0]
    return not (top in NOT_SETTINGS or top.startswith(("tr_", "wb_")) or top.endswith(("_dir", "_path", "_name")))


def flat_settings(config: dict, prefix: str = "") -> dict:
    """``config``'s settings (:func:`is_setting`), nested objects flattened to dotted names, lists as tuples."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if not is_setting(name):
            continue
        if isinstance(value, dict):
            out.update(flat_settings(value, f"{name}."))
        else:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


def differing_settings(configs: list[dict]) -> dict[str, list]:
    """The settings on which ``configs`` disagree, each with its distinct values in order of appearance (a field
    one config lacks counts as None)."""
    settings = [flat_settings(config) for config in configs]
    names = list(dict.fromkeys(name for one in settings for name in one))
    differing = {}
    for name in names:
        values = list(dict.fromkeys(one.get(name) for one in settings))
        if len(values) > 1:
            differing[name] = values
    return differing


def mixed_settings(df: pd.DataFrame, by: str = "method") -> dict:
    """For each curve of ``df`` grouped ``by`` (its runs averaged as seeds) whose runs differ in a setting other
    than the seed: the differing settings and their values (:func:`differing_settings`), read from each run's
    ``config.json``. Curves of one run, runs without a readable config, and tables without run paths give none."""
    if by not in df.columns or "path" not in df.columns:
        return {}
    runs = df.drop_duplicates("run")[[by, "path"]]
    mixed = {}
    for group, paths in runs.groupby(by, sort=False)["path"]:
        configs = []
        for path in paths:
            try:
                configs.append(read_config(Path(path)))
            except DamagedRun:
                continue
        differing = differing_settings(configs) if len(configs) > 1 else {}
        if differing:
            mixed[group] = differing
    return mixed


def mixed_settings_message(curve, differing: dict[str, list]) -> str:
    """The warning for one curve whose runs differ in settings (:func:`mixed_settings`)."""
    shown = "; ".join(f"{name} {' vs '.join(_format_setting(v) for v in values)}" for name, values in differing.items())
    return (f"curve {curve} averages runs whose settings differ: {shown} (plotting them as seeds; "
            "by='label' draws each run)")


def _format_setting(value) -> str:
    """A setting as the warning shows it: ``0.0003``, ``None``, ``a,b`` for a list."""
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "()"
    return f"{value:g}" if isinstance(value, float) else str(value)
