"""Runs are data: ``runs/<name>/config.json``, ``metrics.jsonl``, ``eval.jsonl`` and atomic checkpoints.

Every line of ``metrics.jsonl`` / ``eval.jsonl`` is flushed when written, and checkpoints are written to a
temporary file and renamed, so a crash or a kill loses at most the step in progress. Resuming drops log lines past
the checkpoint's step (they are recomputed identically). wandb and TensorBoard mirror the same numbers when asked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"


def to_jsonable(value: Any) -> Any:
    """Dataclasses, paths, tuples and non-finite floats in a form JSON (and pandas) reads back."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, Path):
        return str(value)
    return value


def check_writable(directory: Path) -> None:
    """Fail now, with the path in the message, if ``directory`` cannot be created and written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ValueError(f"run directory {str(directory)!r} is not writable: {error}") from error


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_jsonl(path: Path) -> list[dict]:
    """All complete JSON lines of ``path`` (a torn last line from a kill is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class RunLog:
    """Writes one run directory. ``resume_step`` truncates the logs to steps ≤ it (``None``: a new run)."""

    def __init__(self, directory: Path, config: dict, *, resume_step: int | None = None,
                 wandb: bool = False, tensorboard: bool = False):
        self.directory = Path(directory)
        check_writable(self.directory)
        atomic_write_bytes(self.directory / "config.json", json.dumps(to_jsonable(config), indent=2).encode())
        for name in ("metrics.jsonl", "eval.jsonl"):
            self._truncate(self.directory / name, resume_step)
        self._wandb = self._start_wandb(config) if wandb else None
        self._tensorboard = self._start_tensorboard() if tensorboard else None

    @staticmethod
    def _truncate(path: Path, resume_step: int | None) -> None:
        rows = [] if resume_step is None else [r for r in read_jsonl(path) if r.get("step", 0) <= resume_step]
        atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in rows).encode())

    def _start_wandb(self, config: dict):
        import wandb  # optional dependency: pip install dppo_oat[wandb]

        return wandb.init(project="dppo_oat", name=self.directory.name, config=to_jsonable(config),
                          dir=str(self.directory), resume="allow", id=self.directory.name)

    def _start_tensorboard(self):
        from torch.utils.tensorboard import SummaryWriter  # optional dependency: pip install dppo_oat[tensorboard]

        return SummaryWriter(log_dir=str(self.directory / "tensorboard"))

    def _append(self, name: str, row: dict) -> None:
        with open(self.directory / name, "a") as handle:
            handle.write(json.dumps(to_jsonable(row)) + "\n")
            handle.flush()
        step = int(row["step"])
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(key, value, step)

    def log_metrics(self, row: dict) -> None:
        """One line of ``metrics.jsonl`` (must contain ``step``)."""
        self._append("metrics.jsonl", row)

    def log_eval(self, row: dict) -> None:
        """One line of ``eval.jsonl`` (must contain ``step``)."""
        self._append("eval.jsonl", row)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
