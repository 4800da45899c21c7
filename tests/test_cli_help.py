"""``python -m dppo_oat.train --help`` describes every option: tyro renders a field without a docstring as its
default alone, so each option's first description line must be more than ``(default: ...)``. It comes in sections,
the flags a first run changes first, with every flag's name as the flat configuration has it."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import subprocess
import sys

import pytest
import tyro

from dppo_oat.engines.local.config import HELP_GROUPS, TrainConfig, logged_config, parse_config, run_spec

OPTION = re.compile(r"--?[a-z]")
HEADING = re.compile(r"╭─ (.+?) ─")
FLAG = re.compile(r"^(?:│ | {2})(--[\w.-]+)(?:, (--[\w.-]+))?", re.MULTILINE)
"""An option's flags at the start of its help line (``--resume, --no-resume``), boxed or plain."""
HELP_LINES_BOUND = 300
"""``--help``'s lines at 80 columns are fewer than this."""


def help_text(monkeypatch, parse=parse_config) -> str:
    """The command's help (its sections one under another, plain when printed into a string); ``parse``: how the
    command line is read."""
    monkeypatch.setenv("COLUMNS", "100")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse(["--help"])
    return out.getvalue()


def sections(text: str) -> dict[str, str]:
    """Each box of the help by its heading."""
    parts = re.split(r"(?m)^(?=╭)", text)[1:]
    return {HEADING.match(part)[1]: part for part in parts}


def flags_in(text: str) -> set[str]:
    return {flag for match in FLAG.finditer(text) for flag in match.groups() if flag}


def undescribed_options(text: str) -> list[str]:
    """Options whose first description line is only their default (or which have none), in the plain or the boxed
    rendering (an option 1-2 spaces in, its description beside it or on the next lines, 6 or more in)."""
    found, option = [], None
    for raw in text.splitlines():
        line = raw.rstrip().removeprefix("│").removesuffix("│").rstrip()
        indent = len(line) - len(line.lstrip())
        if indent <= 2 and OPTION.match(line.lstrip()):
            if option is not None:
                found.append(option)
            option = line.split()[0].rstrip(",")
            beside = re.split(r"\s{2,}", line.strip(), maxsplit=1)[1:]  # a description on the option's own line
            if beside:
                found.extend([option] if beside[0].startswith(("(default:", "(required)")) else [])
                option = None
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


