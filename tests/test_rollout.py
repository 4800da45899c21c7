"""Gem rollouts: real envs, a real tiny model and tokenizer, per-turn samples with μ log-probs."""

import math
import random
import warnings

import gem
import numpy as np
import pytest
import torch

import envs
from dppo_oat.advantages import discounted_returns
from dppo_oat.errors import RunError
from dppo_oat.models.scoring import teacher_forced_logprobs
from dppo_oat.models.tiny import build_tiny_policy
from dppo_oat.rollout.episodes import BROKEN_ENV_EPISODES, EpisodeCollector, turn_sampling
from dppo_oat.rollout.generation import Completion
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import RolloutSettings, SamplingSettings
from envs.contract import INVALID_ACTION
from envs.oracles import oracle_action
from envs.sudoku_compact import COMPACT_ENV_ID, compact_sudoku_observation

PAPER_TASKS = ("game:Sudoku-v0-easy", "rg:arc_1d", "rg:acre")


@pytest.fixture(scope="module")
def tiny_policy():
    texts = [compact_sudoku_observation(_reset(COMPACT_ENV_ID, s)) + " \\boxed{1 2 3}" for s in range(200)]
    texts += ["Question: what is 2+3? Please put your final answer within \\boxed{}."] * 20
    return build_tiny_policy(texts, seed=0, vocab_size=400)


def _reset(env_id, seed):
    env = gem.make(env_id)
    env.reset(seed=seed)
    return env.unwrapped


class ScriptedGenerator:
    """A stand-in *policy* (the envs are real): each prompt's action comes from ``act(prompt_text)``; its
    log-probs are fixed numbers, so the test can check where they end up."""

    max_topk = 4

    def __init__(self, tokenizer, act):
        self.tokenizer, self.act, self.calls = tokenizer, act, 0

    def generate(self, prompts, settings):
        self.calls += 1
        out = []
        for ids in prompts:
            text = self.act(self.tokenizer.decode(ids))
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            logprobs = [-0.5 - 0.01 * t for t in range(len(tokens))]
            out.append(Completion(token_ids=tokens, logprobs=logprobs, text=text, finish_reason="stop"))
        return out

    def update_weights(self, state_dict):
        pass


def oracle_for(collector):
    """Oracle action for a compact Sudoku prompt: find a slot whose board renders to that prompt."""
    def act(prompt):
        for env in collector.vec_env.envs:
            if hasattr(env.unwrapped, "board") and compact_sudoku_observation(env.unwrapped) == prompt:
                return oracle_action(env, random.Random(0))
        raise AssertionError(f"no env shows {prompt!r}")
    return act


def sudoku_collector(tokenizer, groups=2, group_size=3, **settings):
    return EpisodeCollector(
        [COMPACT_ENV_ID], groups, group_size, tokenizer, RolloutSettings(template="plain", **settings)
    )


def test_oracle_episodes_give_groups_returns_and_success(tiny_policy):
    _, tokenizer = tiny_policy
    collector = sudoku_collector(tokenizer)
    rollout = collector.collect(ScriptedGenerator(tokenizer, oracle_for(collector)), SamplingSettings(8), [11, 12])
    assert all(e.success and e.end_reason == "terminated" for e in rollout.episodes)
    assert [e.group_id for e in rollout.episodes] == [f"{COMPACT_ENV_ID}#11"] * 3 + [f"{COMPACT_ENV_ID}#12"] * 3
    for episode in rollout.episodes:
        turns = sorted((s for s in rollout.samples if s.episode_id == episode.episode_id), key=lambda s: s.turn)
        assert len(turns) == episode.turns >= 8  # 8-10 empty cells, one per turn
        assert sum(s.reward for s in turns) == pytest.approx(1.0)
        assert turns[-1].done and not any(s.done for s in turns[:-1])
        returns = discounted_returns([s.reward for s in turns], [s.episode_id for s in turns],
                                     [s.turn for s in turns], 0.9)
        expected = 0.0
        for sample, value in zip(reversed(turns), reversed(returns), strict=True):  # G_t = r_t + γ G_{t+1}
            expected = sample.reward + 0.9 * expected
            assert value == pytest.approx(expected, rel=1e-5)
        assert all(len(s.response_ids) == len(s.behavior_logprobs) > 0 for s in turns)
    assert rollout.stats()["success"] == 1.0


