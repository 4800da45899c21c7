"""A run's directory as a value: every path of a run, and the rules its files keep, for both engines and the readers.

    <run>/config.json     every setting of the run and the trust region it used
    <run>/metrics.jsonl   one JSON object per RL step (``step`` and every metric)
    <run>/eval.jsonl      one JSON object per evaluation (``step``, ``eval/success``, ``eval/return``, ...)
    <run>/tokens.jsonl    a sample of each step's response tokens and what every rule did with them
                          (:mod:`dppo_oat.run.token_samples`; read by :mod:`dppo_oat.analysis.tokens`)
    <run>/token_exports/  with ``--token-export all``: every trained token, ``step_<step>.jsonl`` per step
                          (:mod:`dppo_oat.run.token_export`; read by its ``read_token_export``)
    <run>/checkpoint.pt   the local engine's model and optimizer (atomic)
    <run>/checkpoints/    the oat engine's resumable checkpoints, ``round_<r>/`` per learning round
                          (:mod:`dppo_oat.engines.oat.resume`)
    <run>/.lock           the one writer's lock (:class:`RunLock`)

:class:`RunDir` names those paths and keeps the rules of the folder: which files a new run may not find (the logs are
append-only: a new run never starts over another's), which temporaries a killed save leaves and their removal under
the lock, how ``--overwrite`` moves an earlier run aside, and how a resume cuts the logs back to its checkpoint.
Writing the logs is :class:`dppo_oat.run.log.RunLog`'s; the writes themselves are :mod:`dppo_oat.run.safe_io`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import warnings
from datetime import datetime, timezone
from pathlib import Path

from dppo_oat.run.safe_io import atomic_write_bytes, honour_umask, make_writable_dir, read_jsonl, temporary_prefix
from dppo_oat.settings.kinds import former_names, with_current_names
from dppo_oat.settings.run_flags import RunFlags

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
TOKENS_FILE = "tokens.jsonl"
TOKEN_EXPORT_DIR = "token_exports"
"""``--token-export all``'s folder: every trained token, a file per step (:mod:`dppo_oat.run.token_export`)."""
CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINTS_DIR = "checkpoints"
"""The oat engine's folder of resumable checkpoints, ``round_<r>/`` each (:mod:`dppo_oat.engines.oat.resume`)."""
LOCK_FILE = ".lock"
LOG_FILES = (METRICS_FILE, EVAL_FILE, TOKENS_FILE)
"""The logs: a line per step (or evaluation), appended, cut back to the checkpoint on resume."""
RUN_FILES = (CONFIG_FILE, METRICS_FILE, EVAL_FILE, TOKENS_FILE, CHECKPOINT_FILE)
"""The files that make a run: a new run never starts where one of them is (:meth:`RunDir.run_files`)."""
MIRROR_DIRS = ("tensorboard", "wandb")
"""The folders the wandb and TensorBoard mirrors write into the run directory."""
OVERWRITTEN_PREFIX = "overwritten-"
"""``<run>/overwritten-<UTC time>/``: where ``--overwrite`` moves an earlier run's files (:meth:`RunDir.move_aside`)."""
EXPORT_FILE = re.compile(r"step_(\d+)\.jsonl")
"""A step's file in ``token_exports/`` (:meth:`RunDir.export`)."""
EXPORT_TEMPORARY = re.compile(r"\.step_\d+\.jsonl\..+|step_\d+\.jsonl\.partial")
"""The temporary of a step's export: an atomic write's (:func:`~dppo_oat.run.safe_io.temporary_prefix`), or a
``.partial`` file (which exporters that wrote in place left)."""
RENAMED_KEYS = former_names(RunFlags)
"""The keys an earlier ``config.json`` recorded under a run flag's former name (``run_dir``, now ``runs_dir``), each
mapped to its name now: every reader of a config reads them under the new name (:func:`current_config`)."""


def without_climbs_through_missing_folders(path: Path) -> Path:
    """``path`` with each ``..`` that follows a folder that does not exist taken out together with that folder
    (``new/../x`` → ``x``, ``new/..`` → ``.``): where the file system would create the folder only to climb out of
    it, leaving it empty behind. A ``..`` after an existing folder is kept: the file system follows it as it does
    (through a symbolic link, to the link target's parent)."""
    kept: list[str] = []
    for part in Path(path).parts:
        climbs_out_of_missing = part == ".." and kept and kept[-1] != ".." and not Path(*kept).exists()
        if climbs_out_of_missing:
            kept.pop()
        else:
            kept.append(part)
    return Path(*kept) if kept else Path(".")


