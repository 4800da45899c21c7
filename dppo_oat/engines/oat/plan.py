"""What an oat run will do on its node, worked out from the arguments alone (no GPU, model or launchpad needed).

oat's program (``oat.interface.get_program``) puts actors and learners on the node's GPUs; each learner asks its
actor for ``rollout_batch_size_per_device`` samples per actor step, keeps the last ``pi_buffer_maxlen_per_device``
of them, and learns every ``rollout_batch_size / (learners × rollout_batch_size_per_device)`` actor steps (oat's
``update_interval``: one *learning round*) on its whole buffer, in micro-batches of ``train_batch_size_per_device``,
with DeepSpeed stepping the optimizer every ``train_batch_size / (train_batch_size_per_device × learners)``
micro-batches. :func:`plan_of` works all of that out, :func:`check_plan` refuses plans that would crash or train on
the wrong samples, :func:`priced_plan` adds the run's price (:mod:`~dppo_oat.engines.oat.price`: time and memory)
and :func:`render_plan` prints it (``--dry_run``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dppo_oat.engines.oat.price import (
    EpisodeTurns,
    Lora,
    ModelShape,
    Price,
    StepCalls,
    checkpoint_bytes,
    env_turn_limit,
    episode_turns,
    lora_line,
    lora_of,
    nvidia_smi_gpu,
    price_of,
    render_price,
    resolve_shape,
    step_calls,
)

if TYPE_CHECKING:
    from dppo_oat.trust_region import TrustRegion


@dataclass(frozen=True)
class Plan:
    """The resolved plan of one oat run (per-learner numbers are per device)."""

    gpus: int
    collocate: bool
    actors: int
    gpus_per_actor: int
    num_groups: int
    learners: int
    rollout_batch_size: int
    rollout_per_device: int
    decode_batch: int
    """Episodes an actor plays at once (``groups_per_step × num_samples``): the sequences of each generate call."""
    actor_steps_per_round: int
    samples_per_round: int
    buffer: int
    buffer_clear_every: float
    micro_batch: int
    train_batch_size: int
    grad_acc_step: int
    minibatch: int
    epochs: int
    optimizer_steps_per_round: int
    scheduled_optimizer_steps: int
    actor_steps: int
    rounds: int
    eval_every_rounds: int | None
    save_every_rounds: int | None
    logits_gib: float | None
    logits_note: str
    lm_head: str = "logits"
    """The head the learner will use: ``fused`` (--lm_head fused, not under ZeRO-3) or ``logits``."""
    shape: ModelShape | None = None
    """The model's shape (:func:`~dppo_oat.engines.oat.price.resolve_shape`), None when it is not known here."""
    shape_note: str = ""
    """Where the shape comes from, or which flag gives it."""
    price: Price | None = None
    """The run's price (:func:`priced_plan`)."""
    trust_region: TrustRegion | None = None
    """The trust region the learner will use: the preset ``--trust_region`` with the ``--tr_*`` overrides."""
    tr_overrides: tuple[str, ...] = ()
    """The trust-region fields the ``--tr_*`` overrides set."""
    lora_rank: int = 0
    """``--lora_rank`` (0: full fine-tuning)."""
    lora: Lora | None = None
    """The adapters (``--lora_rank`` > 0) where the model's shape and ``--target_modules`` let them be counted;
    :attr:`lora_note` says why not otherwise."""
    lora_note: str = ""
    checkpoint: tuple[float, str] | None = None
    """Bytes of one resumable checkpoint and what they hold (:func:`~dppo_oat.engines.oat.price.checkpoint_bytes`),
    None without the model's shape or countable adapters."""
    slot_turns: tuple[EpisodeTurns, ...] | None = None
    """The turns of the episode each of an actor's ``decode_batch`` slots plays (:func:`plan_turns`, resolved by
    :func:`priced_plan`)."""
    smi_name: str | None = None
    """The GPU nvidia-smi named where ``--price_gpu`` was not given (:func:`priced_plan`): what the price is for."""


