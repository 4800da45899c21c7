"""Runs are data: the run directory, in one place for the local and oat engines (writing and reading).

    <run>/config.json     every setting of the run and the trust region it used
    <run>/metrics.jsonl   one JSON object per RL step (``step`` and every metric)
    <run>/eval.jsonl      one JSON object per evaluation (``step``, ``eval/success``, ``eval/return``, ...)
    <run>/tokens.jsonl    a sample of each step's response tokens and what every rule did with them
                          (:mod:`dppo_oat.token_samples`; read by :mod:`dppo_oat.analysis.tokens`)
    <run>/token_exports/  with ``--token-export all``: every trained token, ``step_<step>.jsonl`` per step
                          (:mod:`dppo_oat.token_export`; read by its ``read_token_export``)
    <run>/checkpoint.pt   the local engine's model and optimizer (atomic)

Every line of ``metrics.jsonl`` / ``eval.jsonl`` is flushed when written, and checkpoints are written to a
temporary file and renamed, so a crash or a kill loses at most the step in progress. Resuming drops log lines past
the checkpoint's step (they are recomputed identically). wandb and TensorBoard mirror the same numbers when asked.
The writes and reads themselves are :mod:`dppo_oat.safe_io`'s (re-exported here).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import netrc
import os
import re
import urllib.parse
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from dppo_oat.safe_io import (  # noqa: F401  (re-exported: the run directory's IO helpers live in safe_io)
    to_jsonable, check_can_write, make_writable_dir, current_umask, honour_umask, temporary_prefix,
    atomic_write_bytes, atomic_write_lines, append_text, nonfinite_tensors, atomic_torch_save, read_jsonl,
)

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
TOKENS_FILE = "tokens.jsonl"
TOKEN_EXPORT_DIR = "token_exports"
"""``--token-export all``'s folder: every trained token, a file per step (:mod:`dppo_oat.token_export`)."""
CHECKPOINT_FILE = "checkpoint.pt"
RUN_FILES = (CONFIG_FILE, METRICS_FILE, EVAL_FILE, TOKENS_FILE, CHECKPOINT_FILE)
"""The files that make a run: a new run never starts where one of them is (:func:`run_files`)."""
OVERWRITTEN_PREFIX = "overwritten-"
"""``<run>/overwritten-<UTC time>/``: where ``--overwrite`` moves an earlier run's files (:func:`move_run_aside`)."""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"a.b": value}`` in its JSON form (tuples as lists, ``inf`` as ``"inf"``)."""
    flat = {}
    for key, value in to_jsonable(dict(config)).items():
        if isinstance(value, dict):
            flat.update(flatten(value, prefix=f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(stored: Mapping[str, Any], current: Mapping[str, Any], may_change: Iterable[str]) -> list[str]:
    """``"name: old → new"`` for every setting present in both configs that differs, except ``may_change``."""
    old, new, allowed = flatten(stored), flatten(current), set(may_change)
    return [f"{key}: {old[key]!r} → {new[key]!r}" for key in sorted(old.keys() & new.keys())
            if key not in allowed and old[key] != new[key]]


def settings_hash(config: Mapping[str, Any], free: Iterable[str]) -> str:
    """A run's identity as data: the hash of its settings as ``config.json`` records them (flattened), less those in
    ``free`` (what a resume may change). A checkpoint carries it, so a ``config.json`` edited or swapped since is
    told apart from the one the checkpoint was trained under."""
    left_out = set(free)
    settings = {key: value for key, value in flatten(config).items() if key not in left_out}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def read_config(directory: Path) -> dict:
    """The run's ``config.json`` (``{}`` when absent); a damaged one, or one that is not a JSON object, is a one-line
    ``ValueError``."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is damaged ({error}): restore it, or start a new run with another --run-name") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object (it holds a {type(config).__name__}): restore it, or start a "
                         "new run with another --run-name")
    return config


