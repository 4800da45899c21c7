"""A run whose output is not a terminal (a log file, a pipe) prints a plain progress line every few steps, where a
live bar would draw nothing until the end; on a terminal the bar draws as before."""

import io

from rich.console import Console

from dppo_oat.engines.local.progress import PLAIN_LINES, StepProgress, plain_every


def test_without_a_terminal_a_line_every_few_steps_and_at_the_last():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with StepProgress(console, total=45, completed=0) as progress:
        for step in range(1, 46):
            progress.update(step, f"RL steps: success {step / 100:.2f}")
    lines = out.getvalue().splitlines()
    every = plain_every(45)
    assert every == 45 // PLAIN_LINES == 2
    assert [line.split("step ")[1].split("/")[0] for line in lines] == [str(s) for s in range(2, 46, 2)] + ["45"]
    assert lines[-1].startswith("RL steps: success 0.45: step 45/45, ")


def test_a_resumed_run_counts_from_its_step_and_a_terminal_gets_the_bar():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with StepProgress(console, total=4, completed=2) as progress:
        progress.update(3, "RL steps")
        progress.update(4, "RL steps")
    assert progress.bar is not None and "4/4" in out.getvalue() and "step 4/4" not in out.getvalue()
