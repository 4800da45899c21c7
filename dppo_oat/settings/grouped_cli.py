"""A command line whose ``--help`` comes in sections, parsed into the same flat dataclass as before.

The engines' argument classes are flat: every setting is one attribute (``config.steps``, ``args.tr_delta``),
``config.json`` records flat keys, a resume compares them, and oat's own code reads ``args.<name>``. tyro gives a
heading only to a nested dataclass, so :func:`grouped_view` builds from a flat class and its :class:`FlagGroup` list a
class for tyro alone: it subclasses the flat class (a field no group names keeps its place and its help in the first
section, ``options``), hides each grouped field there, and adds one field per group, a dataclass of that group's
fields under ``tyro.conf.OmitArgPrefixes``, so every flag keeps its name (``--tr-delta``, not
``--trust-region.tr-delta``). :func:`parse_grouped` parses with it and returns the flat class (:func:`flattened`),
after refusing in one line a flag given under a former name (:func:`former_flag_refusal`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import tyro

from dppo_oat.settings.docstrings import field_docstrings
from dppo_oat.settings.kinds import former_names


@dataclass(frozen=True)
class FlagGroup:
    """Flags shown together under the heading ``<title> options``, in the order given, with ``about`` under it
    (nothing where it is empty: the title says it). A group whose one field is a dataclass (``warm_start``: flags
    ``--warm-start.*``) is that field's own section, placed here, its prefix kept."""

    title: str
    about: str
    fields: tuple[str, ...]


def flag_help(cls: type) -> dict[str, str]:
    """The help of each field of a dataclass as one line, as tyro picks it: the ``tyro.conf.arg(help=...)`` of its
    annotation (the fields generated at run time, such as the ``--tr-*`` flags), else its docstring
    (:func:`~dppo_oat.settings.docstrings.field_docstrings`)."""
    docs = field_docstrings(cls)
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        helps = [help_text for meta in getattr(hint, "__metadata__", ()) for help_text in [getattr(meta, "help", None)]
                 if help_text]
        if helps:
            docs[name] = " ".join(helps[-1].split())  # the last one, as tyro merges them
    return docs


def as_help(text: str) -> str:
    """A help text as ``--help`` shows it: reST's double backticks as single ones."""
    return text.replace("``", "`")


def default_of(field: dataclasses.Field) -> dataclasses.Field:
    """A new field with ``field``'s default (a value or a factory)."""
    if field.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=field.default_factory)
    return dataclasses.field(default=field.default)


def section_type(flat: type, group: FlagGroup) -> type | None:
    """The dataclass of ``group``'s one field when that field of ``flat`` is a nested dataclass (a section of its own
    already), else None."""
    if len(group.fields) != 1:
        return None
    field = {f.name: f for f in dataclasses.fields(flat)}[group.fields[0]]
    if field.default_factory is dataclasses.MISSING or not dataclasses.is_dataclass(field.default_factory()):
        return None
    return type(field.default_factory())


def check_groups(flat: type, groups: Sequence[FlagGroup]) -> None:
    """Every name a group lists is a field of ``flat``, and no field is in two groups."""
    names = [name for group in groups for name in group.fields]
    unknown = sorted(set(names) - {field.name for field in dataclasses.fields(flat)})
    twice = sorted({name for name in names if names.count(name) > 1})
    if unknown or twice:
        raise ValueError(f"help groups of {flat.__name__}: unknown fields {unknown}, fields in two groups {twice}")


def described_fields(cls: type, names: Sequence[str]) -> list[tuple]:
    """Fields ``names`` of dataclass ``cls`` as ``make_dataclass`` takes them: each with its type, its default and
    its help as one line (tyro keeps a docstring's line breaks, mid-sentence)."""
    hints, docs = typing.get_type_hints(cls, include_extras=True), flag_help(cls)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    return [(name, Annotated[hints[name], tyro.conf.arg(help=as_help(docs[name]))], default_of(fields[name]))
            for name in names]


def group_class(flat: type, group: FlagGroup) -> type:
    """A dataclass of ``group``'s fields, each with ``flat``'s type, default and help."""
    name = "".join(part.capitalize() for part in group.title.replace("-", " ").split()) + "Flags"
    return dataclasses.make_dataclass(name, described_fields(flat, group.fields))


