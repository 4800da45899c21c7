"""Gem episodes → per-turn samples with the behavior policy's log-probs.

A batch of ``num_groups × group_size`` environment slots is stepped in lock-step through a ``gem.make_vec`` vector
env: every turn, the observations of the running episodes are rendered into prompts, one generator call samples all
actions, and each action's tokens become a :class:`~dppo_oat.update_batch.TurnSample` with μ's log-probs (and top-K
set). The ``group_size`` slots of a group start from the same seed, so they form a GRPO group. Single-turn tasks are
one-turn episodes. A prompt longer than the context or an env exception ends that episode with Gem's format-error
penalty and is counted (an env's first exception is also shown, with its id, and :data:`BROKEN_ENV_EPISODES` errors in
a row stop the run: the env is broken, not the policy); a non-finite reward stops the run, naming the env. So does an
env that breaks Gem's contract (:class:`ContractCheckedEnv`: ``reset()`` returns ``(observation, info)``, ``step()``
five values) or whose ``reset()`` raises: a bug in the env's code, never counted as an episode
(:class:`BrokenEnvError`). An unparseable action is the env's own business (Gem games penalise and end the episode). A
response cut at the length limit is sent to the env as :data:`INVALID_ACTION`, as Gem's oat examples do: a cut answer
is not an answer, whatever it happens to contain.

Gem's observation wrappers (``RolloutSettings.wrappers``, e.g. ``concat``: the episode's history in every prompt)
are applied to every env; they render the observation themselves, so the board suffix of Gem games is added here
only without one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gem
import numpy as np
from gem.core import EnvWrapper
from gem.vector.vector_env import AutoresetMode

from dppo_oat.errors import RunError
from dppo_oat.rollout.generation import Completion, Generator
from dppo_oat.rollout.templates import template_renderer
from dppo_oat.settings.spec import DEFAULT_MAX_TURNS, FORMAT_ERROR_PENALTY, RolloutSettings, SamplingSettings
from dppo_oat.update_batch import TurnSample
from envs.contract import INVALID_ACTION, BrokenEnvError, checked_reset, checked_step, observation_text
from envs.plugins import env_label

BROKEN_ENV_EPISODES = 32
"""Consecutive episodes ending in an env error (over calls: an oat actor plays a few at a time) that mean the env is
broken, not unlucky: at a 10% error rate such a run happens once in 10^32 episodes."""

END_REASONS = ("terminated", "truncated", "max_turns", "prompt_too_long", "env_error")


@dataclass
class EpisodeRecord:
    """What happened in one episode (for success rates and failure counts)."""

    episode_id: int
    env_id: str
    group_id: str
    seed: int
    turns: int = 0
    total_reward: float = 0.0
    end_reason: str = ""
    success: bool = False
    error: str = ""
    """The env's exception, when ``end_reason`` is ``env_error``."""


@dataclass
class Rollout:
    samples: list[TurnSample]
    episodes: list[EpisodeRecord]

    def stats(self) -> dict[str, float]:
        """Episode and token statistics of this rollout (plain floats, for the metrics log)."""
        returns = np.array([e.total_reward for e in self.episodes], dtype=np.float64)
        lengths = np.array([len(s.response_ids) for s in self.samples], dtype=np.float64)
        stats = {
            "episodes": float(len(self.episodes)),
            "turn_samples": float(len(self.samples)),
            "episode_return": _mean(returns),
            "success": _mean([float(e.success) for e in self.episodes]),
            "turns_per_episode": _mean([e.turns for e in self.episodes]),
            "response_length": _mean(lengths),
            "response_truncated": _mean([float(s.finish_reason == "length") for s in self.samples]),
            "generated_tokens": float(lengths.sum()),
        }
        for reason in END_REASONS:
            stats[f"end/{reason}"] = float(sum(e.end_reason == reason for e in self.episodes))
        return stats


def _mean(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()) if values.size else 0.0


def wrapped_observation(observation: str, info: dict[str, Any]) -> str:
    """The observation as an observation wrapper rendered it (it has added the suffix already)."""
    return observation


def gem_wrappers(names: Sequence[str], tokenizer) -> list[Callable]:
    """Gem's wrapper constructors by name (``gem.wrappers.wrapper_factory``), quietly (Gem prints them)."""
    if not names:
        return []
    from gem.wrappers.wrapper_factory import get_wrapper_fns

    with contextlib.redirect_stdout(io.StringIO()):
        return get_wrapper_fns(",".join(names), tokenizer=tokenizer)


