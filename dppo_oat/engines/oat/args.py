"""Command-line arguments of the oat engine: oat's ``PPOArgs`` (every oat flag keeps working) plus DPPO's own, and
their one mapping onto the run's :class:`~dppo_oat.settings.spec.RunSpec` (:func:`run_spec`).

DPPO's flags are :class:`~dppo_oat.settings.spec.DPPOFlags` (the trust region, the Gem tasks and how episodes are
played, the advantage estimator: the same names as the local engine's), plus the oat-specific ones below. What
changes meaning:

- ``num_samples`` is the GRPO group size: episodes started from the same seed;
- ``max_train`` counts training turn-samples (oat's placeholder prompt set has that many entries, one per sample);
- ``critic_type`` picks oat's loss aggregation (``drgrpo``: Dr.GRPO's token sum over ``generate_max_length``);
- ``eval_n`` episodes are played per evaluation seed (Avg@eval_n);
- ``dry_run`` prints the resolved plan and launches nothing (oat's fixed-length memory test is not available here).

Flags of oat's own PPO loss that DPPO replaces (``cliprange``, ``tis_c``, ``beta`` ...) are refused when set, rather
than silently ignored (:data:`REPLACED_OAT_FLAGS`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, replace
from typing import Literal

from oat.algorithms.ppo import PPOArgs
from oat.args import default_args_validation

from dppo_oat.aggregation import AGGREGATIONS
from dppo_oat.engines.oat.plan import (  # noqa: F401 (groups_per_step: the actor reads it here)
    check_group_size,
    check_plan,
    check_visible_gpus,
    groups_per_step,
    plan_of,
    round_samples,
)
from dppo_oat.engines.oat.preflight import (
    architecture_modules,
    check_context_lengths,
    check_lora_targets,
    check_model_source,
    check_numbers,
    check_save_path,
)
from dppo_oat.engines.oat.price import check_price_flags, read_config
from dppo_oat.ranges import check_float32_fields
from dppo_oat.run.log import check_run_name, check_wandb
from dppo_oat.settings.grouped_cli import FlagGroup
from dppo_oat.settings.spec import (
    OVERRIDE_FLAGS,
    OVERRIDES_ABOUT,
    AdvantageSettings,
    DPPOFlags,
    RolloutSettings,
    RunSpec,
    SamplingSettings,
    UpdateSettings,
    split_ids,
    topk_logprobs_of,
)

OAT_AGGREGATION = {"drgrpo": "seq-mean-token-sum-norm", "grpo": "seq-mean-token-mean"}
"""oat's loss aggregation per ``critic_type``: ``masked_sum / generate_max_length`` or ``masked_mean``, then a mean
over sequences."""

REPLACED_OAT_FLAGS = {
    "cliprange": (0.2, "the clip range is the trust region's: use --tr_eps_low / --tr_eps_high"),
    "tis_c": (None, "the IS cap is the trust region's C: use --tr_is_cap"),
    "beta": (0.0, "DPPO's loss has no KL term"),
    "kl_penalty_coef": (0.0, "DPPO's loss has no KL term"),
    "reinforce_update": (False, "choose a trust-region preset instead (pg_is is plain REINFORCE with IS)"),
    "whiten_adv": (False, "advantages come from --advantage_mode (rebn normalises over the batch)"),
    "use_fused_lm_head": (False, "oat's fused head returns bf16 log-probs; DPPO's learner already takes fp32 log-probs "
                                 "and the loss's gradients straight from the hidden states, never holding the "
                                 "[N, V] logits (--lm_head fused, the default)"),
    "whiten_rewards": (False, "advantages come from --advantage_mode"),
    "reward_scale": (1.0, "rewards are the environment's"),
    "non_stop_penalty": (0.0, "rewards are the environment's (a cut response is an invalid action)"),
    "non_stop_fixed_reward": (None, "rewards are the environment's (a cut response is an invalid action)"),
    "lora_sync_only": (False, "the actor's generator does not apply LoRA adapters: without it oat merges the "
                              "adapters and sends whole weights"),
    "apply_chat_template": (False, "prompts come from --prompt_template (chat: the tokenizer's chat template)"),
    "save_ckpt": (False, "DPPO's checkpoints resume exactly and are written atomically: use --checkpoint_every "
                         "(oat's own restart its loop and evaluation schedule)"),
    "load_in_4bit": (False, "oat merges LoRA adapters into the weights it sends to vLLM, and a merge into 4-bit "
                            "weights re-quantizes them: vLLM's μ would not be the learner's π"),
    "dump_replay_every": (-1, "DPPO's run loop does not dump oat's replay buffer (--token_export all writes every "
                              "trained token)"),
    "dump_all_buffer": (False, "DPPO's run loop does not dump oat's replay buffer (--token_export all writes every "
                               "trained token)"),
}
"""oat flags whose job DPPO's loss does differently: ``name -> (the only accepted value, what to use instead)``."""