def test_unparseable_action_ends_with_the_env_penalty(tiny_policy):
    _, tokenizer = tiny_policy
    collector = sudoku_collector(tokenizer, groups=1, group_size=2)
    rollout = collector.collect(ScriptedGenerator(tokenizer, lambda _: "no idea"), SamplingSettings(8), [5])
    assert [s.reward for s in rollout.samples] == [-0.1, -0.1]
    assert all(s.done and s.turn == 0 for s in rollout.samples)
    assert all(not e.success and e.end_reason == "terminated" for e in rollout.episodes)


def test_wrong_but_parseable_moves_continue_until_truncation(tiny_policy):
    _, tokenizer = tiny_policy
    collector = sudoku_collector(tokenizer, groups=1, group_size=1)
    board = _reset(COMPACT_ENV_ID, 5).board
    filled = next((r, c) for r in range(4) for c in range(4) if board[r][c] != 0)
    move = f"\\boxed{{{filled[0] + 1} {filled[1] + 1} {board[filled[0]][filled[1]]}}}"  # a filled cell: invalid
    rollout = collector.collect(ScriptedGenerator(tokenizer, lambda _: move), SamplingSettings(8), [5])
    (episode,) = rollout.episodes
    assert episode.end_reason == "truncated" and episode.turns > 1 and episode.total_reward == 0
    assert rollout.samples[-1].truncated and not any(s.done for s in rollout.samples[:-1])


def test_turn_cap_and_prompt_too_long_are_counted(tiny_policy):
    _, tokenizer = tiny_policy
    capped = sudoku_collector(tokenizer, groups=1, group_size=2, max_turns=2)
    rollout = capped.collect(ScriptedGenerator(tokenizer, oracle_for(capped)), SamplingSettings(8), [3])
    assert [e.end_reason for e in rollout.episodes] == ["max_turns"] * 2
    assert all(e.turns == 2 for e in rollout.episodes) and rollout.samples[-1].truncated
    short = sudoku_collector(tokenizer, groups=1, group_size=2, max_prompt_tokens=3)
    generator = ScriptedGenerator(tokenizer, lambda _: "x")
    rollout = short.collect(generator, SamplingSettings(8), [3])
    assert rollout.samples == [] and generator.calls == 0
    assert [e.total_reward for e in rollout.episodes] == [-0.1, -0.1]
    assert rollout.stats()["end/prompt_too_long"] == 2.0


class ExplodingEnv(gem.Env):
    def __init__(self, **kwargs):
        super().__init__()

    def reset(self, seed=None):
        super().reset(seed)
        return "press the button", {}

    def step(self, action):
        raise RuntimeError("the env broke")


@pytest.mark.fault("an env whose `step()` raises",
                   "that episode ends with the format-error penalty and is counted (`end/env_error`); the others play "
                   "on")
def test_env_exception_ends_only_that_episode(tiny_policy):
    _, tokenizer = tiny_policy
    gem.register("test:Exploding-v0", entry_point=ExplodingEnv)
    collector = EpisodeCollector(
        ["test:Exploding-v0", COMPACT_ENV_ID], 2, 1, tokenizer, RolloutSettings(template="plain", max_turns=3)
    )
    sudoku = oracle_for(collector)

    def act(prompt):
        return "\\boxed{1 1 1}" if "button" in prompt else sudoku(prompt)

    with pytest.warns(UserWarning, match="env test:Exploding-v0: step"):
        rollout = collector.collect(ScriptedGenerator(tokenizer, act), SamplingSettings(8), [0, 1])
    broken, fine = rollout.episodes
    assert broken.end_reason == "env_error" and broken.total_reward == -0.1 and broken.turns == 1
    assert broken.error == "env test:Exploding-v0: step() raised RuntimeError: the env broke"
    assert fine.end_reason == "max_turns" and fine.turns == 3
    assert rollout.stats()["end/env_error"] == 1.0


@pytest.mark.fault("an env that keeps raising",
                   "its first exception is shown once, with the env's id")
