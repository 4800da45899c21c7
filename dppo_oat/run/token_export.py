"""Every trained token of a step, written to disk off the hot path (``--token-export all``).

``tokens.jsonl`` holds a sample (:mod:`dppo_oat.run.token_samples`); this holds them all: one JSONL file per RL step,
``<run>/token_exports/step_<step>.jsonl``, one record per response (a row of the loss: one turn), its fields aligned
per-token arrays named as prime-rl's token export names them (``prime_rl/trainer/rl/token_export.py``, schema 1):
``token_ids``, ``loss_mask``, ``advantages``, ``inference_logprobs`` (log μ), ``trainer_logprobs`` (log π_θ of the
forward pass whose loss first used the token, as in ``tokens.jsonl``), ``importance_ratio`` (π_θ/μ), ``entropy``,
``is_masked`` (the run's own M_t = 0), ``is_masked_high`` / ``is_masked_low`` (blocked with A > 0 / A < 0), plus the
record's ``step``, ``row``, ``turn`` and ``env_name``. A record spans the row's first to last response token.

The update loop hands each micro-batch's detached tensors to :meth:`TokenExporter.observe` (no copy, no host
synchronisation); :meth:`TokenExporter.write` moves them to the host and writes the file in a background thread
while the engine syncs its generator and logs the step; :meth:`TokenExporter.wait` returns once the file is on disk
(the local engine checkpoints a step only then, so a step is never checkpointed without its export). A file is
written through a temporary file that is flushed to disk and renamed (a kill leaves a temporary, which the next start
of the run removes under its lock); a write that has not finished :data:`WRITE_TIMEOUT_S` seconds later (a blocked or
hung file system) is a ``TimeoutError`` naming the file, never a hang. Off (the default), nothing is observed and
nothing written.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from dppo_oat.run.directory import TOKEN_EXPORT_DIR, RunDir
from dppo_oat.run.safe_io import atomic_write_lines
from dppo_oat.trust_region import MAX_LOG_RATIO, PolicyLossOutput

SCHEMA_VERSION = 1
"""prime-rl's token-export schema version whose field names the records use."""
EXPORT_DIR = TOKEN_EXPORT_DIR
"""The run directory's folder of exports, a file per step (:meth:`~dppo_oat.run.directory.RunDir.export`)."""
FLOAT_COLUMNS = ("advantages", "inference_logprobs", "trainer_logprobs", "importance_ratio", "entropy")
BOOL_COLUMNS = ("loss_mask", "is_masked", "is_masked_high", "is_masked_low")
WRITE_TIMEOUT_S = 300.0
"""How long :meth:`TokenExporter.wait` waits for a step's file after its update (a step's file takes well under a
second on a working disk); past it, a blocked or hung file system ends the run in one line instead of a hang."""
PROBE_TIMEOUT_S = 30.0
"""How long :func:`check_export_folder` waits for its probe write before the run starts."""


def export_path(run_dir: Path, step: int) -> Path:
    """The export file of ``step``: ``<run_dir>/token_exports/step_<step, 6 digits>.jsonl``
    (:meth:`~dppo_oat.run.directory.RunDir.export`)."""
    return RunDir(run_dir).export(step)


def export_columns(micro, logp: torch.Tensor, entropy: torch.Tensor | None,
                   result: PolicyLossOutput) -> dict[str, torch.Tensor]:
    """One micro-batch's ``[b, T]`` columns, detached, on the device they are on (no synchronisation)."""
    lp, mu = logp.detach().float(), micro.behavior_logp.float()
    mask = micro.response_mask.bool()
    adv = micro.advantages.float().expand_as(lp)
    blocked = mask & ~result.keep
    return {
        "token_ids": micro.input_ids[:, 1: mask.shape[1] + 1], "loss_mask": mask, "advantages": adv,
        "inference_logprobs": mu, "trainer_logprobs": lp,
        "importance_ratio": (lp - mu).clamp(max=MAX_LOG_RATIO).exp(),
        "entropy": entropy.detach().float() if entropy is not None else torch.full_like(lp, math.nan),
        "is_masked": blocked, "is_masked_high": blocked & (adv > 0), "is_masked_low": blocked & (adv < 0),
    }