@dataclass
class DPPOOatArgs(PPOArgs, DPPOFlags):
    """oat's PPO arguments plus DPPO's trust region and Gem tasks."""

    prompt_template: str = "qwen3_game"
    """How an observation becomes a prompt: qwen3_game, qwen3_general, plain or chat."""
    groups_per_step: int | None = None
    """Groups played per actor step (default: enough single-turn episodes for rollout_batch_size_per_device)."""
    env_seed: int = 42
    """Constructor seed of the training envs (reasoning-gym builds its puzzle set from it)."""
    lm_head: Literal["fused", "logits"] = "fused"
    """How the learner gets π_θ: fused (from the last hidden states and the head weight, chunk by chunk, never
    holding the [N, V] logits, in the forward pass or the backward) or logits (the model's logits, for
    comparison)."""
    logprob_chunk_size: int = 1024
    """Token rows per chunk of the logits path's fp32 log-softmax, whose logits memory grows with it (the fused head
    sizes its chunks itself)."""
    loss_aggregation: Literal[AGGREGATIONS] | None = None  # type: ignore[valid-type]
    """How per-token losses are aggregated. None: oat's, from critic_type (drgrpo: seq-mean-token-sum-norm, each
    response's token sum over generate_max_length; grpo: seq-mean-token-mean)."""

    eval_env_ids: tuple[str, ...] = ()
    """Gem ids to evaluate on (default: env_ids)."""
    eval_seed_start: int = 1_000_000_000
    """First evaluation seed; training seeds are drawn below it (a local-math set maps seed s to problem s mod N)."""
    num_eval_seeds: int = 32
    """Evaluation seeds per env, eval_n episodes from each; 0: every problem of a local-math set, once each."""
    eval_env_seed: int = 4242
    """Constructor seed of the evaluation envs (a puzzle set apart from training's for reasoning-gym)."""
    dry_run: bool = False
    """Parse, run every check that needs no GPU, print the resolved plan, and launch nothing (oat's own dry run, a
    fixed-length memory test, is not available here)."""
    checkpoint_every: int = 10
    """Learning rounds between resumable checkpoints (<run>/checkpoints/round_<r>: every learner's weights, optimizer
    state, schedule, loop position and random states, written atomically); a multiple of --sync_params_every. 0: none.
    Go on after a kill with the same command plus --resume_dir <run>."""
    keep_checkpoints: int = 2
    """How many of the newest resumable checkpoints to keep (each holds the optimizer state: about 14 bytes per
    parameter in bf16 with Adam)."""
    seeded_sampling: bool = False
    """Give every vLLM request a seed drawn from the run's seed and actor step, so that two runs with the same --seed
    (and a run and its resume) draw the same samples; vLLM then draws each request's noise from its own generator
    (one small kernel per request and decode step). Off: vLLM's noise is seeded by oat with the time."""
    price_gpu: str | None = None
    """The GPU the plan's price is worked out for: h100, h200 or a100 (default: the one nvidia-smi names, else h200,
    where the learner was measured)."""
    price_model: str | None = None
    """The model shape the price and the logits memory are worked out for: Qwen3-1.7B, Qwen3-1.7B-Base,
    OctoThinker-3B-Hybrid-Base, DeepSeek-R1-Distill-Qwen-1.5B or a config.json (default: --pretrain's config.json
    where readable here, else its name)."""
    price_decode_efficiency: float = 0.5
    """The fraction of the decode roofline the price assumes vLLM reaches (an assumption: not measured here)."""
    max_staleness: int = 0
    """Actors play learning round t with the weights after round max(0, t − 1 − k) while the learners train the
    rounds before it (μ is those weights'; train/staleness/max up to k). 0: synchronous, oat's own loop. Not with
    --collocate, --vllm_sleep or a trust region that recomputes π_θ'. A checkpoint keeps the steps played ahead."""
    on_cpu: bool = False
    """Run oat's program on this machine's CPU: one actor and one learner (--gpus 1), oat's CUDA-only calls replaced
    in their processes (dppo_oat/engines/oat/on_cpu.py); for a short run with a small policy on a laptop, in the
    node's software (make oat-cpu-run, docs/engines/oat.md)."""

    # oat defaults changed for DPPO.
    algo: Literal["DPO", "IPO", "LR_DPO", "SLiC", "SimPO", "BNF", "SFT", "PPO"] = "PPO"
    beta: float = 0.0
    tis_c: float | None = None
    use_fused_lm_head: bool = False
    oracle: str = ""
    prompt_data: str = ""
    eval_temperature: float = 0.6
    eval_top_p: float = 0.95
    pi_buffer_maxlen_per_device: int | None = None
    """Samples each learner keeps for a learning round (oat's buffer). None: one round's samples,
    rollout_batch_size / learners, as the plan needs (oat's 16 holds a round only where 8 learners share its
    rollout_batch_size 128: --collocate on 8 GPUs)."""


