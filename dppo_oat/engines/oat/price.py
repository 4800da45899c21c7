"""A price before launch: the wall time of a learning round and of the whole run, and the learner's peak memory per
GPU, worked out from the plan (:mod:`~dppo_oat.engines.oat.plan`) and each from a named source.

- **The learner** runs at the rate of model FLOPs per second that DPPO's learner on oat reached on a GPU
  (:data:`MEASURED_LEARNER`, a committed row of ``scripts/bench/oat_learner_step.py``). A round's time is its model
  FLOPs (:func:`learner_flops`) over that rate, scaled by the GPU's bf16 peak against the measured GPU's
  (:func:`learner_seconds`): at the measured shape and sequence length this is the measured step time scaled by
  tokens; another shape or length changes the FLOPs per token. Its memory (:func:`learner_memory`) is ZeRO-2's
  states plus the larger of the measured optimizer step and the backward's activations (a formula, not measured).
  Under LoRA (:class:`Lora`) the base is frozen: its bf16 weights only, ZeRO-2's states and the optimizer step for
  the adapters alone, no weight gradient for the base in the FLOPs, the same measured rate (not measured under LoRA).
- **The actors** (vLLM, which has not run on a GPU here) are priced by a stated model: the decode roofline of each
  generate call (:func:`decode_seconds`: the bytes every decode step reads, weights and keys and values, over the
  GPU's bandwidth, or its FLOPs over the bf16 peak if more) divided by an assumed efficiency
  (:data:`ASSUMED_DECODE_EFFICIENCY`, ``--price_decode_efficiency``). An actor step plays episodes in lock-step, one
  generate call per turn, until it has its turn samples (:func:`step_calls`): at most as many calls as the episodes'
  turn limits allow (:func:`episode_turns`), and about as many as their measured mean turns give
  (:data:`MEASURED_TURNS`, where one was measured).

Every sample is taken at its full ``prompt_max_length + generate_max_length`` tokens, so the price is an upper bound
on tokens; a run's real samples are shorter and its time scales with the tokens it has. Not counted: evaluations,
prefill, the weight broadcast to vLLM (LoRA's merge before it is worked out but not added) and vLLM's wake and sleep,
which have not been measured. The model's shape comes from its ``config.json`` where readable (a local folder or the
Hugging Face cache, never the network), else from :data:`SHAPES` by name, else from ``--price_model``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GiB = 2**30


@dataclass(frozen=True)
class GPU:
    """A GPU's dense bf16 peak (FLOP/s), memory bandwidth (B/s) and memory (GiB), with where they come from."""

    name: str
    bf16_flops: float
    bandwidth: float
    memory_gib: float
    source: str


GPUS = {
    "a100": GPU("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12, 80.0,
                "NVIDIA A100 datasheet, SXM 80GB: 312 TFLOP/s bf16 dense, 2,039 GB/s; nvidia-smi: 81,920 MiB"),
    "h100": GPU("NVIDIA H100 80GB HBM3", 989e12, 3.35e12, 79.6,
                "NVIDIA H100 datasheet, SXM: 1,979 TFLOP/s bf16 with sparsity (989 dense), 3.35 TB/s; "
                "nvidia-smi: 81,559 MiB"),
    "h200": GPU("NVIDIA H200", 989e12, 4.8e12, 140.4,
                "NVIDIA H200 datasheet, SXM: 1,979 TFLOP/s bf16 with sparsity (989 dense), 4.8 TB/s; "
                "nvidia-smi: 143,771 MiB"),
}
"""The GPUs the price knows (``--price_gpu``), from their datasheets; nvidia-smi's name picks one by default."""

DEFAULT_GPU = "h200"
"""Priced on when no GPU is named or found: the GPU the learner was measured on."""


@dataclass(frozen=True)
class ModelShape:
    """What the price needs of a decoder-only transformer: vocabulary, width, depth, attention heads (query and
    key-value) of ``head_dim``, the MLP's width, and whether the LM head is the embedding."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool

    @property
    def head_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def decoder_parameters(self) -> int:
        """The layers' weight matrices: q and o (``heads × head_dim`` wide), k and v (``kv_heads × head_dim``),
        the gated MLP's three; norms and biases (under 0.01% for the shapes here) are left out."""
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    @property
    def parameters(self) -> int:
        """Ψ: the decoder, the LM head, and the embedding where it is not the head."""
        return self.decoder_parameters + self.head_parameters * (1 if self.tied else 2)

    @property
    def attention_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one context token in bf16, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """Each layer's weight matrices by their name in Qwen2/Qwen3/Llama models, as ``(in, out)`` features: the
        ones PEFT's LoRA adapts (``--target_modules``)."""
        width, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, width), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (width, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}


SHAPES = {
    "qwen3-1.7b": ModelShape(151_936, 2048, 28, 16, 8, 128, 6144, tied=True),
    "qwen3-1.7b-base": ModelShape(151_936, 2048, 28, 16, 8, 128, 6144, tied=True),
    "octothinker-3b-hybrid-base": ModelShape(128_256, 3072, 28, 24, 8, 128, 8192, tied=True),
    "deepseek-r1-distill-qwen-1.5b": ModelShape(151_936, 1536, 28, 12, 2, 128, 8960, tied=False),
}
"""The shapes of the models the GPU scripts train, from their ``config.json`` on the Hugging Face hub (Qwen/Qwen3-1.7B
and -Base; OctoThinker-3B-Hybrid-Base, which keeps Llama-3.2-3B's; deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B, which
keeps Qwen2.5-Math-1.5B's, with its own LM head), keyed by the model's name in lower case."""


@dataclass(frozen=True)
class MeasuredLearner:
    """One learning step of DPPO's learner on oat, measured on a GPU: its model FLOPs and seconds, the memory at the
    step's start and above it, and the setting it ran in."""

    gpu: str
    gpu_key: str
    commit: str
    source: str
    shape: str
    seconds: float
    model_flops: float
    parameters: int
    start_gib: float
    step_gib: float

    @property
    def flops_per_second(self) -> float:
        return self.model_flops / self.seconds