def topology(args) -> tuple[int, int, int]:
    """``(actor GPUs, learner GPUs, learners)`` as ``oat.interface.get_program`` assigns them."""
    if args.collocate:
        actor_gpus = learner_gpus = args.gpus
    elif args.gpus % 2 == 0:
        actor_gpus = learner_gpus = args.gpus // 2
    else:  # oat shares one GPU between an actor and a learner
        actor_gpus, learner_gpus = args.gpus // 2 + 1, args.gpus - args.gpus // 2
    return actor_gpus, learner_gpus, learner_gpus * args.num_groups


def check_visible_gpus(gpus: int, cuda_visible_devices: str | None) -> None:
    """Refuse, in one line, a node whose ``CUDA_VISIBLE_DEVICES`` disagrees with ``--gpus``.

    oat 0.2.4's ``get_program`` places one actor and one learner on every GPU that ``CUDA_VISIBLE_DEVICES`` lists
    (``int()`` of each entry) and reads ``--gpus`` only when the variable is unset; the plan is made from ``--gpus``.
    ``--gpus 1`` on a node that exports 8 GPUs (SLURM, Kubernetes) would start 8 learners that each fail oat's
    divisibility assertion after the models have loaded.
    """
    if cuda_visible_devices is None:
        return
    entries = [entry.strip() for entry in cuda_visible_devices.split(",")]
    if not all(entry.isdigit() for entry in entries):
        raise ValueError(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}: oat reads it as a list of GPU indices "
                         "(e.g. 0,1,2,3), not UUIDs or an empty value; export the indices of the GPUs to use")
    if len(entries) != gpus:
        narrower = f", or export CUDA_VISIBLE_DEVICES={','.join(entries[:gpus])}" if gpus < len(entries) else ""
        raise ValueError(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices} lists {len(entries)} GPU(s) but --gpus is "
                         f"{gpus}: oat starts an actor and a learner on every visible GPU; pass --gpus "
                         f"{len(entries)}{narrower}")


