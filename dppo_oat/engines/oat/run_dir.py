"""The oat engine's run directory: the same ``config.json`` / ``metrics.jsonl`` / ``eval.jsonl`` as the local engine
writes (:class:`~dppo_oat.run.log.RunLog` into a :class:`~dppo_oat.run.directory.RunDir`), inside oat's own
``save_path/<run>``, so the notebooks and ``python -m dppo_oat.plot`` read GPU runs too.

oat's learner logs through the object it keeps as ``_wandb`` (rank 0 only): ``log(logs)`` after every learning round
and evaluation, ``finish()`` at the end. :class:`RunDirectoryLogger` takes that place, writes each call as run-directory
lines, and passes it on to wandb when ``--use_wb`` is set. Its step is the learning round (one rollout batch and its
update, the local engine's RL step): a metrics line per round (oat's final call repeats the last round's numbers: not
written twice), an evaluation line at the rounds done when it ran (0 before training); the learner adds each round's
token sample (:meth:`RunDirectoryLogger.log_tokens`). A resumed run (``resume_round``) cuts the logs back to the
checkpoint's round and writes on from the next one. Rows keep every oat key and add the names the local engine uses:
``train/dppo/<metric>`` → ``<metric>``, ``actor/<stat>`` → ``rollout/<stat>`` (``reward``: the episode return,
``success``), ``eval/accuracy`` → ``eval/success``, ``eval/score`` → ``eval/return``, ``eval/eval_count`` →
``eval/seeds`` (× ``eval_n``: ``eval/episodes``).
"""

from __future__ import annotations

import os
from typing import Any

from dppo_oat.run.log import RunLog

DPPO_PREFIX, ACTOR_PREFIX, ROUND_KEY = "train/dppo/", "actor/", "train/learning_round"
EVAL_NAMES = {"eval/accuracy": "eval/success", "eval/score": "eval/return", "eval/eval_count": "eval/seeds"}


def metrics_row(logs: dict[str, Any], step: int) -> dict[str, Any]:
    """One ``metrics.jsonl`` line of oat's logs: every oat key, plus the local engine's names."""
    row: dict[str, Any] = {"step": step, **{k: v for k, v in logs.items() if not k.startswith("eval/")}}
    for key, value in logs.items():
        if key.startswith(DPPO_PREFIX):
            row[key[len(DPPO_PREFIX):]] = value
        elif key.startswith(ACTOR_PREFIX):
            row[f"rollout/{key[len(ACTOR_PREFIX):]}"] = value
    if "rollout/episode_return" in row:
        row["reward"] = row["rollout/episode_return"]
    for name in ("success", "response_length"):
        if f"rollout/{name}" in row:
            row[name] = row[f"rollout/{name}"]
    return row


def eval_row(logs: dict[str, Any], step: int, eval_n: int = 1) -> dict[str, Any] | None:
    """One ``eval.jsonl`` line, or None when the logs hold no evaluation (oat counts seeds; ``eval_n`` episodes
    were played from each)."""
    evaluation = {k: v for k, v in logs.items() if k.startswith("eval/")}
    if not evaluation:
        return None
    row = {"step": step, **evaluation, **{EVAL_NAMES[k]: v for k, v in evaluation.items() if k in EVAL_NAMES}}
    if "eval/seeds" in row:
        row["eval/episodes"] = row["eval/seeds"] * eval_n
    return row


class RunDirectoryLogger:
    """Writes oat's logs into a run directory; ``mirror`` (the wandb module, or None) gets every call too."""

    def __init__(self, directory: str | os.PathLike, config: dict, mirror: Any = None, eval_n: int = 1,
                 resume_round: int | None = None):
        self.run_log = RunLog(directory, config, resume_step=resume_round)
        self.mirror, self.rounds, self.eval_n = mirror, resume_round or 0, eval_n

    def log(self, logs: dict[str, Any], *args, **kwargs) -> None:
        learning_round = int(logs.get(ROUND_KEY, 0))
        if learning_round > self.rounds:
            self.rounds = learning_round
            self.run_log.log_metrics(metrics_row(logs, learning_round))
        evaluation = eval_row(logs, self.rounds, self.eval_n)
        if evaluation is not None:
            self.run_log.log_eval(evaluation)
        if self.mirror is not None:
            self.mirror.log(logs, *args, **kwargs)

    def log_tokens(self, rows: list[dict]) -> None:
        """A learning round's token samples (``tokens.jsonl``; the learner numbers them with oat's round)."""
        self.run_log.log_tokens(rows)

    def finish(self) -> None:
        self.run_log.close()
        if self.mirror is not None:
            self.mirror.finish()