MEASURED_LEARNER = MeasuredLearner(
    gpu="NVIDIA H200", gpu_key="h200", commit="318a79e", source="docs/bench/oat_learner_step_h200.jsonl",
    shape="Qwen3-1.7B's shape", seconds=8.900584624000004, model_flops=720_987_855_257_600,
    parameters=1_720_574_976, start_gib=38.52545404434204 - 12.820955276489258, step_gib=12.820955276489258,
)
"""``dppo`` of the committed row: 16 sequences of 512 + 1,536 tokens, 2 epochs of 2 optimizer steps, micro-batch 1,
one learner (DeepSpeed ZeRO-2, bf16, gradient checkpointing, the fused head, sdpa attention). Its start (25.7 GiB)
is ZeRO's 16 bytes per parameter; the step's own 12.8 GiB is 8.0 bytes per parameter, the same for oat's PPO learner,
which holds the [N, V] logits: the step peaks at the optimizer step, not in the backward."""

MEASURED_SETTING = {"zero_stage": 2, "bf16": True, "fp16": False, "gradient_checkpointing": True,
                    "adam_offload": False}
"""The flags the learner was measured with; under others its time and memory are not priced."""

ASSUMED_DECODE_EFFICIENCY = 0.5
"""The fraction of the decode roofline vLLM is assumed to reach: an assumption, not measured here (vLLM has not run on
a GPU in this project); this project's own decode reached 0.026 of it (docs/bench/rollout_h200.jsonl, batch 64,
CUDA graphs)."""

CHECK_ROWS = 4
"""Sequences of the learner's no-grad check of π_θ after each update
(``dppo_oat.learner.guard.check_policy_finite``)."""

ACTIVATION_BYTES_PER_LAYER_TOKEN = 34
"""Bytes per token and unit of width of one transformer layer's activations in 16-bit with attention that keeps no
scores (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1 without its
attention-score term)."""


# ------------------------------------------------------------------------------------------------- the model's shape


def shape_from_config(config: dict) -> ModelShape:
    """The shape in a Hugging Face ``config.json`` (``head_dim`` and ``num_key_value_heads`` default as
    transformers' do)."""
    heads = int(config["num_attention_heads"])
    return ModelShape(
        vocab=int(config["vocab_size"]), hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]),
        heads=heads, kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        intermediate=int(config["intermediate_size"]), tied=bool(config.get("tie_word_embeddings", False)),
    )


def read_config(model: str) -> dict | None:
    """``model``'s ``config.json``: a file, a folder's, or the local Hugging Face cache's; None when none is readable
    here (never the network)."""
    path = Path(model).expanduser()
    candidates = [path] if path.suffix == ".json" else [path / "config.json"]
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
        if isinstance(cached, str):
            candidates.append(Path(cached))
    except Exception:  # not a hub id, or no huggingface_hub
        pass
    for candidate in candidates:
        try:
            return json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
    return None


def table_shape(model: str) -> ModelShape | None:
    """The shape of ``model`` (``org/name`` or ``name``, any case) in :data:`SHAPES`."""
    return SHAPES.get(model.rstrip("/").split("/")[-1].lower())


def resolve_shape(pretrain: str, price_model: str | None) -> tuple[ModelShape | None, str]:
    """The shape to price, and where it comes from: ``--price_model`` (a name of :data:`SHAPES` or a
    ``config.json``), else ``--pretrain``'s ``config.json``, else its name in :data:`SHAPES`; None and what to give
    when none of them knows it."""
    give = f"give --price_model with one of {', '.join(SHAPE_NAMES)} or a config.json"
    for model, flag in ((price_model, "--price_model"), (pretrain, "--pretrain")):
        if not model:
            continue
        config = read_config(model)
        if config is not None:
            try:
                return shape_from_config(config), f"{model}'s config.json ({flag})"
            except (KeyError, TypeError, ValueError) as error:
                return None, f"{model}'s config.json ({flag}) does not give a decoder's shape ({error!r}): {give}"
        shape = table_shape(model)
        if shape is not None:
            where = "" if flag == "--price_model" else ", its config.json not readable here"
            return shape, f"the shape table's {model.rstrip('/').split('/')[-1]} ({flag}{where})"
    return None, (f"the shape of {pretrain!r} is not known here (no readable config.json, not in the shape table): "
                  f"{give}")


SHAPE_NAMES = ("Qwen3-1.7B", "Qwen3-1.7B-Base", "OctoThinker-3B-Hybrid-Base", "DeepSeek-R1-Distill-Qwen-1.5B")


def check_price_flags(args) -> None:
    """Refuse, in one line, a ``--price_gpu``, ``--price_model`` or ``--price_decode_efficiency`` the price cannot
    use."""
    gpu = getattr(args, "price_gpu", None)
    if gpu is not None and gpu not in GPUS:
        raise ValueError(f"--price_gpu {gpu!r}: the price knows {', '.join(GPUS)}")
    model = getattr(args, "price_model", None)
    if model is not None and read_config(model) is None and table_shape(model) is None:
        raise ValueError(f"--price_model {model!r} is neither a readable config.json nor one of "
                         f"{', '.join(SHAPE_NAMES)}")
    efficiency = getattr(args, "price_decode_efficiency", ASSUMED_DECODE_EFFICIENCY)
    if not 0 < efficiency <= 1:
        raise ValueError(f"--price_decode_efficiency must be in (0, 1] (a fraction of the decode roofline), got "
                         f"{efficiency}")


# ------------------------------------------------------------------------------------------------------- the GPU


def gpu_key_of(smi_name: str) -> str | None:
    """The :data:`GPUS` key of a GPU as nvidia-smi names it, None for any other (an H100 PCIe is not an SXM H100)."""
    for key, gpu in GPUS.items():
        if smi_name.strip() == gpu.name:
            return key
    return None


