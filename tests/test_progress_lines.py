"""A run whose output is not a terminal (a log file, a pipe) prints a plain progress line every few steps, where a
live bar would draw nothing until the end; on a terminal the bar draws as before. No line of the commands' output is
broken, so a path stays whole."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from dppo_oat.engines.local.policy import SHIPPED_POLICIES
from dppo_oat.engines.local.progress import PROGRESS_LINES, StepProgress, line_every

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_terminal_a_line_every_few_steps_and_at_the_last():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with StepProgress(console, total=45, completed=0) as progress:
        for step in range(1, 46):
            progress.update(step, f"RL steps: success {step / 100:.2f}")
    lines = out.getvalue().splitlines()
    every = line_every(45)
    assert every == 45 // PROGRESS_LINES == 2
    assert [line.split("step ")[1].split("/")[0] for line in lines] == [str(s) for s in range(2, 46, 2)] + ["45"]
    assert lines[-1].startswith("RL steps: success 0.45: step 45/45, ")


def test_a_resumed_run_counts_from_its_step_and_a_terminal_gets_the_bar():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with StepProgress(console, total=4, completed=2) as progress:
        progress.update(3, "RL steps")
        progress.update(4, "RL steps")
    assert progress.bar is not None and "4/4" in out.getvalue() and "step 4/4" not in out.getvalue()


@pytest.mark.slow
def test_piped_output_never_breaks_a_path(tmp_path):
    """With stdout a pipe (where rich would wrap at 80 columns), every path the train and plot commands print stays
    on one line: the shipped policy's, the run directory's, the figure's."""
    folder = tmp_path / ("a-folder-whose-name-alone-is-longer-than-the-eighty-columns-of-a-pipe-" * 2)
    environment = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    environment["PYTHONPATH"] = str(ROOT)
    train = [sys.executable, "-m", "dppo_oat.train", "--steps", "1", "--groups-per-step", "2", "--group-size", "2",
             "--eval-episodes", "2", "--token-samples", "0", "--runs-dir", str(folder), "--run-name", "piped"]
    done = subprocess.run(train, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.endswith(f"run in {folder / 'piped'})") for line in lines), done.stdout
    assert any(str(SHIPPED_POLICIES) in line for line in lines), done.stdout
    figure = folder / "figure.png"
    plot = [sys.executable, "-m", "dppo_oat.plot", str(folder / "piped"), "-o", str(figure)]
    drawn = subprocess.run(plot, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert drawn.returncode == 0 and f"wrote {figure}" in drawn.stdout.splitlines(), drawn.stdout + drawn.stderr