def test_help_comes_in_sections_the_common_flags_first():
    """One section per part of a run, in ``HELP_GROUPS``' order after tyro's own (``-h``); the first holds what a
    first run changes; the help, on an 80-column terminal, fits in fewer lines than it did as one list."""
    done = subprocess.run([sys.executable, "-m", "dppo_oat.train", "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "80"})
    text = done.stdout
    boxes = sections(text)
    assert list(boxes) == ["options", *(f"{group.title} options" for group in HELP_GROUPS)]
    assert "--help" in boxes["options"] and not flags_in(boxes["options"])  # tyro's -h alone
    common = flags_in(boxes["common options"])
    for flag in ("--steps", "--trust-region", "--env-ids", "--env-module", "--seed", "--lr", "--device", "--dtype",
                 "--runs-dir", "--run-name", "--resume", "--eval-every"):
        assert flag in common, flag
    assert "--tr-delta" in flags_in(boxes["trust-region options"]) and "--tr-delta" not in common
    assert "--warm-start.lr" in flags_in(boxes["warm-start options"])
    assert len(text.splitlines()) < HELP_LINES_BOUND, len(text.splitlines())


def test_help_imports_no_model_code():
    """``--help`` reads the flags alone: transformers (seconds to import) and the policy modules stay unloaded."""
    probe = ("import runpy, sys\n"
             "sys.argv = ['dppo_oat.train', '--help']\n"
             "try:\n    runpy.run_module('dppo_oat.train', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'vllm', 'deepspeed')\n"
             "             or m in ('dppo_oat.models.tiny', 'dppo_oat.models.scoring')), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--trust-region" in done.stdout, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr


def test_every_field_is_in_one_section():
    names = [name for group in HELP_GROUPS for name in group.fields]
    assert sorted(names) == sorted(field.name for field in dataclasses.fields(TrainConfig))


def test_the_sections_keep_every_flag_name(monkeypatch):
    """The sections change where a flag is shown, not its name: the flags are those of the flat ``TrainConfig``."""
    grouped = flags_in(help_text(monkeypatch))
    flat = flags_in(help_text(monkeypatch, parse=lambda args: tyro.cli(TrainConfig, args=args)))
    assert grouped == flat and len(flat) > 80 and {"--tr-delta", "--warm-start.seed", "--no-resume"} <= flat


def test_the_command_line_parses_as_the_flat_configuration():
    """Any flag, in either spelling, gives the same ``TrainConfig`` as before, so config.json has the same keys."""
    args = ["--steps", "3", "--tr-delta", "0.2", "--tr_calibrate", "0.05", "--tr_calibrate_unit", "sequence",
            "--groups_per_step", "2", "--gamma", "0.5", "--num-epochs", "2", "--eval-episodes", "4", "--overwrite",
            "--rollout-dtype", "bfloat16", "--threads", "1", "--warm-start.lr", "0.01", "--warm_start.seed", "None",
            "--env-module", "a", "--env-module", "b", "--env-ids", "x", "y", "--trust-region", "dppo_binary_kl",
            "--engine", "local"]
    grouped, flat = parse_config(args), tyro.cli(TrainConfig, args=args)
    assert type(grouped) is TrainConfig and type(grouped.warm_start) is type(flat.warm_start)
    assert grouped == flat and grouped.warm_start.seed is None and grouped.env_module == ("a", "b")
    assert parse_config([]) == TrainConfig()
    assert logged_config(grouped, run_spec(grouped)) == logged_config(flat, run_spec(flat))


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


@pytest.mark.parametrize("module", ["studies.cpu.run", "studies.cpu.pack", "dppo_oat.calibrate",
                                    "dppo_oat.check_env"])
def test_every_option_of_the_other_commands_has_help_text_and_the_usage_names_the_command(module, monkeypatch):
    """The study's and the tools' tyro commands: each option says what it is for (no code comment standing in for
    it), and the usage line names ``python -m <module>``, not the module's file on this machine."""
    import importlib

    text = help_text(monkeypatch, parse=importlib.import_module(module).main)
    assert text.startswith(f"usage: python -m {module} "), text.splitlines()[0]
    assert undescribed_options(text) == [] and "type: ignore" not in text


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
    assert code == 2 and err == "dppo-plot: error: unrecognized option --sigmaa (did you mean --sigma?) " \
                                "(see dppo-plot --help)\n", err


def test_an_unknown_box_is_still_one_line():
    from dppo_oat.settings.usage import usage_line

    box = ("╭─ Something new ──────╮\n│ a first line that    │\n│ goes on here.        │\n│ ──────────────────── │\n"
           "│ For full helptext    │\n╰──────────────────────╯\n")
    assert usage_line(box, "prog") == "a first line that goes on here. (see prog --help)"


def test_the_plain_rendering_of_a_box_is_one_line_too():
    """Where rich draws no frame (a terminal without Unicode; pytest's captured stderr), tyro's box is a title line
    and sections between rules of ``-``: the same one line, the suggested flag kept."""
    from dppo_oat.settings.usage import usage_line

    plain = (" Unrecognized options            \n --------------------------------- \n"
             "  Unrecognized options: --targt, abc \n  ---------------------------------\n  Perhaps you meant:\n"
             "      --target {None}|FLOAT\n          the fraction of the step's tokens (default: None)\n"
             "  ---------------------------------\n  For full helptext, run p --help\n")
    assert usage_line(plain, "p") == "unrecognized option --targt (did you mean --target?) (see p --help)"


@pytest.mark.fault("`python -m studies.cpu.run` or `python -m studies.cpu.pack` with a mistyped flag, a value that "
                   "does not parse or a setting out of range (`--steps 0`)",
                   "one `error:` line on stderr (exit 2), as `dppo_oat.train`'s, never tyro's framed box")
@pytest.mark.parametrize("module, args, fragment", [
    ("studies.cpu.run", ["--stepz", "3"], "error: unrecognized option --stepz (did you mean --steps?)"),
    ("studies.cpu.run", ["--steps", "0"], "--steps must be >= 1, got 0"),
    ("studies.cpu.run", ["--workers", "two"], "error: --workers"),
    ("studies.cpu.pack", ["--outt", "x"], "error: unrecognized option --outt (did you mean --out?)"),
])
def test_a_usage_error_of_the_study_commands_is_one_line(module, args, fragment):
    code, out, err = cli_error("-m", module, *args)
    assert code == 2 and err.count("\n") == 1 and "╭" not in err and fragment in err, err
    assert err.rstrip().endswith(f"(see python -m {module} --help)"), err


@pytest.mark.fault("`python -m studies.cpu.run` with no arguments (the whole study is hundreds of runs)",
                   "the plan by experiment and one line on how to choose (`--experiments ...`, `--all-experiments`); "
                   "nothing is played or written")
def test_the_study_command_without_a_choice_plays_nothing(tmp_path, monkeypatch, capsys):
    import studies.cpu.run as study_run

    def no_policy(*args):
        raise AssertionError("a policy was prepared without a choice of experiments")

    monkeypatch.setattr(study_run, "prepare_policies", no_policy)
    study_run.main(["--out-dir", str(tmp_path / "study")])
    out = capsys.readouterr().out
    assert "nothing played: name what to play" in out and "--all-experiments" in out
    assert "  mismatch: " in out and not (tmp_path / "study").exists()
