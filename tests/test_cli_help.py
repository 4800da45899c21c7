"""``python -m dppo_oat.train --help`` describes every option: tyro renders a field without a docstring as its
default alone, so each option's first description line must be more than ``(default: ...)``."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys

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


def test_the_later_presets_and_their_flags_are_on_the_command_line(monkeypatch):
    """DRPO, CPPO and M2PO are --trust-region choices with their --tr-* overrides; an override the preset does not
    read is refused in one line before anything is built."""
    from dppo_oat.engines.local.validation import validate_config

    text = help_text(monkeypatch)
    for name in ("drpo", "cppo", "cppo_binary_tv", "m2po", "--tr-w-min", "--tr-delta-b", "--tr-tau-m2"):
        assert name in text, name
    spec, _ = validate_config(tyro.cli(TrainConfig, args=["--trust-region", "m2po", "--tr-tau-m2", "0.1"]))
    assert (spec.trust_region.rule, spec.trust_region.tau_m2) == ("m2po", 0.1)
    spec, _ = validate_config(tyro.cli(TrainConfig, args=["--trust-region", "cppo_binary_tv", "--tr-w-min", "0.5"]))
    assert (spec.trust_region.w_min, spec.trust_region.delta_b) == (0.5, 0.02)
    with pytest.raises(ValueError, match="--tr-tau-m2: not read by the trust region drpo"):
        validate_config(tyro.cli(TrainConfig, args=["--trust-region", "drpo", "--tr-tau-m2", "0.1"]))


def test_every_argparse_option_of_the_package_and_its_scripts_has_help_text():
    """The verl command, the benchmarks and the study scripts: each ``add_argument`` call says what it is for."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    silent = []
    for path in sorted([*root.glob("dppo_oat/**/*.py"), *root.glob("scripts/**/*.py"), *root.glob("studies/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and not any(k.arg == "help" for k in node.keywords)):
                silent.append(f"{path.relative_to(root)}:{node.lineno}")
    assert silent == []


def test_help_names_the_command_shows_no_rest_markup_and_ends_quietly_into_a_closed_pipe():
    """``--help`` says ``python -m dppo_oat.train`` (not the module's file) without reST's double backticks in its
    description; piped into a reader that has stopped (``--help | head``), it ends with status 0 and no traceback."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "dppo_oat.train", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m dppo_oat.train ")
    assert "``" not in done.stdout.split("╭")[0]
    reader_gone = subprocess.Popen([sys.executable, "-m", "dppo_oat.train", "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
    reader_gone.stdout.close()  # the reader stops before the first line
    _, errors = reader_gone.communicate(timeout=120)
    assert reader_gone.returncode == 0 and b"Traceback" not in errors and b"BrokenPipe" not in errors, errors[-2000:]


def cli_error(*argv: str) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.fault("a mistyped value or flag on the command line (`--tr-delta abc`, `--tr-delat 0.2`, `--steps 1.5`, "
                   "`--steps` with no value, `--trust-region dppo`), of `dppo_oat.train` (both engines) or "
                   "`dppo_oat.plot`",
                   "one `error:` line on stderr (exit 2) in place of tyro's framed box, keeping its suggestion: "
                   "`error: unrecognized option --tr-delat (did you mean --tr-delta or --tr-delta-b?) (see … --help)`")
@pytest.mark.parametrize("args, fragment", [
    (["--tr-delta", "abc"], "error: --tr-delta takes {None}|FLOAT, got 'abc'"),
    (["--tr-delat", "0.2"], "error: unrecognized option --tr-delat (did you mean --tr-delta or --tr-delta-b?)"),
    (["--steps", "1.5"], "error: --steps: invalid literal for int() with base 10: '1.5'"),
    (["--steps"], "error: Missing value for argument '--steps'"),
    (["--trust-region", "dppo"], "error: invalid choice 'dppo' for argument '--trust-region'"),
])
def test_a_usage_error_is_one_line(args, fragment):
    code, out, err = cli_error("-m", "dppo_oat.train", *args)
    assert code == 2 and not out and err.count("\n") == 1 and "╭" not in err, err
    assert err.startswith(fragment) and err.rstrip().endswith("(see python -m dppo_oat.train --help)"), err


def test_a_usage_error_of_the_plot_is_one_line():
    code, out, err = cli_error("-m", "dppo_oat.plot", "runs", "--sigmaa", "2")
    assert code == 2 and err == "dppo-plot: error: unrecognized option --sigmaa (did you mean --sigma?) (see dppo-plot " \
                                "--help)\n", err


def test_an_unknown_box_is_still_one_line():
    from dppo_oat.usage import usage_line

    box = ("╭─ Something new ──────╮\n│ a first line that    │\n│ goes on here.        │\n│ ──────────────────── │\n"
           "│ For full helptext    │\n╰──────────────────────╯\n")
    assert usage_line(box, "prog") == "a first line that goes on here. (see prog --help)"