def round_samples(args) -> int:
    """The samples each learner collects in one learning round: ``rollout_batch_size / learners`` (the default of
    ``--pi_buffer_maxlen_per_device``, which must hold them)."""
    return max(args.rollout_batch_size // topology(args)[2], 1)


def plan_of(args) -> Plan:
    """The plan of ``args`` (a :class:`~dppo_oat.engines.oat.args.DPPOOatArgs`); raises ValueError where oat's own
    arithmetic would fail (e.g. a zero-sized step)."""
    _check_positive(args)
    actor_gpus, _, learners = topology(args)
    interval = max(args.rollout_batch_size // (learners * args.rollout_batch_size_per_device), 1)
    grad_acc = args.train_batch_size // args.train_batch_size_per_device // learners
    actor_steps = args.max_train // learners // args.rollout_batch_size_per_device
    shape, shape_note = resolve_shape(args.pretrain, getattr(args, "price_model", None))
    gib, note = logits_memory(args, shape)
    lora, lora_note = lora_of(args, shape) if shape is not None else (None, "no model shape")
    tr, overrides = trust_region_of(args)
    return Plan(
        gpus=args.gpus, collocate=args.collocate, actors=actor_gpus // args.num_gpus_per_actor,
        gpus_per_actor=args.num_gpus_per_actor, num_groups=args.num_groups, learners=learners,
        rollout_batch_size=args.rollout_batch_size, rollout_per_device=args.rollout_batch_size_per_device,
        decode_batch=groups_per_step(args) * args.num_samples, actor_steps_per_round=interval,
        samples_per_round=args.rollout_batch_size // learners,
        buffer=(args.pi_buffer_maxlen_per_device if args.pi_buffer_maxlen_per_device is not None
                else round_samples(args)),
        buffer_clear_every=args.buffer_clear_every, micro_batch=args.train_batch_size_per_device,
        train_batch_size=args.train_batch_size,
        grad_acc_step=grad_acc, minibatch=args.train_batch_size // learners, epochs=args.num_ppo_epochs,
        optimizer_steps_per_round=args.rollout_batch_size // args.train_batch_size * args.num_ppo_epochs,
        scheduled_optimizer_steps=args.max_train // args.train_batch_size,
        actor_steps=actor_steps, rounds=actor_steps // interval,
        eval_every_rounds=_every_rounds(args.eval_steps, interval),
        save_every_rounds=_every_rounds(args.save_steps, interval), logits_gib=gib, logits_note=note,
        lm_head=learner_head(args), shape=shape, shape_note=shape_note, trust_region=tr, tr_overrides=overrides,
        lora_rank=getattr(args, "lora_rank", 0) or 0, lora=lora, lora_note=lora_note,
        checkpoint=plan_checkpoint(args, shape, lora, lora_note),
    )


def trust_region_of(args):
    """The trust region of ``args`` as the learner builds it (``DPPOFlags.build_trust_region``: the preset
    ``--trust_region`` with the ``--tr_*`` overrides, one it does not read refused), and the fields overridden."""
    from dppo_oat.settings.spec import TRUST_REGION_OVERRIDES, DPPOFlags

    overrides = {f"tr_{name}": getattr(args, f"tr_{name}", None) for name in TRUST_REGION_OVERRIDES}
    preset = {"trust_region": args.trust_region} if getattr(args, "trust_region", None) else {}
    tr = DPPOFlags(**preset, **overrides).build_trust_region()
    return tr, tuple(name for name in TRUST_REGION_OVERRIDES if overrides[f"tr_{name}"] is not None)


def plan_checkpoint(args, shape: ModelShape | None, lora: Lora | None, lora_note: str) -> tuple[float, str] | None:
    """One resumable checkpoint's bytes and contents, None where they cannot be counted."""
    if shape is None or (lora is None and lora_note):
        return None
    return checkpoint_bytes(shape, lora, bool(args.bf16 or args.fp16), getattr(args, "zero_stage", 2))


def plan_turns(args) -> tuple[EpisodeTurns, ...]:
    """The turns of each of an actor's slots, in the collector's order (``--env_ids`` assigned to groups round-robin,
    ``num_samples`` slots a group): each env's own limit (:func:`~dppo_oat.engines.oat.price.env_turn_limit`) under
    ``--max_turns``, and its measured mean."""
    from dppo_oat.settings.spec import split_ids

    ids = getattr(args, "env_ids", ("game:Sudoku-v0-easy",))
    ids = split_ids((ids,) if isinstance(ids, str) else ids)
    env_seed, max_turns = getattr(args, "env_seed", 42), getattr(args, "max_turns", None)
    turns = {env_id: episode_turns(env_id, *env_turn_limit(env_id, env_seed), max_turns) for env_id in ids}
    return tuple(turns[ids[g % len(ids)]] for g in range(groups_per_step(args)) for _ in range(args.num_samples))


def actor_step_calls(plan: Plan) -> StepCalls:
    """The vLLM generate calls one actor step of ``plan`` makes (a :func:`priced_plan`, whose turns are resolved):
    at most (for any episode lengths within the turn limits) and at the measured mean turns (None without one), and
    the episode turns (sequences) they decode (:func:`~dppo_oat.engines.oat.price.step_calls`)."""
    if plan.slot_turns is None:
        raise ValueError("the plan's episode turns are not resolved: make it with priced_plan(args)")
    return step_calls(plan.rollout_per_device, plan.slot_turns)


def priced_plan(args) -> Plan:
    """:func:`plan_of` with its episodes' turns (:func:`plan_turns`) and the run's price, for arguments whose plan
    :func:`check_plan` passed (no price without the model's shape: the plan's ``shape_note`` then says which flag
    gives it)."""
    plan = replace(plan_of(args), slot_turns=plan_turns(args))
    if plan.shape is None:
        return plan
    smi_name = None if getattr(args, "price_gpu", None) else nvidia_smi_gpu()
    return replace(plan, smi_name=smi_name, price=price_of(plan, args, plan.shape, plan.shape_note, smi_name))


def groups_per_step(args) -> int:
    """``groups_per_step``, else enough groups for one single-turn batch of ``rollout_batch_size_per_device``."""
    return getattr(args, "groups_per_step", None) or -(-args.rollout_batch_size_per_device // args.num_samples)


def learner_head(args) -> str:
    """``fused`` when the learner takes π_θ through the fused head (ZeRO-3 falls back to the logits path)."""
    fused = getattr(args, "lm_head", "logits") == "fused" and getattr(args, "zero_stage", 2) != 3
    return "fused" if fused else "logits"


def _check_positive(args) -> None:
    for name in ("gpus", "num_gpus_per_actor", "num_groups", "rollout_batch_size", "rollout_batch_size_per_device",
                 "train_batch_size", "train_batch_size_per_device", "pi_buffer_maxlen_per_device", "num_ppo_epochs",
                 "max_train"):
        if getattr(args, name) is not None and getattr(args, name) < 1:  # a None buffer: one round's samples
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")


def _every_rounds(every_actor_steps: int, interval: int) -> int | None:
    """oat evaluates (saves) after a learning round whose actor step count is a multiple of ``every_actor_steps``."""
    if every_actor_steps <= 0:
        return None
    return math.lcm(every_actor_steps, interval) // interval


def check_group_size(num_samples: int) -> None:
    """``--num_samples`` (episodes per prompt, the GRPO group) is a positive count: the actors' batch is divided by
    it (0 would divide by zero on the node, after the models loaded; a negative one would plan nonsense)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"--num_samples must be an integer >= 1 (episodes per prompt, the GRPO group), got "
                         f"{num_samples!r}")


def check_plan(plan: Plan) -> None:
    """Refuse, in one line that says what to change, a plan oat would crash on or that trains on the wrong data."""
    _check_topology(plan)
    _check_rollout(plan)
    _check_buffer(plan)
    _check_minibatches(plan)
    if plan.rounds < 1:
        raise ValueError(f"--max_train gives each learner {plan.actor_steps} actor steps, fewer than one learning "
                         f"round ({plan.actor_steps_per_round}): raise --max_train")


def _check_topology(plan: Plan) -> None:
    if plan.gpus_per_actor not in (1, 2, 4, 8):
        raise ValueError(f"oat runs actors of 1, 2, 4 or 8 GPUs, not --num_gpus_per_actor {plan.gpus_per_actor}")
    if plan.actors < 1:
        raise ValueError(f"{plan.gpus} GPU(s) leave no GPU for an actor of --num_gpus_per_actor {plan.gpus_per_actor}")
    if plan.actors * plan.gpus_per_actor * plan.num_groups != plan.learners:
        raise ValueError(f"oat pairs every learner with an actor GPU: {plan.actors} actor(s) × {plan.gpus_per_actor} "
                         f"GPU(s) for {plan.learners} learner(s); change --num_gpus_per_actor or --gpus")


def _check_rollout(plan: Plan) -> None:
    if plan.rollout_batch_size % (plan.learners * plan.rollout_per_device):
        raise ValueError(f"--rollout_batch_size {plan.rollout_batch_size} is not a multiple of "
                         f"{plan.learners} learner(s) × --rollout_batch_size_per_device {plan.rollout_per_device}")


def _check_buffer(plan: Plan) -> None:
    if plan.buffer < plan.samples_per_round:
        raise ValueError(
            f"each learner collects {plan.samples_per_round} samples per learning round but keeps only the last "
            f"--pi_buffer_maxlen_per_device {plan.buffer}: set --pi_buffer_maxlen_per_device {plan.samples_per_round}"
        )
    if plan.buffer > plan.samples_per_round and plan.buffer_clear_every != 1:
        raise ValueError(
            f"--pi_buffer_maxlen_per_device {plan.buffer} would keep samples of earlier rounds beside the "
            f"{plan.samples_per_round} new ones and train on them again: set it to {plan.samples_per_round} "
            "(or --buffer_clear_every 1)"
        )


def _check_minibatches(plan: Plan) -> None:
    if plan.grad_acc_step < 1 or plan.train_batch_size != plan.micro_batch * plan.grad_acc_step * plan.learners:
        raise ValueError(f"--train_batch_size {plan.train_batch_size} is not a multiple of "
                         f"{plan.learners} learner(s) × --train_batch_size_per_device {plan.micro_batch}")
    if plan.samples_per_round % plan.minibatch:
        raise ValueError(
            f"each learner's {plan.samples_per_round} samples per round do not split into minibatches of "
            f"{plan.minibatch} (train_batch_size / learners): make --rollout_batch_size a multiple of "
            "--train_batch_size"
        )


def logits_memory(args, shape: ModelShape | None) -> tuple[float | None, str]:
    """GiB of one micro-batch's logits path, and how it was worked out; None without the model's ``shape``.

    N = ``train_batch_size_per_device × (prompt_max_length + generate_max_length)`` tokens. With bf16/fp16 weights:
    the ``[N, V]`` logits, the fp32 copies the chunked log-softmax keeps for backward (N × V × (2 + 4) bytes), and
    three fp32 chunks (``logprob_chunk_size × V``) of backward's transients; with fp32 weights, the logits alone.
    Measured on an H100 (``scripts/bench/logits_memory.py``, docs/bench): 0.89–1.02 × this in bf16 (six sizes),
    0.81 × in fp32.
    """
    if shape is None:
        return None, "no model shape"
    vocab = shape.vocab
    tokens = args.train_batch_size_per_device * (args.prompt_max_length + args.generate_max_length)
    if args.bf16 or args.fp16:
        chunk = getattr(args, "logprob_chunk_size", 1024)
        gib = (tokens * vocab * (2 + 4) + 3 * chunk * vocab * 4) / 2**30
        return gib, f"{tokens} tokens × V={vocab} × (2 B logits + 4 B fp32 copies) + 3 fp32 chunks of {chunk} rows"
    return tokens * vocab * 4 / 2**30, f"{tokens} tokens × V={vocab} × 4 B fp32 logits"


def render_plan(plan: Plan) -> str:
    """The plan as the lines ``--dry_run`` prints."""
    placement = "actors and learners share every GPU" if plan.collocate else "actors and learners on separate GPUs"
    lines = [
        f"node: {plan.gpus} GPU(s), {placement}: {plan.actors} actor(s) × {plan.gpus_per_actor} GPU, "
        f"{plan.learners} learner(s)",
        f"per learner and actor step: {plan.rollout_per_device} turn samples from its actor",
        *turns_lines(plan),
        f"learning round (every {plan.actor_steps_per_round} actor step(s)): {plan.samples_per_round} samples per "
        f"learner, buffer {plan.buffer}",
        f"update: {plan.epochs} epoch(s) × {plan.samples_per_round // plan.minibatch} minibatch(es) of "
        f"{plan.minibatch} = {plan.optimizer_steps_per_round} optimizer step(s) per round; micro-batch "
        f"{plan.micro_batch}, gradient accumulation {plan.grad_acc_step}",
        *([trust_region_line(plan.trust_region, plan.tr_overrides)] if plan.trust_region is not None else []),
        f"run: {plan.actor_steps} actor steps = {plan.rounds} learning round(s) = "
        f"{plan.rounds * plan.optimizer_steps_per_round} optimizer steps (oat lays its learning-rate schedule over "
        f"{plan.scheduled_optimizer_steps}: max_train / train_batch_size)",
        f"evaluation: {_schedule(plan.eval_every_rounds, 'before training, ')}",
        f"model saved: {_schedule(plan.save_every_rounds, '')}",
        head_line(plan),
        *plan_lora_lines(plan),
        *price_lines(plan),
    ]
    return "\n".join(lines)


def turns_lines(plan: Plan) -> list[str]:
    """The turns of the episodes an actor step plays, per env id, each number with its source (none before
    :func:`priced_plan` resolved them)."""
    if plan.slot_turns is None:
        return []
    parts = []
    for turns in {slot.env_id: slot for slot in plan.slot_turns}.values():
        if turns.limit == 1:
            parts.append(f"{turns.env_id} 1 turn ({turns.limit_note})")
            continue
        mean = turns.mean_note if turns.mean is None else f"{turns.mean:.2f} on average ({turns.mean_note})"
        parts.append(f"{turns.env_id} at most {turns.limit} turns ({turns.limit_note}), {mean}")
    return [f"episodes: {plan.decode_batch} played at once, one vLLM generate call per turn; " + "; ".join(parts)]


def trust_region_line(tr, overrides: tuple[str, ...]) -> str:
    """The preset and the numbers its rule reads: its band first (δ, ε_low and ε_high, or τ_M2: what its mask
    thresholds), each ``--tr_*`` override named beside the preset's own value."""
    from dppo_oat.trust_region import NUMBER_FIELDS, PRESETS, TrustRegion
    from dppo_oat.trust_region.registry import FIELD_SYMBOLS, RULE_TABLE, THRESHOLDS

    rule = RULE_TABLE[tr.rule]
    threshold = ("delta", *THRESHOLDS.get(rule.threshold, ())) if rule.threshold else ()
    band = [name for name in dict.fromkeys(threshold) if name in tr.fields_read]
    others = [name for name in NUMBER_FIELDS if name in tr.fields_read and name not in band]
    preset = TrustRegion.preset(tr.name)

    def value(name: str) -> str:
        given = f" (--tr_{name}; the preset's {getattr(preset, name):g})" if name in overrides else ""
        return f"{FIELD_SYMBOLS[name]} {getattr(tr, name):g}{given}"

    band_text = f"band {', '.join(map(value, band))}" if band else "no band (its mask thresholds nothing)"
    label = PRESETS[tr.name].label or tr.name
    return (f"trust region: --trust_region {tr.name} ({label}, rule {tr.rule}): {band_text}; also reads "
            f"{', '.join(map(value, others))}")


def plan_lora_lines(plan: Plan) -> list[str]:
    """LoRA's line (``--lora_rank`` > 0): its adapters, merge and checkpoint, or why they are not counted."""
    if plan.lora_rank <= 0:
        return []
    if plan.lora is None or plan.shape is None or plan.checkpoint is None:
        return [f"LoRA: rank {plan.lora_rank}, not priced: {plan.lora_note}"]
    gpu = plan.price.gpu if plan.price is not None else None
    return [lora_line(plan.lora, plan.shape, gpu, plan.checkpoint)]


def checkpoint_size(plan: Plan) -> str:
    """The size part of the launcher's line on resumable checkpoints (``", about 24.1 GB each (1.72B parameters)"``,
    under LoRA what they hold), "" where it is not known."""
    if plan.checkpoint is None or plan.shape is None:
        return ""
    what = (f"LoRA rank {plan.lora_rank}: {plan.checkpoint[1]}" if plan.lora is not None
            else f"{plan.shape.parameters / 1e9:.2f}B parameters")
    return f", about {plan.checkpoint[0] / 1e9:.1f} GB each ({what})"


def price_lines(plan: Plan) -> list[str]:
    """The price's lines, or the one line that says which flag gives the model's shape."""
    if plan.price is not None:
        return render_price(plan.price)
    return [f"price: {plan.shape_note}"] if plan.shape is None else []


def head_line(plan: Plan) -> str:
    """What one micro-batch's LM head holds: the fused head's 128 MiB chunks of fp32 logits, or the logits path's
    estimate (an upper bound since the log-softmax runs on the response tokens only)."""
    if plan.logits_gib is None:
        size = "not priced without the model's shape (the price line says which flag gives it)"
    else:
        size = f"at most {plan.logits_gib:.1f} GiB ({plan.logits_note})"
    if plan.lm_head == "fused":
        return ("LM head: fused, chunks of 128 MiB of fp32 logits on the response tokens, never [N, V]; the logits "
                f"path (--lm_head logits) per micro-batch: {size}")
    return f"logits per micro-batch: {size}"


def _schedule(every_rounds: int | None, before: str) -> str:
    if every_rounds is None:
        return "none (--eval_steps <= 0)" if before else "never (--save_steps <= 0)"
    return f"{before}every {every_rounds} learning round(s) and at the end"
