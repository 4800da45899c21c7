"""DPPO's learner step against oat's PPO learner step, on the same batch; prints one JSON object.

Both sides are oat's real learners, set up by oat's own ``_init`` (DeepSpeed ZeRO-2 engine, optimizer, scheduler,
tokenizer) with no actors, as ``tests/oat/test_oat_learner.py`` builds one, and both run their real
``learning_step`` on ONE trajectory batch, collated by their own ``dataset_builder`` from the same transitions:

- ``ppo``: oat's ``PPOLearner.learning_step`` (oat 0.2.4): a no-grad forward over the whole batch for π_θ', then per
  micro-batch a forward with grad, the clipped loss with TIS (``tis_c`` 2, oat's ``PPOArgs`` default) and backward;
  both passes take the model's ``[B, L, V]`` logits, every position (prompt included), and oat's entropy of them.
- ``dppo``: :class:`~dppo_oat.engines.oat.learner.DPPOLearner`, anchored on μ (no π_θ' pass): per micro-batch a
  forward to the last hidden states, the fused head on the response tokens only (``--lm-head logits``: the model's
  logits), DPPO's loss and backward; after the update a no-grad check of π_θ on the first 4 sequences
  (``check_policy_finite``).

Per step, the JSON's ``per_step`` counts what each side forwarded (hooks on the decoder and the LM head, and a
counting wrapper of DPPO's fused head; they change nothing): optimizer steps, sequences and decoder tokens with and
without grad, and the token rows the LM head ran on.

Set up by hand, and nothing else: oat's ``prepare_data`` of the PPO learner is DPPOLearner's (placeholder prompts:
oat's own loads a prompt set from the hub, which no learning step reads); neither learner has held-out seeds, and no
environment is made (``validate_args(check_tasks=False)``), so Gem and its environments' packages need not be
installed; the batch is synthetic (uniform random
tokens, fixed prompt and response lengths, rewards 0/1 in GRPO groups, μ = the initial policy's log-probs + noise);
before every repetition the weights, DeepSpeed's fp32 master copy (``refresh_fp32_params``), the Adam moments and the
shuffling seeds are reset, so every repetition is the same step from the same state. On the CPU the learners run with
the oat engine's own CPU replacements of oat's CUDA-only calls (``dppo_oat.engines.oat.without_cuda``,
``learner_without_cuda``: ``torch.cuda.synchronize``/``set_device``/``current_device`` made CPU-safe, torch's AdamW
over oat's parameter groups in place of DeepSpeed's CUDA FusedAdam, DeepSpeed's JIT shared-memory collective off),
fp32 and gloo in one process per learner. With ``--device cuda`` the learners run bf16 and NCCL with DeepSpeed's
FusedAdam, JIT-compiled by the device's nvcc before they start; on a stock CUDA image (``scripts/gpu/device_check.sh
oat-learner``) where a package is missing, ``oat_gpu_setup.py`` says what stands in, and the row records it: import
stand-ins for vLLM and
``pyarrow.plasma`` (``tests/oat/import_stand_ins``; a learner without actors never calls them), sdpa attention where
flash-attn is missing, torch's fused AdamW where FusedAdam does not compile (``fused_adam.compiled`` false).

The two learners live in two worker processes (spawned, one DeepSpeed world of one rank each), so that each one's
peak memory is its own: on the CPU the peak resident set during the step above the step's start (the kernel's
``VmHWM``, reset by ``/proc/self/clear_refs``; large blocks are unmapped when freed, ``MALLOC_MMAP_THRESHOLD_``), on a
GPU ``torch.cuda.max_memory_allocated`` above the step's start. The parent alternates them: a warm-up step of each,
then ``--reps`` pairs in alternating order; ``dppo_vs_ppo_step_time`` is the median over pairs of DPPO's seconds ÷
PPO's. The workers' OpenMP threads wait passively (``OMP_WAIT_POLICY``, unless set), so that other work on the machine
does not stall a step for seconds at a barrier. Every pair is checked to do the same optimizer steps and the same
number of sequences with gradient, and oat's own GRPO advantages of the batch (``compute_monte_carlo_advantages``)
to equal those DPPO reads.

Each learner's MFU is its own step's model FLOPs (:func:`step_flops`: what it forwarded, gradient checkpointing's
recomputation not counted) per second at the median step time, over the rate of a bf16 8,192³ matrix product
measured on the same GPU before the learners start; ``peak_mem_total_gib`` is the step's peak with the weights,
gradients and optimizer states it holds.

At the default shape (hidden 128, 2 layers) the tied LM head is 19.4M of the model's 19.9M parameters, so the CPU
ratio is what DPPO saves on the head (no π_θ' pass, no prompt rows, no ``[N, V]`` logits) plus the learners' own
overheads; with a real model's decoder the extra pass and the head are a smaller share of a step.

    python scripts/bench/oat_learner_step.py                                   # ~4 min on 2 CPU cores
    python scripts/bench/oat_learner_step.py --device cuda --hidden 2048 --layers 28 --gradient-checkpointing \\
        --prompt-tokens 512 --response-tokens 1536 --micro-batch 1             # Qwen3-1.7B's shape, a GPU node
    python scripts/bench/oat_learner_step.py --out docs/bench/oat_learner_step_cpu.jsonl
    python scripts/bench/oat_learner_step.py --lora-rank 16 ...                # the same under LoRA (peak memory)

With ``--resume-check`` DPPO's learner also takes the oat engine's resume on this device, as
``DPPOLearner.save_checkpoint`` and ``resume`` do it (DeepSpeed's weights, optimizer and schedule, and the learner's
state with its random states): a step, a checkpoint, a second step (the reference); then back at the start under other
seeds, the checkpoint loaded and the second step again. ``resume.deviation`` is the resumed step's distance from the
reference over the second step's own size (L2 norms over the fp32 weights the optimizer updates): 0 when the step is
deterministic, as on the CPU; small where the device's kernels are not; a sizeable fraction of 1 where the checkpoint
lost the optimizer's moments (0.27 on the CPU's smoke shape) or the shuffle's state (0.14).

With ``--dppo-micro-batch`` m DPPO's learner forwards m sequences at once while PPO's keeps ``--micro-batch``: the
memory DPPO's fused head leaves unused (no ``[N, V]`` logits), spent on fewer, larger micro-batches. Both still take
the same optimizer steps on the same sequences, and the core's loss weighs each micro-batch by its share of the
minibatch, so DPPO's loss and gradient norm (``pg_loss``, ``grad_norm``) are those of its micro-batch 1 up to float
rounding; ``per_step.forwards_grad`` counts the micro-batches.

With ``--lora-rank`` r both learners train LoRA adapters (oat's ``--lora_rank``); the row's ``config`` records the
rank and the trainable parameters, so the learner's memory with and without LoRA is two rows of the same shape.
oat's own learner gets DPPO's fix of its learning-rate schedule under LoRA (``match_scheduler_to_groups``: DeepSpeed
drops oat's empty no-decay group after the schedule was built, and oat 0.2.4's first step fails without it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import pickle
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import matmul_flops  # noqa: E402  (after the sys.path setup)
from oat_gpu_setup import (  # noqa: E402  (after the sys.path setup)
    attention_implementation,
    compile_fused_adam,
    flash_attn_installed,
    use_sdpa_for_eager,
    use_torch_fused_adamw,
)

VARIANTS = ("ppo", "dppo")
MMAP_THRESHOLD = "65536"
"""Blocks from 64 KiB up are mapped and unmapped on their own, so the resident set follows what is allocated."""
OMP_WAIT_POLICY = "PASSIVE"
"""OpenMP threads sleep while they wait: on a shared machine a thread that spins at a barrier while its partner is
descheduled stalls a step for seconds (identical steps of 0.1 s took 0.1-5 s with two threads)."""
PPO_TIS_C = 2.0
"""oat's ``PPOArgs.tis_c`` (DPPO's arguments default it to None and refuse it)."""
GiB = 2**30
TARGET_STEP_TIME_RATIO = 0.85
"""DPPO's step time over PPO's that the oat engine aims at on a real model's shape."""
PEAK_SIZE = 8192
"""The side of the bf16 matrix product whose rate is MFU's peak on a GPU."""


