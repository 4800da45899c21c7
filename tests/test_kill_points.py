"""A kill at every write point of a 5-step run leaves a run directory that goes on to the uninterrupted run: the same
metrics, evaluations, token samples and weights, and no temporary file (``tests/kill_points.py`` kills and goes on);
with ``--token-export all`` (a 3-step run), the same step exports too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dppo_oat.run.directory import CHECKPOINT_FILE
from dppo_oat.run.log import temporaries
from dppo_oat.run.safe_io import read_jsonl

HELPER = Path(__file__).with_name("kill_points.py")
RUN = ["--steps", "5", "--groups-per-step", "2", "--group-size", "4", "--minibatches-per-rollout", "2",
       "--eval-episodes", "2", "--eval-every", "5", "--token-samples", "4", "--lr-schedule", "linear",
       "--threads", "1"]
"""A 5-step run from the shipped policy (its groups differ, so every step changes the weights), evaluated at steps 0
and 5, on one thread per process (two processes share the machine's cores)."""
LANES = 2
TIMING = ("time/", "tokens_per_s/")


EXPORTING = ["--steps", "3", "--groups-per-step", "2", "--group-size", "4", "--minibatches-per-rollout", "2",
             "--eval-episodes", "2", "--eval-every", "3", "--token-samples", "4", "--lr-schedule", "linear",
             "--threads", "1", "--token-export", "all"]
"""A 3-step run of the same settings that exports every trained token."""


def battery(out: Path, points: str, cache: Path, run: list[str]) -> subprocess.Popen:
    out.mkdir(parents=True)
    return subprocess.Popen([sys.executable, str(HELPER), str(out), points, *run, "--cache-dir", str(cache)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # children log to files


def without_timings(rows):
    return [{key: value for key, value in row.items() if not key.startswith(TIMING)} for row in rows]


def same_run(run: Path, straight: Path, steps: int) -> None:
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert without_timings(read_jsonl(run / name)) == without_timings(read_jsonl(straight / name)), name
    assert read_jsonl(run / "tokens.jsonl") == read_jsonl(straight / "tokens.jsonl")
    ours, theirs = (torch.load(path / CHECKPOINT_FILE, weights_only=True) for path in (run, straight))
    assert ours["step"] == theirs["step"] == steps
    assert all(torch.equal(ours["model"][key], value) for key, value in theirs["model"].items())
    assert not temporaries(run), f"{run}: temporaries left: {temporaries(run)}"
    exports = [path.name for path in sorted((straight / "token_exports").glob("*"))]
    assert [path.name for path in sorted((run / "token_exports").glob("*"))] == exports
    for name in exports:
        assert (run / "token_exports" / name).read_bytes() == (straight / "token_exports" / name).read_bytes(), name


def kill_at_every_point(tmp_path: Path, run: list[str], steps: int, fewest: int) -> None:
    """The uninterrupted run counts the write points; two lanes take every other one: SIGKILL there, then go on."""
    cache = tmp_path / "cache"
    counted = battery(tmp_path / "count", "none", cache, run)
    assert counted.wait(timeout=600) == 0, counted.stderr.read()
    total = int((tmp_path / "count" / "points").read_text())
    assert total >= fewest
    lanes = [battery(tmp_path / f"lane{lane}", ",".join(map(str, range(lane + 1, total + 1, LANES))), cache, run)
             for lane in range(LANES)]
    for lane in lanes:
        assert lane.wait(timeout=1200) == 0, lane.stderr.read()
    straight, thens = tmp_path / "count" / "runs" / "straight", set()
    for lane in range(LANES):
        folder = tmp_path / f"lane{lane}"
        for name, outcome in json.loads((folder / "outcomes.json").read_text()).items():
            logs = [(folder / "logs" / f"{name}-{phase}").read_text() for phase in ("killed", "then")]
            assert outcome["killed"] == -9 and outcome["status"] == 0, (name, outcome, logs)
            same_run(folder / "runs" / name, straight, steps)
            thens.add(outcome["then"])
    assert thens == {"--resume", "--overwrite"}


@pytest.mark.fault("a kill (`kill -9`) at any write point of a run: while `config.json`, a log line, an evaluation "
                   "or `checkpoint.pt` is written, or between any two writes",
                   "the next command (`--resume` where a checkpoint was written, else `--overwrite`, which moves the "
                   "killed run's files aside) ends with the uninterrupted run's metrics, evaluations, token samples "
                   "and weights, and no temporary file")
def test_a_kill_at_every_write_point_goes_on_to_the_uninterrupted_run(tmp_path):
    # the config, three log truncations, 2 evaluations, 5 × (tokens, metrics, checkpoint)
    kill_at_every_point(tmp_path, RUN, 5, fewest=40)


@pytest.mark.fault("a kill (`kill -9`) at any write point of a run with `--token-export all`: while a step's export "
                   "is written, or between it and the step's checkpoint",
                   "the next command ends with the uninterrupted run's exports, every step's (a step is checkpointed "
                   "only once its export is on disk), and no temporary file")
def test_a_kill_at_every_write_point_keeps_every_token_export(tmp_path):
    # the config, three log truncations, 2 evaluations, 3 × (tokens, metrics, export, checkpoint)
    kill_at_every_point(tmp_path, EXPORTING, 3, fewest=32)