def described(cls: type) -> type:
    """A subclass of dataclass ``cls`` whose fields' help is one line each (a nested section's flags)."""
    return dataclasses.make_dataclass(cls.__name__, described_fields(cls, [f.name for f in dataclasses.fields(cls)]),
                                      bases=(cls,))


def as_base(value: Any, cls: type) -> Any:
    """``value``, an instance of a subclass of dataclass ``cls`` (:func:`described`), as a ``cls``."""
    return cls(**{field.name: getattr(value, field.name) for field in dataclasses.fields(cls) if field.init})


def grouped_view(flat: type, groups: Sequence[FlagGroup]) -> type:
    """The class tyro parses for ``flat`` with ``groups`` as sections: the same flags, their help in sections (see
    the module's docstring); :func:`flattened` turns what it parses back into ``flat``."""
    check_groups(flat, groups)
    hints = typing.get_type_hints(flat, include_extras=True)
    fields = {field.name: field for field in dataclasses.fields(flat)}
    hidden = [(name, Annotated[hints[name], tyro.conf.Suppress], default_of(fields[name]))
              for group in groups for name in group.fields]
    sections = []
    for index, group in enumerate(groups):
        nested = section_type(flat, group)
        if nested is not None:  # its flags keep their prefix (--warm-start.lr)
            klass = described(nested)
            marks: tuple = (tyro.conf.arg(name=group.fields[0], help=group.about),)
        else:
            klass = group_class(flat, group)
            marks = (tyro.conf.OmitArgPrefixes, tyro.conf.arg(name=group.title, help=group.about))
        sections.append((f"group_{index}", Annotated[(klass, *marks)], dataclasses.field(default_factory=klass)))
    return dataclasses.make_dataclass(f"Grouped{flat.__name__}", hidden + sections, bases=(flat,))


def flattened(view: Any, flat: type, groups: Sequence[FlagGroup]) -> Any:
    """What tyro parsed with :func:`grouped_view` as an instance of ``flat`` (every field where ``flat`` has it)."""
    values = {field.name: getattr(view, field.name) for field in dataclasses.fields(flat) if field.init}
    for index, group in enumerate(groups):
        part, nested = getattr(view, f"group_{index}"), section_type(flat, group)
        if nested is not None:
            values[group.fields[0]] = as_base(part, nested)
        else:
            values.update({name: getattr(part, name) for name in group.fields})
    return flat(**values)


def former_flag_refusal(flat: type, args: Sequence[str]) -> str | None:
    """The line that refuses the first flag of ``args`` given under the former name of a field of ``flat``
    (:func:`~dppo_oat.settings.kinds.former_names`), in either spelling (``--old-name``, ``--old_name=...``): its name
    now and what it is, which tyro would not say (it would call the flag unrecognized). None when there is none."""
    renamed = former_names(flat)
    for arg in args:
        given = arg.split("=", 1)[0]
        old = given.removeprefix("--").replace("-", "_")
        if given.startswith("--") and old in renamed:
            new = renamed[old]
            now = f"--{new if '_' in given else new.replace('_', '-')}"
            what = as_help(flag_help(flat)[new]).rstrip(".")
            return f"{given} is now {now} ({what[:1].lower()}{what[1:]})"
    return None


def parse_grouped(flat: type, groups: Sequence[FlagGroup], args: Sequence[str], **tyro_options: Any) -> Any:
    """``tyro.cli`` on :func:`grouped_view` of ``flat``, as an instance of ``flat``; a flag under a former name is a
    ``ValueError`` of one line (:func:`former_flag_refusal`), raised before tyro parses. ``--help`` piped into a
    reader that stops early (``--help | head``) ends with status 0 and nothing on stderr."""
    refusal = former_flag_refusal(flat, args)
    if refusal is not None:
        raise ValueError(refusal)
    view = grouped_view(flat, groups)
    try:
        return flattened(tyro.cli(view, args=list(args), **tyro_options), flat, groups)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        raise SystemExit(0) from None