# --------------------------------------------------------------------------------------------- policy and batch


def qwen3_overrides(args) -> dict:
    """Qwen3-1.7B's shape rules at ``--hidden``: heads of 128, half as many KV heads, FFN 3 × hidden, tied
    embeddings (``--hidden 2048 --layers 28`` is Qwen3-1.7B's shape)."""
    heads = max(1, args.hidden // 128)
    return dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2), head_dim=128, intermediate_size=3 * args.hidden,
                max_position_embeddings=max(2048, args.prompt_tokens + args.response_tokens))


def build_policy(args, directory: Path):
    """A fresh Qwen3 with ``--vocab`` entries (a small BPE tokenizer for its special tokens), saved to ``directory``."""
    from dppo_oat.models import save_policy, toy_corpus, train_bpe_tokenizer
    from dppo_oat.models.tiny import build_tiny_model, tiny_qwen3_config

    tokenizer = train_bpe_tokenizer(toy_corpus(200), vocab_size=300)
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               bos_token_id=tokenizer.eos_token_id)
    model = build_tiny_model(tiny_qwen3_config(args.vocab, **ids, **qwen3_overrides(args)), seed=0)
    save_policy(model, tokenizer, directory)
    return model


def behavior_logprobs(model, ids: torch.Tensor, prompt: int, device: str, noise: float = 0.05) -> torch.Tensor:
    """μ(a_t): the policy's own log-probs of the response tokens plus a little noise (vLLM's are never exact)."""
    gen = torch.Generator().manual_seed(1)
    model.to(device)
    rows = []
    with torch.no_grad():
        for row in ids.to(device):  # one sequence at a time: [L, V] logits
            logits = model(input_ids=row[None]).logits[0, prompt - 1:-1].float()
            rows.append(logits.log_softmax(-1).gather(-1, row[prompt:, None])[:, 0].cpu())
    model.to("cpu")
    mu = torch.stack(rows)
    return (mu + noise * torch.randn(mu.shape, generator=gen)).clamp(max=0.0)