def check_run_name(name: str, flag: str, parent_flag: str) -> None:
    """A run name is one folder inside the runs' folder: ``..``, ``.``, an empty name or a path would write elsewhere
    (beside it, into it, or nested in another run), and a control character (a line break) would break every line
    that names the run. Both engines refuse one, naming their flags."""
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"{flag} {name!r} must be one folder name inside {parent_flag} (no '/', not '.' or '..')")
    if not name.isprintable():
        raise ValueError(f"{flag} {name!r} holds a line break or another control character: give a printable name")


def run_files(directory: Path) -> list[str]:
    """The run files (:data:`RUN_FILES`) in ``directory``, whatever their size or kind (an empty file or a dangling
    link counts): a new run in that directory would overwrite them."""
    return [name for name in RUN_FILES if os.path.lexists(Path(directory) / name)]


EXPORT_FILE = re.compile(r"step_(\d+)\.jsonl")
"""A step's file in ``token_exports/`` (:func:`dppo_oat.token_export.export_path`)."""
EXPORT_TEMPORARY = re.compile(r"\.step_\d+\.jsonl\..+|step_\d+\.jsonl\.partial")
"""The temporary of a step's export: an atomic write's (:func:`temporary_prefix`), or a ``.partial`` file (which
exporters that wrote in place left)."""


def temporaries(directory: Path) -> list[Path]:
    """The temporary files that atomic writes of run files left in ``directory`` (:func:`temporary_prefix`), and
    those of step exports in its ``token_exports/`` (:data:`EXPORT_TEMPORARY`, whatever their kind: a FIFO too)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    prefixes = tuple(temporary_prefix(name) for name in RUN_FILES)
    found = [path for path in directory.iterdir() if path.name.startswith(prefixes) and path.is_file()]
    exports = directory / TOKEN_EXPORT_DIR
    if exports.is_dir() and not exports.is_symlink():
        found += [path for path in exports.iterdir() if EXPORT_TEMPORARY.fullmatch(path.name) and not path.is_dir()]
    return sorted(found)


def exported_steps(directory: Path) -> list[int]:
    """The steps whose export ``<directory>/token_exports/`` holds, in order."""
    exports = Path(directory) / TOKEN_EXPORT_DIR
    if not exports.is_dir():
        return []
    return sorted(int(match.group(1)) for match in map(EXPORT_FILE.fullmatch, os.listdir(exports)) if match)


def drop_exports_after(directory: Path, step: int) -> None:
    """Remove the step exports past ``step`` (a resume from the checkpoint of ``step`` writes them again, as it does
    their log lines)."""
    for exported in exported_steps(directory):
        if exported > step:
            (Path(directory) / TOKEN_EXPORT_DIR / f"step_{exported:06d}.jsonl").unlink(missing_ok=True)


def remove_temporaries(directory: Path) -> list[Path]:
    """Remove the temporaries of killed saves in ``directory`` (:func:`temporaries`) and return them. Only the holder of
    the run's lock may call it: another live writer's temporary would be one it is still writing."""
    removed = temporaries(directory)
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def move_run_aside(directory: Path) -> Path | None:
    """Move the run files of ``directory`` (and its ``tensorboard/``, ``wandb/`` and ``token_exports/`` folders) into
    a new ``overwritten-<UTC time>/`` folder inside it, and return that folder (None when there was nothing to move).
    Under the run's lock: ``--overwrite`` never deletes what an earlier run wrote."""
    directory = Path(directory)
    folders = ("tensorboard", "wandb", TOKEN_EXPORT_DIR)
    names = run_files(directory) + [name for name in folders if (directory / name).is_dir()]
    if not names:
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = directory / f"{OVERWRITTEN_PREFIX}{stamp}"
    aside.mkdir()
    honour_umask(aside, directory=True)
    for name in names:
        os.replace(directory / name, aside / name)
    return aside


