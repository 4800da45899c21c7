"""Every trained token of a step, written to disk off the hot path (``--token-export all``).

``tokens.jsonl`` holds a sample (:mod:`dppo_oat.token_samples`); this holds them all: one JSONL file per RL step,
``<run>/token_exports/step_<step>.jsonl``, one record per response (a row of the loss: one turn), its fields aligned
per-token arrays named as prime-rl's token export names them (``prime_rl/trainer/rl/token_export.py``, schema 1):
``token_ids``, ``loss_mask``, ``advantages``, ``inference_logprobs`` (log μ), ``trainer_logprobs`` (log π_θ of the
forward pass whose loss first used the token, as in ``tokens.jsonl``), ``importance_ratio`` (π_θ/μ), ``entropy``,
``is_masked`` (the run's own M_t = 0), ``is_masked_high`` / ``is_masked_low`` (blocked with A > 0 / A < 0), plus the
record's ``step``, ``row``, ``turn`` and ``env_name``. A record spans the row's first to last response token.

The update loop hands each micro-batch's detached tensors to :meth:`TokenExporter.observe` (no copy, no host
synchronisation); :meth:`TokenExporter.write` moves them to the host and writes the file in a background thread,
so the next step's rollout runs meanwhile. Off (the default), nothing is observed and nothing written.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from dppo_oat.runlog import TOKEN_EXPORT_DIR
from dppo_oat.trust_region import MAX_LOG_RATIO, PolicyLossOutput

SCHEMA_VERSION = 1
"""prime-rl's token-export schema version whose field names the records use."""
EXPORT_DIR = TOKEN_EXPORT_DIR
"""The run directory's folder of exports, a file per step (:func:`export_path`)."""
TOKEN_EXPORT_MODES = ("none", "all")
"""``--token-export``: ``none`` (the default: nothing) or ``all`` (every trained token of every step)."""
FLOAT_COLUMNS = ("advantages", "inference_logprobs", "trainer_logprobs", "importance_ratio", "entropy")
BOOL_COLUMNS = ("loss_mask", "is_masked", "is_masked_high", "is_masked_low")


def export_path(run_dir: Path, step: int) -> Path:
    """The export file of ``step``: ``<run_dir>/token_exports/step_<step, 6 digits>.jsonl``."""
    return Path(run_dir) / EXPORT_DIR / f"step_{step:06d}.jsonl"


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
    """The records as JSON lines, written to a temporary file and renamed (a reader never sees half a step)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".jsonl.partial")
    with partial.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
    partial.replace(path)


class TokenExporter:
    """Every trained token of each step (see the module docstring). The update loop calls :meth:`observe` for every
    micro-batch of a rollout batch's first epoch; the engine then calls :meth:`write` once per step and
    :meth:`close` at the end of the run (which waits for the last file)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.pending: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="token-export")
        self.last: Future | None = None

    def observe(self, micro_rows: torch.Tensor, micro, logp: torch.Tensor, entropy: torch.Tensor | None,
                result: PolicyLossOutput) -> None:
        """Keep one micro-batch's columns (references to detached tensors: nothing is copied or synchronised)."""
        self.pending.append((micro_rows, export_columns(micro, logp, entropy, result)))

    def write(self, step: int, turns: Sequence[int] | None = None, envs: Sequence[str] | None = None) -> None:
        """Hand the step's tokens to the writer thread and start the next step empty; a failure of the previous
        step's write is raised here."""
        pending, self.pending = self.pending, []
        previous, self.last = self.last, None
        if previous is not None:
            previous.result()
        self.last = self.writer.submit(self._write_step, step, pending, turns, envs)

    def _write_step(self, step, pending, turns, envs) -> None:
        records = []
        for rows, columns in pending:
            host = {name: value.cpu().tolist() for name, value in columns.items()}
            records += row_records(rows.cpu(), host, step, turns, envs)
        write_records(export_path(self.run_dir, step), records)

    def close(self) -> None:
        """Wait for the last step's file (raising its failure), then stop the writer thread."""
        try:
            if self.last is not None:
                self.last.result()
        finally:
            self.writer.shutdown(wait=True)


class TokenObservers:
    """Several token observers (the ``tokens.jsonl`` sampler, the exporter) behind the one ``observe`` the update
    loop calls."""

    def __init__(self, *observers) -> None:
        self.observers = [observer for observer in observers if observer is not None]

    def observe(self, micro_rows, micro, logp, entropy, result) -> None:
        for observer in self.observers:
            observer.observe(micro_rows, micro, logp, entropy, result)


def read_token_export(run_dir: Path, step: int | None = None):
    """The export of ``step`` (every step when None) as a pandas DataFrame, a row per token: the records' per-token
    arrays exploded, with ``step``, ``row``, ``turn``, ``env_name`` and ``position`` (index within the record)."""
    import pandas as pd

    paths = [export_path(run_dir, step)] if step is not None else sorted((Path(run_dir) / EXPORT_DIR).glob("step_*.jsonl"))
    frames = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            columns = {name: record[name] for name in ("token_ids", *BOOL_COLUMNS, *FLOAT_COLUMNS)}
            frame = pd.DataFrame(columns)
            frame.insert(0, "position", range(len(frame)))
            for key in ("env_name", "turn", "row", "step"):
                frame.insert(0, key, record[key])
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
