"""ActorStepPipeline: the oat engine's asynchronous actor steps, with a fake actor on a one-rank gloo group (no
launchpad, no vLLM): the schedule of weight versions, the order steps are played in, the lists each learner gets,
waiting for every step before the weights change, and abandoning the steps not taken."""

import threading
import time

import pytest

pytestmark = pytest.mark.oat
torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402  (after pytest.importorskip)

from dppo_oat.engines.oat.collector import (  # noqa: E402  (after pytest.importorskip)
    ActorStepPipeline,
    round_of_step,
    split_by_rank,
    step_version,
    steps_of_round,
)


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo group of this process alone (the default group, made here unless a test before made one)."""
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    if made:
        dist.destroy_process_group()


class FakeActor:
    """Plays a step as ``[(version, prompt), ...]``, one step at a time; a step waits for ``release`` when given."""

    def __init__(self, release: threading.Event | None = None) -> None:
        self.release, self.playing, self.log = release, 0, []
        self.lock = threading.Lock()

    def play(self, version, prompts, formatted_prompts, references):
        with self.lock:
            self.playing += 1
            assert self.playing == 1, "two steps played at once"
        if self.release is not None:
            assert self.release.wait(10)
        self.log.append((version, list(prompts)))
        with self.lock:
            self.playing -= 1
        return [(version, prompt) for prompt in prompts]


def pipeline_of(actor: FakeActor, group) -> ActorStepPipeline:
    return ActorStepPipeline(actor.play, lambda handle: handle, group)  # the handle is the samples themselves


def test_steps_rounds_and_versions_follow_the_local_engines_schedule():
    """Round t plays with the weights after round max(0, t − 1 − k); with 2 actor steps a round, steps 1-2 are
    round 1."""
    assert [round_of_step(s, 2) for s in range(1, 7)] == [1, 1, 2, 2, 3, 3]
    assert list(steps_of_round(3, 2)) == [5, 6]
    assert [step_version(s, 1, 0) for s in range(1, 5)] == [0, 1, 2, 3]  # synchronous
    assert [step_version(s, 1, 1) for s in range(1, 5)] == [0, 0, 1, 2]
    assert [step_version(s, 2, 2) for s in range(1, 9)] == [0, 0, 0, 0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="count from 1"):
        round_of_step(0, 1)


def test_samples_are_split_into_real_lists_per_rank():
    assert split_by_rank([1, 2, 3], [2, 0, 1]) == [[1, 2], [], [3]]
    with pytest.raises(ValueError, match="sent 2 samples for 3 prompts"):
        split_by_rank([1, 2], [2, 1])


def test_steps_play_in_order_one_at_a_time_and_carry_their_version(one_rank_group):
    actor = FakeActor()
    pipeline = pipeline_of(actor, one_rank_group)
    for step, version in ((1, 0), (2, 0), (3, 1)):
        pipeline.submit(step, version, [f"p{step}a", f"p{step}b"], ["", ""], ["", ""])
    assert pipeline.pending_steps() == [1, 2, 3]
    share, seconds = pipeline.take(1)
    assert share == [(0, "p1a"), (0, "p1b")] and seconds >= 0.0
    assert pipeline.take(2)[0] == [(0, "p2a"), (0, "p2b")]
    assert pipeline.take(3)[0] == [(1, "p3a"), (1, "p3b")]
    assert [version for version, _ in actor.log] == [0, 0, 1]
    pipeline.drop()


def test_take_refuses_a_step_out_of_order(one_rank_group):
    pipeline = pipeline_of(FakeActor(), one_rank_group)
    pipeline.submit(1, 0, ["a"], [""], [""])
    with pytest.raises(ValueError, match="actor step 2 is not the next one submitted"):
        pipeline.take(2)
    with pytest.raises(ValueError, match="submitted already"):
        pipeline.submit(1, 0, ["a"], [""], [""])
    pipeline.drop()


def test_wait_all_returns_only_once_every_step_is_played(one_rank_group):
    """The learner's broadcast follows wait_all: no step may still be playing then."""
    release = threading.Event()
    actor = FakeActor(release)
    pipeline = pipeline_of(actor, one_rank_group)
    pipeline.submit(1, 0, ["a"], [""], [""])
    pipeline.submit(2, 0, ["b"], [""], [""])
    waiter = threading.Thread(target=pipeline.wait_all)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and actor.log == []  # the steps are held: wait_all waits
    release.set()
    waiter.join(10)
    assert not waiter.is_alive() and len(actor.log) == 2 and actor.playing == 0
    assert pipeline.pending_steps() == [1, 2]  # played, still to be taken
    assert pipeline.take(1)[0] == [(0, "a")]
    pipeline.drop()


def test_a_failed_step_raises_where_it_is_waited_for(one_rank_group):
    def failing(version, prompts, formatted_prompts, references):
        raise RuntimeError("vLLM failed")

    pipeline = ActorStepPipeline(failing, lambda handle: handle, one_rank_group)
    pipeline.submit(1, 0, ["a"], [""], [""])
    with pytest.raises(RuntimeError, match="vLLM failed"):
        pipeline.wait_all()