HELP_GROUPS = (
    FlagGroup("dppo trust-region", OVERRIDES_ABOUT, ("trust_region", *OVERRIDE_FLAGS)),
    FlagGroup("dppo tasks", "", ("env_ids", "env_module", "env_seed", "prompt_template", "wrappers", "max_turns",
                                 "groups_per_step", "seeded_sampling", "max_staleness")),
    FlagGroup("dppo evaluation", "", ("eval_env_ids", "eval_seed_start", "num_eval_seeds", "eval_env_seed")),
    FlagGroup("dppo advantage", "", ("advantage_mode", "turn_baseline")),
    FlagGroup("dppo learner", "", ("loss_aggregation", "lm_head", "logprob_chunk_size", "pi_buffer_maxlen_per_device")),
    FlagGroup("dppo output", "", ("token_samples", "token_export", "checkpoint_every", "keep_checkpoints")),
    FlagGroup("dppo plan", "", ("dry_run", "on_cpu", "price_gpu", "price_model", "price_decode_efficiency")),
)
"""The sections of DPPO's flags in ``--engine oat --help``, after oat's own flags (the first section, as oat shows
them); the flags keep their names (:mod:`dppo_oat.settings.grouped_cli`)."""


def loss_aggregation(args: DPPOOatArgs) -> str:
    """``args.loss_aggregation``, else oat's aggregation for ``args.critic_type``."""
    return args.loss_aggregation or OAT_AGGREGATION[args.critic_type]


def run_spec(args: DPPOOatArgs, grad_acc_step: int) -> RunSpec:
    """The oat engine's command line as the run's spec (validates every setting).

    The update runs as oat runs PPO: one minibatch = ``grad_acc_step`` micro-batches of
    ``train_batch_size_per_device`` on each learner, and DeepSpeed averages over the accumulation steps itself.
    """
    tr = args.build_trust_region()
    rollout = RolloutSettings(template=args.prompt_template, max_prompt_tokens=args.prompt_max_length,
                              max_turns=args.max_turns, env_seed=args.env_seed, wrappers=split_ids(args.wrappers))
    with flags_named("--temperature, --top_p, --top_k, --generate_max_length"):
        sampling = SamplingSettings(args.generate_max_length, args.temperature, args.top_p,
                                    top_k_logprobs=topk_logprobs_of(tr), top_k=args.top_k)
    with flags_named("--eval_temperature, --eval_top_p, --eval_top_k, --eval_generate_max_length"):
        eval_sampling = SamplingSettings(args.eval_generate_max_length, args.eval_temperature, args.eval_top_p,
                                         top_k=args.eval_top_k)
    update = UpdateSettings(
        num_epochs=args.num_ppo_epochs, minibatch_size=args.train_batch_size_per_device * grad_acc_step,
        micro_batch_size=args.train_batch_size_per_device, aggregation=loss_aggregation(args),
        norm_constant=float(args.generate_max_length), scale_micro_batches=False, temperature=args.temperature,
    )
    with flags_named("--temperature, --top_p, --top_k"):
        return RunSpec(
            trust_region=tr, rollout=rollout, sampling=sampling,
            eval_rollout=replace(rollout, env_seed=args.eval_env_seed),
            eval_sampling=eval_sampling,
            advantages=AdvantageSettings(args.advantage_mode, args.gamma, args.turn_baseline), update=update,
        )


