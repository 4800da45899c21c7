"""The oat engine's resumable checkpoints as files (no oat needed: these run in the main suite): a checkpoint exists
only once renamed whole, the newest N stay, a kill's leftovers are cleared, ``--resume_dir`` finds the newest whole
one or says in one line why it cannot, and a stopped run's message is the command that resumes it. The whole
program killed and resumed runs in ``tests/oat/test_oat_rehearsal.py``."""

from __future__ import annotations

import dataclasses
import json
import shlex
import signal
from pathlib import Path

import pytest

from dppo_oat.engines.oat import launch, resume
from dppo_oat.engines.oat.resume import (
    CHECKPOINTS_DIR,
    checkpoint_tag,
    commit_checkpoint,
    complete_checkpoints,
    find_resume_point,
    partial_path,
    prune_checkpoints,
    remove_unfinished,
)


def write_checkpoint(root: Path, learning_round: int, *, commit: bool = True) -> Path:
    """A checkpoint folder as the learner writes it: its files into ``<tag>.partial``, then the rename."""
    tag = checkpoint_tag(learning_round)
    partial = partial_path(root, tag)
    partial.mkdir(parents=True)
    (partial / "learner_0.pt").write_bytes(b"state")
    resume.write_resume_record(partial, {"learning_round": learning_round, "actor_steps": 2 * learning_round,
                                         "learners": 1})
    return commit_checkpoint(root, tag) if commit else partial


def test_a_checkpoint_exists_only_once_renamed(tmp_path):
    root = tmp_path / CHECKPOINTS_DIR
    write_checkpoint(root, 1)
    write_checkpoint(root, 2, commit=False)  # a kill before the rename
    assert [c.name for c in complete_checkpoints(root)] == ["round_000001"]
    assert [p.name for p in remove_unfinished(root)] == ["round_000002.partial"]
    assert sorted(p.name for p in root.iterdir()) == ["round_000001"]


def test_a_recomputed_round_replaces_its_checkpoint_and_a_kill_between_keeps_one(tmp_path):
    root = tmp_path / CHECKPOINTS_DIR
    first = write_checkpoint(root, 3)
    (first / "marker").write_text("before the resume")
    write_checkpoint(root, 3)  # the same round again, after resuming from an earlier checkpoint
    assert not (root / "round_000003" / "marker").exists() and not (root / "round_000003.old").exists()
    # a kill after the old one was moved aside and before the new one took its name: the old one comes back
    (root / "round_000003").rename(root / "round_000003.old")
    write_checkpoint(root, 3, commit=False)
    remove_unfinished(root)
    assert [c.name for c in complete_checkpoints(root)] == ["round_000003"]


def test_only_the_newest_checkpoints_stay(tmp_path):
    root = tmp_path / CHECKPOINTS_DIR
    for learning_round in (1, 2, 3, 10):
        write_checkpoint(root, learning_round)
    removed = prune_checkpoints(root, keep=2)
    assert [p.name for p in removed] == ["round_000001", "round_000002"]
    assert [c.name for c in complete_checkpoints(root)] == ["round_000003", "round_000010"]


@pytest.mark.parametrize("named", ["run", "checkpoints", "checkpoint"])
def test_resume_dir_may_name_the_run_its_checkpoints_or_one_checkpoint(tmp_path, named):
    run = tmp_path / "sudoku_1128T09:00:00"
    for learning_round in (4, 8):
        write_checkpoint(run / CHECKPOINTS_DIR, learning_round)
    given = {"run": run, "checkpoints": run / CHECKPOINTS_DIR, "checkpoint": run / CHECKPOINTS_DIR / "round_000004"}
    point = find_resume_point(given[named])
    assert point.run_dir == run
    assert point.learning_round == (4 if named == "checkpoint" else 8)


@pytest.mark.fault("oat engine: `--resume_dir` naming no run, a run without a whole checkpoint, or an unknown "
                   "`--resume_tag`", "one line: what is missing (a kill mid-save leaves the previous checkpoint)")
@pytest.mark.parametrize("case,message", [
    ("missing", "no such run directory"),
    ("no checkpoint", "the run has no whole checkpoint"),
    ("only a partial", "the run has no whole checkpoint"),
    ("unknown tag", "--resume_tag round_000009: .* holds no whole checkpoint of that name"),
    ("damaged record", "resume.json is damaged"),
])
def test_resume_dir_without_a_checkpoint_is_one_line(tmp_path, case, message):
    run = tmp_path / "run"
    tag = None
    if case != "missing":
        (run / CHECKPOINTS_DIR).mkdir(parents=True)
    if case == "only a partial":
        write_checkpoint(run / CHECKPOINTS_DIR, 1, commit=False)
    if case in ("unknown tag", "damaged record"):
        folder = write_checkpoint(run / CHECKPOINTS_DIR, 1)
        tag = "round_000009" if case == "unknown tag" else None
        if case == "damaged record":
            (folder / resume.RESUME_RECORD).write_text("{not json")
    with pytest.raises(ValueError, match=message) as error:
        find_resume_point(run, tag)
    assert "\n" not in str(error.value)