def row_records(rows: torch.Tensor, columns: dict[str, list], step: int, turns: Sequence[int] | None,
                envs: Sequence[str] | None) -> list[dict]:
    """One record per row with a response token: the columns (host lists) from its first to last response token."""
    records = []
    for i, row in enumerate(rows.tolist()):
        mask = columns["loss_mask"][i]
        if not any(mask):
            continue
        start, end = mask.index(True), len(mask) - mask[::-1].index(True)
        record = {"schema_version": SCHEMA_VERSION, "step": step, "row": row,
                  "turn": None if turns is None else int(turns[row]), "env_name": None if envs is None else envs[row]}
        for name, values in columns.items():
            span = values[i][start:end]
            record[name] = [_finite(v) for v in span] if name in FLOAT_COLUMNS else span
        records.append(record)
    return records


def _finite(value: float) -> float | None:
    """JSON has no NaN or ∞: a missing entropy is null."""
    return value if math.isfinite(value) else None


def write_records(path: Path, records: list[dict]) -> None:
    """The records as JSON lines, written to a temporary file, flushed to disk and renamed
    (:func:`~dppo_oat.run.safe_io.atomic_write_lines`): a reader never sees half a step, and a full disk is an
    ``OSError`` naming ``path`` that leaves no temporary file."""
    lines = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n" for record in records)
    atomic_write_lines(path, lines)


class BackgroundCall:
    """``work()`` in a daemon thread (a thread stuck on a hung file system never keeps the process alive), whose
    failure :meth:`wait` raises; a call still running after the timeout is a ``TimeoutError`` naming ``path``."""

    def __init__(self, work: Callable[[], None], path: Path, what: str) -> None:
        self.path, self.what, self.error = path, what, None
        self.thread = threading.Thread(target=self._run, args=(work,), name="token-export", daemon=True)
        self.thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:  # raised on the waiting thread
            self.error = error

    def wait(self, timeout: float) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(errno.ETIMEDOUT, f"{self.what} did not reach the disk in {timeout:g} s (its file "
                               "system is blocked or hung)", str(self.path))
        if isinstance(self.error, OSError) and self.error.filename is None:
            self.error.filename = str(self.path)
        if self.error is not None:
            raise self.error


class TokenExporter:
    """Every trained token of each step (see the module docstring). The update loop calls :meth:`observe` for every
    micro-batch of a rollout batch's first epoch; the engine then calls :meth:`write` once per step, :meth:`wait`
    before it checkpoints the step, and :meth:`close` at the end of the run."""

    def __init__(self, run_dir: Path, timeout: float | None = None) -> None:
        self.run_dir = RunDir(run_dir)
        self.timeout = WRITE_TIMEOUT_S if timeout is None else timeout
        self.pending: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
        self.last: BackgroundCall | None = None

    def observe(self, micro_rows: torch.Tensor, micro, logp: torch.Tensor, entropy: torch.Tensor | None,
                result: PolicyLossOutput) -> None:
        """Keep one micro-batch's columns (references to detached tensors: nothing is copied or synchronised)."""
        self.pending.append((micro_rows, export_columns(micro, logp, entropy, result)))

    def write(self, step: int, turns: Sequence[int] | None = None, envs: Sequence[str] | None = None) -> None:
        """Hand the step's tokens to a writer thread and start the next step empty; the previous step's file is
        waited for first (:meth:`wait`: its failure is raised here)."""
        pending, self.pending = self.pending, []
        self.wait()
        self.last = BackgroundCall(lambda: self._write_step(step, pending, turns, envs),
                                   self.run_dir.export(step), f"the token export of step {step}")

    def _write_step(self, step, pending, turns, envs) -> None:
        records = []
        for rows, columns in pending:
            host = {name: value.cpu().tolist() for name, value in columns.items()}
            records += row_records(rows.cpu(), host, step, turns, envs)
        write_records(self.run_dir.export(step), records)

    def wait(self) -> None:
        """Return once the last step's file is on disk; raise its write's failure (an ``OSError`` naming the file),
        or a ``TimeoutError`` naming it when it is not written within the timeout."""
        last, self.last = self.last, None
        if last is not None:
            last.wait(self.timeout)

    def close(self, *, wait: bool = True) -> None:
        """Wait for the last step's file (raising its failure); ``wait=False`` (a run that already failed) leaves a
        write still running to its daemon thread."""
        if wait:
            self.wait()
        self.last = None


