"""DPPO's learner on oat: oat's ``PPOLearner`` whose learning step is the core's update loop.

oat's ``PPOLearner.learning_step`` clips the ratio against the recomputed π_θ' and multiplies by TIS (the paper's
MiniRL-TIS). :class:`DPPOLearner` replaces only that method: it converts oat's trajectory batch into the core's
:class:`~dppo_oat.update_batch.UpdateBatch` (μ = vLLM's ``action_logprobs``), runs the core's
:func:`~dppo_oat.learner.update.learn_from_rollout` (fp32 log-probs from
:func:`~dppo_oat.learner.forward.causal_lm_forward`) with oat's DeepSpeed strategy as backward and optimizer step,
and returns the core's metrics beside oat's usual names. Everything else (process topology, buffers, DeepSpeed
set-up, weight broadcast to vLLM, logging) is oat's; rank 0 also writes the run directory the notebooks read
(:mod:`~dppo_oat.engines.oat.run_dir`) into oat's ``save_path/<run>``, ``tokens.jsonl`` included (a sample of rank
0's share of each learning round's tokens, :mod:`~dppo_oat.run.token_samples`).

Overridden: ``_init`` (adds the run's spec, the dataset that carries advantages and top-K sets, and the run
directory), ``prepare_data`` (Gem episodes need no prompt set: placeholders, and held-out evaluation seeds of the
evaluation environments, the ``--env_module`` plugins' registered first), ``learning_step``, ``run`` (a diverged
run ends the program with one line; ``--max_staleness`` k > 0 lets the actors play up to k rounds ahead:
:meth:`DPPOLearner.train_ahead`) and ``sync_params_to_actors`` (tells the actors their weight version). Every step,
skip and stop of the update is agreed over the learners (an all-reduce MAX, :data:`~dppo_oat.learner.guard.AnyLearner`),
and after each learning round every learner's shard of the weights is checked finite before oat may save them or send
them to vLLM.
Group advantages are computed by the actor, over whole GRPO groups, before any sub-sampling; ``rebn`` returns are
normalised here, over every learner's batch (Gem's ``norm_return``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from oat.algorithms.ppo import PPOLearner
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from tqdm import tqdm

from dppo_oat.engines.oat.args import DPPOOatArgs, learners_normalise, logged_config, run_spec
from dppo_oat.engines.oat.collector import ActorStepPipeline, step_version, steps_of_round
from dppo_oat.engines.oat.data import DPPOTransitionDataset, update_batch_from_trajectory
from dppo_oat.engines.oat.lora import base_weights_restored, match_scheduler_to_groups
from dppo_oat.engines.oat.resume import (
    ResumePoint,
    checkpoint_failure,
    checkpoint_tag,
    commit_checkpoint,
    find_resume_point,
    learner_state,
    partial_path,
    prune_checkpoints,
    read_learner_state,
    remove_unfinished,
    restore_learner_state,
    set_random_states,
    write_learner_state,
    write_resume_record,
)
from dppo_oat.engines.oat.run_dir import RunDirectoryLogger
from dppo_oat.engines.oat.status import report_failure, report_finished, report_run_dir
from dppo_oat.errors import CheckpointFailed, TrainingBlewUp
from dppo_oat.learner.guard import (
    HEALTHY,
    LOSS_SCALE_SKIPS,
    SKIPPED,
    AnyLearner,
    BlowUpGuard,
    check_weights_finite,
    one_learner,
)
from dppo_oat.learner.update import EngineSteps, learn_from_rollout, summarize_steps
from dppo_oat.run.directory import RunDir
from dppo_oat.run.log import code_commit
from dppo_oat.run.token_export import TokenExporter, TokenObservers
from dppo_oat.run.token_samples import TokenSampler, decode_each
from dppo_oat.settings.spec import UpdateSettings, split_ids

MAX_KEYS = ("policy_grad_norm",)
"""Metrics summarised by their maximum over the optimizer steps of a learning step (the rest: mean)."""


class PlaceholderPrompts(Dataset):
    """oat's learner loop draws ``rollout_batch_size_per_device`` prompts per actor step; Gem envs make their own
    prompts, so these are empty. Its length (``max_train``) is the number of training samples, which sets oat's
    learning-rate schedule and its number of steps."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[str, str, str]:
        return "", "", ""


