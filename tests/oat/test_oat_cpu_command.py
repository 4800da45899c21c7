"""``make oat-cpu-run`` (``scripts/gpu/cpu_run.sh``): the oat engine's short run on this machine's CPU, outside
pytest, in the GPU node's own software, launched by the real dm-launchpad; stopped as a user stops it.

A SIGTERM after the first checkpoint ends the command with one line that gives the command resuming the run, and
that command finishes it with every learning round logged once. Ctrl-C (SIGINT to the whole process group, as a
terminal sends it) at any moment ends it with the one line that is true of what is on disk: nothing to resume and
"start the run again", or the command that resumes from the newest whole checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.oat, pytest.mark.slow]
pytest.importorskip("oat.algorithms.ppo")
launchpad = pytest.importorskip("launchpad")
if hasattr(launchpad, "running"):
    pytest.skip("runs the command under the real dm-launchpad (make test-oat)", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "cpu_run.sh"
TIMEOUT_S = 600
ROUNDS = 20


def start(workdir: Path, *flags: str) -> subprocess.Popen:
    """The command in its own process group (a terminal's job), its output in ``workdir/output.txt``."""
    workdir.mkdir(parents=True, exist_ok=True)
    output = open(workdir / "output.txt", "w")
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.Popen(["bash", str(SCRIPT), "--save_path", str(workdir / "out"), *flags], cwd=workdir,
                            env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def finish(process: subprocess.Popen, workdir: Path) -> tuple[int, str]:
    """Wait for the command; its exit status and its last line."""
    returncode = process.wait(timeout=TIMEOUT_S)
    output = (workdir / "output.txt").read_text(encoding="utf-8", errors="replace")  # workers may cut a character
    lines = [line for line in output.splitlines() if line.strip()]
    return returncode, lines[-1] if lines else ""


def wait_for(condition, process: subprocess.Popen, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"the command ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def run_dirs(workdir: Path) -> list[Path]:
    out = workdir / "out"
    return sorted(out.iterdir()) if out.exists() else []


def whole_checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("round_*") if not p.name.endswith(".partial"))


def logged_rounds(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.fault("oat engine (`make oat-cpu-run`, under the real launchpad): SIGTERM after the first checkpoint",
                   "`error: terminated (SIGTERM): launchpad stopped every worker; <run> resumes from round_NNNNNN: "
                   "python -m dppo_oat.train --engine oat … --resume_dir <run>` (exit 143); that command finishes the "
                   "run, every learning round logged once")
def test_sigterm_after_the_first_checkpoint_prints_the_command_that_finishes_the_run(tmp_path):
    process = start(tmp_path / "run", "--max_train", str(8 * ROUNDS))
    wait_for(lambda: any(whole_checkpoints(d) for d in run_dirs(tmp_path / "run")), process, "first checkpoint")
    os.kill(process.pid, signal.SIGTERM)
    returncode, last = finish(process, tmp_path / "run")
    (run_dir,) = run_dirs(tmp_path / "run")
    newest = whole_checkpoints(run_dir)[-1]
    assert returncode == 143, last
    assert last.startswith(f"error: terminated (SIGTERM): launchpad stopped every worker; {run_dir} resumes from "
                           f"{newest}: python -m dppo_oat.train --engine oat "), last
    command = shlex.split(last.rsplit(": ", 1)[1])
    assert command[-2:] == ["--resume_dir", str(run_dir)]
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path / "run", stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, encoding="utf-8", errors="replace", timeout=TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert logged_rounds(run_dir) == list(range(1, ROUNDS + 1)), "every learning round logged once"
    assert f"finished: {run_dir}" in resumed.stdout


@pytest.mark.fault("oat engine (`make oat-cpu-run`, under the real launchpad): Ctrl-C at any moment",
                   "one line, exit 130: start the run again while no whole checkpoint exists, else the command that "
                   "resumes from the newest")
@pytest.mark.parametrize("after_s", [1.0, 12.0])
def test_ctrl_c_at_any_moment_says_what_is_true(tmp_path, after_s):
    """Ctrl-C while the command starts (imports, the plan), or once the program runs: the one line says to start
    again when no whole checkpoint exists, else gives the command that resumes from the newest."""
    process = start(tmp_path, "--max_train", str(8 * ROUNDS))
    time.sleep(after_s)
    assert process.poll() is None, "the command ended before Ctrl-C"
    os.killpg(process.pid, signal.SIGINT)
    returncode, last = finish(process, tmp_path)
    assert returncode == 130, last
    assert last.startswith("error: interrupted"), last
    checkpoints = [c for d in run_dirs(tmp_path) for c in whole_checkpoints(d)]
    if checkpoints:
        (run_dir,) = run_dirs(tmp_path)
        assert re.search(f"{re.escape(str(run_dir))} resumes from {checkpoints[-1]}: python -m dppo_oat.train", last)
    else:
        assert "start the run again" in last or "run the same command again" in last, last
