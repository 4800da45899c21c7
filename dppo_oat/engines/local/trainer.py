"""The local engine's RL loop, cleanrl-style: validate → build → (rollout → advantages → update → log)*.

Every rollout batch: play ``groups_per_step × group_size`` Gem episodes with the generator (μ), compute per-turn
advantages, run the core's :func:`~dppo_oat.learner.update.learn_from_rollout` with a plain torch optimizer, sync the
generator, log one line of ``metrics.jsonl``, checkpoint. Seeds of puzzles, sampling and minibatch order derive from
``(seed, step)``, so a resumed run continues exactly as an uninterrupted one would.

With ``--max-staleness k > 0`` the rollout of step ``t + 1`` is sampled in a background thread while step ``t``
updates, by a copy of the weights after step ``max(0, t − k)`` (:mod:`dppo_oat.rollout.background`); the last
``k + 1`` weights versions are kept (and checkpointed) so that the schedule never depends on timing. Both are one
object, :class:`~dppo_oat.engines.local.rollout_schedule.RolloutSchedule` (the synchronous loop is its k = 0).
"""

from __future__ import annotations

import copy
import math
import time
import uuid
from dataclasses import replace

import numpy as np
import torch
from rich.console import Console

from dppo_oat.advantages import RewardOverflow, sample_advantages
from dppo_oat.divergence.probe import divergence_estimates, probe_metrics, response_actions, response_logits
from dppo_oat.engines.local.calibration import TrainingCalibration, calibration_flags, calibration_record
from dppo_oat.engines.local.config import TrainConfig, logged_config, resolved_threads
from dppo_oat.engines.local.config_schema import CONFIG_SCHEMA, schema_migrations_of
from dppo_oat.engines.local.policy import load_or_build_tiny_policy, load_pretrained
from dppo_oat.engines.local.progress import StepProgress, line_console
from dppo_oat.engines.local.rollout_schedule import RolloutSchedule
from dppo_oat.engines.local.seeds import EVAL_SAMPLING_SEED, EVAL_SEED, step_seed, train_group_seeds
from dppo_oat.engines.local.validation import settings_free_on_resume, validate_config
from dppo_oat.errors import RunError
from dppo_oat.learner.autocast import (
    autocast,
    autocast_forward,
    loss_scaler,
    rollout_compute_dtype,
    use_shape_agnostic_attention,
)
from dppo_oat.learner.guard import ALL_SKIPPED, BlowUpGuard, every_step_skipped, skip_causes
from dppo_oat.learner.update import (
    clip_and_step,
    observe_before_update,
    policy_forward,
    scaled_clip_and_step,
    summarize_steps,
    update_policy,
)
from dppo_oat.rollout.episodes import EpisodeCollector, Rollout
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.rollout_copy import rollout_model, rollout_state_dict
from dppo_oat.run.directory import RunLock
from dppo_oat.run.log import RunLog, settings_hash
from dppo_oat.run.safe_io import atomic_torch_save, read_jsonl
from dppo_oat.run.token_export import TokenExporter, TokenObservers
from dppo_oat.run.token_samples import TokenSampler, decode_each
from dppo_oat.settings.spec import SamplingSettings, UpdateSettings
from dppo_oat.update_batch import build_update_batch
from envs import ensure_registered, unseeded_plugin_envs


def scheduled_lr(lr: float, schedule: str, step: int, steps: int) -> float:
    """The learning rate of RL step ``step`` (1-based) of ``steps``: ``lr``, or for ``linear`` ``lr`` decayed linearly
    to 0 (``lr · (steps − step + 1) / steps``: the full rate at step 1, ``lr / steps`` at the last)."""
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return lr * (steps - step + 1) / steps
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")