def renders_observation(wrapper: Callable) -> bool:
    """True for Gem's observation wrappers (``concat*``), which build the whole prompt text, suffix included."""
    from gem.wrappers.observation_wrapper import ObservationWrapper

    return isinstance(wrapper, functools.partial) and wrapper.func is ObservationWrapper


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer starts every encoding with its BOS token (Llama-family models do; Qwen's have none)."""
    if tokenizer.bos_token_id is None:
        return False
    encoded = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(encoded) and encoded[0] == tokenizer.bos_token_id


def prompt_token_ids(tokenizer, text: str, *, with_bos: bool) -> list[int]:
    """``text`` as prompt ids, led by the BOS token when ``with_bos`` (see :func:`adds_bos`). A BOS that a chat
    template already wrote is not doubled (oat's actor strips it the same way before vLLM adds its own)."""
    return prompts_token_ids(tokenizer, [text], with_bos=with_bos)[0]


def prompts_token_ids(tokenizer, texts: Sequence[str], *, with_bos: bool) -> list[list[int]]:
    """:func:`prompt_token_ids` of every text, in one call of the tokenizer (a fast tokenizer encodes the batch
    at once)."""
    bos = tokenizer.bos_token
    if with_bos and bos:
        texts = [text[len(bos):] if text.startswith(bos) else text for text in texts]
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    return [[tokenizer.bos_token_id, *ids] for ids in encoded] if with_bos else [list(ids) for ids in encoded]


def env_action(completion: Completion) -> str:
    """What the env receives: the response text, or :data:`INVALID_ACTION` for a response cut at the limit."""
    return INVALID_ACTION if completion.finish_reason == "length" else completion.text


def turn_sampling(sampling: SamplingSettings, turn: int) -> SamplingSettings:
    """The settings of turn ``turn``: a seeded rollout gets a different seed every turn. With one seed for every
    call, an episode whose board did not change (a wrong move) would draw the very same move again, forever."""
    if sampling.seed is None or turn == 0:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + 7919 * turn) % 2**31)


class ContractCheckedEnv(EnvWrapper):
    """Checks what the env it wraps (innermost, before any observation wrapper) returns from ``reset`` and
    ``step`` (:func:`checked_reset`, :func:`checked_step`)."""

    def __init__(self, env):
        super().__init__(env)
        self.label = env_label(getattr(env, "env_id", type(env.unwrapped).__name__))

    def reset(self, seed=None):
        return checked_reset(self.env, seed, self.label)

    def step(self, action):
        return checked_step(self.env, action, self.label)


class GuardedEnv(EnvWrapper):
    """Turns an exception inside ``step`` into the end of that episode with ``penalty`` (``info['env_error']``);
    a :class:`BrokenEnvError` is not an episode's end: it stops the run."""

    def __init__(self, env, penalty: float = FORMAT_ERROR_PENALTY):
        super().__init__(env)
        self.penalty = penalty

    def step(self, action):
        try:
            return self.env.step(action)
        except BrokenEnvError:
            raise
        except Exception as error:
            return "", self.penalty, True, False, {"env_error": f"{type(error).__name__}: {error}"}

    def reset(self, seed=None):
        return self.env.reset(seed=seed)


@dataclass
class _Slot:
    """A running episode in one vector-env slot."""

    record: EpisodeRecord
    prompt: str = ""
    samples: list[TurnSample] = field(default_factory=list)
    running: bool = True


