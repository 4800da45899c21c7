"""The rollout schedule: the synchronous loop is the schedule with max_staleness 0, and it changes nothing.

The end-to-end test runs the local engine twice: once through :class:`RolloutSchedule` (k = 0), once with the
schedule replaced by the loop it took over (sample the step's rollout when the step asks for it, with the trainer's
own generator, seeds and sampling stream). Every metric but the timings, every token sample and every evaluation
must be the same bits. ``test_train.py`` covers k > 0 (its schedule, its checkpoint and its resume).
"""

import json

import pytest
from test_train import SHORT, TIMING_KEYS, read_jsonl

import dppo_oat.engines.local.trainer as trainer_module
from dppo_oat.engines.local.rollout_schedule import RolloutSchedule
from dppo_oat.engines.local.trainer import step_seed, train_group_seeds
from dppo_oat.train import main


def test_a_synchronous_schedule_collects_each_step_when_asked_and_keeps_nothing():
    calls = []

    def plan(step):
        calls.append(("plan", step))
        return lambda generator: calls.append(("collect", step, generator)) or f"rollout {step}"

    schedule = RolloutSchedule(0, plan, "the generator")
    for step in (1, 2, 3):
        rollout, sampled, waited = schedule.rollout(step, last_step=3)
        assert rollout == f"rollout {step}" and sampled == waited >= 0
        schedule.after_update(step, lambda: pytest.fail("a synchronous run keeps no weights"))
    assert calls == [entry for step in (1, 2, 3) for entry in (("plan", step), ("collect", step, "the generator"))]
    assert schedule.checkpoint_state(3) == {} and schedule.weight_versions == {} and schedule.pending is None
    schedule.restore({"step": 3}, current={})  # nothing to restore
    schedule.cancel()


def test_stale_rollouts_need_their_own_sampler_and_the_initial_weights():
    with pytest.raises(ValueError, match="sampler of their own"):
        RolloutSchedule(2, lambda step: None, "the generator")


def test_a_checkpoint_without_a_version_the_next_rollouts_sample_with_is_refused():
    schedule = RolloutSchedule(2, lambda step: None, "generator", stale_generator="sampler", initial_weights={})
    with pytest.raises(KeyError, match=r"version\(s\) \[3\]"):
        schedule.restore({"step": 5, "weight_versions": {4: {}}}, current={})  # steps 6 and 7 sample with 3 and 4


class LoopBeforeTheSchedule:
    """The synchronous loop as the trainer ran it before :class:`RolloutSchedule`: the step's rollout sampled when
    the step asks for it, with the trainer's generator, seeds and sampling stream; nothing else."""

    def __init__(self, trainer):
        self.trainer = trainer

    def rollout(self, step, last_step):
        c = self.trainer.config
        seeds = train_group_seeds(c.seed, step, c.groups_per_step, c.train_pool)
        sampling = self.trainer._sampling(step_seed(c.seed, step, 1))
        return self.trainer.collector.collect(self.trainer.generator, sampling, seeds), 0.0, 0.0

    def after_update(self, step, snapshot):
        pass

    def metrics(self, rollout, step, waited):
        return {}

    def wait(self):
        pass

    def cancel(self):
        pass

    def checkpoint_state(self, step):
        return {}

    def restore(self, state, current):
        pass


def test_the_synchronous_schedule_is_the_loop_it_replaced_bit_for_bit(tmp_path, monkeypatch):
    common = ["--runs-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache"), "--steps", "3",
              "--minibatches-per-rollout", "2", *SHORT]
    main(["--run-name", "schedule", *common])
    real_init = trainer_module.LocalTrainer.__init__

    def with_the_old_loop(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.rollouts = LoopBeforeTheSchedule(self)

    monkeypatch.setattr(trainer_module.LocalTrainer, "__init__", with_the_old_loop)
    main(["--run-name", "loop", *common])
    schedule, loop = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("schedule", "loop"))
    assert [row["step"] for row in schedule] == [1, 2, 3]
    for a, b in zip(schedule, loop, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(TIMING_KEYS)} == \
            {k: v for k, v in b.items() if not k.startswith(TIMING_KEYS)}
    for name in ("tokens.jsonl", "eval.jsonl"):
        assert read_jsonl(tmp_path / "schedule" / name) == read_jsonl(tmp_path / "loop" / name)
    assert json.loads((tmp_path / "schedule" / "config.json").read_text())["max_staleness"] == 0
