"""The oat engine's run directory: oat's learner logs become the local engine's files, which the analysis reads.
Pure Python (no oat needed): these run in the main suite."""

import json

from dppo_oat.analysis import load_run
from dppo_oat.engines.oat.run_dir import RunDirectoryLogger, eval_row, metrics_row

TRAIN_LOGS = {  # what oat's LearnerBase.eval_and_log hands its logger after a learning round
    "train/learning_round": 3.0, "train/pg_loss": 0.1, "train/dppo/mask/fraction": 0.02,
    "train/dppo/mismatch/abs_diff_mean": 0.004, "actor/episode_return": 0.4, "actor/success": 0.25,
    "actor/response_length": 310.0, "misc/lr": 1e-6,
}
EVAL_LOGS = {"eval/accuracy": 0.5, "eval/score": 0.6, "eval/eval_count": 64.0, "misc/lr": 1e-6}


class Mirror:
    def __init__(self):
        self.logged, self.finished = [], False

    def log(self, logs):
        self.logged.append(logs)

    def finish(self):
        self.finished = True


def test_rows_keep_oats_keys_and_add_the_local_engines_names():
    row = metrics_row(TRAIN_LOGS, 3)  # TRAIN_LOGS: round 3
    assert row["step"] == 3 and row["train/pg_loss"] == 0.1
    assert (row["mask/fraction"], row["mismatch/abs_diff_mean"]) == (0.02, 0.004)
    assert (row["reward"], row["success"], row["response_length"]) == (0.4, 0.25, 310.0)
    assert eval_row(TRAIN_LOGS, 3) is None
    assert eval_row(EVAL_LOGS, 0, eval_n=4) == {"step": 0, **EVAL_LOGS_EVAL, "eval/success": 0.5, "eval/return": 0.6,
                                                "eval/seeds": 64.0, "eval/episodes": 256.0}


EVAL_LOGS_EVAL = {k: v for k, v in EVAL_LOGS.items() if k.startswith("eval/")}


def test_the_learner_logger_writes_a_run_the_analysis_reads(tmp_path):
    mirror = Mirror()
    config = {"engine": "oat", "run_name": "sudoku-dppo", "env_ids": ["game:Sudoku-v0-easy"], "seed": 42,
              "trust_region": {"name": "dppo_binary_tv", "rule": "binary_tv", "delta": 0.2}, "algo": "PPO"}
    logger = RunDirectoryLogger(tmp_path / "run", config, mirror=mirror)
    logger.log(EVAL_LOGS)  # oat's evaluation before training
    logger.log({**TRAIN_LOGS, "train/learning_round": 1.0})
    logger.log({**TRAIN_LOGS, "train/learning_round": 2.0, "actor/success": 0.5})
    logger.log({**TRAIN_LOGS, "train/learning_round": 2.0, "actor/success": 0.5, **EVAL_LOGS})  # oat's final call
    logger.finish()
    assert len(mirror.logged) == 4 and mirror.finished
    run = load_run(tmp_path / "run")
    assert run.algo == "dppo_binary_tv" and run.seed == 42 and run.name == "sudoku-dppo"
    assert list(run.metrics["step"]) == [1, 2] and list(run.eval["step"]) == [0, 2]
    assert list(run.metrics["success"]) == [0.25, 0.5] and list(run.eval["eval/success"]) == [0.5, 0.5]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["engine"] == "oat"
