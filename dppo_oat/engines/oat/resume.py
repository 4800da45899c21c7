"""Resumable checkpoints of the oat engine: what oat 0.2.4's ``--resume_dir`` leaves out, saved atomically.

oat reloads DeepSpeed's state on ``--resume_dir`` and nothing else: its loop restarts at actor step 0, its
evaluation schedule and random states start afresh, and its actors play the first round with ``--pretrain``'s
weights. A DPPO checkpoint of learning round r is one folder, ``<run>/checkpoints/round_<r>/``:

- DeepSpeed's own files: every learner's shard of the weights, the optimizer state and the learning-rate schedule;
- ``learner_<rank>.pt`` for each learner: :class:`LearnerState`, the loop's position (actor steps, learning rounds,
  oat's counters and evaluation schedule, the weight versions broadcast) and every random state it draws from;
- ``resume.json`` (rank 0): the round, the actor steps and the number of learners, read by the launcher before any
  model loads (:func:`read_resume_record`).

It is written as ``round_<r>.partial/`` and renamed once every learner has finished writing, so a kill at any moment
leaves the previous checkpoint whole; the next resume removes a ``.partial`` folder. The newest
``--keep_checkpoints`` are kept. A checkpoint is taken only after the round's metrics and evaluation were logged
and its weights broadcast, so on resume the logs are cut back to the round (:class:`~dppo_oat.run.log.RunLog`), the
actors receive the checkpoint's weights and continue at the next actor step (their seeds derive from it), and the
run goes on as an uninterrupted one would. Imports nothing of oat or launchpad.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dppo_oat.run.directory import CHECKPOINTS_DIR, RunDir
from dppo_oat.run.safe_io import atomic_torch_save, atomic_write_bytes
from dppo_oat.settings.kinds import resumable_fields
from dppo_oat.settings.spec import DPPOFlags

PARTIAL_SUFFIX = ".partial"
OLD_SUFFIX = ".old"
RESUME_RECORD = "resume.json"
TAG_PREFIX = "round_"


def checkpoint_tag(learning_round: int) -> str:
    """The folder name of round ``learning_round``'s checkpoint (sorts by round)."""
    return f"{TAG_PREFIX}{learning_round:06d}"


def learner_file(rank: int) -> str:
    return f"learner_{rank}.pt"


@dataclasses.dataclass
class LearnerState:
    """What one learner needs beyond DeepSpeed's checkpoint to continue its loop where it was: oat's counters and
    evaluation schedule (``LearnerBase``), DPPO's rounds and broadcasts, the blow-up guard and every random state."""

    steps: int
    learning_rounds: int
    global_step: int
    policy_sgd_step: float
    pi_beta_version: int
    query_step: int
    prompt_consumed: int
    prompt_epoch: int
    broadcast_rounds: list
    last_eval_query_step: int | None
    pending_eval: bool
    guard: dict
    random_states: dict
    played_steps: list = dataclasses.field(default_factory=list)
    """``--max_staleness``: the actor steps played ahead and not yet learned
    (:meth:`~dppo_oat.engines.oat.collector.ActorStepPipeline.played_steps`), samples on each actor group's rank 0."""


