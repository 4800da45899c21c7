"""The docstring under each field of a dataclass (the string literal after the field, as tyro and the API docs read
it), for help texts and tables generated from the fields themselves."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap


def documented_fields(klass: ast.ClassDef) -> dict[str, str]:
    """The docstring under each field of a class body, joined into one line."""
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(klass.body):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def field_docstrings(cls: type) -> dict[str, str]:
    """The field docstrings of a dataclass and of its dataclass bases (a subclass's own win); a class made at run time
    (no source) contributes none."""
    docs: dict[str, str] = {}
    for klass in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        docs.update(documented_fields(ast.parse(source).body[0]))
    return docs
