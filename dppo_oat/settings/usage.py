"""A usage error in one line: tyro frames each one (a value that does not parse, an unknown or mistyped flag, a
missing value, a choice not offered) in a box of eight lines or more; the commands print it as one ``error:`` line
on stderr instead (exit 2), keeping what the box says the user meant (``did you mean --tr-delta?``).

:func:`one_line_usage_errors` wraps a ``tyro.cli`` call: it holds back what tyro writes to stderr and, when tyro
exits with status 2, writes :func:`usage_line` of it. The box is read as text (its title, then sections between
rules), so a box this module does not know still becomes one line: its first section.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator

VALUE_ERROR = re.compile(r"Error parsing (?P<flag>\S+): no type matching (?P<kind>.+?) could be instantiated from "
                         r"\[(?P<value>.*)\]\.?$")
"""tyro's message for a value no type of the flag takes (``--tr-delta abc``)."""
SUGGESTED_FLAG = re.compile(r"^\s{1,6}(?P<flag>--?[\w.\-]+)")
"""A flag tyro suggests under "Perhaps you meant:" (its help text is indented further)."""


def box_sections(text: str) -> tuple[str, list[list[str]]]:
    """The title of tyro's box and its sections (their lines, the box's frame taken off, indentation kept). Where
    the terminal gets the plain rendering (no frame: a title line, then sections between rules of ``-``), its first
    line is the title."""
    title, sections = "", [[]]
    framed = "╭" in text
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("╭"):
            title = line.strip("╭─╮ ")
            continue
        if not framed and not title and line:
            title = line
            continue
        if not line or line.startswith("╰"):
            continue
        if line.startswith("│"):
            line = line[1:-1] if line.endswith("│") else line[1:]
        elif not framed:
            line = raw.rstrip()  # the plain rendering's indentation tells a suggested flag from its help
        if line.strip() and set(line.strip()) <= {"─", "-"}:
            sections.append([])
        else:
            sections[-1].append(line.rstrip())
    return title, [section for section in sections if any(part.strip() for part in section)]


def joined(lines: list[str]) -> str:
    """Lines as one, whitespace collapsed."""
    return " ".join(" ".join(lines).split())


def suggested_flags(sections: list[list[str]]) -> list[str]:
    """The flags of the section headed "Perhaps you meant:" (none when there is none)."""
    for section in sections:
        if section and section[0].strip().startswith("Perhaps you meant"):
            return [match["flag"] for line in section[1:] for match in [SUGGESTED_FLAG.match(line)] if match]
    return []


def usage_line(text: str, prog: str) -> str:
    """tyro's error box ``text`` as one line (without ``error:``): what was wrong, the flags it suggests, and where
    the full help is."""
    title, sections = box_sections(text)
    if not sections:
        return joined(text.splitlines()) or "the command line does not parse"
    message = joined(sections[0])
    if title.startswith("Value error"):
        message = message.split(" Got errors:")[0]
        match = VALUE_ERROR.match(message)
        if match:
            message = f"{match['flag']} takes {match['kind']}, got {match['value']}"
        message = message.removeprefix("Error parsing ")
    elif title.startswith("Unrecognized"):
        tokens = [token.strip() for token in message.partition(":")[2].split(",") if token.strip()]
        flags = [token for token in tokens if token.startswith("-")] or tokens
        message = f"unrecognized option{'s' if len(flags) > 1 else ''} {', '.join(flags)}"
        meant = suggested_flags(sections)
        if meant:
            message += f" (did you mean {' or '.join(meant)}?)"
    return f"{message} (see {prog} --help)"


@contextlib.contextmanager
def one_line_usage_errors(prog: str, prefix: str = "error: ") -> Iterator[None]:
    """Within it, a usage error of tyro (``SystemExit(2)`` with its box on stderr) is one line, ``prefix`` +
    :func:`usage_line`, on stderr; anything else tyro writes to stderr is passed on as it is."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    except SystemExit as exit_:
        if exit_.code == 2 and captured.getvalue().strip():
            sys.stderr.write(f"{prefix}{usage_line(captured.getvalue(), prog)}\n")
            raise SystemExit(2) from None
        sys.stderr.write(captured.getvalue())
        raise
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    sys.stderr.write(captured.getvalue())