@pytest.mark.fault("oat engine: `--resume_dir` with settings that differ from the run's",
                   "one line naming the settings that differ: resume with the command that started the run")
def test_a_resume_with_other_settings_is_refused_by_name():
    stored = {"learning_rate": 1e-6, "trust_region": "dppo_binary_tv", "wb_run_name": "a", "resume_dir": ""}
    resume.check_resume_settings(stored, {**stored, "wb_run_name": "b", "resume_dir": "x"})  # logging may change
    with pytest.raises(ValueError, match=r"1 setting\(s\) differ .*learning_rate: 1e-06 → 2e-06"):
        resume.check_resume_settings(stored, {**stored, "learning_rate": 2e-6})
    with pytest.raises(ValueError, match="no config.json"):
        resume.check_resume_settings({}, stored)


ARGV = ["--pretrain", "Qwen/Qwen3-1.7B-Base", "--gpus", "8", "--resume_dir=old", "--trust_region", "ppo"]


def test_the_stop_message_is_the_command_that_resumes(tmp_path):
    run = tmp_path / "sudoku_1128T09:00:00"
    write_checkpoint(run / CHECKPOINTS_DIR, 20)
    message = launch.stopped_message(ARGV, str(run), signal.SIGTERM)
    assert message.startswith(f"terminated (SIGTERM): launchpad stopped every worker; {run} resumes from "
                              "round_000020: python -m dppo_oat.train --engine oat --pretrain Qwen/Qwen3-1.7B-Base")
    assert message.endswith(f"--trust_region ppo --resume_dir {shlex.quote(str(run))}")
    assert "--resume_dir=old" not in message


def test_the_stop_message_before_any_checkpoint_says_to_start_again(tmp_path):
    assert "nothing to resume" in launch.stopped_message(ARGV, None, signal.SIGINT)
    message = launch.stopped_message(ARGV, str(tmp_path), signal.SIGINT)
    assert message.startswith("interrupted: launchpad stopped every worker before the first checkpoint")


def test_the_resume_command_replaces_every_spelling_of_the_resume_flags():
    argv = ["--resume-dir", "a", "--resume_tag", "round_000001", "--seed", "3", "--resume_tag=round_000002"]
    assert launch.resume_command(argv, "/runs/x") == ("python -m dppo_oat.train --engine oat --seed 3 "
                                                      "--resume_dir /runs/x")


def test_a_failed_checkpoint_names_the_newest_whole_one_and_the_command(tmp_path):
    root = tmp_path / "run" / CHECKPOINTS_DIR
    write_checkpoint(root, 5)
    message = resume.checkpoint_failure(root, checkpoint_tag(6), OSError(28, "No space left on device"))
    assert "OSError: [Errno 28] No space left on device" in message
    assert "the newest whole checkpoint is round_000005" in message and message.endswith(f"--resume_dir {root.parent}")
    assert json.loads((root / "round_000005" / resume.RESUME_RECORD).read_text())["learning_round"] == 5


@dataclasses.dataclass
class Transition:
    """Stands for oat's transition dataclasses: what the samples of steps played ahead are."""

    response_ids: list
    logprobs: list


def test_a_learner_state_keeps_the_samples_played_ahead_as_they_were(tmp_path):
    """The steps played ahead (``--max_staleness``) come back as the objects the learner took from the actor, not as
    dicts (oat's learner refuses anything but its own transition types)."""
    samples = [Transition([1, 2], [-0.5, -0.25]), Transition([3], [-1.0])]
    played = [{"step": 3, "version": 1, "rank_lengths": [2], "samples": samples, "seconds": 1.5}]
    state = resume.LearnerState(
        steps=2, learning_rounds=2, global_step=4, policy_sgd_step=4.0, pi_beta_version=2, query_step=16,
        prompt_consumed=16, prompt_epoch=1, broadcast_rounds=[1, 2], last_eval_query_step=None, pending_eval=False,
        guard={"skipped": 0}, random_states={"python": 1}, played_steps=played)
    resume.write_learner_state(tmp_path, 0, state)
    back = resume.read_learner_state(tmp_path, 0)
    assert back == state and back.played_steps[0]["samples"] == samples
    assert all(type(sample) is Transition for sample in back.played_steps[0]["samples"])