def nvidia_smi_gpu() -> str | None:
    """The name nvidia-smi gives this node's first GPU, None without nvidia-smi or a GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def resolve_gpu(price_gpu: str | None, smi_name: str | None) -> tuple[GPU, str]:
    """The GPU to price on and why: ``--price_gpu``, else the one nvidia-smi names, else :data:`DEFAULT_GPU`."""
    if price_gpu:
        return GPUS[price_gpu], f"--price_gpu {price_gpu}"
    if smi_name and gpu_key_of(smi_name):
        return GPUS[gpu_key_of(smi_name)], "nvidia-smi"
    why = f"nvidia-smi's {smi_name} is not in the table" if smi_name else "no --price_gpu, no nvidia-smi"
    return GPUS[DEFAULT_GPU], f"{why}: the learner's measured GPU; --price_gpu {'|'.join(GPUS)}"


# --------------------------------------------------------------------------------------------------- the learner


def learner_flops(shape: ModelShape, grad_sequences: int, no_grad_sequences: int, sequence_tokens: int,
                  head_rows: int, lora: Lora | None = None) -> float:
    """Model FLOPs of a learning round on one learner (``scripts/bench/oat_learner_step.py``'s count; gradient
    checkpointing's recomputation not counted): 2 FLOPs per weight per token forward, 6 with the backward; causal
    attention adds ``L · width · s`` per token (its two products over s/2 earlier positions, 2 FLOPs each); the LM
    head runs on ``head_rows`` rows of each sequence (the response for the fused head, every token for logits):

        6 · (N_dec + L·width·s) · s · grad_sequences + 2 · (N_dec + L·width·s) · s · no_grad_sequences
          + (6 · grad_sequences + 2 · no_grad_sequences) · V·H · head_rows

    Under LoRA (``lora``) the base's matrices and the head are frozen: 4 FLOPs per weight and token with the backward
    (the forward and the gradient of the input, none of the weight) instead of 6, and the adapters' parameters add
    6 per token with the backward, 2 without.
    """
    weight = 4 if lora is not None else 6
    attention = shape.layers * shape.attention_width * sequence_tokens
    decoder = ((weight * grad_sequences + 2 * no_grad_sequences) * shape.decoder_parameters
               + (6 * grad_sequences + 2 * no_grad_sequences) * attention) * sequence_tokens
    adapters = 0 if lora is None else (
        (6 * grad_sequences + 2 * no_grad_sequences) * lora.adapter_parameters * sequence_tokens)
    return decoder + adapters + (weight * grad_sequences + 2 * no_grad_sequences) * shape.head_parameters * head_rows


def learner_seconds(flops: float, gpu: GPU, measured: MeasuredLearner = MEASURED_LEARNER) -> float:
    """Seconds for ``flops`` model FLOPs at the measured learner's rate, scaled by ``gpu``'s bf16 peak over the
    measured GPU's: the achieved fraction of the peak (MFU) is taken to stay what it was measured at."""
    return flops / (measured.flops_per_second * gpu.bf16_flops / GPUS[measured.gpu_key].bf16_flops)


def unmeasured_setting(args) -> str | None:
    """The flags in which the run differs from the measured learner's setting, or None."""
    differs = [f"--{name} {getattr(args, name, value)}" for name, value in MEASURED_SETTING.items()
               if getattr(args, name, value) != value]
    return ", ".join(differs) or None


def zero2_state_bytes(parameters: int, learners: int) -> float:
    """Per GPU under ZeRO-2: bf16 weights, and the bf16 gradients, fp32 master weights and Adam's two moments
    partitioned over the learners, 2Ψ + 14Ψ/N (Rajbhandari et al. 2020, ZeRO, Figure 1's P_os+g); at N = 1 the
    16Ψ the measured learner held at its step's start."""
    return 2 * parameters + 14 * parameters / learners


def optimizer_step_bytes(parameters: int, learners: int, measured: MeasuredLearner = MEASURED_LEARNER) -> float:
    """The optimizer step's memory above the step's start, per GPU: the measured bytes per parameter (DeepSpeed's
    fp32 copy of the gradient partition and its work space), over the N learners' partitions."""
    return measured.step_gib * GiB / measured.parameters * parameters / learners


def activation_bytes(shape: ModelShape, tokens: int) -> float:
    """The backward's activations of one micro-batch of ``tokens`` under gradient checkpointing: every layer's input
    kept (2 bytes × hidden per token and layer) and one layer rebuilt at a time (34 bytes × hidden per token,
    :data:`ACTIVATION_BYTES_PER_LAYER_TOKEN`). A formula, not measured."""
    return tokens * shape.hidden * (2 * shape.layers + ACTIVATION_BYTES_PER_LAYER_TOKEN)


# ---------------------------------------------------------------------------------------------------- the actors


def decode_seconds(shape: ModelShape, gpu: GPU, batch: int, prompt: int, response: int, gpus: int = 1) -> float:
    """The decode roofline of one generate call: ``batch`` sequences of ``prompt`` tokens, each decoding
    ``response`` tokens on ``gpus`` GPUs (tensor parallel). Each of the ``response`` steps reads the weights once
    (2 bytes each) and every sequence's keys and values so far; the time is the larger of those bytes over the
    bandwidth and the steps' FLOPs (2 per weight and token, 4 · L · width per token and context token) over the bf16
    peak. Prefill is not counted."""
    context_tokens = response * prompt + response * (response - 1) // 2  # Σ over the steps of each sequence's context
    read_weights = shape.decoder_parameters + shape.head_parameters
    bytes_read = response * 2 * read_weights + batch * context_tokens * shape.kv_bytes_per_token
    flops = batch * (2 * read_weights * response + 4 * shape.layers * shape.attention_width * context_tokens)
    return max(bytes_read / (gpu.bandwidth * gpus), flops / (gpu.bf16_flops * gpus))


def concurrent_sequences(shape: ModelShape, gpu: GPU, vllm_gpu_ratio: float, sequence_tokens: int,
                         gpus: int = 1) -> int:
    """How many sequences of ``sequence_tokens`` vLLM holds at once: its share of the GPUs' memory
    (``--vllm_gpu_ratio``) less the bf16 weights, over one sequence's keys and values."""
    cache = vllm_gpu_ratio * gpu.memory_gib * GiB * gpus - 2 * shape.parameters
    return max(int(cache // (sequence_tokens * shape.kv_bytes_per_token)), 0)


def duration(seconds: float) -> str:
    """``seconds`` as s, min or h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    days = f" ({seconds / 86400:.1f} days)" if seconds >= 2 * 86400 else ""
    return f"{seconds / 3600:.1f} h{days}"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------- the episodes' turns


SINGLE_TURN_ENTRY_POINTS = {
    "gem.envs.reasoning_gym:ReasoningGymEnv": "single-turn: Gem's reasoning-gym env ends every episode at its first "
                                              "step",
    "gem.envs.math_env:MathEnv": "single-turn: Gem's math env ends every episode at its first step",
    "envs.math_local:make_local_math_env": "single-turn: a local-math set (Gem's math env) ends every episode at its "
                                           "first step",
}
"""Gem entry points (``module:name``) whose ``step()`` returns ``terminated`` at the first turn (gem-llm 0.1.0's
``ReasoningGymEnv.step`` and ``MathEnv.step``; ``envs/math_local.py``'s env is a ``MathEnv``)."""


@dataclass(frozen=True)
class MeasuredTurns:
    """A measured mean of turns per episode, the turn limit it was measured under, and where it comes from."""

    mean: float
    limit: int
    source: str


_TINY_POLICY_SUDOKU = MeasuredTurns(
    52_962 / 4_608, 15,
    "measured: 52,962 turns in 4,608 episodes of the tiny CPU policy, notebooks/example_runs/*/metrics.jsonl (six "
    "local-engine runs of 24 RL steps on game:Sudoku-v0-easy-compact-wrong: Sudoku-v0-easy's puzzles and 15-turn "
    "limit, a compact board), not with the model priced, whose episodes may be longer or shorter",
)
MEASURED_TURNS = {"game:Sudoku-v0-easy": _TINY_POLICY_SUDOKU, "game:Sudoku-v0-easy-compact-wrong": _TINY_POLICY_SUDOKU}
"""Measured mean turns per episode by env id, each with its source; an env id not here has no measured mean."""


@dataclass(frozen=True)
class EpisodeTurns:
    """The turns an episode of ``env_id`` plays: at most ``limit``, ``mean`` on average (None: no measured mean),
    each with where it comes from."""

    env_id: str
    limit: int
    limit_note: str
    mean: float | None
    mean_note: str


def entry_point_name(entry) -> str:
    """A Gem entry point as ``module:name`` (it is registered as that string, or as the callable)."""
    if isinstance(entry, str):
        return entry
    return f"{getattr(entry, '__module__', '')}:{getattr(entry, '__qualname__', repr(entry))}"


def positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


PROBE_RESETS = 8
"""Resets of a made env whose ``max_turns`` is read (an env may draw its limit at each reset)."""


def env_turn_limit(env_id: str, env_seed: int = 42) -> tuple[int | None, str]:
    """The turn limit of ``env_id``'s own episodes and where it comes from: 1 for a single-turn entry point
    (:data:`SINGLE_TURN_ENTRY_POINTS`, and any ``local-math:`` id); else its Gem registration's ``max_turns``; else,
    for an env of this project or a plugin (Gem's own are never made here: some load data over the network), the
    ``max_turns`` it holds after each of :data:`PROBE_RESETS` resets, made as the actor makes it
    (``gem.make(env_id, seed=env_seed)``; where it draws one per episode, the largest seen); None, and why, where
    none is known."""
    try:
        from gem.envs.registration import ENV_REGISTRY

        import envs  # registers the project's ids
    except ImportError as error:
        return None, f"Gem is not importable here ({error})"
    spec = ENV_REGISTRY.get(env_id)
    if spec is None and env_id.startswith(f"{envs.LOCAL_MATH_PREFIX}:"):
        return 1, SINGLE_TURN_ENTRY_POINTS["envs.math_local:make_local_math_env"]
    if spec is None:
        return None, f"{env_id} is not registered here"
    entry = entry_point_name(spec.entry_point)
    if entry in SINGLE_TURN_ENTRY_POINTS:
        return 1, SINGLE_TURN_ENTRY_POINTS[entry]
    if positive_int(spec.kwargs.get("max_turns")):
        return spec.kwargs["max_turns"], "its own limit, Gem's registration"
    if entry.startswith("gem."):
        return None, f"{env_id}'s Gem registration gives no fixed turn limit"
    limits, why = probed_turn_limits(env_id, env_seed)
    if not limits or not all(positive_int(limit) for limit in limits):
        return None, why or f"{env_id} has no turn limit of its own"
    if len(set(limits)) == 1:
        return limits[0], "its own limit, the env's max_turns"
    return max(limits), f"its own limit, drawn per episode: {min(limits)} to {max(limits)} over {len(limits)} " \
                        "resets, the largest seen"


def probed_turn_limits(env_id: str, env_seed: int) -> tuple[list, str]:
    """``max_turns`` of ``env_id`` made with ``env_seed`` after each of :data:`PROBE_RESETS` resets (seeds 0, 1,
    ...), or ``[]`` and why it could not be made or reset here."""
    import gem

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            env = gem.make(env_id, seed=env_seed)
    except Exception as error:  # a plugin's constructor: the dry run's env check says more
        return [], f"{env_id} could not be made here ({type(error).__name__})"
    limits = []
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for seed in range(PROBE_RESETS):
                env.reset(seed=seed)
                limits.append(getattr(env.unwrapped, "max_turns", None))
    except Exception as error:
        return [], f"{env_id} could not be reset here ({type(error).__name__})"
    finally:
        with contextlib.suppress(Exception):
            env.close()
    return limits, ""


def episode_turns(env_id: str, own: int | None, own_note: str, max_turns: int | None = None,
                  measured: dict[str, MeasuredTurns] = MEASURED_TURNS) -> EpisodeTurns:
    """The turns the actor's collector lets an episode of ``env_id`` play and the measured mean at that limit.

    The env ends its episodes at its own limit ``own`` (None: none known, ``own_note`` says why) and the collector at
    ``--max_turns`` when given, else, for an env without a limit, at ``DEFAULT_MAX_TURNS``
    (``EpisodeCollector.turn_cap``). The mean is :data:`MEASURED_TURNS`'s where it was measured at the same limit;
    a 1-turn limit is 1 turn."""
    from dppo_oat.settings.spec import DEFAULT_MAX_TURNS

    if own is not None and (max_turns is None or own <= max_turns):
        limit, note = own, own_note
    elif max_turns is not None:
        limit, note = max_turns, "--max_turns" + (f", below {own_note}'s {own}" if own is not None else "")
    else:
        limit, note = DEFAULT_MAX_TURNS, f"the actor's cap for an env without a limit ({own_note})"
    if limit == 1:
        return EpisodeTurns(env_id, 1, note, 1.0, "one turn")
    found = measured.get(env_id)
    if found is None:
        return EpisodeTurns(env_id, limit, note, None, "no measured mean")
    if found.limit != limit:
        return EpisodeTurns(env_id, limit, note, None,
                            f"no measured mean at a {limit}-turn limit (measured at {found.limit})")
    return EpisodeTurns(env_id, limit, note, found.mean, found.source)


@dataclass(frozen=True)
class StepCalls:
    """vLLM generate calls of one actor step and the episode turns they decode (one sequence each): at most, for any
    episode lengths within the turn limits, and expected at the measured mean turns (None without one)."""

    bound_calls: int
    bound_sequences: int
    expected_calls: float | None
    expected_sequences: float | None


def step_calls(wanted: int, slots: Sequence[EpisodeTurns]) -> StepCalls:
    """The generate calls of an actor step that wants ``wanted`` turn samples, playing one episode in each of
    ``slots`` at a time as ``DPPOGemActor.collect_transitions`` does: rounds of ``B = len(slots)`` episodes in
    lock-step (one call per turn over the episodes still running, one sample per episode and turn) until it holds
    ``wanted`` samples.

    Bound, for any lengths within the limits, each episode playing at least one turn: the rounds before the last hold
    at most ``wanted − 1`` samples, and a round of c calls (its longest episode's turns, at most the longest limit L)
    holds at least ``c + B − 1``; with ``wanted − 1 = k·(L + B − 1) + r`` they make at most
    ``k·L + max(0, r − B + 1)`` calls, and the last round at most L calls of at most Σ limits samples; no call
    decodes more than B sequences.
    Expected: every episode plays its mean turns T_j, a round makes ``max_j T_j`` calls of ``Σ_j T_j`` samples, and
    the step plays ``ceil(wanted / Σ_j T_j)`` rounds.
    """
    batch, longest = len(slots), max(slot.limit for slot in slots)
    rounds, left = divmod(wanted - 1, longest + batch - 1)
    bound_calls = rounds * longest + max(0, left - batch + 1) + longest
    bound_sequences = min(wanted - 1 + sum(slot.limit for slot in slots), bound_calls * batch)
    means = [slot.mean for slot in slots]
    if any(mean is None for mean in means):
        return StepCalls(bound_calls, bound_sequences, None, None)
    per_round = sum(means)
    played = math.ceil(wanted / per_round - 1e-9)  # the tolerance: a whole number of rounds stays whole
    return StepCalls(bound_calls, bound_sequences, played * max(means), played * per_round)


# ------------------------------------------------------------------------------------------------------------ LoRA


OAT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "up_proj", "gate_proj")
"""oat 0.2.4's default ``--target_modules`` (``oat/args.py``): every attention and MLP projection."""


@dataclass(frozen=True)
class Lora:
    """LoRA adapters (``--lora_rank`` > 0) as the price counts them: rank r, the projections they adapt in every
    layer, the adapters' parameters (r·(in + out) per adapted matrix, A and B) and the base weights they adapt (the
    matrices a merge writes)."""

    rank: int
    modules: tuple[str, ...]
    adapter_parameters: int
    adapted_parameters: int


def lora_of(args, shape: ModelShape) -> tuple[Lora | None, str]:
    """The run's adapters (None without ``--lora_rank``), or None and why they cannot be counted: a
    ``--target_modules`` naming other modules than the projections of :attr:`ModelShape.projections` (PEFT's
    ``all-linear`` is all of them: it leaves out the LM head)."""
    rank = getattr(args, "lora_rank", 0) or 0
    if rank <= 0:
        return None, ""
    targets = getattr(args, "target_modules", OAT_TARGET_MODULES)
    names = (targets,) if isinstance(targets, str) else tuple(targets or ())
    projections = shape.projections
    if names == ("all-linear",):
        names = tuple(projections)
    unknown = [name for name in names if name not in projections]
    if unknown or not names:
        return None, (f"--target_modules {' '.join(map(str, targets or ())) or 'None'}: the price counts adapters "
                      f"on {', '.join(projections)} or all-linear")
    adapters = sum(rank * sum(projections[name]) for name in names) * shape.layers
    adapted = sum(projections[name][0] * projections[name][1] for name in names) * shape.layers
    return Lora(rank, names, adapters, adapted), ""


def merge_flops(lora: Lora) -> float:
    """FLOPs of oat's merge before a weight broadcast and its unmerge after: ``s·B·A`` of every adapted matrix, 2·r
    FLOPs per weight, twice."""
    return 2 * 2 * lora.rank * lora.adapted_parameters


MERGE_BYTES_PER_WEIGHT = 24
"""GPU memory traffic of the merge and unmerge per adapted bf16 weight: PEFT 0.15's ``get_delta_weight`` writes
``B @ A`` (2 bytes), reads and writes it scaled (4), and the merge reads the weight and the delta and writes the
weight (6): 12 bytes, twice."""


def checkpoint_bytes(shape: ModelShape, lora: Lora | None, half: bool, zero_stage: int) -> tuple[float, str]:
    """Bytes of one resumable checkpoint and what they hold, as DeepSpeed 0.16.8's ``save_checkpoint`` writes it
    (``exclude_frozen_parameters`` False, as the learner calls it): the module's state dict, every parameter in the
    weights' dtype (2 bytes in bf16 or fp16, 4 in fp32); ZeRO's fp32 partition and Adam's two moments of every
    trained parameter (12 bytes); and, where ZeRO partitions the gradients (stage 2 and up), a copy of every frozen
    parameter (``frozen_param_fragments``). Full fine-tuning: 14 bytes per parameter in bf16, 16 in fp32."""
    weight = 2 if half else 4
    if lora is None:
        return (weight + 12) * shape.parameters, f"{weight + 12} bytes per parameter"
    copies = 2 if zero_stage >= 2 else 1
    again = f", DeepSpeed's copy of every frozen parameter under ZeRO-{zero_stage} ({weight}Ψ again)" if copies > 1 \
        else ""
    return weight * shape.parameters * copies + (weight + 12) * lora.adapter_parameters, (
        f"the state dict of base and adapters ({weight}(Ψ + Ψ_A)){again}, and the adapters' fp32 master weights and "
        "Adam's moments (12Ψ_A)")


# ------------------------------------------------------------------------------------------------- the whole price


@dataclass(frozen=True)
class LearnerMemory:
    """The learner's peak memory per GPU (bytes): a frozen base's weights (LoRA; 0 otherwise), ZeRO-2's states of the
    ``trained`` parameters plus the larger of the optimizer step's and the backward's, against what the GPU leaves
    the learner."""

    frozen: float
    states: float
    step: float
    backward: float
    logits: float
    micro_batch_tokens: int
    available_gib: float
    available_note: str
    trained: int

    @property
    def peak(self) -> float:
        return self.frozen + self.states + max(self.step, self.backward)


@dataclass(frozen=True)
class Price:
    """The priced run: per learning round the actors' seconds at most and at the measured mean turns (None where not
    priced or no mean was measured: the note says why), the learner's seconds (None where not priced), the run's
    rounds, the learner's memory per GPU (:class:`LearnerMemory`, None where not priced), and how far the actors
    play ahead (``--max_staleness``)."""

    shape: ModelShape
    shape_note: str
    gpu: GPU
    gpu_note: str
    sample_tokens: tuple[int, int]
    actor_seconds: float | None
    actor_note: str
    learner_seconds: float | None
    learner_note: str
    rounds: int
    memory: LearnerMemory | None
    actor_expected_seconds: float | None = None
    max_staleness: int = 0

    @property
    def round_seconds(self) -> float | None:
        """Actors, then learner, where oat's synchronous loop waits for each; the longer of the two where the actors
        play ahead (``--max_staleness`` k ≥ 1: round t + 1's actor steps while round t is learned)."""
        return overlapped(self.actor_seconds, self.learner_seconds, self.max_staleness)

    @property
    def expected_round_seconds(self) -> float | None:
        """:attr:`round_seconds` with the actors at the measured mean turns."""
        return overlapped(self.actor_expected_seconds, self.learner_seconds, self.max_staleness)

    @property
    def run_seconds(self) -> float | None:
        """The run's seconds (:func:`run_time`)."""
        return run_time(self.actor_seconds, self.learner_seconds, self.rounds, self.max_staleness)

    @property
    def expected_run_seconds(self) -> float | None:
        """:attr:`run_seconds` with the actors at the measured mean turns."""
        return run_time(self.actor_expected_seconds, self.learner_seconds, self.rounds, self.max_staleness)


def overlapped(actor: float | None, learner: float | None, max_staleness: int) -> float | None:
    """A learning round's seconds: synchronous (k = 0) the actors then the learners, ``actor + learner``; with the
    actors up to k ≥ 1 rounds ahead the two overlap, ``max(actor, learner)``. None where either is not priced."""
    if actor is None or learner is None:
        return None
    return actor + learner if max_staleness == 0 else max(actor, learner)


def run_time(actor: float | None, learner: float | None, rounds: int, max_staleness: int) -> float | None:
    """Seconds of ``rounds`` learning rounds: synchronous ``rounds × (actor + learner)``; with k ≥ 1
    ``rounds × max + min``: the first round's actors play before any learner trains, the last round's learner after
    every actor step. None where either is not priced."""
    per_round = overlapped(actor, learner, max_staleness)
    if per_round is None:
        return None
    return rounds * per_round + (min(actor, learner) if max_staleness else 0.0)


def price_of(plan, args, shape: ModelShape, shape_note: str, smi_name: str | None = None) -> Price:
    """The price of ``plan`` (:class:`~dppo_oat.engines.oat.plan.Plan`, its turns resolved) for ``args`` and the
    model's ``shape``; ``smi_name``: the GPU nvidia-smi names, used when ``--price_gpu`` is not given."""
    gpu, gpu_note = resolve_gpu(getattr(args, "price_gpu", None), smi_name)
    tokens = (args.prompt_max_length, args.generate_max_length)
    actor_seconds, actor_expected, actor_note = actor_price(plan, args, shape, gpu)
    actors = dict(actor_seconds=actor_seconds, actor_expected_seconds=actor_expected, actor_note=actor_note)
    unmeasured = unmeasured_setting(args)
    if unmeasured or (plan.lora_rank > 0 and plan.lora is None):
        why = (f"not measured with {unmeasured} (the learner was measured with ZeRO-2, bf16, gradient "
               "checkpointing and no Adam offload)" if unmeasured else f"not priced: {plan.lora_note}")
        return Price(shape, shape_note, gpu, gpu_note, tokens, learner_seconds=None, learner_note=why,
                     rounds=plan.rounds, memory=None, **actors)
    seconds, learner_note = learner_price(plan, shape, gpu, tokens)
    return Price(shape, shape_note, gpu, gpu_note, tokens, learner_seconds=seconds, learner_note=learner_note,
                 rounds=plan.rounds, memory=learner_memory(plan, args, shape, gpu, sum(tokens)),
                 max_staleness=getattr(args, "max_staleness", 0), **actors)


def actor_price(plan, args, shape: ModelShape, gpu: GPU) -> tuple[float | None, float | None, str]:
    """Seconds of vLLM decode per learning round on one actor, at most and at the measured mean turns (None without
    one), and how: each actor step's generate calls (:func:`step_calls`), each at the decode roofline over the
    assumed efficiency, in as many waves as vLLM's cache holds sequences. A call of the bound of k ≤ B sequences
    (B episodes played at once) is priced on the roofline's chord from 1 to B sequences, which lies above the
    roofline (a maximum of two affine functions of k) and grows with both calls and sequences:
    ``C·f(1) + (S − C)·(f(B) − f(1))/(B − 1)`` for C calls of S sequences; in several waves, every call at B
    sequences' (fewer sequences never take more waves or larger ones). The expected calls are priced at B
    sequences each."""
    prompt, response = args.prompt_max_length, args.generate_max_length
    ratio = getattr(args, "vllm_gpu_ratio", 0.25)
    held = concurrent_sequences(shape, gpu, ratio, prompt + response, plan.gpus_per_actor)
    if held < 1:
        return None, None, (f"not priced: vLLM's share of the GPU (--vllm_gpu_ratio {ratio} of "
                            f"{gpu.memory_gib:.0f} GiB) does not hold the weights and one sequence of "
                            f"{prompt + response:,} tokens")
    efficiency = getattr(args, "price_decode_efficiency", ASSUMED_DECODE_EFFICIENCY)
    batch, calls = plan.decode_batch, step_calls(plan.rollout_per_device, plan.slot_turns)
    waves = ceil_div(batch, held)

    def decode(sequences: int) -> float:
        return decode_seconds(shape, gpu, sequences, prompt, response, plan.gpus_per_actor)

    full_call = waves * decode(ceil_div(batch, waves))
    if waves > 1 or batch == 1:
        bound = calls.bound_calls * full_call
    else:
        slope = (decode(batch) - decode(1)) / (batch - 1)
        bound = calls.bound_calls * decode(1) + (calls.bound_sequences - calls.bound_calls) * slope
    steps = plan.actor_steps_per_round * (plan.learners // plan.actors)
    expected = None if calls.expected_calls is None else steps * calls.expected_calls * full_call / efficiency
    in_waves = f" in {waves} waves (vLLM's cache holds {held})" if waves > 1 else ""
    return steps * bound / efficiency, expected, (
        f"{steps} actor step(s) of {calls_text(calls, batch, plan.rollout_per_device)}; a call of at most {batch} "
        f"sequence(s){in_waves} × {response:,} tokens at the decode roofline ({roofline_text(shape, gpu)}) ÷ "
        f"{efficiency:g}, an assumed vLLM efficiency (not measured: vLLM has not run on a GPU here; this project's "
        "own decode reached 0.026 of its roofline; --price_decode_efficiency)")


def calls_text(calls: StepCalls, batch: int, wanted: int) -> str:
    """An actor step's generate calls in words: one figure for single-turn episodes, else the bound and the
    expected."""
    if calls.expected_calls == calls.bound_calls and calls.expected_sequences == calls.bound_sequences:
        return f"{calls.bound_calls} generate call(s) of {batch} sequence(s)"
    expected = ("no measured mean turns: the bound only" if calls.expected_calls is None else
                f"about {calls.expected_calls:.1f} calls of {batch} at the measured mean turns")
    return (f"at most {calls.bound_calls} generate calls decoding {calls.bound_sequences} episode turns (one call a "
            f"turn over the {batch} episode(s) played at once, until {wanted} turn samples, any lengths within the "
            f"turn limits), {expected}")


def roofline_text(shape: ModelShape, gpu: GPU) -> str:
    weights_gb = 2 * (shape.decoder_parameters + shape.head_parameters) / 1e9
    return (f"{weights_gb:.2f} GB of weights and {shape.kv_bytes_per_token:,} B per context token of keys and values "
            f"read per step at {gpu.bandwidth / 1e12:g} TB/s")


def learner_price(plan, shape: ModelShape, gpu: GPU, tokens: tuple[int, int]) -> tuple[float, str]:
    """Seconds of one learner's learning round, and how (:func:`learner_flops` at :func:`learner_seconds`'s rate)."""
    sequence = sum(tokens)
    head_rows = sequence if plan.lm_head == "logits" else tokens[1]
    flops = learner_flops(shape, plan.epochs * plan.samples_per_round, min(CHECK_ROWS, plan.samples_per_round),
                          sequence, head_rows, plan.lora)
    measured = MEASURED_LEARNER
    scaled = "" if gpu == GPUS[measured.gpu_key] else f", × {gpu.name}'s bf16 peak ÷ the {measured.gpu}'s"
    alone = (f"; ZeRO-2's traffic between {plan.learners} learners not measured (one learner was)"
             if plan.learners > 1 else "")
    lora = ("; LoRA: the frozen base 4 FLOPs per weight and token with the backward (no weight gradient), the "
            "adapters 6, at full fine-tuning's measured rate (not measured under LoRA)" if plan.lora else "")
    return learner_seconds(flops, gpu), (
        f"{flops / 1e15:,.1f} PFLOP of the model ({plan.epochs} epoch(s) × {plan.samples_per_round} samples × "
        f"{sequence:,} tokens) at the rate of DPPO's oat learner at {measured.shape}, "
        f"{measured.model_flops / 1e12:,.0f} TFLOP in {measured.seconds:.2f} s ({measured.gpu}, commit "
        f"{measured.commit}, {measured.source}){scaled}{alone}{lora}")


def learner_memory(plan, args, shape: ModelShape, gpu: GPU, sequence_tokens: int) -> LearnerMemory:
    """The learner's memory per GPU in its parts: under LoRA the frozen base's bf16 weights and ZeRO-2's states and
    optimizer step of the adapters alone, else of every parameter; the backward holds one micro-batch's activations,
    and the logits path's logits (:func:`~dppo_oat.engines.oat.plan.logits_memory`) when the learner takes them;
    collocated with vLLM without ``--vllm_sleep``, the learner has what ``--vllm_gpu_ratio`` leaves it."""
    logits = (plan.logits_gib or 0.0) * GiB if plan.lm_head == "logits" else 0.0
    tokens = plan.micro_batch * sequence_tokens
    ratio = getattr(args, "vllm_gpu_ratio", 0.25)
    if plan.collocate and not getattr(args, "vllm_sleep", False):
        available, note = gpu.memory_gib * (1 - ratio), f"vLLM keeps --vllm_gpu_ratio {ratio} (no --vllm_sleep)"
    else:
        available, note = gpu.memory_gib, ""
    trained = plan.lora.adapter_parameters if plan.lora else shape.parameters
    return LearnerMemory(
        frozen=2.0 * shape.parameters if plan.lora else 0.0,
        states=zero2_state_bytes(trained, plan.learners), step=optimizer_step_bytes(trained, plan.learners),
        backward=activation_bytes(shape, tokens) + logits, logits=logits, micro_batch_tokens=tokens,
        available_gib=available, available_note=note, trained=trained,
    )


# ------------------------------------------------------------------------------------------------------ rendering


def render_price(price: Price) -> list[str]:
    """The lines ``--dry_run`` prints for the price."""
    shape = price.shape
    prompt, response = price.sample_tokens
    return [
        f"model: {price.shape_note}: {shape.parameters / 1e9:.2f}B parameters, V {shape.vocab:,}, hidden "
        f"{shape.hidden:,}, {shape.layers} layers",
        f"price on {price.gpu.name} ({price.gpu_note}; datasheet: {price.gpu.bf16_flops / 1e12:.0f} TFLOP/s bf16, "
        f"{price.gpu.bandwidth / 1e12:g} TB/s): an estimate, every sample at its full {prompt:,} + {response:,} "
        "tokens, so at most; not counted: evaluations, prefill, weight broadcasts, vLLM's wake and sleep "
        "(not measured)",
        f"  actors per round: {actors_timed(price)}{price.actor_note}",
        f"  learner per round: {timed(price.learner_seconds)}{price.learner_note}",
        f"  run: {run_line(price)}",
        f"  learner memory per GPU: {memory_line(price.memory, price.learner_note)}",
    ]


def timed(seconds: float | None) -> str:
    return "" if seconds is None else f"at most {duration(seconds)}: "


def actors_timed(price: Price) -> str:
    """The actors' time per round: at most, and at the measured mean turns where that differs."""
    if price.actor_seconds is None:
        return ""
    expected = price.actor_expected_seconds
    if expected is None:
        return f"at most {duration(price.actor_seconds)} (no measured mean turns): "
    if math.isclose(expected, price.actor_seconds, rel_tol=1e-9):  # single-turn: the same calls
        return timed(price.actor_seconds)
    return f"at most {duration(price.actor_seconds)}, about {duration(expected)} at the measured mean turns: "


def run_line(price: Price) -> str:
    if price.round_seconds is None:
        return "not priced: " + ("the actors are not" if price.actor_seconds is None else "the learner is not")
    ahead = (f" (actors a round ahead, --max_staleness {price.max_staleness}: the longer of actors and learner a "
             "round)") if price.max_staleness else ""
    line = (f"at most {duration(price.run_seconds)}: {price.rounds} learning round(s) × "
            f"{duration(price.round_seconds)}{ahead}")
    expected = price.expected_round_seconds
    if expected is None or math.isclose(expected, price.round_seconds, rel_tol=1e-9):
        return line
    return (f"{line}; about {duration(price.expected_run_seconds)} at the measured mean turns ({duration(expected)} "
            "a round)")


def memory_line(memory: LearnerMemory | None, learner_note: str) -> str:
    """The peak and its parts, each with its source."""
    if memory is None:
        return learner_note
    measured = MEASURED_LEARNER
    of = f"of {memory.available_gib:.0f} GiB" + (f" ({memory.available_note})" if memory.available_note else "")
    if memory.peak > memory.available_gib * GiB:
        of += ", more than the learner has"
    logits = f" + the logits path's {memory.logits / GiB:.1f} GiB" if memory.logits else ""
    per_parameter = measured.step_gib * GiB / measured.parameters
    lora = memory.frozen > 0
    psi = "Ψ_A" if lora else "Ψ"
    frozen = f"the frozen base's bf16 weights 2Ψ, {memory.frozen / GiB:.1f} GiB, + " if lora else ""
    scaled = ", taken to scale with the trained parameters: not measured under LoRA" if lora else ""
    return (f"about {memory.peak / GiB:.1f} GiB {of} = {frozen}ZeRO-2's states (2 + 14/N){psi}"
            f"{' of the adapters' if lora else ''}, {memory.states / GiB:.1f} GiB, + the larger of the optimizer "
            f"step's {per_parameter:.1f} B × {psi}/N, {memory.step / GiB:.1f} GiB (states and step as measured at "
            f"N = 1: {measured.start_gib:.1f} + {measured.step_gib:.1f} GiB for Ψ = {measured.parameters / 1e9:.2f}B, "
            f"{measured.gpu}, commit {measured.commit}{scaled}), and the backward's {memory.backward / GiB:.1f} GiB "
            f"(not measured: activations of {memory.micro_batch_tokens:,} tokens under gradient checkpointing, "
            f"(2L + 34) × hidden bytes a token{logits})")


def lora_line(lora: Lora, shape: ModelShape, gpu: GPU | None, checkpoint: tuple[float, str]) -> str:
    """What LoRA changes: the adapters, the merge at every broadcast, and what a checkpoint holds."""
    default = " (oat's default --target_modules)" if lora.modules == OAT_TARGET_MODULES else ""
    flops, moved = merge_flops(lora), MERGE_BYTES_PER_WEIGHT * lora.adapted_parameters
    at = ("" if gpu is None else
          f", about {max(flops / gpu.bf16_flops, moved / gpu.bandwidth) * 1e3:.0f} ms at the {gpu.name}'s roofline")
    return (f"LoRA: rank {lora.rank} on {', '.join(lora.modules)}{default} in {shape.layers} layers: "
            f"{lora.adapter_parameters / 1e6:.1f}M adapter parameters trained (Ψ_A, "
            f"{lora.adapter_parameters / shape.parameters:.1%} of Ψ), the base frozen; at every weight broadcast oat "
            f"merges W + s·BA into the {lora.adapted_parameters / 1e9:.2f}B adapted weights and unmerges after: "
            f"{flops / 1e12:.2f} TFLOP and {moved / 1e9:.1f} GB of GPU memory traffic{at}, and the learner copies "
            f"those weights to host memory and back, 2 × {2 * lora.adapted_parameters / 1e9:.1f} GB (neither is in "
            f"the round's time, as the broadcast is not); a resumable checkpoint holds about "
            f"{checkpoint[0] / 1e9:.1f} GB: {checkpoint[1]}")