def test_an_envs_first_exception_is_shown_with_its_id_once(tiny_policy):
    """An env that raises in step() is not a silent penalty (only a count in the metrics would say so)."""
    _, tokenizer = tiny_policy
    gem.register("test:ExplodingShown-v0", entry_point=ExplodingEnv)
    collector = EpisodeCollector(["test:ExplodingShown-v0", COMPACT_ENV_ID], 2, 1, tokenizer,
                                 RolloutSettings(template="plain", max_turns=2))
    sudoku = oracle_for(collector)

    def act(prompt):
        return "\\boxed{1 1 1}" if "button" in prompt else sudoku(prompt)

    with pytest.warns(UserWarning, match=r"env test:ExplodingShown-v0: step\(\) raised RuntimeError: the env broke"):
        collector.collect(ScriptedGenerator(tokenizer, act), SamplingSettings(8), [0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shown once per env, not at every episode
        collector.collect(ScriptedGenerator(tokenizer, act), SamplingSettings(8), [2, 3])


class SometimesExplodingEnv(ExplodingEnv):
    """Raises on odd seeds only."""

    def reset(self, seed=None):
        self.seed_ = seed
        return super().reset(seed)

    def step(self, action):
        if self.seed_ % 2:
            raise RuntimeError("the env broke")
        return "done", 1.0, True, False, {}


@pytest.mark.fault("32 episodes in a row that end in an env error",
                   "the run stops: `error: the last 32 episodes all ended in an env error; the first: env …` (exit 1)")
def test_episodes_that_all_err_in_a_row_stop_the_run_and_a_good_one_resets_the_count(tiny_policy):
    """An oat actor plays a few episodes a call (2 for Gem's Sudoku recipe): a call whose episodes all erred is bad
    luck; BROKEN_ENV_EPISODES in a row, over calls, is a broken env."""
    _, tokenizer = tiny_policy
    gem.register("test:Sometimes-v0", entry_point=SometimesExplodingEnv)
    collector = EpisodeCollector(["test:Sometimes-v0"], 2, 1, tokenizer, RolloutSettings(template="plain"))
    generator = ScriptedGenerator(tokenizer, lambda prompt: "go")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in range(BROKEN_ENV_EPISODES // 2 - 1):  # 30 errors in a row, then a good episode
            collector.collect(generator, SamplingSettings(8), [2 * call + 1, 2 * call + 3])
        collector.collect(generator, SamplingSettings(8), [1, 2])
        for _ in range(BROKEN_ENV_EPISODES // 2 - 1):
            collector.collect(generator, SamplingSettings(8), [1, 3])
        with pytest.raises(RunError, match=r"the last 32 episodes all ended in an env error; the first: "
                                           r"env test:Sometimes-v0: step\(\) raised RuntimeError: the env broke"):
            collector.collect(generator, SamplingSettings(8), [1, 3])


class NonFiniteRewardEnv(ExplodingEnv):
    def step(self, action):
        return "again", float("nan"), False, False, {}


@pytest.mark.fault("an env that returns a NaN or infinite reward",
                   "the run stops: `error: env … returned the reward nan (seed …, turn …): rewards must be finite "
                   "numbers` (exit 1), before it reaches an update")
def test_a_non_finite_reward_stops_the_run_naming_the_env(tiny_policy):
    """A NaN reward stops the run, naming the env (passed on, it would skip every update and the run would stop blaming
    the learning rate)."""
    _, tokenizer = tiny_policy
    gem.register("test:NaNReward-v0", entry_point=NonFiniteRewardEnv)
    collector = EpisodeCollector(["test:NaNReward-v0"], 1, 2, tokenizer, RolloutSettings(template="plain", max_turns=3))
    with pytest.raises(RunError, match=r"env test:NaNReward-v0 returned the reward nan \(seed 5, turn 0\): "
                                       r"rewards must be finite numbers"):
        collector.collect(ScriptedGenerator(tokenizer, lambda prompt: "go"), SamplingSettings(8), [5])


@pytest.mark.parametrize("env_id", [*PAPER_TASKS, "local-math"])
def test_tiny_model_rollouts_align_on_every_task(tiny_policy, env_id, tmp_path):
    model, tokenizer = tiny_policy
    if env_id == "local-math":
        path = tmp_path / "tiny_math.jsonl"
        path.write_text('{"problem": "What is 2+3?", "answer": "5"}\n{"problem": "What is 1+1?", "answer": "2"}\n')
        env_id = envs.register_math_dataset("local-math:test-tiny", str(path), overwrite=True)
    collector = EpisodeCollector(
        [env_id], 2, 2, tokenizer, RolloutSettings(template="qwen3_game", max_prompt_tokens=4096, max_turns=2)
    )
    sampling = SamplingSettings(max_new_tokens=6, top_k_logprobs=3, seed=0)
    rollout = collector.collect(HFGenerator(model, tokenizer, batch_size=8), sampling, [0, 1])
    assert len(rollout.episodes) == 4 and rollout.samples
    for sample in rollout.samples:
        t = len(sample.response_ids)
        assert len(sample.behavior_logprobs) == t and 1 <= t <= 6
        assert sample.topk_ids.shape == (t, 4) and sample.topk_logprobs.shape == (t, 4)
        assert all(math.isfinite(x) and x <= 0 for x in sample.behavior_logprobs)
        assert sample.prompt_ids and sample.env_id == env_id
    # μ of the first sample equals a teacher-forced forward of the same model
    sample = rollout.samples[0]
    reference = teacher_forced_logprobs(model, sample.prompt_ids, sample.response_ids)
    expected = reference.gather(-1, torch.tensor(sample.response_ids)[:, None])[:, 0]
    np.testing.assert_allclose(sample.behavior_logprobs, expected.numpy(), atol=1e-4)
    collector.close()


def test_a_seeded_rollout_draws_new_moves_after_a_wrong_one(tiny_policy):
    """Same board + same seed on every turn would replay the same wrong move forever: turns get their own seeds."""
    model, tokenizer = tiny_policy
    base = SamplingSettings(8, seed=3)
    seeds = [turn_sampling(base, turn).seed for turn in range(15)]
    assert len(set(seeds)) == 15 and seeds[0] == 3
    assert turn_sampling(SamplingSettings(8), 4).seed is None
    prompt = [tokenizer(compact_sudoku_observation(_reset(COMPACT_ENV_ID, 7)))["input_ids"]] * 16
    generator = HFGenerator(model, tokenizer)
    first, second = (generator.generate(prompt, turn_sampling(base, t)) for t in (0, 1))
    assert [c.token_ids for c in first] != [c.token_ids for c in second]


class CutGenerator(ScriptedGenerator):
    """Like ScriptedGenerator, but every response was cut at the length limit."""

    def generate(self, prompts, settings):
        return [Completion(c.token_ids, c.logprobs, c.text, "length") for c in super().generate(prompts, settings)]


def test_a_cut_response_reaches_the_env_as_an_invalid_action(tiny_policy):
    """A response cut at the length limit is no answer, even one that holds a complete move (Gem's convention)."""
    _, tokenizer = tiny_policy
    seen = []
    collector = sudoku_collector(tokenizer, groups=1, group_size=1)
    original_step = collector.vec_env.step
    collector.vec_env.step = lambda actions: seen.append(dict(actions)) or original_step(actions)
    solve = oracle_for(collector)
    rollout = collector.collect(CutGenerator(tokenizer, solve), SamplingSettings(8), [5])
    assert seen[0] == {0: INVALID_ACTION}
    assert rollout.episodes[0].turns == 1 and rollout.samples[0].reward == pytest.approx(-0.1)


def test_concat_wrapper_keeps_the_rules_in_every_prompt(tiny_policy):
    """Gem's Sudoku states its rules and answer format only at reset: with --wrappers concat every later prompt still
    has them (and the board, which the wrapper adds itself: once)."""
    _, tokenizer = tiny_policy
    prompts = []

    def wrong_move(prompt):
        prompts.append(prompt)
        return "\\boxed{1 1 1}"

    for wrappers in ((), ("concat",)):
        prompts.clear()
        collector = EpisodeCollector(["game:Sudoku-v0-easy"], 1, 1, tokenizer,
                                     RolloutSettings(template="qwen3_game", max_prompt_tokens=100_000,
                                                     max_turns=3, wrappers=wrappers))
        collector.collect(ScriptedGenerator(tokenizer, wrong_move), SamplingSettings(8), [3])
        assert len(prompts) == 3 and "Rules and Instructions" in prompts[0]
        assert all(p.count("Here is the current board layout") == 1 for p in prompts)
        assert all(("Rules and Instructions" in p) == bool(wrappers) for p in prompts[1:])


def test_unknown_wrappers_and_chat_wrappers_with_a_template_are_refused():
    with pytest.raises(ValueError, match="unknown Gem wrapper"):
        RolloutSettings(wrappers=("concatenate",))
    with pytest.raises(ValueError, match="prompt template plain"):
        RolloutSettings(template="qwen3_game", wrappers=("concat_chat",))


def test_prompts_start_with_bos_when_the_tokenizer_adds_one(tiny_policy):
    """Llama-family tokenizers add a BOS token; vLLM then sees it (and a chat template's BOS is not doubled)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from dppo_oat.rollout.episodes import adds_bos, prompt_token_ids

    _, plain = tiny_policy
    assert not adds_bos(plain) and prompt_token_ids(plain, "abc", with_bos=False) == plain("abc")["input_ids"]
    backend = plain.backend_tokenizer.__class__.from_str(plain.backend_tokenizer.to_str())
    backend.add_special_tokens(["<bos>"])
    bos_id = backend.token_to_id("<bos>")
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos_id)])
    llama_like = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token=plain.eos_token,
                                         pad_token=plain.pad_token)
    assert adds_bos(llama_like)
    ids = prompt_token_ids(llama_like, "abc", with_bos=True)
    assert ids[0] == bos_id and ids[1:] == llama_like("abc", add_special_tokens=False)["input_ids"]
    assert prompt_token_ids(llama_like, "<bos>abc", with_bos=True) == ids
    collector = EpisodeCollector([COMPACT_ENV_ID], 1, 1, llama_like, RolloutSettings(template="plain"))
    rollout = collector.collect(ScriptedGenerator(llama_like, lambda p: "\\boxed{1 2 3}"), SamplingSettings(8), [1])
    assert all(s.prompt_ids[0] == bos_id and s.prompt_ids[1] != bos_id for s in rollout.samples)


def test_prompts_are_tokenized_in_one_call_as_one_by_one(tiny_policy):
    from dppo_oat.rollout.episodes import prompt_token_ids, prompts_token_ids

    _, tokenizer = tiny_policy
    texts = ["Sudoku 4x4\n1 . 3 4\nMove:", "", "abc def", "Move:"]
    assert prompts_token_ids(tokenizer, texts, with_bos=False) == [prompt_token_ids(tokenizer, t, with_bos=False)
                                                                   for t in texts]
    assert prompts_token_ids(tokenizer, [], with_bos=False) == []


def test_a_rollout_encodes_each_distinct_prompt_once(tiny_policy, monkeypatch):
    """A group's members share their first board, and a wrong move leaves the board as it was: such a prompt is
    encoded once per rollout, and every sample still carries the ids that encoding it alone gives."""
    import dppo_oat.rollout.episodes as episodes

    _, tokenizer = tiny_policy
    encoded, encode = [], episodes.prompts_token_ids

    def counting(tok, texts, *, with_bos):
        encoded.extend(texts)
        return encode(tok, texts, with_bos=with_bos)

    monkeypatch.setattr(episodes, "prompts_token_ids", counting)
    collector = sudoku_collector(tokenizer, groups=2, group_size=3)
    wrong = ScriptedGenerator(tokenizer, lambda prompt: "\\boxed{9 9 9}")  # out of bounds: the board stays
    rollout = collector.collect(wrong, SamplingSettings(8), [11, 12])
    assert len(rollout.samples) == 6 * 15 and len(encoded) == len(set(encoded)) == 2
    for sample in rollout.samples:
        text = tokenizer.decode(sample.prompt_ids)
        assert sample.prompt_ids == encode(tokenizer, [text], with_bos=False)[0]
    collector.collect(wrong, SamplingSettings(8), [11, 12])  # a new rollout encodes again
    assert len(encoded) == 4