def test_drop_cancels_the_queued_steps_and_waits_for_the_one_playing(one_rank_group):
    release = threading.Event()
    actor = FakeActor(release)
    pipeline = pipeline_of(actor, one_rank_group)
    for step in (1, 2, 3):
        pipeline.submit(step, 0, [str(step)], [""], [""])
    threading.Timer(0.2, release.set).start()
    pipeline.drop()
    assert pipeline.pending_steps() == [] and actor.playing == 0
    assert [prompts for _, prompts in actor.log] == [["1"]]  # step 1 was playing; 2 and 3 never started


def test_drop_after_a_failure_waits_for_nothing(one_rank_group):
    """After a learner failed another of its group may be gone: no collective, no wait for the step playing."""
    release = threading.Event()
    actor = FakeActor(release)
    pipeline = pipeline_of(actor, one_rank_group)
    pipeline.submit(1, 0, ["a"], [""], [""])
    pipeline.submit(2, 0, ["b"], [""], [""])
    pipeline.drop(collective=False)
    assert pipeline.pending_steps() == []
    release.set()


class FakeLoader:
    """oat's prompt loader of placeholders: ``batches`` batches of one prompt."""

    sampler = None

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        return iter([([f"p{i}"], [f"p{i}"], [""]) for i in range(self.batches)])


class ScheduledActor:
    """An actor whose step of round 2 plays only once the learners have begun learning round 1 (it must not wait for
    the round to be learned) and goes on after the learning is done; a broadcast that comes while it plays fails."""

    def __init__(self, update_interval: int) -> None:
        self.update_interval, self.weight_version, self.playing = update_interval, 0, False
        self.learning_round_1 = threading.Event()
        self.steps, self.versions_played = 0, []

    def play_step(self, version, prompts, formatted_prompts, references):
        assert version == self.weight_version, (version, self.weight_version)
        self.steps += 1
        self.versions_played.append(version)
        self.playing = True
        if self.steps > self.update_interval and self.weight_version == 0:  # round 2
            assert self.learning_round_1.wait(10), "round 2 waited for round 1's learning"
            time.sleep(0.3)  # still playing when round 1's learning is done: the broadcast must wait for it
        self.playing = False
        return [version for _ in prompts]


def stub_learner(max_staleness: int, rounds: int, update_interval: int, group):
    """A DPPOLearner with oat's machinery replaced by records: what each round learned, and its staleness."""
    from types import SimpleNamespace

    from dppo_oat.engines.oat.learner import DPPOLearner, sample_staleness

    learner = DPPOLearner.__new__(DPPOLearner)
    actor = ScheduledActor(update_interval)
    learner.args = SimpleNamespace(max_staleness=max_staleness, max_queries=10**9, buffer_clear_every=1,
                                   num_gpus_per_actor=1, num_prompt_epoch=1, checkpoint_every=0)
    learner.update_interval, learner.actors, learner._same_actor_group = update_interval, [actor], group
    learner.prompts_dataloader = FakeLoader(rounds * update_interval)
    learner.strategy = SimpleNamespace(get_rank=lambda: 0, is_group_rank_0=lambda: True)
    learner.collector = SimpleNamespace(ipc_client=SimpleNamespace(deserialize_ipc=lambda handle: handle),
                                        get_metrics=lambda seconds, data: {})
    learner.steps, learner.pi_beta_version, learner.prompt_consumed = 1, 0, 0
    learner.learning_rounds, learner.broadcast_rounds, learner.pi_buffer = 0, [], []
    learner.staleness = []
    learner.process_feedback_data = learner.pi_buffer.extend
    learner._pre_learning = learner._post_learning = lambda: None
    learner.eval_and_log = lambda info: None
    learner.get_current_query = lambda: 0

    def learn(learning_round):
        actor.learning_round_1.set()
        ages = sample_staleness(learner.pi_buffer, learner.learning_rounds, learner.broadcast_rounds)
        learner.staleness.append(ages["staleness/max"].item())
        learner.learning_rounds += 1
        return {"round": learning_round}

    def sync_params_to_actors():
        assert not actor.playing, "weights broadcast while the actor plays"
        learner.pi_beta_version += 1
        learner.broadcast_rounds.append(learner.learning_rounds)
        actor.weight_version = learner.pi_beta_version

    learner.learn, learner.sync_params_to_actors = learn, sync_params_to_actors
    return learner


@pytest.mark.parametrize(("max_staleness", "update_interval", "expected"), [
    (1, 1, [0, 1, 1, 1]),
    (1, 2, [0, 1, 1, 1]),
    (2, 1, [0, 1, 2, 2, 2]),
])
def test_the_learners_loop_plays_ahead_on_the_schedule(max_staleness, update_interval, expected, one_rank_group):
    """``train_ahead``: round r samples with the weights after round max(0, r − 1 − k), so train/staleness/max per
    round is [0, 1, …, k, k, …]; the actor plays round 2 while round 1 is learned, and no broadcast comes while it
    plays."""
    learner = stub_learner(max_staleness, len(expected), update_interval, one_rank_group)
    train_info = learner.train_ahead()
    assert learner.staleness == expected
    assert train_info == {"round": len(expected)} and learner.steps == len(expected) * update_interval + 1
    assert learner.prompt_consumed == len(expected) * update_interval


