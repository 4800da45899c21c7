"""Runs are data: writing a run directory's logs and config, and what a run records of itself (its settings'
identity, its provenance, the wandb and TensorBoard mirrors), for the local and oat engines.

The directory's layout and the rules its files keep (the paths, the lock, temporaries of killed saves, moving an
earlier run aside, cutting logs back on resume) are :class:`~dppo_oat.run.directory.RunDir`'s; the writes and reads
themselves are :mod:`dppo_oat.run.safe_io`'s. Every line of ``metrics.jsonl`` / ``eval.jsonl`` is flushed when
written, and checkpoints are written to a temporary file and renamed, so a crash or a kill loses at most the step in
progress. Resuming drops log lines past the checkpoint's step (they are recomputed identically). wandb and
TensorBoard mirror the same numbers when asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import netrc
import os
import urllib.parse
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dppo_oat.run.directory import RunDir
from dppo_oat.run.safe_io import append_text, atomic_write_bytes, make_writable_dir, to_jsonable


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
    """The run's ``config.json`` (``{}`` when absent): :meth:`RunDir.read_config`."""
    return RunDir(directory).read_config()


def check_run_name(name: str, flag: str, parent_flag: str) -> None:
    """A run name is one folder inside the runs' folder: ``..``, ``.``, an empty name or a path would write elsewhere
    (beside it, into it, or nested in another run), and a control character (a line break) would break every line
    that names the run. Both engines refuse one, naming their flags."""
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"{flag} {name!r} must be one folder name inside {parent_flag} (no '/', not '.' or '..')")
    if not name.isprintable():
        raise ValueError(f"{flag} {name!r} holds a line break or another control character: give a printable name")


def temporaries(directory: Path) -> list[Path]:
    """The temporaries that killed saves left in a run directory: :meth:`RunDir.temporaries`."""
    return RunDir(directory).temporaries()


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
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (imported only to see that it imports)
    except ImportError:
        raise ValueError(f"{flag} needs tensorboard: pip install tensorboard (or leave {flag} out)") from None


PROVENANCE = ("code_commit", "started_at", "torch_threads")
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

    import dppo_oat
    from dppo_oat import __version__

    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]
    root = Path(dppo_oat.__file__).resolve().parents[1]  # the checkout: the folder that holds the package
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


def with_provenance(config: dict, stored: dict | None, resume_step: int | None, process: dict | None = None) -> dict:
    """``config`` with the run's provenance (:data:`PROVENANCE`): this process's (its code commit, start time, and
    what else the engine chose for it, ``process``: the local engine's torch thread count) for a new run; for a
    resume (``stored``: the run's config.json), the run's own, and this process's in a new ``resumes`` entry with the
    step it resumed at and the ``--steps`` it asked for."""
    now = {"code_commit": code_commit(), "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           **(process or {})}
    if stored is None:
        return {**config, **now}
    kept = {key: stored[key] for key in PROVENANCE if key in stored}
    resume = {"step": resume_step, "steps": config.get("steps"), **now}
    return {**config, **kept, "resumes": [*stored.get("resumes", []), resume]}


class RunLog:
    """Writes one run directory's config and logs. ``resume_step`` cuts the logs back to steps ≤ it (``None``: a
    new run, whose logs start empty); ``process``: what the engine chose for this process, recorded with its
    provenance (:func:`with_provenance`)."""

    def __init__(self, directory: str | os.PathLike, config: dict, *, resume_step: int | None = None,
                 wandb: bool = False, tensorboard: bool = False, process: dict | None = None):
        self.run_dir = RunDir(directory)
        make_writable_dir(self.run_dir.path)
        config = with_provenance(config, self.run_dir.read_config() if resume_step is not None else None,
                                 resume_step, process)
        self.config = config
        self._write_config()
        self.run_dir.cut_logs_back(resume_step)
        self._wandb = self._start_wandb(config) if wandb else None
        self._tensorboard = self._start_tensorboard() if tensorboard else None

    def _write_config(self) -> None:
        atomic_write_bytes(self.run_dir.config, json.dumps(to_jsonable(self.config), indent=2).encode())

    def update_config(self, changes: dict) -> None:
        """Rewrite ``config.json`` (atomically) with ``changes`` merged in: what the run settled on after it started
        (a calibrated trust-region band)."""
        self.config = {**self.config, **changes}
        self._write_config()
        if self._wandb is not None:
            self._wandb.config.update(to_jsonable(changes), allow_val_change=True)

    def _start_wandb(self, config: dict):
        import wandb  # optional dependency: pip install dppo_oat[wandb]

        return wandb.init(project="dppo_oat", name=self.run_dir.name, config=to_jsonable(config),
                          dir=str(self.run_dir), resume="allow", id=self.run_dir.name)

    def _start_tensorboard(self):
        from torch.utils.tensorboard import SummaryWriter  # optional dependency: pip install dppo_oat[tensorboard]

        return SummaryWriter(log_dir=str(self.run_dir.tensorboard))

    def _append(self, path: Path, row: dict) -> None:
        append_text(path, json.dumps(to_jsonable(row)) + "\n")
        step = int(row["step"])
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(key, value, step)

    def log_metrics(self, row: dict) -> None:
        """One line of ``metrics.jsonl`` (must contain ``step``)."""
        self._append(self.run_dir.metrics, row)

    def log_eval(self, row: dict) -> None:
        """One line of ``eval.jsonl`` (must contain ``step``)."""
        self._append(self.run_dir.eval, row)

    def log_tokens(self, rows: list[dict]) -> None:
        """One step's token samples, a line each, in ``tokens.jsonl`` (not mirrored to wandb or TensorBoard)."""
        if rows:
            append_text(self.run_dir.tokens, "".join(json.dumps(to_jsonable(row)) + "\n" for row in rows))

    def discard(self) -> None:
        """Remove what this log wrote (:meth:`RunDir.remove_logs`: for a new run that never completed a step)."""
        self.close()
        self.run_dir.remove_logs()

    def close(self) -> None:
        """Finish the mirrors (idempotent)."""
        if self._wandb is not None:
            self._wandb.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
        self._wandb = self._tensorboard = None