class TokenObservers:
    """Several token observers (the ``tokens.jsonl`` sampler, the exporter) behind the one ``observe`` the update
    loop calls."""

    def __init__(self, *observers) -> None:
        self.observers = [observer for observer in observers if observer is not None]

    def observe(self, micro_rows, micro, logp, entropy, result) -> None:
        for observer in self.observers:
            observer.observe(micro_rows, micro, logp, entropy, result)


def exported_steps_of(run_dir: Path, step: int | None) -> list[int]:
    """The exported steps :func:`read_token_export` reads: ``[step]``, or every one (see its docstring)."""
    exported = RunDir(run_dir).exported_steps()
    folder = RunDir(run_dir).token_exports
    if not exported:
        raise ValueError(f"{run_dir} has no token exports (no step_*.jsonl in {folder}): it was trained without "
                         "--token-export all")
    span = f"steps {exported[0]}–{exported[-1]}" if len(exported) > 1 else f"step {exported[0]}"
    if step is not None:
        if step not in exported:
            raise ValueError(f"{run_dir} has no token export of step {step} ({len(exported)} exported, {span})")
        return [step]
    missing = sorted(set(range(exported[0], exported[-1] + 1)) - set(exported))
    if missing:
        warnings.warn(f"{folder} lacks {len(missing)} of {span} (step {missing[0]} first): the table misses them",
                      stacklevel=3)
    return exported


def check_export_folder(run_dir: Path, timeout: float | None = None) -> None:
    """Refuse, in one line (``ValueError``) before the run starts, a ``token_exports`` path that is not a folder, a
    folder that cannot be written, and one whose file system does not answer a probe write within ``timeout``
    seconds (:data:`PROBE_TIMEOUT_S`: a blocked or hung file system). A folder that does not exist yet is left to
    the run directory's own check (it is created inside it)."""
    folder = RunDir(run_dir).token_exports
    probe = BackgroundCall(lambda: _probe_folder(folder), folder, "a probe write")
    try:
        probe.wait(PROBE_TIMEOUT_S if timeout is None else timeout)
    except TimeoutError as error:
        raise ValueError(f"--token-export all: {folder}: {error.strerror}: fix or unmount it, or give another "
                         "--runs-dir") from None
    except NotADirectoryError:
        raise ValueError(f"--token-export all writes a file per step into {folder}, which is not a folder: move "
                         "that file away, or give another --run-name") from None
    except OSError as error:
        raise ValueError(f"--token-export all cannot write into {folder}: {error.strerror or error}") from None


def _probe_folder(folder: Path) -> None:
    """Write, sync and remove one temporary file in ``folder`` when it exists (``NotADirectoryError`` when it is a
    file)."""
    if not os.path.lexists(folder):
        return
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-") as handle:
        handle.write(b"\n")
        handle.flush()
        os.fsync(handle.fileno())


RECORD_KEYS = ("step", "row", "turn", "env_name")
"""A record's fields that name it (a record of a step is one row of its batch: ``step`` and ``row`` are its key)."""
TOKEN_FIELDS = ("token_ids", *BOOL_COLUMNS, *FLOAT_COLUMNS)
"""A record's per-token fields: lists of one length, a value per token."""