def missing_steps(rows: list[dict], last: int) -> list[int]:
    """The steps 1..``last`` that no row of a log holds (a log that lost lines, or all of them)."""
    logged = {row.get("step") for row in rows}
    return [step for step in range(1, last + 1) if step not in logged]


LOCK_FILE = ".lock"


class RunLock:
    """The one writer of a run directory: an exclusive ``flock`` on ``<run>/.lock``, held until :meth:`release`.

    A second run in the same directory would interleave its steps with the first's in ``metrics.jsonl`` and
    overwrite its config and checkpoint; it is refused in one line naming the process that holds the lock. The
    kernel drops the lock when that process ends, however it ends, so the lock of a killed run is never stale.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory).absolute()
        self.removed: list[Path] = []
        """The temporaries of killed saves that taking the lock removed (:func:`remove_temporaries`)."""
        self._created = [p for p in (self.directory, *self.directory.parents) if not p.exists()]
        make_writable_dir(self.directory)
        self._file = open(self.directory / LOCK_FILE, "a+")
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
            self.removed = remove_temporaries(self.directory)
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
            (self.directory / LOCK_FILE).unlink(missing_ok=True)
            for folder in self._created:  # deepest first
                with contextlib.suppress(OSError):  # not empty: something else was written there
                    folder.rmdir()
        self._file.close()


WANDB_KEYLESS_MODES = ("offline", "disabled", "dryrun")
"""``WANDB_MODE`` values under which wandb logs without an API key."""


def check_wandb(flag: str) -> None:
    """Refuse ``flag`` (``--wandb``, ``--use_wb``) in one line, before any model loads, where wandb cannot log:
    not installed, or no API key (``WANDB_API_KEY``, ``wandb login``'s netrc) outside an offline ``WANDB_MODE``.
    Without a key, wandb would ask for one at the first log call, which a worker process cannot answer (oat calls
    ``wandb.login(key=True)`` there)."""
    try:
        import wandb
    except ImportError:
        raise ValueError(f"{flag} needs wandb: pip install wandb (or leave {flag} out)") from None
    if os.environ.get("WANDB_MODE", "").lower() in WANDB_KEYLESS_MODES:
        return
    if not wandb_api_key_present(wandb):
        raise ValueError(f"{flag}: wandb has no API key here: run `wandb login`, or set WANDB_API_KEY, or "
                         f"WANDB_MODE=offline (or leave {flag} out)")


def wandb_api_key_present(wandb) -> bool:
    """Where wandb looks for a key: ``WANDB_API_KEY``, the netrc ``wandb login`` writes (``$NETRC``, else
    ``~/.netrc``) for the host of ``WANDB_BASE_URL``, then wandb's own settings through ``wandb.api`` (what oat
    reads; deprecated in newer wandb, so asked last and only where it exists)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        if netrc.netrc(os.environ.get("NETRC")).authenticators(host):
            return True
    return bool(getattr(getattr(wandb, "api", None), "api_key", None))


def check_tensorboard(flag: str) -> None:
    """Refuse ``flag`` in one line where TensorBoard's writer cannot be imported."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ValueError(f"{flag} needs tensorboard: pip install tensorboard (or leave {flag} out)") from None


PROVENANCE = ("code_commit", "started_at")
"""What ``config.json`` records of where a run came from: the code it ran (:func:`code_commit`) and when it started
(UTC). A resume keeps the run's own and records its own under ``resumes``."""


CODE_PATHS = ("dppo_oat", "envs", "scripts", "requirements", "pyproject.toml")
"""The parts of the checkout that decide what a run does (not its docs, notebooks or run folders)."""


COMMIT_VARIABLE = "DPPO_COMMIT"
"""Names the commit for a copy of the checkout whose ``.git`` is missing or not its own (a tree copied to another
machine): when set, :func:`code_commit` returns it as it is."""


