"""Env plugins: a user's own module or file that registers Gem environments, so that a new task needs no edit to
this package.

A plugin is any Python module whose import registers ids with Gem (``gem.envs.registration.register``) and, for the
tiny policy's warm start, their oracles (:func:`envs.register_oracle`). Both engines import the plugins named by
``--env-module`` (repeatable) before any env id is checked, the oat engine in each of its processes too:

- a file path (``path/to/my_envs.py``: ends in ``.py`` or contains a ``/``) is imported on its own, under a module name
  made from its absolute path (:func:`plugin_module_name`), so a second import in the same process is a no-op and
  Gem never sees an id twice; its folder is not added to ``sys.path``;
- a dotted name (``my_lab.envs``) is imported with :func:`importlib.import_module`, from the working directory or
  the installed packages.

Installed packages can also declare plugins in the entry-point group :data:`ENTRY_POINT_GROUP` (``dppo_oat.envs``),
each entry naming a module (``[project.entry-points."dppo_oat.envs"] my_lab = "my_lab.envs"``); they are imported
before the named ones. A plugin that fails to import, or exits while being imported (``sys.exit``), is reported in
one line with its own error (:class:`ValueError`), so a command line can refuse it before any model is built. The
ids each plugin registers are noted, so that errors about an env name the plugin it comes from (:func:`env_label`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from gem.envs.registration import ENV_REGISTRY

ENTRY_POINT_GROUP = "dppo_oat.envs"
"""Entry-point group of installed env plugins: each entry's value is a module to import."""


def is_file_path(name: str) -> bool:
    """True when ``name`` names a Python file (ends in ``.py`` or contains a ``/``), not a dotted module name."""
    return name.endswith(".py") or "/" in name


def plugin_module_name(path: Path) -> str:
    """The module name a plugin file is imported under: its stem and a hash of its absolute path (stable per file)."""
    resolved = path.expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return f"dppo_env_plugin_{resolved.stem}_{digest}"


def import_file(path: Path) -> ModuleType:
    """Import the Python file ``path`` once per process (see :func:`plugin_module_name`); raises what it raises."""
    name = plugin_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path.expanduser().resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as an import does (dataclasses and pickling look it up)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def plugin_source(name: str) -> Path | None:
    """The file a plugin's code is in (None when a dotted name cannot be found)."""
    if is_file_path(name):
        return Path(name).expanduser().resolve()
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


def error_location(error: BaseException, source: Path | None) -> str:
    """``file:line`` of the innermost frame of ``error``'s traceback in the plugin's own file, or ``""`` (a
    ``SyntaxError`` names its line in its message)."""
    own = [frame for frame in traceback.extract_tb(error.__traceback__)
           if source is not None and Path(frame.filename).resolve() == source]
    return f"{source.name}:{own[-1].lineno}" if own else ""


def one_line(error: BaseException, source: Path | None) -> str:
    """``Type: message (file:line)`` on one line."""
    message = " ".join(str(error).split())
    location = error_location(error, source)
    return f"{type(error).__name__}: {message}" + (f" ({location})" if location else "")


def raised(error: BaseException, function: Any) -> str:
    """``Type: message (file:line)`` of an exception raised by a plugin's ``function`` (an oracle, an env's method):
    the line is the innermost one in the function's own file."""
    code = getattr(function, "__code__", None)
    return one_line(error, Path(code.co_filename).resolve() if code is not None else None)


def import_failure(name: str, error: BaseException) -> str:
    """Why plugin ``name`` failed to import, in one line (for :class:`ValueError`): its own error, or its exit."""
    source = plugin_source(name)
    if isinstance(error, SystemExit):
        location = error_location(error, source)
        return (f"env module {name!r} called sys.exit({error.code!r}) while being imported"
                + (f" ({location})" if location else "")
                + ": a plugin must not exit on import; put script code under if __name__ == \"__main__\":")
    return f"env module {name!r} failed to import: {one_line(error, source)}"


def import_env_module(name: str) -> ModuleType:
    """Import one plugin, a file path or a dotted module name, and note the env ids it registers
    (:func:`env_label`); a failure, an exit included, is one :class:`ValueError` line that quotes the plugin's own
    error. Ctrl-C is not caught."""
    if is_file_path(name) and not Path(name).expanduser().is_file():
        raise ValueError(f"env module {name!r}: no such file")
    if not is_file_path(name) and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # a dotted name is found from the working directory, as with python -m
    before = set(ENV_REGISTRY)
    try:
        module = import_file(Path(name)) if is_file_path(name) else importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(error.name + ".")):  # the plugin itself
            raise ValueError(f"env module {name!r} not found: give an importable module name, or the path of a "
                             "file (path/to/my_envs.py)") from error
        raise ValueError(import_failure(name, error)) from error
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        raise ValueError(import_failure(name, error)) from error
    for env_id in ENV_REGISTRY:
        if env_id not in before:
            PLUGIN_ENV_IDS.setdefault(env_id, name)
    return module


PLUGIN_ENV_IDS: dict[str, str] = {}
"""The plugin (as given to :func:`import_env_module`) that registered each env id, noted when it was imported."""


def env_label(env_id: str) -> str:
    """How errors name an env: ``env <id>``, and ``(plugin <module or file>)`` when a plugin registered it."""
    plugin = PLUGIN_ENV_IDS.get(env_id)
    return f"env {env_id}" + (f" (plugin {plugin})" if plugin else "")


def installed_env_modules() -> list[str]:
    """The modules installed packages declare in the entry-point group :data:`ENTRY_POINT_GROUP`, by entry name."""
    return [entry.module for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)]


def import_env_modules(names: Iterable[str] = ()) -> list[ModuleType]:
    """Import the installed plugins, then ``names`` in order (see the module docstring); each import happens once
    per process. Raises one :class:`ValueError` line for the first plugin that fails."""
    return [import_env_module(name) for name in [*installed_env_modules(), *names]]