def json_kind(value) -> str:
    """The JSON type of a parsed value, as a message names it: ``a list``, ``null``, ``a string``, ..."""
    if value is None:
        return "null"
    names = {bool: "a boolean", dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def record_problem(record) -> str | None:
    """Why a parsed line is not a record of a step's export (None when it is one): not a JSON object, a field of
    :data:`RECORD_KEYS` or :data:`TOKEN_FIELDS` missing, a ``step`` or ``row`` that is not an integer, a per-token
    field that is not a list, or per-token fields of different lengths."""
    if not isinstance(record, dict):
        return f"holds {json_kind(record)}, not a JSON object"
    missing = [name for name in (*RECORD_KEYS, *TOKEN_FIELDS) if name not in record]
    if missing:
        return f"the record lacks {', '.join(missing)}"
    for key in ("step", "row"):
        if isinstance(record[key], bool) or not isinstance(record[key], int):
            return f"its {key} is not an integer ({json_kind(record[key])})"
    for name in TOKEN_FIELDS:
        if not isinstance(record[name], list):
            return f"its {name} is not a list ({json_kind(record[name])})"
    lengths = sorted({len(record[name]) for name in TOKEN_FIELDS})
    if len(lengths) > 1:
        return f"its per-token fields differ in length ({lengths[0]} to {lengths[-1]} values)"
    return None


def read_export_file(path: Path, step: int) -> list[dict]:
    """The records of step ``step``'s export file ``path`` (blank lines skipped). A file that cannot be read, or a
    line that is not a record (:func:`record_problem`), is a ``ValueError`` naming the file, the step and the line."""
    where = f"token export {path} (step {step})"
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ValueError(f"{where} is a directory, not a file: move it out of {path.parent} (that step has no "
                         "export then), or read another step") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{where}: not UTF-8 text (byte {error.start} of the file): restore it from a copy, or read "
                         "another step") from None
    except OSError as error:
        raise ValueError(f"{where} cannot be read ({error.strerror or error})") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problem = f"not JSON ({error.msg} at column {error.colno})"
        else:
            problem = record_problem(record)
        if problem is not None:
            raise ValueError(f"{where}, line {number}: {problem}: restore the file from a copy, or read another "
                             "step")
        records.append(record)
    return records


def first_repeat(keys: list) -> int:
    """The index of the first key of ``keys`` that an earlier one equals (ask only when there is one)."""
    seen = set()
    for index, key in enumerate(keys):
        if key in seen:
            return index
        seen.add(key)
    raise ValueError("no key is repeated")


def without_repeated_records(read: list[tuple[Path, dict]]) -> list[dict]:
    """The records of ``read`` (each with the file it was read from, in the order read) with each ``(step, row)``
    once, the last copy kept: where a record is written twice (a file appended to, a copy's lines), one warning names
    the file of the first repeat, that record and how many records were repeated (their tokens would otherwise count
    twice)."""
    keys = [(record["step"], record["row"]) for _, record in read]
    last = {key: index for index, key in enumerate(keys)}
    if len(last) == len(keys):
        return [record for _, record in read]
    first = first_repeat(keys)
    repeated = sum(1 for count in Counter(keys).values() if count > 1)
    warnings.warn(f"{read[first][0]}: the record of step {keys[first][0]}, row {keys[first][1]} is written more "
                  f"than once ({repeated} record(s) repeated): the last copy of each is kept", stacklevel=3)
    return [record for index, (_, record) in enumerate(read) if last[keys[index]] == index]


def record_frame(record: dict):
    """One record as a pandas DataFrame, a row per token: its :data:`TOKEN_FIELDS`, ``position`` (the index within
    the record) and, in front, its :data:`RECORD_KEYS`."""
    import pandas as pd

    frame = pd.DataFrame({name: record[name] for name in TOKEN_FIELDS})
    frame.insert(0, "position", range(len(frame)))
    for key in reversed(RECORD_KEYS):
        frame.insert(0, key, record[key])
    return frame


def read_token_export(run_dir: Path, step: int | None = None):
    """The export of ``step`` (every step when None) as a pandas DataFrame, a row per token: the records' per-token
    arrays exploded, with ``step``, ``row``, ``turn``, ``env_name`` and ``position`` (index within the record).

    A run without exports, or a ``step`` it did not export, is a ``ValueError`` (one line naming the steps it has);
    so is a damaged file or record (naming the file, the step and the line: :func:`read_export_file`). Reading every
    step warns once when steps between the first and the last exported are missing, and a record written twice is
    read once, with a warning (:func:`without_repeated_records`)."""
    import pandas as pd

    read = []
    for exported in exported_steps_of(run_dir, step):
        path = RunDir(run_dir).export(exported)
        read += [(path, record) for record in read_export_file(path, exported)]
    frames = [record_frame(record) for record in without_repeated_records(read)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