def code_commit() -> str:
    """The commit of the checkout this package runs from (``-dirty`` when its code, :data:`CODE_PATHS`, differs
    from it), or ``dppo_oat <version>`` for an installed package or a machine without git; ``$DPPO_COMMIT`` when
    set (:data:`COMMIT_VARIABLE`)."""
    import subprocess

    from dppo_oat import __version__

    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return f"dppo_oat {__version__}"
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                  *CODE_PATHS], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"dppo_oat {__version__}"
    return head + ("-dirty" if changed else "")


def with_provenance(config: dict, stored: dict | None, resume_step: int | None) -> dict:
    """``config`` with the run's provenance (:data:`PROVENANCE`): this process's for a new run; for a resume
    (``stored``: the run's config.json), the run's own, and this process's in a new ``resumes`` entry with the step
    it resumed at and the ``--steps`` it asked for."""
    now = {"code_commit": code_commit(), "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if stored is None:
        return {**config, **now}
    kept = {key: stored[key] for key in PROVENANCE if key in stored}
    resume = {"step": resume_step, "steps": config.get("steps"), **now}
    return {**config, **kept, "resumes": [*stored.get("resumes", []), resume]}


class RunLog:
    """Writes one run directory. ``resume_step`` truncates the logs to steps ≤ it (``None``: a new run)."""

    def __init__(self, directory: Path, config: dict, *, resume_step: int | None = None,
                 wandb: bool = False, tensorboard: bool = False):
        self.directory = Path(directory)
        make_writable_dir(self.directory)
        config = with_provenance(config, read_config(self.directory) if resume_step is not None else None,
                                 resume_step)
        self.config = config
        atomic_write_bytes(self.directory / CONFIG_FILE, json.dumps(to_jsonable(config), indent=2).encode())
        for name in (METRICS_FILE, EVAL_FILE, TOKENS_FILE):
            self._truncate(self.directory / name, resume_step)
        if resume_step is not None:
            drop_exports_after(self.directory, resume_step)
        self._wandb = self._start_wandb(config) if wandb else None
        self._tensorboard = self._start_tensorboard() if tensorboard else None

    def update_config(self, changes: dict) -> None:
        """Rewrite ``config.json`` (atomically) with ``changes`` merged in: what the run settled on after it started
        (a calibrated trust-region band)."""
        self.config = {**self.config, **changes}
        atomic_write_bytes(self.directory / CONFIG_FILE, json.dumps(to_jsonable(self.config), indent=2).encode())
        if self._wandb is not None:
            self._wandb.config.update(to_jsonable(changes), allow_val_change=True)

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
        append_text(self.directory / name, json.dumps(to_jsonable(row)) + "\n")
        step = int(row["step"])
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(key, value, step)

    def log_metrics(self, row: dict) -> None:
        """One line of ``metrics.jsonl`` (must contain ``step``)."""
        self._append(METRICS_FILE, row)

    def log_eval(self, row: dict) -> None:
        """One line of ``eval.jsonl`` (must contain ``step``)."""
        self._append(EVAL_FILE, row)

    def log_tokens(self, rows: list[dict]) -> None:
        """One step's token samples, a line each, in ``tokens.jsonl`` (not mirrored to wandb or TensorBoard)."""
        if rows:
            append_text(self.directory / TOKENS_FILE, "".join(json.dumps(to_jsonable(row)) + "\n" for row in rows))

    def discard(self) -> None:
        """Remove what this log wrote (for a new run that never completed a step: nothing of it is worth keeping,
        and no half-written run is left to be mistaken for a result)."""
        self.close()
        for name in (CONFIG_FILE, METRICS_FILE, EVAL_FILE, TOKENS_FILE):
            (self.directory / name).unlink(missing_ok=True)
        for path in (self.directory / TOKEN_EXPORT_DIR).glob("step_*.jsonl*"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (self.directory / TOKEN_EXPORT_DIR).rmdir()

    def close(self) -> None:
        """Finish the mirrors (idempotent)."""
        if self._wandb is not None:
            self._wandb.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
        self._wandb = self._tensorboard = None