def transitions(args, model) -> list:
    """The rollout batch as oat's actor hands it over: DPPO's transitions (oat's ``TransitionData`` + advantage),
    rewards 0/1 in groups of ``--group-size``, Dr.GRPO advantages ``R − mean_g R``."""
    from dppo_oat.advantages import group_advantages
    from dppo_oat.engines.oat.data import DPPOTransitionData

    gen = torch.Generator().manual_seed(0)
    length = args.prompt_tokens + args.response_tokens
    ids = torch.randint(0, args.vocab, (args.sequences, length), generator=gen)
    mu = behavior_logprobs(model, ids, args.prompt_tokens, args.device)
    rewards = [float(i % 3 == 0) for i in range(args.sequences)]
    advantages = group_advantages(rewards, [i // args.group_size for i in range(args.sequences)], "drgrpo")
    return [DPPOTransitionData(prompt="", prompt_ids=row[:args.prompt_tokens].tolist(), response="",
                               response_ids=row[args.prompt_tokens:].tolist(), response_logprobs=mu[i].tolist(),
                               rewards=[0.0] * (args.response_tokens - 1) + [reward], loss_mask=True, info={},
                               advantage=float(advantage))
            for i, (row, reward, advantage) in enumerate(zip(ids, rewards, advantages, strict=True))]


# ------------------------------------------------------------------------------------------- learners (workers)


def micro_batch(variant: str, args) -> int:
    """The sequences ``variant``'s learner forwards at once: ``--dppo-micro-batch`` for DPPO's when given (the memory
    its fused head leaves unused, spent on larger micro-batches), else ``--micro-batch``."""
    return args.dppo_micro_batch if variant == "dppo" and args.dppo_micro_batch is not None else args.micro_batch


def learner_argv(args, model_dir: str, save_path: str, variant: str = "ppo") -> list[str]:
    """The oat engine's command line ``variant``'s learner is built from: the GPU scripts' ZeRO-2, learning rate and
    Dr.GRPO aggregation (``critic_type drgrpo``), its :func:`micro_batch`; on the CPU fp32 and oat's eager attention,
    on a GPU bf16 and flash-attn 2 where it is installed (else ``--no-flash_attn``, which :func:`prepare_process`
    turns into sdpa)."""
    on_gpu = args.device.startswith("cuda")
    flash = on_gpu and flash_attn_installed()
    return [
        "--pretrain", model_dir, "--flash_attn" if flash else "--no-flash_attn", "--bf16" if on_gpu else "--no-bf16",
        "--gpus", "1",
        "--zero_stage", "2", *(["--gradient_checkpointing"] if args.gradient_checkpointing else []),
        "--trust_region", args.trust_region, *tr_delta_flags(args), "--lm_head", args.lm_head,
        "--learning_rate", "1e-6", "--lr_scheduler", "constant", "--lr_warmup_ratio", "0",
        "--critic_type", "drgrpo", "--num_ppo_epochs", str(args.epochs),
        "--train_batch_size", str(args.minibatch), "--train_batch_size_per_device", str(micro_batch(variant, args)),
        "--rollout_batch_size", str(args.sequences), "--rollout_batch_size_per_device", str(args.sequences),
        "--pi_buffer_maxlen_per_device", str(args.sequences), "--num_samples", str(args.group_size),
        "--generate_max_length", str(args.response_tokens), "--max_train", "100000", "--token_samples", "0",
        "--save_path", save_path, "--seed", "42", *lora_flags(args),
    ]


def lora_flags(args) -> list[str]:
    """``--lora-rank`` r > 0: both learners train LoRA adapters of rank r (alpha 2r) on oat's default modules."""
    return [] if not args.lora_rank else ["--lora_rank", str(args.lora_rank), "--lora_alpha", str(2 * args.lora_rank)]


def tr_delta_flags(args) -> list[str]:
    """``--tr_delta`` as given, else 0.2 for DPPO-Binary-TV (as ``scripts/gpu/node.sh`` runs it), else the preset's."""
    delta = 0.2 if args.tr_delta is None and args.trust_region == "dppo_binary_tv" else args.tr_delta
    return [] if delta is None else ["--tr_delta", str(delta)]


def import_stand_ins(device: str) -> list[str]:
    """launchpad's stand-in where it is missing (oat imports it; a learning step never uses it), and on a GPU the
    import stand-ins of ``tests/oat/import_stand_ins`` for a missing vLLM and ``pyarrow.plasma``; the names stood in.
    Before anything imports oat."""
    from dppo_oat.engines.oat.launch import stand_in_for_missing_launchpad

    stand_in_for_missing_launchpad()
    if not device.startswith("cuda"):
        return []
    import importlib.util

    spec = importlib.util.spec_from_file_location("stand_ins", ROOT / "tests" / "oat" / "import_stand_ins" /
                                                  "stand_ins.py")
    stand_ins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_ins)
    return stand_ins.install()


def prepare_process(device: str, gpu: dict) -> None:
    """What oat needs in a learner's process here: the import stand-ins; on the CPU the oat rehearsal's learner
    patches (module docstring); on a GPU sdpa for oat's eager attention where flash-attn is missing, and torch's
    fused AdamW where DeepSpeed's FusedAdam did not compile (``gpu``: :func:`gpu_setup`'s facts)."""
    import_stand_ins(device)
    if device == "cpu":
        from dppo_oat.engines.oat.without_cuda import learner_without_cuda

        learner_without_cuda()
        return
    if gpu["attention"] == "sdpa":
        use_sdpa_for_eager()
    if not gpu["fused_adam"]["compiled"]:
        use_torch_fused_adamw()


def gpu_setup(device: str) -> dict:
    """In the parent, before the learners start: the import stand-ins, the attention the learners run, DeepSpeed's
    FusedAdam compiled (on a GPU; the learners load that build) and the bf16 matrix product's rate, MFU's peak."""
    stood_in = import_stand_ins(device)
    if not device.startswith("cuda"):
        return {"import_stand_ins": stood_in, "attention": "eager", "peak_flops": None, "peak_method": None,
                "fused_adam": {"compiled": False, "seconds": 0.0, "header_dirs_added": [],
                               "error": "CPU: torch's AdamW (the oat rehearsal's patch)"}}
    fused_adam = compile_fused_adam()
    progress(f"DeepSpeed FusedAdam: {'compiled' if fused_adam['compiled'] else 'NOT compiled'} in "
             f"{fused_adam['seconds']:.0f} s" + (f" ({fused_adam['error']})" if fused_adam["error"] else ""))
    peak = matmul_flops(device, torch.bfloat16, PEAK_SIZE)
    return {"import_stand_ins": stood_in, "attention": attention_implementation(flash_attn_installed()),
            "fused_adam": fused_adam, "peak_flops": peak,
            "peak_method": f"bf16 {PEAK_SIZE}^3 matrix product on random data, median of 10 (scripts/bench/machine.py)"}


def build_learner(variant: str, args, model_dir: str, save_path: str):
    """oat's ``PPOLearner`` or DPPO's learner, set up by oat's ``_init`` in this process (one learner, no actors)."""
    from oat.algorithms.ppo import PPOLearner
    from oat.utils.launcher import get_free_port

    from dppo_oat.engines.oat.args import validate_args
    from dppo_oat.engines.oat.launch import parse_args
    from dppo_oat.engines.oat.learner import DPPOLearner, EvalSeeds
    from dppo_oat.engines.oat.lora import match_scheduler_to_groups

    def no_held_out_seeds(self, args) -> EvalSeeds:
        """No evaluation: its seeds come from the environments, which need Gem, and no learning step reads them."""
        return EvalSeeds([], args.eval_seed_start, args.num_eval_seeds)

    class OatPPOLearner(PPOLearner):
        """oat's PPO learner; only its prompt set is DPPO's placeholders (oat's own is downloaded)."""

        prepare_data, held_out_seeds = DPPOLearner.prepare_data, no_held_out_seeds

    class BenchDPPOLearner(DPPOLearner):
        """DPPO's learner, without the evaluation's seeds."""

        held_out_seeds = no_held_out_seeds

    oat_args = validate_args(parse_args(learner_argv(args, model_dir, save_path, variant)), check_gpus=False,
                             check_tasks=False)  # no environment is made: Gem need not be installed
    if variant == "ppo":
        oat_args.tis_c = PPO_TIS_C
    cls = OatPPOLearner if variant == "ppo" else BenchDPPOLearner
    learner = cls(1, 0, 0, "127.0.0.1", get_free_port(), True, oat_args, [], None)
    learner._init(oat_args, [])
    if variant == "ppo":  # DPPOLearner does it in its _init; without it oat's first step fails under LoRA
        match_scheduler_to_groups(learner.scheduler)
    return learner


def collate(learner, buffer: list) -> dict:
    """The batch ``PPOLearner.learn`` hands to ``learning_step``: the whole buffer, collated by the learner's own
    ``dataset_builder`` (oat's ``TransitionDataset`` for PPO, DPPO's for DPPO), unshuffled (GRPO groups)."""
    from torch.utils.data import DataLoader

    dataset = learner.dataset_builder(buffer, learner.tokenizer, learner.strategy)
    return next(iter(DataLoader(dataset, batch_size=len(dataset), shuffle=False, collate_fn=dataset.collate_fn)))


def oat_advantages(learner, trajectory: dict) -> list[float]:
    """oat's own GRPO-family advantages of the batch (``critic_type`` drgrpo: ``R − mean_g R``)."""
    final = torch.tensor([r[-1] for r in trajectory["rewards"]], dtype=torch.float32)[:, None]
    return learner.compute_monte_carlo_advantages(final, None).tolist()


class Counters:
    """Per step: decoder forwards (micro-batches) and tokens forwarded with and without grad, sequences with grad, rows
    the LM head ran on (with and without grad)."""

    def __init__(self, learner) -> None:
        import dppo_oat.learner.forward

        module = learner.model.model.module
        self.values = {}
        module.model.register_forward_hook(self._decoder)
        module.get_output_embeddings().register_forward_hook(self._head)
        fused = dppo_oat.learner.forward.fused_head_logprobs

        def counted(hidden, *rest, **kwargs):  # DPPO's fused head reads the weight, not the module
            self.add_head_rows(hidden.shape[0])
            return fused(hidden, *rest, **kwargs)

        dppo_oat.learner.forward.fused_head_logprobs = counted

    def add(self, key: str, value: int) -> None:
        self.values[key] = self.values.get(key, 0) + int(value)

    def _decoder(self, module, inputs, output) -> None:
        batch, length = output[0].shape[:2]
        kind = "grad" if torch.is_grad_enabled() else "no_grad"
        self.add(f"forwards_{kind}", 1)
        self.add(f"decoder_tokens_{kind}", batch * length)
        self.add(f"sequences_{kind}", batch)

    def add_head_rows(self, rows: int) -> None:
        self.add("lm_head_rows", rows)
        self.add(f"lm_head_rows_{'grad' if torch.is_grad_enabled() else 'no_grad'}", rows)

    def _head(self, module, inputs, output) -> None:
        self.add_head_rows(inputs[0].shape[:-1].numel())

    def take(self) -> dict:
        values, self.values = self.values, {}
        return values


def initial_state(learner) -> dict:
    """A copy of the weights after ``_init``."""
    return {name: p.detach().clone() for name, p in learner.model.model.module.named_parameters()}


def reset(learner, start: dict, seed: int) -> None:
    """Back to the state after ``_init``: weights, DeepSpeed's fp32 master copy, zero Adam moments at step 0
    (a fresh Adam), and the seeds of both learners' shuffles (oat: NumPy's; DPPO: its generator)."""
    engine = learner.model.model
    with torch.no_grad():
        for name, parameter in engine.module.named_parameters():
            parameter.copy_(start[name])
    engine.optimizer.refresh_fp32_params()
    inner = engine.optimizer.optimizer
    for state in inner.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                value.zero_()
    for group in inner.param_groups:
        if "step" in group:  # DeepSpeed's FusedAdam counts steps per group
            group["step"] = 0
    np.random.seed(seed)
    torch.manual_seed(seed)
    if hasattr(learner, "shuffle_generator"):
        learner.shuffle_generator.manual_seed(seed)


def resume_check(learner, trajectory: dict, start: dict, folder: Path) -> dict:
    """The oat engine's resume, in one learner just reset to ``start`` (module docstring): seconds to save and load,
    the checkpoint's size, and how far the resumed second step lands from the uninterrupted one's, relative to that
    step's size."""
    from dppo_oat.engines.oat.resume import (
        learner_state,
        read_learner_state,
        restore_learner_state,
        set_random_states,
        write_learner_state,
    )

    engine, tag = learner.model.model, "round_1"
    learner.steps = getattr(learner, "steps", 0)  # oat's run loop sets it; this learner runs no loop
    learner.learning_step(trajectory)
    started = time.perf_counter()
    engine.save_checkpoint(str(folder), tag=tag, save_latest=False)
    write_learner_state(folder / tag, 0, learner_state(learner))
    saved = time.perf_counter() - started
    after_first = trainable_copy(engine)
    learner.learning_step(trajectory)
    reference = trainable_copy(engine)
    step_size = l2_distance(reference, after_first)
    del after_first
    reset(learner, start, seed=7)
    started = time.perf_counter()
    learner.strategy.load_ckpt(engine, str(folder), tag=tag)
    state = read_learner_state(folder / tag, 0)
    restore_learner_state(learner, state)
    set_random_states(state.random_states, learner.shuffle_generator)
    loaded = time.perf_counter() - started
    learner.learning_step(trajectory)
    resumed = trainable_copy(engine)
    return {"deviation": l2_distance(resumed, reference) / max(step_size, 1e-30), "step_l2": step_size,
            "max_abs_weight_diff": max((resumed[n] - reference[n]).abs().max().item() for n in reference),
            "save_seconds": saved, "load_seconds": loaded,
            "checkpoint_gib": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / GiB}


def trainable_copy(engine) -> dict:
    """A copy, on the host, of what the optimizer updates: DeepSpeed's fp32 partitions under ZeRO (a step at the
    bench's learning rate moves a weight far less than bf16 resolves, so the module's bf16 weights would count
    roundings), else the trainable weights in fp32."""
    partitions = getattr(engine.optimizer, "single_partition_of_fp32_groups", None)
    if partitions is not None:
        return {str(i): part.detach().to("cpu", torch.float32, copy=True) for i, part in enumerate(partitions)}
    return {name: p.detach().to("cpu", torch.float32, copy=True)
            for name, p in engine.module.named_parameters() if p.requires_grad}


def l2_distance(a: dict, b: dict) -> float:
    """The L2 norm of ``a − b`` over every weight."""
    return sum(float((a[name] - b[name]).double().pow(2).sum()) for name in a) ** 0.5


def resident_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"{field}:\s+(\d+) kB", status.read()).group(1))


