"""Faults of the launch scripts (``scripts/gpu/*.sh``, ``scripts/verl/math.sh``): a refused setting stops the script
with one line on stderr before anything launches."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def script(path, *args, tmp_path, **env):
    """Run a launch script whose interpreter records that it was started (``tmp_path / "launched"``)."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'launched'}\n")
    python.chmod(0o755)
    done = subprocess.run(["bash", str(REPO / path), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(python), **env})
    return done, (tmp_path / "launched").exists()


@pytest.mark.fault("`scripts/gpu/gem.sh sudoku --gpus 3 --dry-run` (also `math.sh`, `sanity_test.sh`, "
                   "`takeaway2.sh`): a batch that does not split over the GPUs",
                   "one line on stderr (`128 does not split evenly over --gpus 3 (use 1, 2, 4 or 8)`), exit 2; "
                   "nothing launches")
@pytest.mark.parametrize("path", ["scripts/gpu/gem.sh sudoku", "scripts/gpu/math.sh", "scripts/gpu/sanity_test.sh",
                                  "scripts/gpu/takeaway2.sh"])
def test_a_batch_that_does_not_split_stops_the_script_in_one_line(path, tmp_path):
    name, *task = path.split()
    done, launched = script(name, *task, "--gpus", "3", "--dry-run", tmp_path=tmp_path, DPPO_MATH_DATA=str(tmp_path))
    assert done.returncode == 2 and not launched, done
    assert done.stderr.count("does not split evenly over --gpus 3") == 1, done.stderr


@pytest.mark.fault("`TR='delta=nan'` (or `delta=abc`, `delta=`) for `scripts/verl/math.sh`, with `DRY_RUN=1` too",
                   "the verl CLI's one line on stderr (`error: delta=nan: …`), exit 2; nothing launches")
@pytest.mark.parametrize("fields", ["delta=nan", "delta=abc", "delta="])
def test_a_bad_trust_region_field_stops_the_verl_script_in_one_line(fields, tmp_path):
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\n[ \"$2\" = dppo_oat.engines.verl ] && exec {sys.executable} \"$@\"\n"
                      f"echo \"$@\" >> {tmp_path / 'launched'}\n")
    python.chmod(0o755)
    done = subprocess.run(["bash", str(REPO / "scripts/verl/math.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(python), "DATA": str(tmp_path), "TR": fields,
                               "DRY_RUN": "1"})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert fields in errors[0] and not (tmp_path / "launched").exists()