def current_config(config: dict) -> dict:
    """A parsed ``config.json`` with the keys of :data:`RENAMED_KEYS` under their names now, so that a run whose file
    records a flag's former name resumes and is analysed as one that records its name now (the file stays as
    written)."""
    return with_current_names(config, RENAMED_KEYS)


def missing_steps(rows: list[dict], last: int) -> list[int]:
    """The steps 1..``last`` that no row of a log holds (a log that lost lines, or all of them)."""
    logged = {row.get("step") for row in rows}
    return [step for step in range(1, last + 1) if step not in logged]


@dataclasses.dataclass(frozen=True)
class RunDir:
    """One run's directory (``<--runs-dir>/<--run-name>`` for the local engine, ``<save_path>/<run>_<time>`` for the
    oat engine): its paths, a property each, and the rules its files keep. ``RunDir(path)`` takes a path or another
    ``RunDir``, and is itself a path to ``open``, ``Path`` and ``os`` (``os.fspath``)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    # ------------------------------------------------------------------ the paths
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def eval(self) -> Path:
        return self.path / EVAL_FILE

    @property
    def tokens(self) -> Path:
        return self.path / TOKENS_FILE

    @property
    def checkpoint(self) -> Path:
        """The local engine's checkpoint (the oat engine's are :attr:`round_checkpoints`)."""
        return self.path / CHECKPOINT_FILE

    @property
    def token_exports(self) -> Path:
        return self.path / TOKEN_EXPORT_DIR

    def export(self, step: int) -> Path:
        """The export file of ``step``: ``token_exports/step_<step, 6 digits>.jsonl``."""
        return self.token_exports / f"step_{step:06d}.jsonl"

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def round_checkpoints(self) -> Path:
        """The oat engine's resumable checkpoints of learning rounds (``checkpoints/round_<r>/``)."""
        return self.path / CHECKPOINTS_DIR

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    # ------------------------------------------------------------------ what it holds
    def read_config(self) -> dict:
        """The run's ``config.json`` (``{}`` when absent), a key under a flag's former name read under its name now
        (:func:`current_config`); a damaged one, or one that is not a JSON object, is a one-line ``ValueError``."""
        if not self.config.is_file():
            return {}
        try:
            config = json.loads(self.config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{self.config} is damaged ({error}): restore it, or start a new run with another "
                             "--run-name") from None
        if not isinstance(config, dict):
            raise ValueError(f"{self.config} is not a JSON object (it holds a {type(config).__name__}): restore it, "
                             "or start a new run with another --run-name")
        return current_config(config)

    def run_files(self) -> list[str]:
        """The run files (:data:`RUN_FILES`) it holds, whatever their size or kind (an empty file or a dangling link
        counts): a new run here would overwrite them."""
        return [name for name in RUN_FILES if os.path.lexists(self.path / name)]

    def exported_steps(self) -> list[int]:
        """The steps whose export ``token_exports/`` holds, in order."""
        if not self.token_exports.is_dir():
            return []
        names = os.listdir(self.token_exports)
        return sorted(int(match.group(1)) for match in map(EXPORT_FILE.fullmatch, names) if match)

    def steps_missing_from_metrics(self, last: int) -> list[int]:
        """The steps 1..``last`` that ``metrics.jsonl`` lacks."""
        return missing_steps(read_jsonl(self.metrics), last)

    def steps_missing_from_exports(self, last: int) -> list[int]:
        """The steps 1..``last`` that ``token_exports/`` lacks."""
        exported = set(self.exported_steps())
        return [step for step in range(1, last + 1) if step not in exported]

    def temporaries(self) -> list[Path]:
        """The temporary files that atomic writes of run files left here
        (:func:`~dppo_oat.run.safe_io.temporary_prefix`), and those of step exports in ``token_exports/``
        (:data:`EXPORT_TEMPORARY`, whatever their kind: a FIFO too)."""
        if not self.path.is_dir():
            return []
        prefixes = tuple(temporary_prefix(name) for name in RUN_FILES)
        found = [path for path in self.path.iterdir() if path.name.startswith(prefixes) and path.is_file()]
        exports = self.token_exports
        if exports.is_dir() and not exports.is_symlink():
            found += [path for path in exports.iterdir() if EXPORT_TEMPORARY.fullmatch(path.name) and not path.is_dir()]
        return sorted(found)

    # ------------------------------------------------------------------ changing it (the lock holder's)
    def remove_temporaries(self) -> list[Path]:
        """Remove the temporaries of killed saves (:meth:`temporaries`) and return them. Only the holder of the run's
        lock may call it: another live writer's temporary would be one it is still writing."""
        removed = self.temporaries()
        for path in removed:
            path.unlink(missing_ok=True)
        return removed

    def move_aside(self) -> Path | None:
        """Move the run files (and the ``tensorboard/``, ``wandb/`` and ``token_exports/`` folders) into a new
        ``overwritten-<UTC time>/`` folder inside the run, and return that folder (None when there was nothing to
        move). Under the run's lock: ``--overwrite`` never deletes what an earlier run wrote."""
        folders = (*MIRROR_DIRS, TOKEN_EXPORT_DIR)
        names = self.run_files() + [name for name in folders if (self.path / name).is_dir()]
        if not names:
            return None
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        aside = self.path / f"{OVERWRITTEN_PREFIX}{stamp}"
        aside.mkdir()
        honour_umask(aside, directory=True)
        for name in names:
            os.replace(self.path / name, aside / name)
        return aside

    def cut_logs_back(self, step: int | None) -> None:
        """Keep the log lines of steps ≤ ``step`` alone (``None``: a new run, whose logs start empty), each log
        rewritten atomically, and drop the step exports past ``step``: a resume from the checkpoint of ``step``
        writes them again, identically."""
        for log in (self.metrics, self.eval, self.tokens):
            rows = [] if step is None else [row for row in read_jsonl(log) if row.get("step", 0) <= step]
            atomic_write_bytes(log, "".join(json.dumps(row) + "\n" for row in rows).encode())
        if step is not None:
            self.drop_exports_after(step)

    def drop_exports_after(self, step: int) -> None:
        """Remove the step exports past ``step``."""
        for exported in self.exported_steps():
            if exported > step:
                self.export(exported).unlink(missing_ok=True)

    def remove_logs(self) -> None:
        """Remove ``config.json``, the logs and the step exports (what a new run that never completed a step wrote:
        nothing of it is worth keeping, and no half-written run is left to be mistaken for a result)."""
        for path in (self.config, self.metrics, self.eval, self.tokens):
            path.unlink(missing_ok=True)
        for path in self.token_exports.glob("step_*.jsonl*"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.token_exports.rmdir()


class RunLock:
    """The one writer of a run directory: an exclusive ``flock`` on ``<run>/.lock``, held until :meth:`release`.

    A second run in the same directory would interleave its steps with the first's in ``metrics.jsonl`` and
    overwrite its config and checkpoint; it is refused in one line naming the process that holds the lock. The
    kernel drops the lock when that process ends, however it ends, so the lock of a killed run is never stale.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory).absolute()
        self.removed: list[Path] = []
        """The temporaries of killed saves that taking the lock removed (:meth:`RunDir.remove_temporaries`)."""
        self._created = [p for p in (self.directory, *self.directory.parents) if not p.exists()]
        make_writable_dir(self.directory)
        self._file = open(RunDir(self.directory).lock, "a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            raise ValueError(f"run directory {str(self.directory)!r} is in use by another run (process {holder}): "
                             "give this run another --run-name (or wait for that run to end)") from None
        except OSError as error:  # a file system without flock (NFS without lockd): run, but say it is unguarded
            warnings.warn(f"run directory {self.directory} cannot be locked ({error}): a second run writing it "
                          "would not be refused", stacklevel=2)
        else:  # the one writer: a temporary here is a killed writer's
            self.removed = RunDir(self.directory).remove_temporaries()
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()

    @property
    def released(self) -> bool:
        return self._file.closed

    def release(self, *, unused: bool = False) -> None:
        """Unlock (safe to call twice); the lock file stays. ``unused``: the run never started (it failed while
        being built), so the lock file and every folder this lock created go too, when nothing else was written."""
        if self._file.closed:
            return
        with contextlib.suppress(OSError):  # unlocked explicitly: a forked child sharing the file keeps no lock
            fcntl.flock(self._file, fcntl.LOCK_UN)
        if unused:
            RunDir(self.directory).lock.unlink(missing_ok=True)
            for folder in self._created:  # deepest first
                with contextlib.suppress(OSError):  # not empty: something else was written there
                    folder.rmdir()
        self._file.close()