class Killed(Exception):
    """Stands for a kill right after a checkpoint was written."""


def test_a_resume_learns_the_steps_its_checkpoint_kept_and_hands_over_the_rest(one_rank_group):
    """A run with k = 1 checkpointed after round 2 (round 3's step played ahead, with round 1's weights) and stopped
    there; a new learner resumed from that checkpoint learns round 3 from the kept samples, hands round 4 to the
    actor with round 2's weights, and the staleness goes on as an uninterrupted run's: [0, 1] then [1, 1, 1]."""
    import copy

    first = stub_learner(1, 5, 1, one_rank_group)
    first.args.checkpoint_every = 2
    saved = {}

    def save_checkpoint(learning_round):
        saved.update(steps=first.steps, learning_rounds=first.learning_rounds, version=first.pi_beta_version,
                     broadcast_rounds=list(first.broadcast_rounds), played=copy.deepcopy(first.ahead.played_steps()))
        raise Killed

    first.save_checkpoint = save_checkpoint
    with pytest.raises(Killed):
        first.train_ahead()
    assert first.staleness == [0, 1] and [(p["step"], p["version"], p["samples"]) for p in saved["played"]] == [
        (3, 1, [1])]

    resumed = stub_learner(1, 5, 1, one_rank_group)
    resumed.steps, resumed.learning_rounds = saved["steps"] + 1, saved["learning_rounds"]  # as train() sets them
    resumed.pi_beta_version = resumed.actors[0].weight_version = saved["version"]
    resumed.broadcast_rounds = saved["broadcast_rounds"]
    train_info = resumed.train_ahead(saved["played"])
    assert resumed.staleness == [1, 1, 1] and train_info == {"round": 5}
    assert resumed.actors[0].versions_played == [2, 3], "rounds 4 and 5 only: round 3 came from the checkpoint"
    assert resumed.prompt_consumed == 3


def test_restore_refuses_once_steps_were_submitted(one_rank_group):
    pipeline = pipeline_of(FakeActor(), one_rank_group)
    pipeline.submit(1, 0, ["a"], [""], [""])
    with pytest.raises(ValueError, match="restore before submitting"):
        pipeline.restore([{"step": 2, "version": 0, "rank_lengths": [1], "samples": [(0, "b")], "seconds": 1.0}])
    pipeline.drop()


def two_learners_of_one_actor(rank: int, store: str, results: str) -> None:
    """One of two learners sharing an actor: each asks for its own prompts (rank 1 for none at step 2), rank 0 plays
    for both, each gets back the samples of its own prompts."""
    import json

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        pipeline = pipeline_of(FakeActor(), dist.group.WORLD)
        pipeline.submit(1, 0, [f"r{rank}a", f"r{rank}b"], ["", ""], ["", ""])
        pipeline.submit(2, 0, [f"r{rank}c"] if rank == 0 else [], [""] * (rank == 0), [""] * (rank == 0))
        shares = [pipeline.take(1)[0], pipeline.take(2)[0]]
        pipeline.wait_all()
        pipeline.drop()
        with open(f"{results}.{rank}", "w") as file:
            json.dump(shares, file)
    finally:
        dist.destroy_process_group()


def test_each_learner_of_an_actor_gets_the_samples_of_its_own_prompts(tmp_path):
    """Two ranks of one actor group: the actor's samples are cut by the prompts each rank asked for, and a rank that
    asked for none gets an empty list (oat's asynchronous collector scatters None there)."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(two_learners_of_one_actor, args=(str(tmp_path / "store"), str(tmp_path / "shares")), nprocs=2)
    shares = [json.loads((tmp_path / f"shares.{rank}").read_text()) for rank in (0, 1)]
    assert shares[0] == [[[0, "r0a"], [0, "r0b"]], [[0, "r0c"]]]
    assert shares[1] == [[[0, "r1a"], [0, "r1b"]], []]


@pytest.mark.parametrize(("handed", "left"), [(0, 3), (1, 2), (3, 0)])
def test_a_resumed_loop_reads_the_prompts_left_and_takes_the_checkpoints_random_states(handed, left, one_rank_group):
    """``prompt_batches`` from the step after those handed over, with the checkpoint's random states set, even when
    every prompt was handed over before the checkpoint (the rounds left are learned from the steps it kept)."""
    from dppo_oat.engines.oat.resume import random_states

    learner = stub_learner(1, 3, 1, one_rank_group)
    learner.shuffle_generator = torch.Generator().manual_seed(0)
    saved = torch.Generator().manual_seed(7)
    torch.randint(10, (3,), generator=saved)
    states = random_states(saved)
    assert [prompts for prompts, _, _ in learner.prompt_batches(handed, states)] == [[f"p{i}"] for i in
                                                                                     range(handed, 3)][:left]
    assert torch.equal(learner.shuffle_generator.get_state(), saved.get_state())
