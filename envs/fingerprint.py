"""What a policy warm-started on an env depends on beyond the env's id: its data and its user code, as hashes.

The tiny policy's cache (``dppo_oat.engines.local.policy``) keys each policy on its env id and warm-start settings;
the id alone cannot tell that a ``local-math:data.jsonl`` file or a plugin's game was edited since. So the key also
holds :func:`env_content`: a hash of every existing file or folder the env's Gem registration names (a math set),
of an in-memory data set's own fingerprint, and of the source file of the env's class and of its oracle when they
are a user's code. The package's own envs and Gem's are versioned with their packages (the cache's format number),
so their content is empty and their keys stay those of the shipped policies.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
from pathlib import Path
from typing import Any

from gem.envs.registration import ENV_REGISTRY

PACKAGE_DIR = Path(__file__).resolve().parent
"""The package's own envs: versioned with it, not hashed."""


def flat_name(env_id: str, limit: int = 60) -> str:
    """``env_id`` as one folder name: every run of characters other than letters, digits, ``.``, ``_`` and ``-``
    becomes ``_`` (a ``local-math:/abs/path.jsonl`` id nests no folders), keeping its last ``limit`` characters."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", env_id).strip("_")[-limit:]


def hash_path(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative names and bytes, in sorted order)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def is_user_code(path: Path | None) -> bool:
    """True for a source file outside this package and outside installed packages (a plugin, a lab's module)."""
    if path is None:
        return False
    installed = {"site-packages", "dist-packages"} & set(path.parts)
    return not installed and PACKAGE_DIR not in path.parents


def source_file(obj: Any) -> Path | None:
    """The file that defines ``obj`` (a class, a function, or a ``module:Class`` string), when there is one."""
    if isinstance(obj, str):
        module_name = obj.split(":")[0]
        import importlib.util

        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            return None
        return Path(spec.origin).resolve() if spec is not None and spec.origin else None
    try:
        return Path(inspect.getsourcefile(obj)).resolve()
    except (TypeError, OSError):
        return None


def _data_hashes(kwargs: dict[str, Any]) -> dict[str, str]:
    """Hashes of the data a registration names: existing paths, and data sets with a ``_fingerprint``."""
    hashes = {}
    for name, value in sorted(kwargs.items()):
        if isinstance(value, (str, os.PathLike)) and os.path.exists(value):
            hashes[f"data.{name}"] = hash_path(Path(value))
        elif isinstance(getattr(value, "_fingerprint", None), str):
            hashes[f"data.{name}"] = value._fingerprint
    return hashes


def env_content(env_id: str) -> dict[str, str]:
    """The hashes of what ``env_id``'s warm start depends on beyond its id (see the module docstring); ``{}`` for
    an unregistered id or the package's and Gem's own envs."""
    from envs.oracles import oracle_for_env_id

    spec = ENV_REGISTRY.get(env_id)
    if spec is None:
        return {}
    content = _data_hashes(spec.kwargs or {})
    for part, obj in (("code.env", spec.entry_point), ("code.oracle", oracle_for_env_id(env_id))):
        path = source_file(obj) if obj is not None else None
        if is_user_code(path) and path.is_file():
            content[part] = hash_path(path)
    return content
