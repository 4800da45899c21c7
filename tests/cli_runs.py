"""Running a command's ``main`` in the test's process, as its users run it: what it exits with and what it says."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def run(argv: Sequence[str], capsys, main: Callable[[list[str]], object] | None = None):
    """``main(argv)`` (``python -m dppo_oat.train`` when None): (exit code, the ``error:`` lines of its output, all
    its output, stdout then stderr)."""
    if main is None:
        from dppo_oat.train import main
    code = 0
    try:
        main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    text = out.out + out.err
    return code, [line for line in text.splitlines() if line.startswith("error:")], text


def one_error(capsys, argv: Sequence[str], code: int, *fragments: str) -> str:
    """The command exits with ``code`` and exactly one ``error:`` line that holds every fragment (no traceback);
    returns that line."""
    got, errors, text = run(argv, capsys)
    assert got == code, text
    assert len(errors) == 1 and "Traceback" not in text, text
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]