def random_states(shuffle: torch.Generator) -> dict[str, Any]:
    """The random states a learner draws from: torch's (CPU and every CUDA device), NumPy's and Python's global
    ones, and the update loop's shuffle generator."""
    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
              "shuffle": shuffle.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict[str, Any], shuffle: torch.Generator) -> None:
    """Undo :func:`random_states`."""
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    shuffle.set_state(states["shuffle"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def learner_state(learner, played_steps: list | None = None) -> LearnerState:
    """A :class:`~dppo_oat.engines.oat.learner.DPPOLearner`'s state at the end of a learning round, with the actor
    steps played ahead of it (``played_steps``)."""
    return LearnerState(
        steps=learner.steps, learning_rounds=learner.learning_rounds, global_step=learner.global_step,
        policy_sgd_step=learner.policy_sgd_step, pi_beta_version=learner.pi_beta_version,
        query_step=learner.query_step, prompt_consumed=learner.prompt_consumed, prompt_epoch=learner.prompt_epoch,
        broadcast_rounds=list(learner.broadcast_rounds),
        last_eval_query_step=getattr(learner, "last_eval_query_step", None),
        pending_eval=getattr(learner, "_pending_eval", False),
        guard=dataclasses.asdict(learner.guard), random_states=random_states(learner.shuffle_generator),
        played_steps=list(played_steps or []),
    )


def restore_learner_state(learner, state: LearnerState) -> None:
    """Undo :func:`learner_state` but for the random states (:func:`set_random_states`; oat's ``_should_do`` keeps
    its schedule in attributes it creates on first use)."""
    for name in ("steps", "learning_rounds", "global_step", "policy_sgd_step", "pi_beta_version", "query_step",
                 "prompt_consumed", "prompt_epoch"):
        setattr(learner, name, getattr(state, name))
    learner.broadcast_rounds = list(state.broadcast_rounds)
    if state.last_eval_query_step is not None:
        learner.last_eval_query_step = state.last_eval_query_step
    learner._pending_eval = state.pending_eval
    learner.guard = type(learner.guard)(**state.guard)


# ------------------------------------------------------------------------------------------------------ the folders


def partial_path(root: Path, tag: str) -> Path:
    return root / f"{tag}{PARTIAL_SUFFIX}"


def complete_checkpoints(root: Path) -> list[Path]:
    """The whole checkpoints under ``root``, oldest round first (``.partial`` and ``.old`` folders are not)."""
    if not root.is_dir():
        return []
    return sorted(path for path in root.iterdir() if path.is_dir() and path.name.startswith(TAG_PREFIX)
                  and not path.name.endswith((PARTIAL_SUFFIX, OLD_SUFFIX)) and (path / RESUME_RECORD).is_file())


def commit_checkpoint(root: Path, tag: str) -> Path:
    """Rename ``<tag>.partial`` to ``<tag>`` (the one step that makes a checkpoint exist). A checkpoint of the same
    round from before a resume is moved aside first and removed after, so no moment is without a whole one."""
    final, old = root / tag, root / f"{tag}{OLD_SUFFIX}"
    if final.exists():
        os.replace(final, old)
    os.replace(partial_path(root, tag), final)
    _fsync_directory(root)
    shutil.rmtree(old, ignore_errors=True)
    return final


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` whole checkpoints; return the removed ones."""
    removed = complete_checkpoints(root)[:-keep] if keep > 0 else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def remove_unfinished(root: Path) -> list[Path]:
    """Remove the ``.partial`` folders of saves a kill cut short, and restore a checkpoint a kill left moved aside
    (``.old`` without its replacement); return what was removed. Only the run's one writer may call it."""
    removed = []
    if not root.is_dir():
        return removed
    for path in sorted(root.iterdir()):
        if path.name.endswith(OLD_SUFFIX):
            final = root / path.name[: -len(OLD_SUFFIX)]
            if final.exists():
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.replace(path, final)
        elif path.name.endswith(PARTIAL_SUFFIX):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_learner_state(folder: Path, rank: int, state: LearnerState) -> None:
    """``state``'s fields as a dict (shallow: ``dataclasses.asdict`` would turn the samples of ``played_steps``,
    oat's transition dataclasses, into dicts that oat's learner refuses)."""
    fields = {field.name: getattr(state, field.name) for field in dataclasses.fields(state)}
    atomic_torch_save(fields, folder / learner_file(rank))


def read_learner_state(folder: Path, rank: int) -> LearnerState:
    data = torch.load(folder / learner_file(rank), map_location="cpu", weights_only=False)
    return LearnerState(**data)


def write_resume_record(folder: Path, record: dict) -> None:
    atomic_write_bytes(folder / RESUME_RECORD, json.dumps(record, indent=2).encode())


# ------------------------------------------------------------------------------------------------------ resuming


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumes from: its run directory, its folder and ``resume.json``."""

    run_dir: Path
    folder: Path
    record: dict

    @property
    def learning_round(self) -> int:
        return int(self.record["learning_round"])


def run_directory_of(resume_dir: str | Path) -> Path:
    """The run directory ``--resume_dir`` names: the run's own folder (oat's ``<save_path>/<run>_<time>``), its
    ``checkpoints`` folder, or one checkpoint folder in it."""
    path = Path(resume_dir).expanduser()
    if path.name == CHECKPOINTS_DIR:
        return path.parent
    if path.parent.name == CHECKPOINTS_DIR and path.name.startswith(TAG_PREFIX):
        return path.parent.parent
    return path


def find_resume_point(resume_dir: str | Path, tag: str | None = None) -> ResumePoint:
    """The checkpoint to resume from: ``tag`` (``round_NNNNNN``, or the folder ``--resume_dir`` names), else the
    newest whole one. Raises ValueError with one line that says what to do."""
    path = Path(resume_dir).expanduser()
    run_dir = run_directory_of(path)
    if not run_dir.is_dir():
        raise ValueError(f"--resume_dir {resume_dir}: no such run directory (oat's <save_path>/<run>_<start time>)")
    if tag is None and path.parent.name == CHECKPOINTS_DIR:
        tag = path.name
    checkpoints = complete_checkpoints(RunDir(run_dir).round_checkpoints)
    if tag is not None:
        checkpoints = [c for c in checkpoints if c.name == tag]
        if not checkpoints:
            raise ValueError(f"--resume_tag {tag}: {RunDir(run_dir).round_checkpoints} holds no whole checkpoint of "
                             "that name: leave --resume_tag out to take the newest")
    if not checkpoints:
        raise ValueError(f"--resume_dir {resume_dir}: the run has no whole checkpoint (one is written every "
                         "--checkpoint_every learning rounds under <run>/checkpoints): start a new run")
    folder = checkpoints[-1]
    try:
        record = json.loads((folder / RESUME_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{folder / RESUME_RECORD} is damaged ({error}): {DAMAGED_HINT}") from None
    check_resume_record(folder, record)
    return ResumePoint(run_dir=run_dir, folder=folder, record=record)


DAMAGED_HINT = "resume from an older checkpoint with --resume_tag, or start a new run"
RECORD_COUNTS = ("learning_round", "actor_steps", "learners")
"""The fields of ``resume.json`` a resume reads (the launcher, the log cut and the learners), each a whole number
>= 1."""


def check_resume_record(folder: Path, record: object) -> None:
    """``resume.json`` as the learner writes it (:meth:`~dppo_oat.engines.oat.learner.DPPOLearner.resume_record`): a
    JSON object whose :data:`RECORD_COUNTS` are whole numbers >= 1, whose round is the folder's and takes at least as
    many actor steps, beside a ``learner_<rank>.pt`` of each learner. Raises ValueError with one line naming the
    file and what is wrong in it, before any model loads (else a learner fails on it after the models loaded)."""
    where = folder / RESUME_RECORD
    if not isinstance(record, dict):
        raise ValueError(f"{where} is damaged (a JSON {type(record).__name__}, not an object): {DAMAGED_HINT}")
    for name in RECORD_COUNTS:
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            missing = "has no" if name not in record else f"has {json.dumps(value)} for"
            raise ValueError(f"{where} is damaged (it {missing} {name}, a whole number >= 1): {DAMAGED_HINT}")
    learning_round, actor_steps = record["learning_round"], record["actor_steps"]
    if folder.name != checkpoint_tag(learning_round):
        raise ValueError(f"{where} is damaged (its learning_round {learning_round} is not the round of the folder "
                         f"{folder.name}): {DAMAGED_HINT}")
    if actor_steps < learning_round:
        raise ValueError(f"{where} is damaged (actor_steps {actor_steps} is fewer than its learning_round "
                         f"{learning_round}, each of which takes an actor step at least): {DAMAGED_HINT}")
    absent = [learner_file(rank) for rank in range(record["learners"]) if not (folder / learner_file(rank)).is_file()]
    if absent:
        raise ValueError(f"{folder} lacks {', '.join(absent)} of the {record['learners']} learner(s) resume.json "
                         f"names: {DAMAGED_HINT}")


OAT_MAY_CHANGE_ON_RESUME = (
    "resume_dir", "resume_tag", "dry_run", "debug", "use_wb", "wb_org", "wb_group", "wb_project", "wb_run_name",
    "run_name", "logging_steps", "price_gpu", "price_model", "price_decode_efficiency", "save_path", "save_steps",
    "save_from", "checkpoint_every", "keep_checkpoints", "max_save_num", "max_save_mem", "launch_type",
    "learner_gpus_per_group", "local_rank", "algo",
)
"""The fields of oat's own argument class (which cannot declare them) and of this engine's that a resume may give
anew: where and how the run is logged and saved (the dry run's price included), not what it trains (``algo``, oat's
algorithm, is checked to be PPO: a run's ``config.json`` records it as ``oat_algo``, an earlier run's as ``algo``;
``learner_gpus_per_group`` and ``local_rank`` are set by oat's ``get_program`` and strategy)."""
MAY_CHANGE_ON_RESUME = (*OAT_MAY_CHANGE_ON_RESUME, *resumable_fields(DPPOFlags))
"""Settings a resume may give anew: :data:`OAT_MAY_CHANGE_ON_RESUME` and the DPPO flags that declare so
(:func:`~dppo_oat.settings.kinds.flag`: the token samples and exports)."""


def free_on_resume(trust_region) -> list[str]:
    """The ``config.json`` keys a resume may give anew beside :data:`MAY_CHANGE_ON_RESUME`, as the local engine's
    resume has them: the trust-region override flags (``tr_delta`` ...), which are compared as the trust region they
    resolve to (``trust_region.delta`` ...), and the fields of ``trust_region`` its rule never reads."""
    from dppo_oat.settings.spec import OVERRIDE_FLAGS, TRUST_REGION_OVERRIDES

    unread = [f"trust_region.{name}" for name in TRUST_REGION_OVERRIDES if name not in trust_region.fields_read]
    return [*OVERRIDE_FLAGS, *unread]


def check_resume_settings(stored: dict, current: dict, free: Iterable[str] = ()) -> None:
    """Refuse, in one line naming them, the settings that differ from the run's ``config.json`` (a resume continues
    the run it names, with its own settings) beyond :data:`MAY_CHANGE_ON_RESUME` and ``free``. ``current`` is what
    this command's run would record (:func:`~dppo_oat.engines.oat.args.logged_config`), so that each setting is
    compared in the form the run recorded it: the trust region as the settings it resolved to, not a preset's name."""
    from dppo_oat.run.log import config_differences

    if not stored:
        raise ValueError("--resume_dir: the run has no config.json: it cannot be told what it trained with")
    differences = config_differences(stored, current, [*MAY_CHANGE_ON_RESUME, *free])
    if differences:
        shown = "; ".join(differences[:4]) + ("; ..." if len(differences) > 4 else "")
        raise ValueError(f"--resume_dir: {len(differences)} setting(s) differ from the run's config.json ({shown}): "
                         "a resume may change only where and how the run logs and saves (--save_path, --wb_*, "
                         "--checkpoint_every, ...); resume with the command that started the run, plus --resume_dir")


def checkpoint_failure(root: Path, tag: str, error: BaseException | None) -> str:
    """The one line a run ends on when its checkpoint ``tag`` could not be written."""
    newest = complete_checkpoints(root)
    kept = f"the newest whole checkpoint is {newest[-1].name}" if newest else "no whole checkpoint was written yet"
    cause = f"{type(error).__name__}: {error}" if error is not None else "another learner failed to write its part"
    return (f"writing the checkpoint {root / tag} failed ({cause}); {kept}: make room or fix the folder, then go on "
            f"with the same command plus --resume_dir {root.parent}")