class EpisodeCollector:
    """Plays ``num_groups × group_size`` episodes per call on a persistent ``gem.make_vec`` vector env.

    ``env_ids`` are assigned to groups round-robin, so a mixture of tasks (e.g. Sudoku and math) shares a batch.
    """

    def __init__(
        self,
        env_ids: Sequence[str],
        num_groups: int,
        group_size: int,
        tokenizer,
        settings: RolloutSettings = RolloutSettings(),
    ):
        if num_groups < 1 or group_size < 1:
            raise ValueError(f"num_groups and group_size must be >= 1, got {num_groups}, {group_size}")
        self.settings, self.tokenizer, self.group_size = settings, tokenizer, group_size
        wrappers = gem_wrappers(settings.wrappers, tokenizer)
        self.observation_fn = wrapped_observation if any(map(renders_observation, wrappers)) else observation_text
        self.render = template_renderer(settings.template, tokenizer)
        self.with_bos = adds_bos(tokenizer)
        self.slot_env_ids = [env_ids[g % len(env_ids)] for g in range(num_groups) for _ in range(group_size)]

        def guard(env):
            return GuardedEnv(env, settings.penalty)

        with contextlib.redirect_stdout(io.StringIO()):  # make_vec prints a banner
            self.vec_env = gem.make_vec(
                self.slot_env_ids,
                vec_kwargs=[{"seed": settings.env_seed} for _ in self.slot_env_ids],
                wrappers=[ContractCheckedEnv, *wrappers, guard],
            )
        # finished episodes are never stepped again (collect() resets every slot), and NEXT_STEP keeps the final
        # step's info (e.g. ``env_error``) instead of replacing it with a fresh reset's
        self.vec_env.autoreset_mode = AutoresetMode.NEXT_STEP
        self._next_episode_id = 0
        self._encoded: dict[str, list[int]] = {}  # prompt text -> token ids, within one rollout
        self._env_errors_shown: set[str] = set()  # env ids whose first step() exception was shown
        self._default_cap_shown: set[str] = set()  # env ids whose episodes reached the default turn cap
        self._errors_in_a_row, self._first_error_in_a_row = 0, ""  # the latest episodes ended by env errors

    @property
    def num_slots(self) -> int:
        return len(self.slot_env_ids)

    def collect(self, generator: Generator, sampling: SamplingSettings, group_seeds: Sequence[int]) -> Rollout:
        """Play one episode in every slot, group ``g`` starting from ``group_seeds[g]``."""
        if len(group_seeds) * self.group_size != self.num_slots:
            raise ValueError(f"need {self.num_slots // self.group_size} group seeds, got {len(group_seeds)}")
        slot_seeds = [int(seed) for seed in group_seeds for _ in range(self.group_size)]
        forget_prefixes = getattr(generator, "forget_prefixes", None)  # a generator caching prefixes across calls
        if forget_prefixes is not None:
            forget_prefixes()  # reuses them within this rollout only: it never depends on calls before it
        self._encoded = {}  # a fresh memo of prompt ids for every rollout
        observations, infos = self.vec_env.reset(seed=slot_seeds)
        slots = [self._new_slot(i, seed) for i, seed in enumerate(slot_seeds)]
        for i, slot in enumerate(slots):
            slot.prompt = self.render(self.observation_fn(observations[i], infos[i]))
        caps = [self.turn_cap(env) for env in self.vec_env.envs]  # after reset: an env may draw its limit there
        turn = 0
        while any(slot.running for slot in slots):
            self._stop_at_turn_caps(slots, caps, turn)
            if any(slot.running for slot in slots):
                self._play_turn(generator, sampling, slots, turn)
                turn += 1
        return self._finish(slots)

    def turn_cap(self, env) -> tuple[int, bool]:
        """``(cap, by_default)``: the turns an episode of ``env`` may play: ``--max-turns`` when given, else none
        beyond the env's own limit (its ``max_turns``: the env ends the episode), else :data:`DEFAULT_MAX_TURNS`
        (``by_default``: said when it binds)."""
        if self.settings.max_turns is not None:
            return self.settings.max_turns, False
        own = getattr(env.unwrapped, "max_turns", None)
        if isinstance(own, int) and not isinstance(own, bool) and own > 0:
            return max(own, DEFAULT_MAX_TURNS), False
        return DEFAULT_MAX_TURNS, True

    def first_prompt_lengths(self, seed: int) -> dict[str, int]:
        """The token count of each env's first prompt from reset ``seed`` (the longest over its slots)."""
        observations, infos = self.vec_env.reset(seed=[seed] * self.num_slots)
        lengths: dict[str, int] = {}
        for env_id, observation, info in zip(self.slot_env_ids, observations, infos, strict=True):
            length = len(self._tokenize(self.render(self.observation_fn(observation, info))))
            lengths[env_id] = max(length, lengths.get(env_id, 0))
        return lengths

    def _new_slot(self, index: int, seed: int) -> _Slot:
        env_id = self.slot_env_ids[index]
        record = EpisodeRecord(self._next_episode_id, env_id, group_id=f"{env_id}#{seed}", seed=seed)
        self._next_episode_id += 1
        return _Slot(record=record)

    def _play_turn(self, generator, sampling, slots: list[_Slot], turn: int) -> None:
        """One generator call for every running episode, then one vector-env step."""
        running = [i for i, slot in enumerate(slots) if slot.running]
        prompt_ids = dict(zip(running, self._prompts_ids([slots[i].prompt for i in running]), strict=True))
        for i in running:
            if len(prompt_ids[i]) > self.settings.max_prompt_tokens:
                self._end(slots[i], "prompt_too_long", penalty=self.settings.penalty)
        playable = [i for i in running if slots[i].running]
        if not playable:
            return
        completions = generator.generate([prompt_ids[i] for i in playable], turn_sampling(sampling, turn))
        actions = {i: env_action(completion) for i, completion in zip(playable, completions, strict=True)}
        observations, rewards, terminated, truncated, infos = self.vec_env.step(actions)
        for k, (i, completion) in enumerate(zip(playable, completions, strict=True)):
            step = (observations[k], float(rewards[k]), bool(terminated[k]), bool(truncated[k]), infos[k])
            self._record_turn(slots[i], prompt_ids[i], completion, step, turn)

    def _record_turn(self, slot: _Slot, prompt_ids, completion: Completion, step, turn: int) -> None:
        observation, reward, terminated, truncated, info = step
        record = slot.record
        if not math.isfinite(reward):
            raise RunError(f"env {record.env_id} returned the reward {reward} (seed {record.seed}, turn {turn}): "
                           "rewards must be finite numbers; fix the env's step()")
        slot.samples.append(
            TurnSample(
                prompt_ids=list(prompt_ids), response_ids=list(completion.token_ids),
                behavior_logprobs=list(completion.logprobs), reward=reward, done=terminated, truncated=truncated,
                turn=turn, env_id=record.env_id, episode_id=record.episode_id, group_id=record.group_id,
                finish_reason=completion.finish_reason, response_text=completion.text,
                topk_ids=completion.topk_ids, topk_logprobs=completion.topk_logprobs,
            )
        )
        record.turns += 1
        record.total_reward += reward
        if "env_error" in info:
            record.error = f"env {record.env_id}: step() raised {info['env_error']}"
            self._show_env_error(record)
            self._end(slot, "env_error")
        elif terminated or truncated:  # Gem games report both at their turn limit: that is a truncation
            self._end(slot, "truncated" if truncated else "terminated")
        else:
            slot.prompt = self.render(self.observation_fn(observation, info))

    def _check_env_not_broken(self, episodes: list[EpisodeRecord]) -> None:
        """Stop the run once :data:`BROKEN_ENV_EPISODES` episodes in a row, over calls, ended in an env error:
        training on nothing but penalties would hide a broken env behind a falling success rate."""
        for record in episodes:
            erred = record.end_reason == "env_error"
            self._errors_in_a_row = self._errors_in_a_row + 1 if erred else 0
            self._first_error_in_a_row = (self._first_error_in_a_row or record.error) if erred else ""
        if self._errors_in_a_row >= BROKEN_ENV_EPISODES:
            raise RunError(f"the last {self._errors_in_a_row} episodes all ended in an env error; the first: "
                           f"{self._first_error_in_a_row}: fix the env, or leave it out of the env ids")

    def _show_env_error(self, record: EpisodeRecord) -> None:
        """Warn once per env id: its episodes end with the penalty and are counted (``end/env_error``) from then on."""
        if record.env_id not in self._env_errors_shown:
            self._env_errors_shown.add(record.env_id)
            warnings.warn(f"{record.error}; its episodes end with the format-error penalty ({self.settings.penalty}) "
                          "and are counted in end/env_error", stacklevel=2)

    def _end(self, slot: _Slot, reason: str, penalty: float = 0.0) -> None:
        """End the episode; a penalty with no turn to carry it becomes the reward of its last turn, if any."""
        slot.running = False
        slot.record.end_reason = reason
        if penalty:
            slot.record.total_reward += penalty
            if slot.samples:
                slot.samples[-1].reward += penalty
        if slot.samples:
            slot.samples[-1].done = slot.samples[-1].done or reason in ("terminated", "env_error")
            slot.samples[-1].truncated = slot.samples[-1].truncated or reason in ("max_turns", "prompt_too_long")

    def _stop_at_turn_caps(self, slots: list[_Slot], caps: list[tuple[int, bool]], turn: int) -> None:
        """End the running episodes that played their turn cap (:meth:`turn_cap`); say once per env id when the
        default cap bound (its env has no limit of its own)."""
        for slot, (cap, by_default) in zip(slots, caps, strict=True):
            if not slot.running or turn < cap:
                continue
            self._end(slot, "max_turns")
            env_id = slot.record.env_id
            if by_default and env_id not in self._default_cap_shown:
                self._default_cap_shown.add(env_id)
                warnings.warn(f"env {env_id}: its episodes reached the turn cap {cap} (the env has no turn limit of "
                              "its own): they end there, counted in end/max_turns; --max-turns sets another cap",
                              stacklevel=3)

    def _prompts_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The prompt ids of ``texts``; a text already encoded in this rollout (a group's shared first board, a
        board that a move left as it was) is not encoded again. The lists are shared: read, never modified."""
        missing = list(dict.fromkeys(text for text in texts if text not in self._encoded))
        if missing:
            encoded = prompts_token_ids(self.tokenizer, missing, with_bos=self.with_bos)
            self._encoded.update(zip(missing, encoded, strict=True))
        return [self._encoded[text] for text in texts]

    def _tokenize(self, text: str) -> list[int]:
        return prompt_token_ids(self.tokenizer, text, with_bos=self.with_bos)

    def _finish(self, slots: list[_Slot]) -> Rollout:
        samples = [sample for slot in slots for sample in slot.samples]
        episodes = [slot.record for slot in slots]
        self._check_env_not_broken(episodes)
        for record in episodes:
            record.success = record.total_reward >= self.settings.success_threshold
        return Rollout(samples=samples, episodes=episodes)

    def close(self) -> None:
        for env in getattr(self.vec_env, "envs", []):
            try:
                env.close()
            except Exception:
                pass