OAT_ALGO = "oat_algo"
"""The key under which ``config.json`` records oat's ``--algo`` (always PPO here). Not ``algo``: in the analysis a run's
``algo`` is its trust-region preset (:attr:`dppo_oat.analysis.Run.algo`), which oat's algorithm is not. Earlier runs
recorded it as ``algo``; the analysis takes their preset from their trust region all the same."""


def logged_config(args: DPPOOatArgs, spec: RunSpec) -> dict:
    """What the learner's ``config.json`` records: every flag as parsed (``--algo`` as :data:`OAT_ALGO`), the engine,
    the run name and the trust region."""
    flags = {name: value for name, value in vars(args).items() if name != "algo"}
    return {**flags, OAT_ALGO: "PPO", "engine": "oat", "run_name": args.wb_run_name,
            "trust_region": asdict(spec.trust_region)}


@contextlib.contextmanager
def flags_named(flags: str):
    """Prefix a settings error with the command-line flags it comes from."""
    try:
        yield
    except ValueError as error:
        raise ValueError(f"{flags}: {error}") from None


def spec_of(args: DPPOOatArgs) -> RunSpec:
    """:func:`run_spec` with the gradient accumulation of the planned node."""
    return run_spec(args, plan_of(args).grad_acc_step)


def learners_normalise(advantage_mode: str) -> bool:
    """True when the learners normalise returns over the whole learning batch (``rebn``, Gem's ``norm_return``);
    the actors then send the discounted returns themselves."""
    return advantage_mode == "rebn"


