"""Small IO helpers every run file goes through: atomic replacement that honours the umask, appends that survive a
kill, JSON(L) in and out (``*.jsonl.gz`` read where the plain file is absent), and the check that no non-finite
tensor is saved. The run directory itself (its files, lock and config) is :class:`dppo_oat.run.directory.RunDir`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from dppo_oat.errors import TrainingBlewUp


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


DEFAULT_NAME_MAX = 255
"""The longest file or folder name, in bytes, where the file system does not say (ext4's, tmpfs's, NTFS's in
UTF-16 units)."""


def name_max(folder: Path) -> int:
    """The longest file or folder name, in bytes, the file system of ``folder`` (an existing path) takes: its
    ``PC_NAME_MAX``, else :data:`DEFAULT_NAME_MAX`."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf on this system, or no such setting
        return DEFAULT_NAME_MAX


def nearest_existing(path: Path) -> Path:
    """``path`` when it exists, else its nearest parent that does (``path`` made absolute first)."""
    path = Path(path).absolute()
    return next(p for p in (path, *path.parents) if p.exists())


@dataclasses.dataclass(frozen=True)
class BrokenLink:
    """A symbolic link that cannot be followed: to a ``target`` that does not exist, or (``target`` None) one of a
    loop of links."""

    link: Path
    target: str | None

    def describe(self) -> str:
        """What the link is, as a message says it."""
        if self.target is None:
            return f"{self.link} is a loop of symbolic links (following it leads back to it)"
        return f"{self.link} is a symbolic link to {self.target}, which does not exist"


def broken_link_on(path: Path) -> BrokenLink | None:
    """The first folder on the way to ``path`` (``path`` itself included) that is a symbolic link to a missing
    target or a loop of links, None when there is none: creating ``path`` there would fail with a misleading
    ``File exists`` or ``Too many levels of symbolic links``."""
    path = Path(path).absolute()
    for step in (*reversed(path.parents), path):
        if not step.is_symlink():
            continue
        try:
            step.stat()
        except FileNotFoundError:
            return BrokenLink(step, os.readlink(step))
        except OSError as error:
            if error.errno == errno.ELOOP:
                return BrokenLink(step, None)
            raise
    return None


def check_can_write(directory: Path) -> None:
    """Fail now, with the path in the message, if ``directory`` could not be created or written. Leaves nothing
    behind: it writes (and removes) one temporary file in the nearest folder that exists."""
    directory = Path(directory).absolute()
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"run directory {str(directory)!r} is not writable: {existing} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ValueError(f"run directory {str(directory)!r} is not writable: {error}") from error


def make_writable_dir(directory: Path) -> None:
    """Create ``directory`` and check that a file can be written in it (one clear error naming it otherwise)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ValueError(f"run directory {str(directory)!r} is not writable: {error}") from error


def current_umask() -> int:
    """The process's file-creation mask: Linux reports it in ``/proc/self/status``; elsewhere it is read by setting it
    and putting it back (for that instant another thread's new file would get the stand-in mask)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: str | Path, *, directory: bool = False) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would have (``0o666``/``0o777`` less the umask):
    ``mkstemp`` and ``mkdtemp`` create private ones, which would hide a shared run or cache from colleagues."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def temporary_prefix(name: str) -> str:
    """The prefix of the temporary files an atomic write of ``name`` goes through (``.checkpoint.pt.`` + 8 random
    characters): a kill mid-write leaves one, which the next start of the run removes
    (:meth:`~dppo_oat.run.directory.RunDir.remove_temporaries`)."""
    return f".{name}."


def _temporary_sibling(path: Path) -> tuple[int, str]:
    """An open temporary file beside ``path`` (same file system: the rename is atomic), with the umask's mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path.name))
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


@contextlib.contextmanager
def _replacing(path: Path):
    """A binary handle whose content replaces ``path`` at once when the block ends (readers see the old file or the
    new one, never a partial one); nothing is left behind when it fails. An ``OSError`` (a full disk) names
    ``path``."""
    fd, tmp = _temporary_sibling(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_directory(path.parent)
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a power cut after it keeps the new file); a file system that cannot
    sync a directory is left as it is."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def atomic_write_lines(path: Path, lines: Iterable[str]) -> None:
    """Write the text ``lines`` (each with its newline) to ``path`` atomically and durably (:func:`_replacing`),
    streamed: the whole text is never held in memory at once."""
    with _replacing(path) as handle:
        for line in lines:
            handle.write(line.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`_replacing`)."""
    with _replacing(path) as handle:
        handle.write(data)


class _WriteErrors:
    """A file handle for ``torch.save`` that remembers the ``OSError`` of a failed write: torch reports a full disk
    as an opaque ``RuntimeError`` ("unexpected pos ..."), which :func:`atomic_torch_save` replaces by it."""

    def __init__(self, handle):
        self.handle, self.error = handle, None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as error:
            self.error = error
            raise


def append_text(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` and flush it; an ``OSError`` (a full disk) names ``path``."""
    try:
        with open(path, "a") as handle:
            handle.write(text)
            handle.flush()
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise


def nonfinite_tensors(state: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Names of the floating-point tensors of a (nested) state dict that hold a NaN or an infinity."""
    names = []
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            names += nonfinite_tensors(value, prefix=f"{name}.")
        elif torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
            names.append(name)
    return names


def atomic_torch_save(obj: Any, path: Path, *, weights: Mapping[str, Any] | None = None) -> None:
    """``torch.save`` through a temporary file and a rename (a failed write raises its ``OSError``). ``weights``
    (e.g. the model's state dict) must be finite, or nothing is written and :class:`TrainingBlewUp` names them: a
    checkpoint never holds NaN weights."""
    broken = nonfinite_tensors(weights or {})
    if broken:
        raise TrainingBlewUp(f"{len(broken)} weight tensor(s) are non-finite (e.g. {broken[0]}); {path} keeps the "
                               "last finite checkpoint: lower --lr and start a new run")
    with _replacing(path) as handle:
        recorder = _WriteErrors(handle)
        try:
            torch.save(obj, recorder)
            recorder.flush()
        except RuntimeError:
            if recorder.error is None:
                raise
            raise recorder.error from None  # e.g. [Errno 28] No space left on device


def read_jsonl(path: Path) -> list[dict]:
    """All JSON objects of ``path`` (or, when only it exists, of its gzip copy ``<path>.gz``, as packed runs keep
    them), one per line; ``[]`` when neither exists. Blank lines and a torn last line (no newline: a kill mid-write)
    are skipped silently; any other unreadable line is skipped with a warning that names the file and the line."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")
    elif packed.is_file():
        path, text = packed, gzip.decompress(packed.read_bytes()).decode("utf-8", errors="replace")
    else:
        return []
    lines = text.splitlines()
    rows, unreadable = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif not (number == len(lines) and not text.endswith("\n")):
            unreadable.append(number)
    if unreadable:
        warnings.warn(f"{path}: skipped {len(unreadable)} unreadable line(s) (line {unreadable[0]} first)",
                      stacklevel=2)
    return rows
