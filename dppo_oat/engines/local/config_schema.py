"""``config.json``'s schema: the version a run records, and how the reader brings an older config up to it.

A local run's ``config.json`` carries ``schema`` (:data:`CONFIG_SCHEMA`). A config written before versioning is
schema 1: it may lack any setting added since (``max_staleness`` was left out of synchronous runs' configs, and
no ``lr_schedule`` meant a constant rate). :func:`migrate_config` fills what an older schema lacks with the value that
schema meant, one version step at a time (:data:`MIGRATIONS`), and records each filled key under
``schema_migrations``, so the settings the checkpoint was trained under can still be told from the file
(:func:`as_written`). A new setting that changes nothing for earlier runs at its default needs no new version; one
whose absence meant something else does: bump :data:`CONFIG_SCHEMA` and add the step. Schema 3 added band calibration
(``tr_calibrate``, ``tr_calibrate_like``, ``tr_calibrate_unit`` and, once calibrated, ``calibration``): a schema-2
config calibrated nothing, and the step records the keys it fills, so that a checkpoint written under schema 2 is
still told from an edited config (:func:`as_written` from the checkpoint's schema). ``tr_calibrate_band`` came later
at a default that keeps the earlier behaviour (the rule's default band), so it needed no new version; so did
``tr_calibrate_every`` (None: the band set once). The rename of ``run_dir`` to ``runs_dir`` needed none either: every
reader of a config undoes it (:func:`~dppo_oat.run.directory.current_config`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

CONFIG_SCHEMA = 3
"""The schema a run of this version writes."""
SCHEMA_KEYS = ("schema", "schema_migrations")
"""What records the schema, not a setting: left out of the settings' comparison and hash."""
SCHEMA_1_MEANT = {"lr_schedule": "constant", "max_staleness": 0}
"""Settings a schema-1 config may lack whose absence meant something other than today's default: a constant rate
(before ``--lr-schedule``; its default is now ``linear``), and synchronous rollouts (recorded only when > 0)."""


def fill_missing(stored: dict, defaults: Mapping[str, Any], meant: Mapping[str, Any]) -> tuple[dict, list[str]]:
    """``stored`` with every key of ``defaults`` it lacks (one level into nested dicts) set to ``meant``'s value where
    given, else to the default; and the filled keys, dotted."""
    filled, names = copy.deepcopy(stored), []
    for key, default in defaults.items():
        if key in SCHEMA_KEYS:
            continue
        if key not in filled:
            filled[key] = copy.deepcopy(meant.get(key, default))
            names.append(key)
        elif isinstance(default, dict) and isinstance(filled[key], dict):
            for inner, value in default.items():
                if inner not in filled[key]:
                    filled[key][inner] = copy.deepcopy(value)
                    names.append(f"{key}.{inner}")
    return filled, names


def from_schema_1(stored: dict, defaults: Mapping[str, Any]) -> tuple[dict, list[str]]:
    """Schema 1 → 2: the settings added before versioning, at what their absence meant (:data:`SCHEMA_1_MEANT`; every
    other one was added with a default that keeps the earlier behaviour)."""
    return fill_missing(stored, defaults, SCHEMA_1_MEANT)


def from_schema_2(stored: dict, defaults: Mapping[str, Any]) -> tuple[dict, list[str]]:
    """Schema 2 → 3: the band-calibration flags at their defaults (a schema-2 run calibrated nothing), and any other
    setting a schema-2 config lacks at its default."""
    return fill_missing(stored, defaults, {})


MIGRATIONS: dict[int, Callable[[dict, Mapping[str, Any]], tuple[dict, list[str]]]] = {1: from_schema_1,
                                                                                      2: from_schema_2}
"""Schema n → n + 1, given the current schema's defaults (a config as :func:`logged_config` writes it)."""


def config_schema(stored: Mapping[str, Any]) -> int:
    """The schema of a stored config (1: written before versioning); a newer or malformed one, or a malformed record
    of its migrations, is one line."""
    schema = stored.get("schema", 1)
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise ValueError(f"config.json's schema is {schema!r}, not a version number: restore the file, or start a new "
                         "run with another --run-name")
    migrations = stored.get("schema_migrations", [])
    if not (isinstance(migrations, list) and all(map(_is_migration_record, migrations))):
        raise ValueError(f"config.json's schema_migrations is {migrations!r}, not a list of the migrations it went "
                         "through: restore the file, or start a new run with another --run-name")
    if schema > CONFIG_SCHEMA:
        raise ValueError(f"config.json has schema {schema}, written by a newer dppo_oat (this one reads up to "
                         f"{CONFIG_SCHEMA}): upgrade dppo_oat to resume it")
    return schema


def _is_migration_record(record: Any) -> bool:
    """One entry of ``schema_migrations``: an object whose ``filled`` (when present) lists setting names."""
    filled = record.get("filled", []) if isinstance(record, dict) else None
    return isinstance(filled, list) and all(isinstance(name, str) for name in filled)


def migrate_config(stored: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict:
    """``stored`` brought up to :data:`CONFIG_SCHEMA`, each step's filled keys appended to ``schema_migrations``."""
    config, schema = dict(stored), config_schema(stored)
    migrations = list(config.get("schema_migrations", []))
    while schema < CONFIG_SCHEMA:
        config, filled = MIGRATIONS[schema](config, defaults)
        migrations.append({"from": schema, "to": schema + 1, "filled": filled})
        schema += 1
    config["schema"] = schema
    if migrations:
        config["schema_migrations"] = migrations
    return config


def as_written(config: Mapping[str, Any], since: int = 1) -> dict:
    """``config`` as schema ``since`` had it (the schema a checkpoint was written under; 1: before versioning): the
    keys its migrations from ``since`` on filled taken out (the settings that checkpoint was hashed with)."""
    written = copy.deepcopy(dict(config))
    for migration in config.get("schema_migrations", []):
        start = migration.get("from", 1)
        if isinstance(start, int) and not isinstance(start, bool) and start < since:
            continue
        for name in migration.get("filled", []):
            outer, _, inner = name.partition(".")
            if inner and isinstance(written.get(outer), dict):
                written[outer].pop(inner, None)
            elif not inner:
                written.pop(outer, None)
    for key in SCHEMA_KEYS:
        written.pop(key, None)
    return written


def schema_migrations_of(stored: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict:
    """``{"schema_migrations": [...]}`` of ``stored`` brought up to the current schema (``{}`` when none was needed):
    what a resumed run's rewritten ``config.json`` keeps on record."""
    migrations = migrate_config(stored, defaults).get("schema_migrations")
    return {"schema_migrations": migrations} if migrations else {}