def perturb_logprobs(rollout: Rollout, sigma: float, seed: int) -> None:
    """Injected mismatch: log μ ← min(log μ + N(0, σ²), 0) on every reported token (documented knob), in the
    token's slot of the top-K set too, so binary and top-K rules see the same μ(a_t)."""
    rng = np.random.default_rng(seed)
    for sample in rollout.samples:
        noise = rng.normal(0.0, sigma, size=len(sample.behavior_logprobs))
        noisy = np.minimum(np.asarray(sample.behavior_logprobs) + noise, 0.0)
        sample.behavior_logprobs = noisy.tolist()
        if sample.topk_ids is not None:
            slot = sample.topk_ids == np.asarray(sample.response_ids)[:, None]
            sample.topk_logprobs = np.where(slot, noisy[:, None], sample.topk_logprobs)


PROMPT_TOO_LONG_SHARE = 0.1
"""The share of a step's episodes ended by a prompt longer than --max-prompt-tokens past which the run warns."""


class LocalTrainer:
    """One run of the local engine. ``run()`` trains; ``evaluate()`` measures held-out success."""

    def __init__(self, config: TrainConfig, console: Console | None = None):
        self.config, self.console = config, console or line_console()
        self.spec, self.resume_step = validate_config(config)  # every user error surfaces here, before any model
        self.run_dir = config.run_directory()  # this run's files (config.runs_dir is the folder of runs)
        self.lock = RunLock(self.run_dir)  # a second run writing the same directory is refused here
        if self.lock.removed:
            self.console.print(f"note: removed {len(self.lock.removed)} temporary file(s) of a killed or failed write "
                               f"({self.lock.removed[0].relative_to(self.lock.directory)} first)", soft_wrap=True)
        try:
            self._build(config)
        except BaseException:  # a failed start (a prompt too long, Ctrl-C) frees the directory and leaves no new one
            self.lock.release(unused=True)
            raise

    def _build(self, config: TrainConfig) -> None:
        """The policy, optimizer, generators, env collectors and run log, then the checkpoint when resuming."""
        self.tr = self.spec.trust_region
        threads, threads_line = resolved_threads(config.threads)
        torch.set_num_threads(threads)
        self.torch_threads = threads  # config.json records it with the process's provenance
        self.console.print(threads_line, soft_wrap=True, markup=False)
        torch.manual_seed(config.seed)
        for env_id in config.env_ids:  # a local-math:<path> id is registered now (validation imported the plugins)
            ensure_registered(env_id)
        self._warn_of_unseeded_envs()
        self.model, self.tokenizer = self._load_policy()
        self._check_topk_fits()
        self.model.to(config.device)  # fp32 master weights whatever --dtype (learner.autocast)
        use_shape_agnostic_attention(config.device)  # minibatches and decode steps differ in length
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                           fused=True if torch.device(config.device).type == "cuda" else None)
        self.scaler = loss_scaler(config.device, config.dtype)
        self.generator = self._make_generator()
        self.max_staleness = config.max_staleness
        # the background rollout tokenizes with a tokenizer of its own: a fast tokenizer is not safe to share
        rollout_tokenizer = copy.deepcopy(self.tokenizer) if self.max_staleness else self.tokenizer
        self.stale_generator = self._make_stale_generator(rollout_tokenizer) if self.max_staleness else None
        self.collector = EpisodeCollector(config.env_ids, config.groups_per_step, config.group_size,
                                          rollout_tokenizer, self.spec.rollout)
        self.eval_collector = EpisodeCollector(config.env_ids[:1], config.eval_episodes, 1, self.tokenizer,
                                               self.spec.eval_rollout)
        self.step = self.step_in_progress = self.checkpointed_step = 0
        self.guard = BlowUpGuard()
        self.token_rows: list[dict] = []  # the last RL step's tokens.jsonl sample
        self.exporter = TokenExporter(self.run_dir) if config.token_export == "all" else None
        self._noted_small_batch = self._warned_long_prompts = self._warned_all_skipped = False
        self._said_held_band = False
        self._check_prompts_fit()
        self._open_log()
        self.rollouts = RolloutSchedule(self.max_staleness, self._train_rollout_plan, self.generator,
                                        stale_generator=self.stale_generator, rollout_dtype=config.rollout_dtype,
                                        initial_weights=self._weights_snapshot() if self.max_staleness else None)
        if config.rollout_redraw:  # the first rollout's copy on a grid of its own too
            self._sync_generator()
        if self.resume_step is not None:
            self._load_checkpoint()

    def _warn_of_unseeded_envs(self) -> None:
        """A plugin env whose ``reset(seed)`` does not fix its episode (checked on the first training seeds): one
        warning line each (the run goes on; envs/contract.py's checks fail on it)."""
        c = self.config
        seeds = list(dict.fromkeys(train_group_seeds(c.seed, 1, c.groups_per_step, c.train_pool) + [EVAL_SEED]))
        for problem in unseeded_plugin_envs(c.env_ids, env_seed=self.spec.rollout.env_seed, seeds=seeds):
            self.console.print(f"warning: {problem}", soft_wrap=True, markup=False)

    def _open_log(self) -> None:
        """The run log, with the run's identity: a new run id, or the resumed run's (validation matched it with the
        checkpoint's); the checkpoint carries it and the hash of the settings it was trained under."""
        c, resuming = self.config, self.resume_step is not None
        stored = self.run_dir.read_config() if resuming else {}
        self.run_id = stored.get("run_id") or uuid.uuid4().hex
        written = {**logged_config(c, self.spec), "run_id": self.run_id}
        recorded = stored.get("calibration") if self.spec.calibration is not None else None
        if recorded is not None:  # the band it recorded (validation set the spec's trust region to it)
            written["calibration"] = recorded
        self.calibration = None if self.spec.calibration is None else TrainingCalibration(
            self.spec.calibration, self.tr, calibration_flags(c), self._say, recorded=recorded)
        if resuming:  # what the reader filled in an older config.json stays on record (validation migrated it)
            written.update(schema_migrations_of(stored, written))
        self.written = written
        self.settings_hash = settings_hash(written, settings_free_on_resume(self.spec))
        if resuming:
            self._warn_of_metrics_gap()
            self._warn_of_export_gap()
        elif c.overwrite:
            self._move_earlier_run_aside()
        self.log = RunLog(self.run_dir, written, resume_step=self.resume_step, wandb=c.wandb,
                          tensorboard=c.tensorboard, process={"torch_threads": self.torch_threads})

    def _warn_of_metrics_gap(self) -> None:
        """Say which checkpointed steps ``metrics.jsonl`` lacks (validation let them pass: --allow-metrics-gap)."""
        missing = self.run_dir.steps_missing_from_metrics(self.resume_step)
        if missing:
            self.console.print(f"warning: {self.run_dir.metrics} lacks {len(missing)} of the {self.resume_step} "
                               f"checkpointed steps (step {missing[0]} first): its curves will miss them",
                               soft_wrap=True)

    def _warn_of_export_gap(self) -> None:
        """With --token-export all, say which checkpointed steps have no export (trained before the flag was given):
        they cannot be exported again, their rollouts are gone."""
        if self.exporter is None:
            return
        missing = self.run_dir.steps_missing_from_exports(self.resume_step)
        if missing:
            self.console.print(f"warning: {self.run_dir.token_exports} lacks {len(missing)} of the "
                               f"{self.resume_step} checkpointed steps (step {missing[0]} first: trained without "
                               "--token-export all); the steps from here on are exported", soft_wrap=True)

    def _move_earlier_run_aside(self) -> None:
        """--overwrite: the earlier run's files go into a folder of their own, under this run's lock."""
        aside = self.run_dir.move_aside()
        if aside is not None:
            self.console.print(f"--overwrite: the earlier run's files are in {aside}", soft_wrap=True)

    # ------------------------------------------------------------------ building
    def _sampling(self, seed: int, *, evaluation: bool = False) -> SamplingSettings:
        return replace(self.spec.eval_sampling if evaluation else self.spec.sampling, seed=seed)

    def _load_policy(self):
        if self.config.pretrain is not None:
            return load_pretrained(self.config.pretrain)
        return load_or_build_tiny_policy(self.config, self.console, self.spec)

    def _make_generator(self):
        c = self.config
        if c.generator == "vllm":
            from dppo_oat.engines.local.vllm_sync import make_vllm_generator

            return make_vllm_generator(self.model, self.tokenizer, c)
        compute_dtype = rollout_compute_dtype(c.dtype, c.rollout_dtype)
        # a lower precision: training-inference mismatch; for the decode graphs, linear weights in the compute dtype
        rollout_policy = rollout_model(self.model, c.rollout_dtype, compute_dtype, c.cuda_graphs)
        generator = HFGenerator(rollout_policy, self.tokenizer, batch_size=max(64, c.episodes_per_step),
                                compute_dtype=compute_dtype, cuda_graphs=c.cuda_graphs)
        if not generator.runs_direct:
            self.console.print("note: the sampling loop cannot run this model's layers itself (its architecture or "
                               "transformers version); rollouts sample with model.generate, which is slower")
        return generator

    def _make_stale_generator(self, tokenizer) -> HFGenerator:
        """The background rollout's sampler: its own copy of the rollout model (never the learner's weights, which
        the update changes while it samples), loaded with an older weights version before every rollout."""
        c = self.config
        return HFGenerator(copy.deepcopy(self.generator.model), tokenizer, batch_size=max(64, c.episodes_per_step),
                           compute_dtype=rollout_compute_dtype(c.dtype, c.rollout_dtype), cuda_graphs=c.cuda_graphs)

    def _weights_snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of the learner's current weights (one weights version)."""
        return {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}

    def _sync_generator(self) -> None:
        """The rollout copy takes the learner's new weights, at its own precision, in place (the decode graphs of
        ``--cuda-graphs`` read them where they are)."""
        redraw = torch.Generator().manual_seed(step_seed(self.config.seed, self.step, 5)) \
            if self.config.rollout_redraw else None
        self.generator.update_weights(rollout_state_dict(self.model.state_dict(), self.config.rollout_dtype, redraw))

    def _check_topk_fits(self) -> None:
        """A top-K rule's K is at most the policy's vocabulary (validation knew only an upper bound of the tiny one)."""
        vocab = self.model.get_output_embeddings().weight.shape[0]
        k = self.spec.sampling.top_k_logprobs
        if k > vocab:
            raise ValueError(f"--tr-k {k} exceeds the policy's vocabulary ({vocab} tokens): "
                             f"give --tr-k {vocab} or less")

    def _check_prompts_fit(self) -> None:
        """Every env's first prompt fits in --max-prompt-tokens (else no episode could ever play a turn)."""
        limit = self.config.max_prompt_tokens
        for env_id, length in self.collector.first_prompt_lengths(seed=EVAL_SEED).items():
            if length > limit:
                raise ValueError(f"the first prompt of {env_id} has {length} tokens, more than --max-prompt-tokens "
                                 f"{limit}: raise --max-prompt-tokens")

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """Success and return on the held-out seeds, sampling at the training temperature."""
        self.rollouts.wait()  # never beside a background rollout: both may seed torch's global RNG
        seeds = [EVAL_SEED + i for i in range(self.config.eval_episodes)]
        sampling = self._sampling(EVAL_SAMPLING_SEED, evaluation=True)
        rollout = self.eval_collector.collect(self.generator, sampling, seeds)
        stats = rollout.stats()
        row = {"step": self.step, "eval/success": stats["success"], "eval/return": stats["episode_return"],
               "eval/episodes": stats["episodes"]}
        if self.generator.model is not self.model and self.config.generator == "hf":
            row["eval/learner_success"] = self._learner_success(seeds)
        return row

    def _learner_success(self, seeds: list[int]) -> float:
        """Held-out success of the learner's own weights (not its rollout copy), on the same seeds and sampling
        streams as ``eval/success``: whether the learner itself or only the rollout copy of a lower precision
        learned or lost the task."""
        c = self.config
        learner = HFGenerator(self.model, self.tokenizer, batch_size=max(64, c.episodes_per_step),
                              compute_dtype=c.dtype, cuda_graphs=False)
        rollout = self.eval_collector.collect(learner, self._sampling(EVAL_SAMPLING_SEED, evaluation=True), seeds)
        return rollout.stats()["success"]

    # ------------------------------------------------------------------ one RL step
    def rl_step(self) -> dict[str, float]:
        """Rollout → advantages → update → generator sync, for step ``self.step + 1``."""
        c, step = self.config, self.step + 1
        rollout, rollout_seconds, waited_seconds = self.rollouts.rollout(step, c.steps)
        if c.logprob_noise > 0:
            perturb_logprobs(rollout, c.logprob_noise, step_seed(c.seed, step, 2))
        stats = rollout.stats()
        if not rollout.samples:
            raise RunError(f"step {step}: no episode produced a turn (every prompt longer than "
                           f"--max-prompt-tokens {c.max_prompt_tokens}?)")
        samples = rollout.samples
        try:
            advantages = sample_advantages(samples, self.spec.advantages)
        except RewardOverflow as error:
            raise RewardOverflow(f"step {step}: {error}") from None
        batch = build_update_batch(samples, advantages, self.tokenizer.pad_token_id,
                                   with_topk=self.tr.uses_topk).to(c.device)
        probing = c.probe_every > 0 and step % c.probe_every == 0
        behavior_logits = None
        if probing:
            with self.generator.autocast():
                behavior_logits = response_logits(self.generator.model, batch,
                                                  temperature=self.spec.sampling.temperature)
        update_started = time.perf_counter()
        for group in self.optimizer.param_groups:  # from the step alone: a resumed run gets the same rates
            group["lr"] = scheduled_lr(c.lr, c.lr_schedule, step, c.steps)
        self.model.train()
        sampler = TokenSampler(c.token_samples, seed=step_seed(c.seed, step, 4))
        history, band = self._update(step, batch, sampler)
        self.token_rows = sampler.rows(step, decode_each(self.tokenizer), [sample.turn for sample in samples])
        if self.exporter is not None:
            self.exporter.write(step, [sample.turn for sample in samples], [sample.env_id for sample in samples])
        self.model.eval()
        if self.generator.model is not self.model:
            self._sync_generator()
        self.rollouts.after_update(step, self._weights_snapshot)
        update_seconds = time.perf_counter() - update_started
        self.step = step
        metrics = self._step_metrics(stats, history, batch, rollout_seconds, update_seconds)
        metrics.update(self.rollouts.metrics(rollout, step, waited_seconds))
        metrics.update(band)
        if probing:
            metrics.update(self._probe(batch, behavior_logits))
        return metrics

    def _update(self, step: int, batch, sampler: TokenSampler) -> tuple[list[dict[str, float]], dict[str, float]]:
        """Step ``step``'s optimizer steps on its rollout batch, at the band calibration sets (``--tr-calibrate``)
        before the update, or after it from the update's own loss calls; their metrics and the held band's."""
        c, settings = self.config, self._update_settings_for(len(batch))
        forward = policy_forward(self.model, settings, precision=lambda f: autocast_forward(f, c.device, c.dtype))
        shuffle = torch.Generator().manual_seed(step_seed(c.seed, step, 3))
        started = time.perf_counter()
        batch, band = self._calibrate_before(step, batch, forward, settings, shuffle)
        calibration_seconds = time.perf_counter() - started
        observers = [o for o in (self.exporter, self.calibration and self.calibration.collector) if o is not None]
        history = update_policy(batch, self.tr, forward, self._backward, self._optimizer_step, settings,
                                generator=shuffle, discard_step=self._discard_step, guard=self.guard,
                                token_sampler=TokenObservers(sampler, *observers) if observers else sampler)
        if self.calibration is not None:
            started = time.perf_counter()
            self._use_band(self.calibration.after_update(step))
            if band:  # a held band: what setting it costs each step
                band["time/calibration"] = calibration_seconds + time.perf_counter() - started
        return history, band

    def _calibrate_before(self, step: int, batch, forward, settings, shuffle) -> tuple[object, dict[str, float]]:
        """The band set on the step's loss calls at the weights before its update, where calibration sets one
        there (:meth:`TrainingCalibration.before_update`); the batch (with π_θ' where the pass recomputed it) and
        the held band's metrics."""
        if self.calibration is None:
            return batch, {}
        observed = [batch]

        def observe(calls) -> None:
            observed[0] = observe_before_update(batch, self.tr, forward, settings, calls, generator=shuffle)

        self._use_band(self.calibration.before_update(step, observe))
        return observed[0], self.calibration.metrics()

    def _use_band(self, report) -> None:
        """Train with the band calibration set (``report``; None: it set none). A band set once is recorded in
        config.json (with the settings hash the next checkpoints carry); a held one is logged at every step
        (``band/*``), and its first setting is said."""
        if report is None:
            return
        tr = self.calibration.trust_region
        self.tr, self.spec = tr, replace(self.spec, trust_region=tr)
        if self.calibration.holds:
            if not self._said_held_band:
                self._said_held_band = True
                self._say(f"calibrated {report.line()}; set again every {self.calibration.held.every} step(s) "
                          "(band/* in metrics.jsonl)")
            return
        record = calibration_record(report, self.calibration.held.set_on)
        changes = {"trust_region": logged_config(self.config, self.spec)["trust_region"], "calibration": record}
        self.written.update(changes)
        self.settings_hash = settings_hash(self.written, settings_free_on_resume(self.spec))
        self.log.update_config(changes)
        self._say(f"calibrated {report.line()}")

    def _say(self, line: str) -> None:
        self.console.print(line, soft_wrap=True, markup=False)

    # ------------------------------------------------------------------ the rollouts (RolloutSchedule)
    def _train_rollout_plan(self, step: int):
        """Step ``step``'s training rollout, its env seeds and sampling stream fixed now: ``collect(generator)``."""
        c = self.config
        seeds = train_group_seeds(c.seed, step, c.groups_per_step, c.train_pool)
        sampling = self._sampling(step_seed(c.seed, step, 1))
        return lambda generator: self.collector.collect(generator, sampling, seeds)

    def _update_settings_for(self, rows: int) -> UpdateSettings:
        """The update settings of a rollout batch of ``rows`` turn samples (--minibatches-per-rollout)."""
        parts = self.config.minibatches_per_rollout
        if parts is None:
            self._note_small_batch(rows)
            return self.spec.update
        return replace(self.spec.update, minibatch_size=max(1, math.ceil(rows / parts)))

    def _note_small_batch(self, rows: int) -> None:
        """Say once when a whole rollout batch fits in one minibatch: every update is then fully on-policy."""
        if rows <= self.config.minibatch_size and not self._noted_small_batch:
            self._noted_small_batch = True
            self.console.print(f"note: step {self.step + 1} has {rows} turn samples ≤ --minibatch-size "
                               f"{self.config.minibatch_size}: one optimizer step per rollout batch", soft_wrap=True)

    def _probe(self, batch, behavior_logits) -> dict[str, float]:
        """Binary vs top-K vs exact divergence between μ (the rollout model before the step) and the updated π."""
        # every TrustRegion has a K and a δ: rules that use neither keep the defaults (K = 20, δ = 0.15)
        with autocast(self.config.device, self.config.dtype):
            logits = response_logits(self.model, batch, temperature=self.spec.update.temperature)
        estimates = divergence_estimates(behavior_logits, logits, response_actions(batch), self.tr.k)
        return probe_metrics(estimates, self.tr.delta)

    def _backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def _optimizer_step(self) -> dict[str, float]:
        parameters = list(self.model.parameters())
        if self.scaler is None:
            return clip_and_step(parameters, self.optimizer, self.config.grad_clip)
        return scaled_clip_and_step(parameters, self.optimizer, self.scaler, self.config.grad_clip)

    def _discard_step(self) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        return {}

    def _step_metrics(self, stats, history, batch, rollout_seconds, update_seconds) -> dict[str, float]:
        trained_tokens = float(batch.attention_mask.sum()) * self.config.num_epochs
        metrics = {"step": self.step, "reward": stats["episode_return"], "success": stats["success"]}
        metrics.update({f"rollout/{k}": v for k, v in stats.items()})
        metrics["response_length"] = stats["response_length"]
        metrics.update(summarize_steps(history))
        metrics[ALL_SKIPPED] = float(every_step_skipped(history))
        metrics.update({
            "optimizer_steps": float(len(history)),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "time/rollout": rollout_seconds,
            "time/update": update_seconds,
            "tokens_per_s/rollout": stats["generated_tokens"] / max(rollout_seconds, 1e-9),
            "tokens_per_s/update": trained_tokens / max(update_seconds, 1e-9),
        })
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        weights = self.model.state_dict()
        state = {"step": self.step, "model": weights, "optimizer": self.optimizer.state_dict(),
                 "run_id": self.run_id, "settings_hash": self.settings_hash, "config_schema": CONFIG_SCHEMA}
        if self.scaler is not None:  # float16's loss scale: a resumed run continues from it
            state["loss_scaler"] = self.scaler.state_dict()
        state.update(self.rollouts.checkpoint_state(self.step))  # stale rollouts: the older weights they sample with
        if self.calibration is not None and self.calibration.holds:  # the band the next step trains with
            state["held_band"] = self.calibration.state_dict()
        atomic_torch_save(state, self.run_dir.checkpoint, weights=weights)
        self.checkpointed_step = self.step

    def _load_checkpoint(self) -> None:
        path = self.run_dir.checkpoint
        try:
            state = torch.load(path, map_location=self.config.device, weights_only=True)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None:
                self.scaler.load_state_dict(state["loss_scaler"])
            self.rollouts.restore(state, self._weights_snapshot())
            if self.calibration is not None and self.calibration.holds:
                self.calibration.load_state_dict(state["held_band"])
                self.tr = self.calibration.trust_region
                self.spec = replace(self.spec, trust_region=self.tr)
        except (RuntimeError, KeyError, ValueError, EOFError, OSError) as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"--resume: {path} does not load into this run's policy ({first_line}): restore the "
                             "file, or start a new run with another --run-name") from None
        self.step = self.checkpointed_step = int(state["step"])
        if self.generator.model is not self.model:
            self._sync_generator()
        self.console.print(f"resumed {self.run_dir} at step {self.step}")

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, float]:
        """Train until ``config.steps``; returns the held-out success before and after RL."""
        c = self.config
        self._evaluate_if_missing()  # before RL; or the evaluation that a kill after the last checkpoint cut short
        with StepProgress(self.console, c.steps, completed=self.step) as progress:
            while self.step < c.steps:
                self.step_in_progress = self.step + 1
                metrics = self.rl_step()
                self.log.log_tokens(self.token_rows)
                self._warn_of_long_prompts(metrics)
                self._warn_of_skipped_updates(metrics)
                self.log.log_metrics(metrics)  # logs first, then the checkpoint: a resume rewrites this step
                if self.exporter is not None:  # and its export: a step is checkpointed once its export is on disk
                    self.exporter.wait()
                self.save_checkpoint()
                if self._eval_due(self.step):
                    self.log.log_eval(self.evaluate())
                progress.update(self.step, description=(
                    f"RL steps: success {metrics['success']:.2f}, |π−μ| {metrics['mismatch/abs_diff_mean']:.4f}, "
                    f"masked {metrics['mask/fraction']:.3f}"))
        return self._summary()

    def _warn_of_long_prompts(self, metrics: dict[str, float]) -> None:
        """Say once when more than :data:`PROMPT_TOO_LONG_SHARE` of a step's episodes (and at least two) ended
        because a later turn's prompt outgrew --max-prompt-tokens (``rollout/end/prompt_too_long``): those episodes
        stop after the turns that fit, which the reward alone does not show."""
        ended, episodes = metrics["rollout/end/prompt_too_long"], metrics["rollout/episodes"]
        if self._warned_long_prompts or ended < 2 or ended <= PROMPT_TOO_LONG_SHARE * episodes:
            return
        self._warned_long_prompts = True
        self.console.print(f"warning: step {self.step}: {ended:.0f} of {episodes:.0f} episodes ended when a later "
                           f"turn's prompt outgrew --max-prompt-tokens {self.config.max_prompt_tokens} (metric "
                           "rollout/end/prompt_too_long): raise --max-prompt-tokens, or keep the env's observations "
                           "shorter", soft_wrap=True, markup=False)

    def _warn_of_skipped_updates(self, metrics: dict[str, float]) -> None:
        """Say (once) when the blow-up guard skipped every optimizer step of a step (:data:`ALL_SKIPPED`): the run goes
        on, as a transient blow-up recovers, but that step taught the policy nothing."""
        if not metrics[ALL_SKIPPED] or self._warned_all_skipped:
            return
        self._warned_all_skipped = True
        causes = " and ".join(skip_causes(metrics))
        self.console.print(f"warning: step {self.step}: the guard skipped every optimizer step ({causes} non-finite): "
                           f"nothing was learned from it (metric {ALL_SKIPPED}; said once): lower --lr or the trust "
                           "region's penalties (--tr-*)", soft_wrap=True, markup=False)

    def _eval_due(self, step: int) -> bool:
        return step == 0 or step % self.config.eval_every == 0 or step == self.config.steps

    def _evaluate_if_missing(self) -> None:
        evaluated = {row["step"] for row in read_jsonl(self.run_dir.eval)}
        if self._eval_due(self.step) and self.step not in evaluated:
            result = self.evaluate()
            self.log.log_eval(result)
            if self.step == 0:
                self.console.print(f"held-out success before RL: {result['eval/success']:.3f}")

    def _summary(self) -> dict[str, float]:
        evals = read_jsonl(self.run_dir.eval)
        before = evals[0]["eval/success"] if evals else float("nan")
        after = evals[-1]["eval/success"] if evals else float("nan")
        self.console.print(f"held-out success: before RL {before:.3f} → after {self.step} RL steps {after:.3f} "
                           f"({self.config.eval_episodes} episodes; run in {self.run_dir})")
        self.close()
        return {"success_before": before, "success_after": after, "steps": self.step}

    def close(self, *, failed: bool = False) -> None:
        """Release the log's mirrors, the envs (graders) and the run directory; safe to call twice and after a
        failure. A new run that ``failed`` before its first checkpoint leaves no run directory behind."""
        if self.lock.released:
            return
        unused = failed and self.checkpointed_step == 0 and self.resume_step is None
        try:
            self.rollouts.cancel()
            if self.exporter is not None:
                self.exporter.close(wait=not failed)
            self.log.discard() if unused else self.log.close()
            self.collector.close()
            self.eval_collector.close()
        finally:
            self.lock.release(unused=unused)
