"""``python -m dppo_oat.train --help`` describes every option: tyro renders a field without a docstring as its
default alone, so each option's first description line must be more than ``(default: ...)``."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
import tyro

from dppo_oat.engines.local.config import TrainConfig

OPTION = re.compile(r"--?[a-z]")


def help_text(monkeypatch) -> str:
    """tyro's help for TrainConfig, wide enough that no option line wraps into its description."""
    monkeypatch.setenv("COLUMNS", "400")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        tyro.cli(TrainConfig, args=["--help"])
    return out.getvalue()


def undescribed_options(text: str) -> list[str]:
    """Options whose first description line is only their default (or which have none), in the plain or the boxed
    rendering (an option 1-2 spaces in, its description 6 or more)."""
    found, option = [], None
    for raw in text.splitlines():
        line = raw.rstrip().removeprefix("│").removesuffix("│").rstrip()
        indent = len(line) - len(line.lstrip())
        if indent <= 2 and OPTION.match(line.lstrip()):
            if option is not None:
                found.append(option)
            option = line.split()[0].rstrip(",")
        elif option is not None and indent >= 6:
            if line.lstrip().startswith(("(default:", "(required)")):
                found.append(option)
            option = None
    if option is not None:
        found.append(option)
    return found


def test_every_option_of_the_local_engine_has_help_text(monkeypatch):
    text = help_text(monkeypatch)
    assert "--warm-start.max-steps" in text and "--tr-delta" in text  # the parse below saw the options
    assert undescribed_options(text) == []


def test_the_check_sees_an_undescribed_option():
    text = ("│ --steps INT                 │\n│       (default: 100)          │\n"
            "│ --lr FLOAT                  │\n│       Learning rate. (default: 0.0003) │\n")
    assert undescribed_options(text) == ["--steps"]