class PeakMemory:
    """Peak bytes above the level at entry (``extra``) and in all (``total``: the weights, gradients and optimizer
    states held before the step included): CUDA's allocator statistics, else the kernel's peak resident set.

    The kernel counts resident pages in per-thread or per-CPU caches that it folds in by batches, so on the CPU both
    readings are exact only to a few pages; a step that allocates less than that can read a few KiB
    below its entry level, and ``extra`` is then reported as 0 (a peak is never below the level it started from)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.extra = self.total = 0

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # VmHWM := VmRSS
            self.base = resident_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.total = torch.cuda.max_memory_allocated()
        else:
            self.total = resident_kib("VmHWM") * 1024
        self.extra = max(0, self.total - self.base)


def timed_step(learner, trajectory: dict, device: str, counters: Counters) -> dict:
    """One ``learning_step``: seconds, peak memory above its start, optimizer steps, what it forwarded."""
    engine = learner.model.model
    steps, skipped = engine.global_steps, engine.skipped_steps
    counters.take()
    learner.model.train()
    with PeakMemory(device) as memory:
        start = time.perf_counter()
        infos = learner.learning_step(trajectory)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    fingerprint = sum(p.detach().double().sum().item() for p in engine.module.parameters())
    return {"seconds": seconds, "peak_bytes": memory.extra, "peak_total_bytes": memory.total,
            "optimizer_steps": engine.global_steps - steps,
            "skipped_steps": engine.skipped_steps - skipped, "pg_loss": float(infos["pg_loss"]),
            "grad_norm": float(infos.get("policy_grad_norm", float("nan"))),
            "weights_after": fingerprint, **counters.take()}


PROFILE_TOP = 12
"""Operations listed per learner by ``--profile``, by their own time on the device (on the CPU: on the host)."""


def own_time_us(event, where: str) -> float:
    """An aggregated profiler event's own time in µs on ``where`` ("device" or "cpu"), across torch's names for it."""
    names = (f"self_{where}_time_total", "self_cuda_time_total") if where == "device" else ("self_cpu_time_total",)
    return next((float(getattr(event, name)) for name in names if hasattr(event, name)), 0.0)


def on_device(event) -> bool:
    """Whether an aggregated profiler event is a GPU kernel (or copy), not a host operation."""
    return str(getattr(event, "device_type", "")).rsplit(".", 1)[-1] in ("CUDA", "PrivateUse1")


def profile_summary(events, wall_seconds: float, on_gpu: bool) -> dict:
    """Where one profiled step's time went: the device's busy fraction (its kernels' own time over the wall time,
    on a GPU) and the :data:`PROFILE_TOP` host operations by the time of the kernels they launched (on a GPU) or by
    their own host time (on the CPU)."""
    where = "device" if on_gpu else "cpu"
    host_ops = [event for event in events if not on_device(event)]
    ranked = sorted(host_ops, key=lambda event: own_time_us(event, where), reverse=True)[:PROFILE_TOP]
    busy = sum(own_time_us(event, "device") for event in events if on_device(event)) / 1e6 if on_gpu else None
    return {"wall_seconds": wall_seconds, "device_busy_seconds": busy,
            "device_busy_fraction": None if busy is None else busy / wall_seconds,
            "host_seconds_all_ops": sum(own_time_us(event, "cpu") for event in host_ops) / 1e6,
            "top": [{"op": event.key[:80], "calls": int(event.count),
                     "own_device_ms": round(own_time_us(event, "device") / 1e3, 3) if on_gpu else None,
                     "own_host_ms": round(own_time_us(event, "cpu") / 1e3, 3)} for event in ranked]}


def profiled_step(learner, trajectory: dict, device: str, counters: Counters) -> dict:
    """One more ``learning_step`` under ``torch.profiler`` (host, and the GPU's kernels on a GPU), summarised by
    :func:`profile_summary`; not one of the timed steps (the profiler slows it)."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=activities) as profiler:
        seconds = timed_step(learner, trajectory, device, counters)["seconds"]
    return profile_summary(profiler.key_averages(), seconds, on_gpu)


def worker(variant: str, args, gpu: dict, model_dir: str, batch_path: str, conn) -> None:
    """One learner's process: build it, then one reset + ``learning_step`` per "step" message from the parent."""
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # DeepSpeed's and oat's prints: stdout carries the JSON only
    try:
        torch.set_num_threads(args.threads)
        prepare_process(args.device, gpu)
        with tempfile.TemporaryDirectory() as save_path:
            learner = build_learner(variant, args, model_dir, save_path)
            with open(batch_path, "rb") as handle:
                trajectory = collate(learner, pickle.load(handle))
            start, counters = initial_state(learner), Counters(learner)
            ready = {"advantages": oat_advantages(learner, trajectory) if variant == "ppo" else None,
                     "trust_region": getattr(learner, "trust_region", None),
                     "trainable": sum(p.numel() for p in learner.model.model.module.parameters() if p.requires_grad)}
            conn.send(("ready", ready))
            while (message := conn.recv()) in ("step", "profile", "resume"):
                reset(learner, start, seed=42)
                if message == "step":
                    conn.send(("step", timed_step(learner, trajectory, args.device, counters)))
                elif message == "resume":
                    conn.send(("resume", resume_check(learner, trajectory, start, Path(save_path) / "resume")))
                else:
                    conn.send(("profile", profiled_step(learner, trajectory, args.device, counters)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class Worker:
    """The parent's handle on a learner's process."""

    def __init__(self, variant: str, args, gpu: dict, model_dir: str, batch_path: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.variant = variant
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker, args=(variant, args, gpu, model_dir, batch_path, child),
                                       daemon=True)
        self.process.start()
        child.close()

    def receive(self):
        try:
            kind, payload = self.conn.recv()
        except EOFError as error:
            self.process.join(timeout=10)
            raise RuntimeError(f"the {self.variant} learner's process ended "
                               f"(exit code {self.process.exitcode})") from error
        if kind == "error":
            raise RuntimeError(f"the {self.variant} learner failed:\n{payload}")
        return payload

    def step(self, message: str = "step") -> dict:
        self.conn.send(message)
        return self.receive()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send("stop")
        self.process.join(timeout=60)


# -------------------------------------------------------------------------------------------------- measurement


def model_shape(model) -> dict:
    """What the FLOP count needs of the policy: vocabulary, hidden size, layers, attention width (heads × head
    dimension), the LM head's parameters and the decoder's (every other parameter; the embedding is tied to the
    head and its lookup costs no FLOPs)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    head = config.vocab_size * config.hidden_size
    decoder = sum(p.numel() for p in model.parameters()) - head * (1 if config.tie_word_embeddings else 2)
    return {"vocab": config.vocab_size, "hidden": config.hidden_size, "layers": config.num_hidden_layers,
            "attention_width": config.num_attention_heads * head_dim, "decoder_parameters": decoder,
            "head_parameters": head}


def step_flops(counts: dict, shape: dict, sequence_length: int) -> float:
    """Model FLOPs of one learner's step from what it forwarded (:class:`Counters`), recomputation (gradient
    checkpointing) not counted: 2 FLOPs per weight per token forward, 6 with its backward; causal attention adds
    2 · L · width · s per token forward (the score and value products, 4 · L · width per earlier position, over s/2
    positions on average); the LM head on the rows it ran:

        6 · (N_dec + L·width·s) · tokens_grad + 2 · (N_dec + L·width·s) · tokens_no_grad
          + 6 · V·H · head_rows_grad + 2 · V·H · head_rows_no_grad
    """
    per_token = shape["decoder_parameters"] + shape["layers"] * shape["attention_width"] * sequence_length
    head = shape["head_parameters"]
    return (6 * per_token * counts.get("decoder_tokens_grad", 0)
            + 2 * per_token * counts.get("decoder_tokens_no_grad", 0)
            + 6 * head * counts.get("lm_head_rows_grad", 0) + 2 * head * counts.get("lm_head_rows_no_grad", 0))


def learner_mfu(pairs: list[dict], facts: dict, sequence_length: int) -> dict:
    """Per learner: model FLOPs of its step, and its MFU at the median step time against the GPU's measured peak
    (None on the CPU, where no peak is measured)."""
    peak = facts["gpu"]["peak_flops"]
    result = {}
    for variant in VARIANTS:
        flops = step_flops(pairs[0][variant], facts["shape"], sequence_length)
        seconds = statistics.median(pair[variant]["seconds"] for pair in pairs)
        result[variant] = {"model_flops_per_step": flops, "achieved_flops": flops / seconds,
                           "mfu": None if not peak else flops / seconds / peak}
    return result


def check_pair(pair: dict) -> None:
    """Both learners took the same optimizer steps on the same number of sequences with gradient, and applied them."""
    ppo, dppo = pair["ppo"], pair["dppo"]
    for key in ("optimizer_steps", "sequences_grad"):
        if ppo.get(key) != dppo.get(key):
            raise AssertionError(f"unequal work: {key} {ppo.get(key)} (ppo) vs {dppo.get(key)} (dppo)")
    if ppo["skipped_steps"] or dppo["skipped_steps"]:
        raise AssertionError(f"skipped steps: {ppo['skipped_steps']} (ppo), {dppo['skipped_steps']} (dppo)")


def measure(args) -> tuple[list[dict], dict]:
    """Warm-up of each learner, then ``args.reps`` pairs in alternating order; the pairs and the set-up facts."""
    started = time.perf_counter()
    gpu = gpu_setup(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, batch_path = Path(tmp) / "policy", Path(tmp) / "batch.pkl"
        model = build_policy(args, model_dir)
        buffer = transitions(args, model)
        facts = {"parameters": sum(p.numel() for p in model.parameters()), "shape": model_shape(model),
                 "gpu": gpu}
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        with open(batch_path, "wb") as handle:
            pickle.dump(buffer, handle)
        workers = {v: Worker(v, args, gpu, str(model_dir), str(batch_path)) for v in VARIANTS}
        try:
            ready = {v: w.receive() for v, w in workers.items()}
            progress(f"learners ready after {time.perf_counter() - started:.0f} s")
            wanted = [t.advantage for t in buffer]
            if not np.allclose(ready["ppo"]["advantages"], wanted, atol=1e-6):
                raise AssertionError(f"oat's advantages {ready['ppo']['advantages']} are not DPPO's {wanted}")
            facts["trust_region"] = ready["dppo"]["trust_region"]
            facts["trainable_parameters"] = ready["dppo"]["trainable"]
            facts["warmup"] = {v: w.step() for v, w in workers.items()}
            progress("warm-up: " + ", ".join(f"{v} {out['seconds']:.2f} s" for v, out in facts["warmup"].items()))
            pairs = []
            for rep in range(args.reps):
                order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
                pair = {v: workers[v].step() for v in order}
                check_pair(pair)
                pairs.append(pair)
                progress(f"pair {rep + 1}/{args.reps}: ppo {pair['ppo']['seconds']:.2f} s, "
                         f"dppo {pair['dppo']['seconds']:.2f} s")
            if args.profile:
                facts["profile"] = {v: w.step("profile") for v, w in workers.items()}
                progress("profiled: " + ", ".join(f"{v} device busy {p['device_busy_fraction']}"
                                                  for v, p in facts["profile"].items()))
            if args.resume_check:
                facts["resume"] = workers["dppo"].step("resume")
                progress(f"resume: deviation {facts['resume']['deviation']:.2e} of the step's size")
        finally:
            for w in workers.values():
                w.close()
    return pairs, facts


def progress(message: str) -> None:
    print(f"oat_learner_step: {message}", file=sys.stderr, flush=True)


def commit(results_file: str | None = None) -> str:
    """``DPPO_COMMIT`` where set (a copy of the checkout without its ``.git``, as on the GPU check's machine); else
    ``git rev-parse --short HEAD``, plus ``-dirty`` when the tree differs from it (untracked files included: this
    script may be one), the file the results are appended to aside."""
    if os.environ.get("DPPO_COMMIT"):
        return os.environ["DPPO_COMMIT"]

    def git(*argv):
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    relative = None if results_file is None else os.path.relpath(os.path.abspath(results_file), ROOT)
    aside = [] if relative is None or relative.startswith("..") else [f":(exclude){relative}"]
    status = subprocess.run(["git", "status", "--porcelain", "--", ".", *aside], cwd=ROOT, capture_output=True,
                            text=True)
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")


def machine(device: str) -> str:
    """The GPU's name, else the CPU's model and core count."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    with contextlib.suppress(OSError, AttributeError):
        with open("/proc/cpuinfo") as cpuinfo:
            name = re.search(r"model name\s*:\s*(.+)", cpuinfo.read()).group(1).strip()
            return f"{name} ({os.cpu_count()} cores)"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def summary(args, pairs: list[dict], facts: dict) -> dict:
    """The JSON object: ratios, medians, peaks, what each step computed, the configuration and the machine."""
    from importlib.metadata import version

    import deepspeed

    def median(variant: str, key: str) -> float:
        return statistics.median(pair[variant][key] for pair in pairs)

    def peak(variant: str, key: str = "peak_bytes") -> int:
        return max(pair[variant][key] for pair in pairs)

    def spread(variant: str) -> float:
        """Relative spread of the weights' sum after the step, warm-up included: 0 when every reset worked."""
        values = [facts["warmup"][variant]["weights_after"]] + [pair[variant]["weights_after"] for pair in pairs]
        return (max(values) - min(values)) / max(abs(statistics.mean(values)), 1e-30)

    counts = ("optimizer_steps", "sequences_grad", "forwards_grad", "forwards_no_grad", "decoder_tokens_grad",
              "decoder_tokens_no_grad", "lm_head_rows", "lm_head_rows_grad", "lm_head_rows_no_grad")
    tr = facts["trust_region"]
    on_gpu = args.device.startswith("cuda")
    return {
        "dppo_vs_ppo_step_time": statistics.median(p["dppo"]["seconds"] / p["ppo"]["seconds"] for p in pairs),
        "ppo_step_seconds": median("ppo", "seconds"),
        "dppo_step_seconds": median("dppo", "seconds"),
        "ppo_peak_mem_gib": peak("ppo") / GiB,
        "dppo_peak_mem_gib": peak("dppo") / GiB,
        "dppo_vs_ppo_peak_mem": peak("dppo") / peak("ppo"),
        "peak_mem_total_gib": {v: peak(v, "peak_total_bytes") / GiB for v in VARIANTS},
        "learners": learner_mfu(pairs, facts, args.prompt_tokens + args.response_tokens),
        "peak_flops": facts["gpu"]["peak_flops"], "peak_method": facts["gpu"]["peak_method"],
        "fused_adam": facts["gpu"]["fused_adam"], "attention": facts["gpu"]["attention"],
        "import_stand_ins": facts["gpu"]["import_stand_ins"], "profile": facts.get("profile"),
        "resume": facts.get("resume"),
        "targets": {"dppo_vs_ppo_step_time": TARGET_STEP_TIME_RATIO},
        "meets_targets": statistics.median(p["dppo"]["seconds"] / p["ppo"]["seconds"] for p in pairs)
        <= TARGET_STEP_TIME_RATIO,
        "memory": ("torch.cuda.max_memory_allocated above the step's start" if on_gpu
                   else "peak resident set above the step's start (VmHWM), one process per learner"),
        "pair_ratios": [p["dppo"]["seconds"] / p["ppo"]["seconds"] for p in pairs],
        "step_seconds": {v: [p[v]["seconds"] for p in pairs] for v in VARIANTS},
        "per_step": {v: {key: pairs[0][v].get(key, 0) for key in counts} for v in VARIANTS},
        "pg_loss": {v: median(v, "pg_loss") for v in VARIANTS},
        "grad_norm": {v: median(v, "grad_norm") for v in VARIANTS},
        "weights_after_step_spread": {v: spread(v) for v in VARIANTS},
        "config": {
            "vocab": args.vocab, "hidden": args.hidden, "layers": args.layers, "parameters": facts["parameters"],
            "lora_rank": args.lora_rank, "trainable_parameters": facts["trainable_parameters"],
            "sequences": args.sequences, "prompt_tokens": args.prompt_tokens, "response_tokens": args.response_tokens,
            "tokens": args.sequences * (args.prompt_tokens + args.response_tokens), "group_size": args.group_size,
            "micro_batch": args.micro_batch, "dppo_micro_batch": micro_batch("dppo", args), "minibatch": args.minibatch,
            "grad_accumulation": args.minibatch // args.micro_batch, "epochs": args.epochs,
            "zero_stage": 2, "dtype": "bfloat16" if on_gpu else "float32",
            "gradient_checkpointing": args.gradient_checkpointing,
            "dppo": {"trust_region": tr.name, "rule": tr.rule, "delta": tr.delta, "lm_head": args.lm_head},
            "ppo": {"cliprange": 0.2, "tis_c": PPO_TIS_C, "lm_head": "logits (oat's use_fused_lm_head off)"},
        },
        "reps": args.reps, "warmup": 1, "device": args.device, "threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "machine": machine(args.device), "commit": commit(args.out), "torch": torch.__version__,
        "deepspeed": deepspeed.__version__, "oat": version("oat-llm"), "transformers": version("transformers"),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def presets_without_topk() -> list[str]:
    """The trust-region presets this synthetic batch can feed (it carries no top-K set of μ)."""
    from dppo_oat.trust_region import PRESETS, TrustRegion

    return [name for name in PRESETS if not TrustRegion.preset(name).uses_topk]


def check_sizes(args) -> None:
    """Whole minibatches and whole GRPO groups (oat's learner and DPPO's both need them)."""
    sizes = {"--sequences": args.sequences, "--minibatch": args.minibatch, "--micro-batch": args.micro_batch,
             "--dppo-micro-batch": micro_batch("dppo", args)}
    for flag, size in sizes.items():
        if size < 1:
            raise SystemExit(f"{flag} must be at least 1, got {size}")
    if args.sequences % args.minibatch or args.minibatch % args.micro_batch:
        raise SystemExit("--sequences must be a multiple of --minibatch, and --minibatch of --micro-batch")
    if args.minibatch % micro_batch("dppo", args):
        raise SystemExit("--minibatch must be a multiple of --dppo-micro-batch")
    if args.sequences % args.group_size:
        raise SystemExit("--sequences must be a multiple of --group-size")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where it runs (default: cuda when available)")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary (Qwen3: 151,936)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (Qwen3-1.7B: 2,048)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (Qwen3-1.7B: 28)")
    parser.add_argument("--sequences", type=int, default=16, help="sequences of the rollout batch")
    parser.add_argument("--group-size", type=int, default=4, help="GRPO group (oat's --num_samples)")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt tokens of every sequence")
    parser.add_argument("--response-tokens", type=int, default=48, help="response tokens of every sequence")
    parser.add_argument("--micro-batch", type=int, default=4, help="oat's --train_batch_size_per_device")
    parser.add_argument("--dppo-micro-batch", type=int, default=None,
                        help="DPPO's learner's own --train_batch_size_per_device (default: --micro-batch): the "
                             "memory its fused head saves, spent on larger micro-batches; the same optimizer steps "
                             "on the same sequences, so the same update up to float rounding")
    parser.add_argument("--minibatch", type=int, default=8, help="oat's --train_batch_size: sequences per step")
    parser.add_argument("--epochs", type=int, default=2, help="oat's --num_ppo_epochs")
    parser.add_argument("--trust-region", default="dppo_binary_tv", choices=presets_without_topk(),
                        help="DPPO's preset (those that need no top-K set from the rollout)")
    parser.add_argument("--tr-delta", type=float, default=None,
                        help="δ (default: 0.2 for dppo_binary_tv, as the GPU scripts run it; else the preset's)")
    parser.add_argument("--lm-head", default="fused", choices=["fused", "logits"], help="DPPO's π_θ path")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="as the GPU scripts run")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="LoRA adapters of this rank (alpha 2r, oat's default modules) on both learners; 0: none")
    parser.add_argument("--reps", type=int, default=5, help="timed pairs, after one warm-up step of each")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads per learner")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed pairs, one profiled step of each learner: where its time went")
    parser.add_argument("--resume-check", action="store_true",
                        help="then DPPO's learner saves a checkpoint, steps, loads it and steps again: the resumed "
                             "step's deviation from the uninterrupted one")
    parser.add_argument("--out", default=None, help="also append the JSON line to this JSONL file")
    args = parser.parse_args()
    check_sizes(args)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)  # read by the workers' allocator at start
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)  # read by the workers' OpenMP at start
    if os.environ.get("CUDA_VISIBLE_DEVICES"):  # one learner of one rank: the first GPU the node exports to us
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
    with contextlib.redirect_stdout(sys.stderr):
        pairs, facts = measure(args)
        report = summary(args, pairs, facts)
    line = json.dumps(report)
    print(line)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()