class EvalSeeds(Dataset):
    """Evaluation items ``(seed, seed, env_id)`` (oat's ``(formatted prompt, prompt, reference)`` slots): every env
    of ``eval_env_ids`` (default ``env_ids``) on ``num_eval_seeds`` seeds from ``eval_seed_start`` on, which training
    never draws. A local-math set is covered without repeats (seed s is problem s mod N): at most N seeds, and every
    problem once with ``num_eval_seeds`` 0."""

    def __init__(self, env_ids: Sequence[str], first_seed: int, num_seeds: int) -> None:
        self.items = [(str(seed), str(seed), env_id) for env_id in env_ids
                      for seed in range(first_seed, first_seed + eval_seed_count(env_id, num_seeds))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[str, str, str]:
        return self.items[index]


def eval_seed_count(env_id: str, requested: int) -> int:
    """How many seeds evaluate ``env_id``: ``requested``, capped at a local-math set's size (all of it for 0)."""
    from envs import ensure_registered, math_dataset_size

    size = math_dataset_size(ensure_registered(env_id))
    if size is None:
        if requested < 1:
            raise ValueError(f"--num_eval_seeds 0 means every problem of a data set; {env_id} has none: give a count")
        return requested
    return size if requested < 1 else min(requested, size)


def eval_seeds_of(args: DPPOOatArgs) -> EvalSeeds:
    return EvalSeeds(split_ids(args.eval_env_ids or args.env_ids), args.eval_seed_start, args.num_eval_seeds)


def global_batch_normalize(values: torch.Tensor, all_reduce_sum, eps: float = 1e-9) -> torch.Tensor:
    """ReBN over every learner's batch: ``(x − mean) / (std + eps)`` with the mean and std of all of them
    (``all_reduce_sum`` sums a float over the learners), as Gem's oat learner normalises returns."""
    values = values.float()
    count = all_reduce_sum(float(values.numel()))
    mean = all_reduce_sum(float(values.sum())) / count
    variance = max(all_reduce_sum(float((values**2).sum())) / count - mean**2, 0.0)
    return (values - mean) / (variance**0.5 + eps)


def check_whole_minibatches(num_samples: int, settings: UpdateSettings) -> None:
    """DeepSpeed steps the optimizer every ``grad_acc_step`` micro-batches: a partial minibatch would shift that
    boundary into the next minibatch (or the next learning round)."""
    if num_samples % settings.minibatch_size:
        raise ValueError(
            f"{num_samples} samples on this learner do not split into minibatches of {settings.minibatch_size} "
            "(train_batch_size / learners): make rollout_batch_size a multiple of train_batch_size"
        )


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the policy lives (oat's own code assumes ``torch.cuda.current_device()``)."""
    return next(model.parameters()).device


def local_shard(parameter: torch.Tensor) -> torch.Tensor:
    """The part of ``parameter`` this learner holds: under ZeRO-3 the valid elements of its partition
    (``ds_tensor``, padded up to a multiple of the world size with uninitialised memory, which may hold anything),
    else the parameter itself."""
    shard = getattr(parameter, "ds_tensor", None)
    if shard is None:
        return parameter
    size = shard.numel()
    rank = 0
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank(group=getattr(parameter, "ds_process_group", None))
    valid = max(0, min(size, int(parameter.ds_numel) - rank * size))
    return shard.reshape(-1).narrow(0, 0, valid)


def weight_shards(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter as this learner holds it (:func:`local_shard`)."""
    for name, parameter in model.named_parameters():
        yield name, local_shard(parameter)


def stop_program(error: TrainingBlewUp | CheckpointFailed, rank_0: bool, finish_logs) -> None:
    """End the whole launchpad program after a divergence or a failed checkpoint every learner agreed on: rank 0
    closes its logs and hands the reason to the launcher (which prints it as one line and exits 1); the checkpoints
    already written stay (each was checked finite before it was written)."""
    import launchpad as lp

    if rank_0:
        finish_logs()
        report_failure(f"training diverged: {error}" if isinstance(error, TrainingBlewUp) else str(error))
    lp.stop()


def stop_after_failure(error: Exception) -> None:
    """End the whole program after a learner raised (its traceback follows on stderr): the actors and the IPC server
    serve until launchpad stops them, so without this the launcher would wait for them forever. A learner that
    raised because the program was already stopping (Ctrl-C, SIGTERM: oat's IPC server is gone at once) reports
    nothing: the launcher's line is about the stop."""
    import launchpad as lp

    if not stop_requested():
        report_failure(f"a learner failed ({type(error).__name__}: {error}); its traceback is above")
    lp.stop()


def stop_requested() -> bool:
    """Whether launchpad was asked to stop this worker (its worker manager's stop event: a SIGTERM or Ctrl-C came)."""
    import launchpad as lp

    try:
        return lp.stop_event().is_set()
    except (RuntimeError, AttributeError):  # not in a launchpad worker
        return False


def sample_staleness(weight_versions: Sequence[int], rounds_trained: int,
                     broadcast_rounds: Sequence[int]) -> dict[str, torch.Tensor]:
    """How many weight versions old the actors' weights were when they sampled a learning round's batch, its mean
    and max (``staleness/mean``, ``staleness/max``): a weight version is the policy after one more learning round,
    the weights being trained hold ``rounds_trained`` of them, and a sample of the actor's weight version v (the
    broadcasts it had loaded, 0 for ``--pretrain``'s weights) was drawn from the policy after
    ``broadcast_rounds[v - 1]`` rounds. 0 for an on-policy round; up to n − 1 with ``--sync_params_every`` n (oat's
    ``--asynchronous`` prefetch would make it 1)."""
    rounds_of_version = [0, *broadcast_rounds]
    ages = torch.tensor([float(rounds_trained - rounds_of_version[int(v)]) for v in weight_versions])
    return {"staleness/mean": ages.mean(), "staleness/max": ages.max()}


def summarize_history(history: Sequence[dict], advantages: torch.Tensor) -> dict[str, torch.Tensor]:
    """The core's per-optimizer-step metrics as oat's learner infos (0-d tensors): every metric under ``dppo/``,
    plus oat's own names for the loss, entropy, gradient norm and advantages."""
    infos = {f"dppo/{key}": value for key, value in summarize_steps(history, MAX_KEYS).items()}
    infos["pg_loss"] = infos["dppo/loss"]
    infos["policy_grad_norm"] = infos.get("dppo/policy_grad_norm", float("nan"))
    if "dppo/entropy" in infos:
        infos["entropy"] = infos["dppo/entropy"]
    advantages = advantages.detach().float().cpu()
    infos.update(adv_mean=advantages.mean().item(), adv_min=advantages.min().item(), adv_max=advantages.max().item())
    return {key: torch.tensor(value) for key, value in infos.items()}


class DPPOLearner(PPOLearner):
    """oat's PPO learner with the paper's trust regions (every preset), anchored on vLLM's μ."""

    def _init(self, args: DPPOOatArgs, actors) -> None:
        super()._init(args, actors)
        match_scheduler_to_groups(self.scheduler)  # LoRA: DeepSpeed dropped oat's empty no-decay group
        self.dataset_builder = DPPOTransitionDataset
        self.spec = run_spec(args, self.strategy.grad_acc_step)
        self.trust_region, self.update_settings = self.spec.trust_region, self.spec.update
        self.shuffle_generator = torch.Generator().manual_seed(args.seed + self.strategy.get_rank())
        self.guard = BlowUpGuard()
        self.learning_rounds = 0
        self.broadcast_rounds: list[int] = []  # learning rounds in the weights of each broadcast, in order
        self.ahead: ActorStepPipeline | None = None  # --max_staleness: the actor steps handed over and not yet taken
        self.resume_point = find_resume_point(args.resume_dir, args.resume_tag) if args.resume_dir else None
        if self.resume_point is not None:
            self.save_path = self._continue_in(self.resume_point.run_dir)
        self.run_dir = RunDir(self.save_path)  # oat's save_path/<run>_<time>, or the resumed run's
        if self.strategy.is_rank_0():
            report_run_dir(self.run_dir)
            resumed_round = None if self.resume_point is None else self.resume_point.learning_round
            self._wandb = RunDirectoryLogger(self.run_dir, logged_config(args, self.spec), mirror=self._wandb,
                                             eval_n=args.eval_n, resume_round=resumed_round)
        self.exporter = (TokenExporter(self.run_dir) if args.token_export == "all" and self.strategy.is_rank_0()
                         else None)  # rank 0's share of each learning round, as tokens.jsonl

    def _continue_in(self, run_dir: Path) -> str:
        """A resumed run writes on in its own run directory: the one oat's ``_init`` just made for this start is
        removed (nothing was written to it yet), and so are the saves a kill cut short."""
        fresh = Path(self.save_path)
        if self.strategy.is_rank_0() and fresh.resolve() != run_dir.resolve():
            for folder in (fresh / "lora", fresh):
                with contextlib.suppress(OSError):
                    folder.rmdir()
        if self.strategy.is_rank_0():
            remove_unfinished(RunDir(run_dir).round_checkpoints)
        return str(run_dir)

    def run(self) -> None:
        """oat's ``LearnerBase.run`` (0.2.4), resumable (:meth:`train`); a divergence or a failed checkpoint (raised
        on every learner at once) ends the program with one line."""
        try:
            self._init(self.args, self.actors)
            self.train()
        except (TrainingBlewUp, CheckpointFailed) as error:
            stop_program(error, self.strategy.is_rank_0(), finish_logs=lambda: self._wandb and self._wandb.finish())
        except Exception as error:  # any other failure: the traceback above, one line from the launcher, no hang
            stop_after_failure(error)
            raise

    def train(self) -> None:
        """oat's loop over actor steps (``LearnerBase.run`` after ``_init``; tests/oat holds its source to oat 0.2.4's),
        started afresh or where a checkpoint left off (:meth:`resume`): collect a step's samples, learn every
        ``update_interval`` steps, broadcast, evaluate and log, then checkpoint every ``--checkpoint_every`` rounds
        (:meth:`train_in_lockstep`), or with the actors up to ``--max_staleness`` rounds ahead (:meth:`train_ahead`)."""
        self.start_time, self.actor_info, train_info = time.time(), {}, {}
        random_states, played = None, []
        if self.resume_point is None:
            self.steps = 0
            if not self.args.debug:
                self.eval_and_log({}, eval=True, save=False)
        else:
            random_states, played = self.resume(self.resume_point)
        steps_done = self.steps
        self.steps = steps_done + 1
        self.gradient_update_st = time.time()
        if self.args.max_staleness:
            train_info = self.train_ahead(played, random_states) or train_info
        else:
            train_info = self.train_in_lockstep(steps_done, random_states) or train_info
        self.eval_and_log(train_info, eval=True, save=True)
        if self.strategy.is_rank_0():
            self._wandb.finish() if self._wandb else None
            import launchpad as lp

            report_finished()
            lp.stop()

    def train_in_lockstep(self, steps_done: int, random_states: dict | None) -> dict:
        """oat's synchronous loop from actor step ``steps_done + 1`` on: each step's samples are played with the
        weights after the learning round before (``--max_staleness 0``); the last learning round's train info."""
        train_info, early_stop = {}, False
        for epoch, skip in self.remaining_epochs(steps_done):
            if random_states is not None and skip == 0:  # resumed at an epoch's start
                set_random_states(random_states, self.shuffle_generator)
                random_states = None
            batches = itertools.islice(iter(self.prompts_dataloader), skip, None)  # the iterator draws a seed
            if random_states is not None:  # resumed mid-epoch: the run being resumed drew it before its checkpoint
                set_random_states(random_states, self.shuffle_generator)
                random_states = None
            progress = tqdm(range(len(self.prompts_dataloader)), desc=f"Prompt epoch [{epoch + 1}/"
                            f"{self.args.num_prompt_epoch}]", disable=not self.strategy.is_rank_0())
            progress.update(skip)
            for processed_prompts, raw_prompts, refs in batches:
                if early_stop:
                    break
                train_info = self.actor_step(processed_prompts, raw_prompts, refs) or train_info
                progress.update()
                self.steps += 1
                early_stop = self.get_current_query() > self.args.max_queries
            self.prompt_epoch = epoch * getattr(self, "_prompt_n_repeat", 1) + 1
        return train_info

    def train_ahead(self, played: list[dict] = (), random_states: dict | None = None) -> dict:
        """The loop of ``--max_staleness k > 0`` (:mod:`~dppo_oat.engines.oat.collector`): rounds ``1 … k + 1`` are
        handed to the actors at once, with the initial weights; after round ``r`` is learned and the actors have
        played every step handed to them, its weights are broadcast (version ``r``) and round ``r + 1 + k``, whose
        schedule names version ``r``, is handed over. With k = 1 the actors play round ``r + 1`` while the learners
        train round ``r``. A resumed run (``played``: the steps its checkpoint kept, played and not yet learned;
        ``random_states``: the checkpoint's) hands over the rounds after those. Returns the last learning round's
        train info."""
        pipeline = ActorStepPipeline(self._play_on_actor, self.collector.ipc_client.deserialize_ipc,
                                     self._same_actor_group)
        pipeline.restore(list(played))
        handed = max([self.steps - 1, *pipeline.pending_steps()])  # actor steps handed over so far
        batches, train_info = self.prompt_batches(handed, random_states), {}
        self.ahead = pipeline
        try:
            next_round = handed // self.update_interval + 1
            for learning_round in range(next_round, self.learning_rounds + self.args.max_staleness + 2):
                self.hand_round_to_actors(pipeline, batches, learning_round)
            while pipeline.pending_steps():
                train_info = self.actor_step_ahead(pipeline, batches) or train_info
                self.steps += 1
                if self.get_current_query() > self.args.max_queries:
                    break
        except BaseException:
            pipeline.drop(collective=False)  # another learner may be gone: wait for nothing
            raise
        finally:
            self.ahead = None
        pipeline.drop()  # the steps handed over and not taken (--max_queries): nothing plays on
        return train_info

    def actor_step_ahead(self, pipeline: ActorStepPipeline, batches: Iterator) -> dict | None:
        """One actor step of :meth:`train_ahead`, played already or still playing: its samples, and when it ends a
        learning round, the round's learning, the broadcast once no actor step is in flight, evaluation and logs,
        and the next round handed to the actors. The round's train info, else None."""
        waited = time.time()
        feedback_data, seconds = pipeline.take(self.steps)
        self.actor_info = {**self.collector.get_metrics(seconds, feedback_data),
                           "actor/wait_time": time.time() - waited}
        learned = self.absorb_and_learn(feedback_data)
        if learned is None:
            return None
        learning_round, train_info = learned
        pipeline.wait_all()  # vLLM must not generate while its weights change
        self.sync_params_to_actors()
        if learning_round % self.args.buffer_clear_every == 0:
            self.pi_buffer.clear()
        self.eval_and_log(train_info)  # nothing in flight: an evaluation's generate calls are the actors' only ones
        if self.args.checkpoint_every and learning_round % self.args.checkpoint_every == 0:
            self.save_checkpoint(learning_round)  # with the steps played ahead, which no later weights change
        self.hand_round_to_actors(pipeline, batches, learning_round + 1 + self.args.max_staleness)
        return train_info

    def hand_round_to_actors(self, pipeline: ActorStepPipeline, batches: Iterator, learning_round: int) -> None:
        """Every actor step of ``learning_round`` handed to the actors, with the weight version the schedule names
        for it, which they hold (the broadcasts so far); fewer when the prompt loader runs out."""
        for step in steps_of_round(learning_round, self.update_interval):
            batch = next(batches, None)
            if batch is None:
                return
            version = step_version(step, self.update_interval, self.args.max_staleness)
            if version != self.pi_beta_version:
                raise RuntimeError(f"actor step {step} is scheduled on weight version {version}, the actors hold "
                                   f"version {self.pi_beta_version}")
            processed_prompts, raw_prompts, refs = batch
            pipeline.submit(step, version, raw_prompts, processed_prompts, refs)

    def prompt_batches(self, steps_done: int = 0, random_states: dict | None = None) -> Iterator:
        """oat's prompt loader, epoch after epoch, from actor step ``steps_done + 1`` on (``prompt_epoch`` counts
        those begun: the loop reads ahead). ``random_states`` (a resumed run's) are set where the run being resumed
        had them: after the iterator of the epoch it was in was made (that draws from torch's random state)."""
        for epoch, skip in self.remaining_epochs(steps_done):
            self.prompt_epoch = epoch * getattr(self, "_prompt_n_repeat", 1) + 1
            if random_states is not None and skip == 0:
                set_random_states(random_states, self.shuffle_generator)
                random_states = None
            batches = itertools.islice(iter(self.prompts_dataloader), skip, None)
            if random_states is not None:
                set_random_states(random_states, self.shuffle_generator)
                random_states = None
            yield from batches
        if random_states is not None:  # resumed with every prompt handed over already: the rounds left to learn
            set_random_states(random_states, self.shuffle_generator)

    def _play_on_actor(self, weight_version: int, prompts, formatted_prompts, references):
        """One actor step on this learner group's actor (oat's choice of actor, oat/collectors/base.py:105), waited
        for: the pipeline's worker calls it."""
        actor = self.actors[(self.strategy.get_rank() // self.args.num_gpus_per_actor) % len(self.actors)]
        return actor.play_step(weight_version, prompts, formatted_prompts, references)

    def remaining_epochs(self, steps_done: int) -> Iterator[tuple[int, int]]:
        """``(epoch, batches to skip)`` of oat's prompt loader from actor step ``steps_done + 1`` on (the prompts are
        placeholders: a skipped batch costs nothing)."""
        per_epoch = len(self.prompts_dataloader)
        for epoch in range(steps_done // per_epoch, self.args.num_prompt_epoch):
            if isinstance(self.prompts_dataloader.sampler, DistributedSampler):
                self.prompts_dataloader.sampler.set_epoch(epoch)
            yield epoch, (steps_done - epoch * per_epoch if epoch == steps_done // per_epoch else 0)

    def actor_step(self, processed_prompts, raw_prompts, refs) -> dict | None:
        """One actor step of oat's loop; its learning round's train info when the step ends one, else None."""
        feedback_data, self.actor_info = self.collector.collect_feedback(
            raw_prompts, processed_prompts, refs, self._same_actor_group)
        learned = self.absorb_and_learn(feedback_data)
        if learned is None:
            return None
        learning_round, train_info = learned
        if learning_round % self.args.sync_params_every == 0:
            self.sync_params_to_actors()
        if learning_round % self.args.buffer_clear_every == 0:
            self.pi_buffer.clear()
        self.eval_and_log(train_info)
        if self.args.checkpoint_every and learning_round % self.args.checkpoint_every == 0:
            self.save_checkpoint(learning_round)
        return train_info

    def absorb_and_learn(self, feedback_data: list) -> tuple[int, dict] | None:
        """An actor step's samples into the buffer (oat's ``process_feedback_data``, every learner together); when
        the step ends a learning round, that round's learning: ``(round, train info)``, else None."""
        torch.distributed.barrier()
        self.prompt_consumed += len(feedback_data)
        self.process_feedback_data(feedback_data)
        if self.steps % self.update_interval:
            return None
        learning_round = self.steps // self.update_interval
        self._pre_learning()
        train_info = self.learn(learning_round)
        self._post_learning()
        return learning_round, train_info

    def save_checkpoint(self, learning_round: int) -> None:
        """Round ``learning_round``'s resumable checkpoint (:mod:`~dppo_oat.engines.oat.resume`), by every learner:
        DeepSpeed's files and each learner's state into ``<tag>.partial``, renamed by rank 0 once every learner
        wrote its part; then only the newest ``--keep_checkpoints`` stay."""
        root, tag = self.run_dir.round_checkpoints, checkpoint_tag(learning_round)
        partial, rank_0 = partial_path(root, tag), self.strategy.is_rank_0()
        failure = None
        try:
            if rank_0:
                root.mkdir(exist_ok=True)
                shutil.rmtree(partial, ignore_errors=True)
            torch.distributed.barrier()
            self.model.model.save_checkpoint(str(root), tag=partial.name, save_latest=False)
            played = self.ahead.played_steps() if self.ahead is not None else []
            write_learner_state(partial, self.strategy.get_rank(), learner_state(self, played))
            if rank_0:
                write_resume_record(partial, self.resume_record(learning_round))
        except OSError as error:
            failure = error
        if self._any_learner(int(failure is not None)):
            raise CheckpointFailed(checkpoint_failure(root, tag, failure))
        if rank_0:
            commit_checkpoint(root, tag)
            prune_checkpoints(root, self.args.keep_checkpoints)
        torch.distributed.barrier()

    def resume_record(self, learning_round: int) -> dict:
        """``resume.json``: what the launcher checks before any model loads."""
        return {"learning_round": learning_round, "actor_steps": self.steps, "learners": self.strategy.world_size,
                "pi_beta_version": self.pi_beta_version, "code_commit": code_commit()}

    def resume(self, point: ResumePoint) -> tuple[dict, list[dict]]:
        """Load ``point``'s checkpoint on every learner (DeepSpeed's weights, optimizer and schedule, then each
        learner's state), send the weights to the actors and tell them where the run stopped: the actor steps behind
        them include those played ahead (``--max_staleness``), which the checkpoint kept. Returns the random states,
        for :meth:`train` to set once it has made the prompt loader's iterator (which draws from torch's random
        state, as it did at the start of the epoch in the run being resumed), and the steps played ahead."""
        self.strategy.load_ckpt(self.model.model, str(point.folder.parent), tag=point.folder.name)
        state = read_learner_state(point.folder, self.strategy.get_rank())
        restore_learner_state(self, state)
        self._broadcast_to_vllm()
        played_by_actors = max([self.steps, *(record["step"] for record in state.played_steps)])
        if self.strategy.is_group_rank_0():
            done = [actor.futures.resume_at(played_by_actors, self.pi_beta_version) for actor in self.actors]
            _ = [future.result() for future in done]
        torch.distributed.barrier()
        ahead = f", {len(state.played_steps)} played ahead" if state.played_steps else ""
        self.strategy.print(f"resumed {point.run_dir} at learning round {point.learning_round} "
                            f"(actor step {self.steps}{ahead})")
        return state.random_states, state.played_steps

    def _broadcast_to_vllm(self) -> None:
        """oat's broadcast; with LoRA, oat merges the adapters into the base weights, sends them and subtracts them
        again, which in bf16 does not give the base weights back: they are restored exactly afterwards."""
        with base_weights_restored(self.strategy._unwrap_model(self.model) if self.args.lora_rank > 0 else None):
            super()._broadcast_to_vllm()

    def sync_params_to_actors(self) -> None:
        """oat's weight broadcast; remembers how many learning rounds the broadcast weights hold and tells the actors
        their weight version, oat's count of broadcasts (:func:`sample_staleness`)."""
        super().sync_params_to_actors()
        self.broadcast_rounds.append(self.learning_rounds)
        if self.strategy.is_group_rank_0():
            done = [actor.futures.set_weight_version(self.pi_beta_version) for actor in self.actors]
            _ = [future.result() for future in done]

    def prepare_data(self, strategy, tokenizer) -> None:
        args: DPPOOatArgs = strategy.args
        self.prompts_dataset = PlaceholderPrompts(args.max_train)
        self.eval_prompts_dataset = self.held_out_seeds(args)
        self.prompts_dataloader = strategy.setup_dataloader(
            self.prompts_dataset, args.rollout_batch_size_per_device, shuffle=False
        )
        self.eval_prompts_dataloader = DataLoader(
            self.eval_prompts_dataset, batch_size=args.eval_batch_size, shuffle=False, drop_last=False
        )

    def held_out_seeds(self, args: DPPOOatArgs) -> EvalSeeds:
        """The evaluation's episodes: every evaluation environment's held-out seeds (a plugin's environments
        registered in this learner's process first)."""
        import envs

        envs.import_env_modules(args.env_module)
        return eval_seeds_of(args)

    def learning_step(self, trajectory: dict) -> dict[str, torch.Tensor]:
        """Every optimizer step of one rollout batch, by the core's update loop."""
        tr = self.trust_region
        batch = update_batch_from_trajectory(trajectory, self.tokenizer.pad_token_id, with_topk=tr.uses_topk)
        check_whole_minibatches(len(batch), self.update_settings)
        if learners_normalise(self.spec.advantages.mode):

            def sum_over_learners(value):
                return self.strategy.all_reduce(value, op="sum")

            batch.advantages = global_batch_normalize(batch.advantages, sum_over_learners)
        batch = batch.to(model_device(self.model))
        chunk_size = self.args.logprob_chunk_size if self.args.lm_head == "logits" else None
        staleness = sample_staleness(trajectory["weight_version"], self.learning_rounds, self.broadcast_rounds)
        self.learning_rounds += 1  # oat's learning round: its learn() hands over one batch, the whole buffer
        sampler = TokenSampler(self.args.token_samples if self.strategy.is_rank_0() else 0,
                               seed=self.args.seed + self.learning_rounds)
        steps = EngineSteps(self._backward, self._optimizer_step, self._discard_step)
        history = learn_from_rollout(self.model, batch, tr, self.update_settings, steps, shuffle=self.shuffle_generator,
                                     guard=self.guard, lm_head=self.args.lm_head,
                                     token_sampler=sampler if self.exporter is None else
                                     TokenObservers(sampler, self.exporter),
                                     chunk_size=chunk_size, any_learner=self._any_learner)
        check_weights_finite(weight_shards(self.model.model.module), self._any_learner)
        if self.strategy.is_rank_0():
            rows = sampler.rows(self.learning_rounds, decode_each(self.tokenizer), trajectory["turn"])
            self._wandb.log_tokens(rows)
        if self.exporter is not None:
            self.exporter.write(self.learning_rounds, trajectory["turn"])
        return {**summarize_history(history, batch.advantages), **staleness}

    def _backward(self, loss: torch.Tensor) -> None:
        """One micro-batch through oat's strategy. DeepSpeed counts micro-batches itself, so its ``step`` follows
        every backward, as in oat, except at the accumulation boundary: that step is the core's to take
        (:meth:`_optimizer_step`) or skip (:meth:`_discard_step`) once the minibatch is done."""
        self.strategy.backward(loss, self.model, self.optimizer)
        if not self.model.model.is_gradient_accumulation_boundary():
            self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler)

    def _optimizer_step(self) -> dict[str, float]:
        """DeepSpeed's step at the boundary (gradient clipping, LR schedule). In bf16 (oat's default) a non-finite
        gradient norm skips it (DeepSpeed applies bf16 gradients unchecked); in fp16 DeepSpeed's loss scaler judges
        the step itself (:func:`loss_scaled_step`). The core calls it only when every learner's minibatch is
        healthy, and the norm is all-reduced: every learner takes the same branch."""
        if self.model.model.fp16_enabled():
            return loss_scaled_step(self.model.model, self._any_learner)
        grad_norm = float(self.strategy.get_gradient_norm(self.model))
        if not math.isfinite(grad_norm):
            skip_deepspeed_step(self.model.model)
            return {"policy_grad_norm": grad_norm, SKIPPED: 1.0, "guard/nonfinite_grad": 1.0}
        self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler)
        return {"policy_grad_norm": grad_norm}

    def _discard_step(self) -> dict[str, float]:
        skip_deepspeed_step(self.model.model)
        return {}

    def _any_learner(self, state: int) -> int:
        """The worst ``state`` over the learners (:data:`~dppo_oat.learner.guard.AnyLearner`): a non-finite μ or π_θ
        usually reaches one learner's batch only, and ZeRO's collectives must line up on all of them."""
        flag = torch.tensor([float(state)], device=model_device(self.model))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item())


def loss_scaled_step(engine, any_learner: AnyLearner = one_learner) -> dict[str, float]:
    """DeepSpeed's fp16 step, its own overflow path included: its ZeRO optimizer finds the scaled gradients
    non-finite (all-reduced over the learners), skips the step (gradients cleared; weights, Adam state and LR
    schedule untouched) and lowers the loss scale; else it unscales, clips and steps, and its gradient norm is the
    unscaled one of that step (oat's ``get_gradient_norm`` cannot serve here: after an overflow DeepSpeed 0.16's
    ZeRO-1/2 parameters still point at the gradients of the skipped step).

    An overflow at a scale above the scaler's minimum is its search for a scale (:data:`LOSS_SCALE_SKIPS`, never a
    reason to stop). At the minimum (DeepSpeed's ``min_loss_scale``, 1 by default; a static scale is its own
    minimum) the gradient is non-finite however small the scale: the blow-up guard's skip (:data:`SKIPPED`),
    ``patience`` of which in a row stop the run with one line, where DeepSpeed itself would raise a bare exception
    ("Current loss scale already at minimum") halfway through its step."""
    optimizer = engine.optimizer
    check_can_skip(optimizer, needs=("check_overflow", "_update_scale", "loss_scaler"))
    scaler = optimizer.loss_scaler
    scale = float(optimizer.loss_scale)
    at_minimum = scale <= getattr(scaler, "min_scale", scale) if scaler.dynamic else True
    with overriding(scaler, raise_error_at_min_scale=False):
        engine.step()
    metrics = {"loss_scale": scale, LOSS_SCALE_SKIPS: 0.0}
    if any_learner(int(bool(optimizer.overflow))) == HEALTHY:
        return {**metrics, "policy_grad_norm": float(engine.get_global_grad_norm())}
    if at_minimum:
        return {**metrics, SKIPPED: 1.0, "guard/nonfinite_grad": 1.0}
    return {**metrics, LOSS_SCALE_SKIPS: 1.0}


def skip_deepspeed_step(engine) -> None:
    """End an accumulation window without applying its gradients, by DeepSpeed's own fp16 overflow path: its ZeRO
    optimizers then clear the gradients, leave the weights and the LR schedule, and count a skipped step. bf16 never
    sets ``overflow`` itself (DeepSpeed checks it for fp16 only), so the flag is raised for this one step; in fp16
    the optimizer's own overflow check is held off for it too (the discarded gradients may well be finite), and so
    is its loss-scale update (a discarded minibatch says nothing about the scale)."""
    optimizer = engine.optimizer
    fp16 = engine.fp16_enabled()
    check_can_skip(optimizer, needs=("check_overflow", "_update_scale") if fp16 else ())
    held_off = {"check_overflow": lambda *args, **kwargs: None, "_update_scale": lambda *args, **kwargs: None}
    with overriding(optimizer, overflow=True, **(held_off if fp16 else {})):
        engine.step()


def check_can_skip(optimizer, needs: Sequence[str] = ()) -> None:
    """DeepSpeed's ZeRO optimizers (stage 1, 2 or 3) have the overflow path a skipped step takes; the others not."""
    if not all(hasattr(optimizer, name) for name in ("overflow", *needs)):
        raise TrainingBlewUp(f"non-finite values in a minibatch, and DeepSpeed's {type(optimizer).__name__} cannot "
                               "skip a step (ZeRO stage 1, 2 or 3 can, in bf16 without fp32 gradient accumulation, "
                               "or in fp16)")


@contextlib.contextmanager
def overriding(obj, **values):
    """``obj``'s attributes set to ``values`` for the block (an instance attribute shadows a method), then as they
    were."""
    saved = {name: vars(obj)[name] for name in values if name in vars(obj)}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name in values:
            if name in saved:
                setattr(obj, name, saved[name])
            else:
                delattr(obj, name)