def check_dppo_args(args: DPPOOatArgs, *, check_tasks: bool = True) -> RunSpec:
    """Everything DPPO needs of the arguments, without a GPU, a model or launchpad; the run's spec. Raises
    ValueError with one line that says what to change. ``check_tasks`` False leaves the environments unmade (a
    learner with no actors, as ``scripts/bench/oat_learner_step.py`` builds one, plays none)."""
    _check_replaced_flags(args)
    check_numbers(args)  # the ranges oat, DeepSpeed, vLLM, torch and NumPy take
    check_float32_fields(args, lambda name: f"--{name}")  # every number fits the float32 it becomes
    args.check_logging()
    if args.use_wb:
        check_wandb("--use_wb")
    _check_precision(args)
    _check_staleness(args)  # before the checkpoint checks: it names what asynchrony lacks
    _check_checkpoints(args)
    _check_files(args)
    _check_lora(args)
    if args.algo != "PPO":
        raise ValueError(f"the oat engine runs algo PPO (got {args.algo!r})")
    if args.asynchronous:
        raise ValueError(ASYNCHRONOUS_REFUSED)
    check_visible_gpus(args.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    check_run_name(args.wb_run_name, "--wb_run_name", "--save_path")  # oat writes save_path/<wb_run_name>_<time>
    check_group_size(args.num_samples)
    check_price_flags(args)
    if args.pi_buffer_maxlen_per_device is None:  # one learning round's samples (oat reads the number itself)
        args.pi_buffer_maxlen_per_device = round_samples(args)
    plan = plan_of(args)
    check_plan(plan)
    spec = run_spec(args, plan.grad_acc_step)
    if spec.advantages.needs_groups and args.num_samples < 2:
        raise ValueError(f"--advantage_mode {args.advantage_mode} needs groups: --num_samples >= 2 "
                         "(or --advantage_mode rebn, Gem's normalised returns)")
    if not spec.sampling.is_plain:
        raise ValueError(
            "vLLM 0.8.4 reports raw log-probs, so μ is the sampling distribution only with --temperature 1 --top_p 1 "
            f"--top_k -1 (got {args.temperature}, {args.top_p}, {args.top_k})"
        )
    if check_tasks:
        _check_tasks(args, spec.rollout.env_seed)
        check_context_lengths(args, read_config(args.pretrain), args.pretrain)  # the actors' vLLM
    return spec


ASYNCHRONOUS_REFUSED = (
    "--asynchronous: oat 0.2.4's asynchronous collector fails at its first actor step (the prefill has no samples "
    "yet, and it scatters None from the source rank, which torch.distributed.scatter_object_list refuses); use "
    "--max_staleness 1 (actors play the next round while the learners train, staleness bounded and logged)"
)
"""Why oat's ``--asynchronous`` is refused: the program would fail after every model has loaded."""


def _check_staleness(args: DPPOOatArgs) -> None:
    """``--max_staleness k > 0`` needs actors on GPUs of their own that keep their weights while the learners train,
    and a loss anchored on the samples' μ: a recomputed π_θ' would be the learners' current weights, not the ones
    that sampled."""
    k = args.max_staleness
    if k < 0:
        raise ValueError(f"--max_staleness must be >= 0 (0: synchronous), got {k}")
    if k == 0:
        return
    if args.collocate:
        raise ValueError(f"--max_staleness {k} with --collocate: actors and learners would share the GPUs they "
                         "overlap on; give the actors GPUs of their own")
    if args.vllm_sleep:
        raise ValueError(f"--max_staleness {k} with --vllm_sleep: the actors generate while the learners train, "
                         "so vLLM cannot sleep then")
    if args.build_trust_region().needs_recompute:
        raise ValueError(f"--max_staleness {k} with --trust_region {args.trust_region}: it recomputes π_θ' with the "
                         "learners' current weights, not the ones that sampled; use a preset anchored on μ")
    if args.sync_params_every != 1:
        raise ValueError(f"--max_staleness {k} with --sync_params_every {args.sync_params_every}: the schedule "
                         "sends the weights after every learning round; give --sync_params_every 1")


def _check_precision(args: DPPOOatArgs) -> None:
    """``--fp16`` replaces oat's default ``--bf16`` (oat runs one of them) and needs a ZeRO optimizer: the
    learner's skipped steps take DeepSpeed's fp16 overflow path, which only ZeRO's optimizers have (the learner
    counts the loss scaler's own skips in ``guard/loss_scale_skips``, never as divergence)."""
    if not args.fp16:
        return
    if args.bf16:
        raise ValueError("--fp16 replaces oat's default --bf16: pass --fp16 --no-bf16")
    if args.zero_stage not in (1, 2, 3):
        raise ValueError(f"--fp16 needs --zero_stage 1, 2 or 3 (got {args.zero_stage}): a skipped step takes the "
                         "overflow path of DeepSpeed's ZeRO optimizers")


def _check_checkpoints(args: DPPOOatArgs) -> None:
    """A checkpoint is taken where the actors hold the learner's weights (after a broadcast), so that a resume
    that sends them the checkpoint's weights puts them where an uninterrupted run's actors are."""
    if args.checkpoint_every < 0 or args.keep_checkpoints < 1:
        raise ValueError(f"--checkpoint_every must be >= 0 (0: none) and --keep_checkpoints >= 1, got "
                         f"{args.checkpoint_every} and {args.keep_checkpoints}")
    if args.checkpoint_every and args.checkpoint_every % args.sync_params_every:
        raise ValueError(f"--checkpoint_every {args.checkpoint_every} must be a multiple of --sync_params_every "
                         f"{args.sync_params_every}: a checkpoint is taken right after a weight broadcast")
    if args.resume_dir and not args.checkpoint_every:
        raise ValueError("--resume_dir with --checkpoint_every 0: the resumed run would write no checkpoint to go on "
                         "from; give --checkpoint_every")
    if args.resume_tag and not args.resume_dir:
        raise ValueError(f"--resume_tag {args.resume_tag} names a checkpoint of the run --resume_dir names: give "
                         "--resume_dir <run> too (oat would start a new run and ignore the tag)")


def _check_files(args: DPPOOatArgs) -> None:
    """The model, tokenizer and folder the learners and actors open first, as the launch would find them here
    (:mod:`~dppo_oat.engines.oat.preflight`)."""
    check_model_source("--pretrain", args.pretrain)
    if args.tokenizer:
        check_model_source("--tokenizer", args.tokenizer, model=False)
    check_save_path(args.save_path)


def _check_lora(args: DPPOOatArgs) -> None:
    """LoRA (``--lora_rank`` > 0): oat merges the adapters into whole weights for every broadcast; under ZeRO-3 the
    weights it merges into are partitioned away from the process that merges. ``--target_modules`` are the model's,
    where its architecture can be built here from a readable config.json (as peft matches them)."""
    if args.lora_rank < 0 or (args.lora_rank > 0 and args.lora_alpha <= 0):
        raise ValueError(f"--lora_rank must be >= 0 (0: full fine-tuning) and --lora_alpha > 0, got "
                         f"{args.lora_rank} and {args.lora_alpha}")
    if args.lora_rank > 0 and args.zero_stage == 3:
        raise ValueError("--lora_rank with --zero_stage 3: oat merges the adapters into weights ZeRO-3 has "
                         "partitioned across the learners; use --zero_stage 2")
    config = read_config(args.pretrain) if args.lora_rank > 0 else None
    modules = architecture_modules(config) if config is not None else None
    if modules is not None:
        check_lora_targets(args.target_modules, modules, args.pretrain)


def check_resume(args: DPPOOatArgs, learners: int) -> None:
    """``--resume_dir``: a whole checkpoint is there, with a sound record, of as many learners, and the run's
    settings are these (but :data:`~dppo_oat.engines.oat.resume.MAY_CHANGE_ON_RESUME`), each compared as the run's
    ``config.json`` records it (:func:`logged_config`: the trust region as the settings the preset and the ``--tr_*``
    overrides resolve to). Raises ValueError with one line."""
    from dppo_oat.engines.oat.resume import check_resume_settings, find_resume_point, free_on_resume
    from dppo_oat.run.directory import RunDir

    point = find_resume_point(args.resume_dir, args.resume_tag)
    if point.record["learners"] != learners:
        raise ValueError(f"--resume_dir: {point.folder.name} was written by {point.record['learners']} "
                         f"learner(s) and this plan has {learners}: resume on the node layout the run started on")
    spec = spec_of(args)
    check_resume_settings(RunDir(point.run_dir).read_config(), logged_config(args, spec),
                          free_on_resume(spec.trust_region))


def _check_replaced_flags(args: DPPOOatArgs) -> None:
    for name, (accepted, hint) in REPLACED_OAT_FLAGS.items():
        if getattr(args, name) != accepted:
            raise ValueError(f"--{name}={getattr(args, name)!r} is not used by DPPO: {hint}")
    if args.critic_type not in OAT_AGGREGATION:
        raise ValueError(f"critic_type {args.critic_type!r} needs a learned critic; DPPO uses drgrpo or grpo")


def _check_tasks(args: DPPOOatArgs, env_seed: int) -> None:
    from envs import LOCAL_MATH_PREFIX, check_env_id, check_plugin_envs, import_env_modules

    import_env_modules(args.env_module)  # the ids a plugin registers are known from here on
    if not split_ids(args.env_ids):
        raise ValueError("--env_ids names no environment")
    for env_id in split_ids(args.env_ids) + split_ids(args.eval_env_ids):
        check_env_id(env_id)
    ids = split_ids(args.env_ids) + split_ids(args.eval_env_ids)
    check_plugin_envs(ids, env_seed=env_seed)  # each made, reset and stepped once: Gem's contract
    if args.num_eval_seeds < 0 or args.eval_seed_start < 1:
        raise ValueError("--num_eval_seeds must be >= 0 and --eval_seed_start >= 1")
    no_data_set = [e for e in split_ids(args.eval_env_ids or args.env_ids) if not e.startswith(LOCAL_MATH_PREFIX)]
    if args.num_eval_seeds == 0 and no_data_set:
        raise ValueError(f"--num_eval_seeds 0 evaluates every problem of a local-math set; {no_data_set[0]} is not "
                         "one: give a number of seeds")


def validate_args(args: DPPOOatArgs, *, check_gpus: bool = True, check_tasks: bool = True) -> DPPOOatArgs:
    """DPPO's checks (``check_tasks``: :func:`check_dppo_args`'s), then oat's own validation, which also checks that
    ``args.gpus`` GPUs are visible unless ``check_gpus`` is False (a dry run plans a node it does not run on)."""
    check_dppo_args(args, check_tasks=check_tasks)
    if check_gpus:
        args = default_args_validation(args)
    else:
        gpus, args.gpus = args.gpus, 0  # oat's only use of args.gpus there is the count of visible GPUs
        try:
            args = default_args_validation(args)
        finally:
            args.gpus = gpus
    if args.resume_dir:
        check_resume(args, plan_of(args).learners)  # after oat's validation: config.json records validated args
    return args
