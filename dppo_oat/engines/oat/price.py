"""A price before launch: the wall time of a learning round and of the whole run, and the learner's peak memory per
GPU, worked out from the plan (:mod:`~dppo_oat.engines.oat.plan`) and each from a named source.

- **The learner** runs at the rate of model FLOPs per second that DPPO's learner on oat reached on a GPU
  (:data:`MEASURED_LEARNER`, a committed row of ``scripts/bench/oat_learner_step.py``). A round's time is its model
  FLOPs (:func:`learner_flops`) over that rate, scaled by the GPU's bf16 peak against the measured GPU's
  (:func:`learner_seconds`): at the measured shape and sequence length this is the measured step time scaled by
  tokens; another shape or length changes the FLOPs per token. Its memory (:func:`learner_memory`) is ZeRO-2's
  states plus the larger of the measured optimizer step and the backward's activations (a formula, not measured).
- **The actors** (vLLM, which has not run on a GPU here) are priced by a stated model: the decode roofline at the
  planned batch (:func:`decode_seconds`: the bytes every decode step reads, weights and keys and values, over the
  GPU's bandwidth, or its FLOPs over the bf16 peak if more) divided by an assumed efficiency
  (:data:`ASSUMED_DECODE_EFFICIENCY`, ``--price_decode_efficiency``).

Every sample is taken at its full ``prompt_max_length + generate_max_length`` tokens, so the price is an upper bound
on tokens; a run's real samples are shorter and its time scales with the tokens it has. Not counted: evaluations,
prefill, the weight broadcast to vLLM and vLLM's wake and sleep, which have not been measured. The model's shape comes
from its ``config.json`` where readable (a local folder or the Hugging Face cache, never the network), else from
:data:`SHAPES` by name, else from ``--price_model``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
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
                  head_rows: int) -> float:
    """Model FLOPs of a learning round on one learner (``scripts/bench/oat_learner_step.py``'s count; gradient
    checkpointing's recomputation not counted): 2 FLOPs per weight per token forward, 6 with the backward; causal
    attention adds ``L · width · s`` per token (its two products over s/2 earlier positions, 2 FLOPs each); the LM
    head runs on ``head_rows`` rows of each sequence (the response for the fused head, every token for logits):

        6 · (N_dec + L·width·s) · s · grad_sequences + 2 · (N_dec + L·width·s) · s · no_grad_sequences
          + (6 · grad_sequences + 2 · no_grad_sequences) · V·H · head_rows
    """
    per_token = shape.decoder_parameters + shape.layers * shape.attention_width * sequence_tokens
    decoder = (6 * grad_sequences + 2 * no_grad_sequences) * per_token * sequence_tokens
    return decoder + (6 * grad_sequences + 2 * no_grad_sequences) * shape.head_parameters * head_rows


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


# ------------------------------------------------------------------------------------------------- the whole price


@dataclass(frozen=True)
class LearnerMemory:
    """The learner's peak memory per GPU (bytes): ZeRO-2's states plus the larger of the optimizer step's and the
    backward's, against what the GPU leaves the learner."""

    states: float
    step: float
    backward: float
    logits: float
    micro_batch_tokens: int
    available_gib: float
    available_note: str

    @property
    def peak(self) -> float:
        return self.states + max(self.step, self.backward)


@dataclass(frozen=True)
class Price:
    """The priced run: per learning round the actors' and the learner's seconds (None where not priced: the note
    says why), the run's rounds, and the learner's memory per GPU (:class:`LearnerMemory`, None where not priced)."""

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

    @property
    def round_seconds(self) -> float | None:
        """Actors, then learner: oat's synchronous loop waits for each."""
        if self.actor_seconds is None or self.learner_seconds is None:
            return None
        return self.actor_seconds + self.learner_seconds


def price_of(plan, args, shape: ModelShape, shape_note: str, smi_name: str | None = None) -> Price:
    """The price of ``plan`` (:class:`~dppo_oat.engines.oat.plan.Plan`) for ``args`` and the model's ``shape``;
    ``smi_name``: the GPU nvidia-smi names, used when ``--price_gpu`` is not given."""
    gpu, gpu_note = resolve_gpu(getattr(args, "price_gpu", None), smi_name)
    tokens = (args.prompt_max_length, args.generate_max_length)
    actor_seconds, actor_note = actor_price(plan, args, shape, gpu)
    unmeasured = unmeasured_setting(args)
    if unmeasured:
        why = (f"not measured with {unmeasured} (the learner was measured with ZeRO-2, bf16, gradient "
               "checkpointing and no Adam offload)")
        return Price(shape, shape_note, gpu, gpu_note, tokens, actor_seconds, actor_note, None, why, plan.rounds,
                     None)
    seconds, learner_note = learner_price(plan, shape, gpu, tokens)
    return Price(shape, shape_note, gpu, gpu_note, tokens, actor_seconds, actor_note, seconds, learner_note,
                 plan.rounds, learner_memory(plan, args, shape, gpu, sum(tokens)))


def actor_price(plan, args, shape: ModelShape, gpu: GPU) -> tuple[float | None, str]:
    """Seconds of vLLM decode per learning round on one actor, and how: each request of ``rollout_per_device``
    samples is played in generate calls of ``decode_batch`` sequences (episodes in lock-step, one call per turn),
    each at the decode roofline over the assumed efficiency, in as many waves as vLLM's cache holds sequences."""
    prompt, response = args.prompt_max_length, args.generate_max_length
    ratio = getattr(args, "vllm_gpu_ratio", 0.25)
    held = concurrent_sequences(shape, gpu, ratio, prompt + response, plan.gpus_per_actor)
    if held < 1:
        return None, (f"not priced: vLLM's share of the GPU (--vllm_gpu_ratio {ratio} of {gpu.memory_gib:.0f} GiB) "
                      f"does not hold the weights and one sequence of {prompt + response:,} tokens")
    efficiency = getattr(args, "price_decode_efficiency", ASSUMED_DECODE_EFFICIENCY)
    waves = ceil_div(plan.decode_batch, held)
    call = waves * decode_seconds(shape, gpu, ceil_div(plan.decode_batch, waves), prompt, response,
                                  plan.gpus_per_actor) / efficiency
    calls = (plan.actor_steps_per_round * (plan.learners // plan.actors)
             * ceil_div(plan.rollout_per_device, plan.decode_batch))
    in_waves = f" in {waves} waves (vLLM's cache holds {held})" if waves > 1 else ""
    weights_gb = 2 * (shape.decoder_parameters + shape.head_parameters) / 1e9
    return calls * call, (
        f"{calls} generate call(s) of {plan.decode_batch} sequence(s){in_waves} × {response:,} tokens at the decode "
        f"roofline ({weights_gb:.2f} GB of weights and {shape.kv_bytes_per_token:,} B per context token of keys and "
        f"values read per step at {gpu.bandwidth / 1e12:g} TB/s) ÷ {efficiency:g}, an assumed vLLM efficiency (not "
        "measured: vLLM has not run on a GPU here; this project's own decode reached 0.026 of its roofline; "
        "--price_decode_efficiency)")


def learner_price(plan, shape: ModelShape, gpu: GPU, tokens: tuple[int, int]) -> tuple[float, str]:
    """Seconds of one learner's learning round, and how (:func:`learner_flops` at :func:`learner_seconds`'s rate)."""
    sequence = sum(tokens)
    head_rows = sequence if plan.lm_head == "logits" else tokens[1]
    flops = learner_flops(shape, plan.epochs * plan.samples_per_round, min(CHECK_ROWS, plan.samples_per_round),
                          sequence, head_rows)
    measured = MEASURED_LEARNER
    scaled = "" if gpu == GPUS[measured.gpu_key] else f", × {gpu.name}'s bf16 peak ÷ the {measured.gpu}'s"
    alone = (f"; ZeRO-2's traffic between {plan.learners} learners not measured (one learner was)"
             if plan.learners > 1 else "")
    return learner_seconds(flops, gpu), (
        f"{flops / 1e15:,.1f} PFLOP of the model ({plan.epochs} epoch(s) × {plan.samples_per_round} samples × "
        f"{sequence:,} tokens) at the rate of DPPO's oat learner at {measured.shape}, "
        f"{measured.model_flops / 1e12:,.0f} TFLOP in {measured.seconds:.2f} s ({measured.gpu}, commit "
        f"{measured.commit}, {measured.source}){scaled}{alone}")


def learner_memory(plan, args, shape: ModelShape, gpu: GPU, sequence_tokens: int) -> LearnerMemory:
    """The learner's memory per GPU in its parts: the backward holds one micro-batch's activations, and the logits
    path's logits (:func:`~dppo_oat.engines.oat.plan.logits_memory`) when the learner takes them; collocated with
    vLLM without ``--vllm_sleep``, the learner has what ``--vllm_gpu_ratio`` leaves it."""
    logits = (plan.logits_gib or 0.0) * GiB if plan.lm_head == "logits" else 0.0
    tokens = plan.micro_batch * sequence_tokens
    ratio = getattr(args, "vllm_gpu_ratio", 0.25)
    if plan.collocate and not getattr(args, "vllm_sleep", False):
        available, note = gpu.memory_gib * (1 - ratio), f"vLLM keeps --vllm_gpu_ratio {ratio} (no --vllm_sleep)"
    else:
        available, note = gpu.memory_gib, ""
    return LearnerMemory(
        states=zero2_state_bytes(shape.parameters, plan.learners),
        step=optimizer_step_bytes(shape.parameters, plan.learners),
        backward=activation_bytes(shape, tokens) + logits, logits=logits, micro_batch_tokens=tokens,
        available_gib=available, available_note=note,
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
        f"  actors per round: {timed(price.actor_seconds)}{price.actor_note}",
        f"  learner per round: {timed(price.learner_seconds)}{price.learner_note}",
        f"  run: {run_line(price)}",
        f"  learner memory per GPU: {memory_line(price.memory, price.learner_note)}",
    ]


def timed(seconds: float | None) -> str:
    return "" if seconds is None else f"at most {duration(seconds)}: "


def run_line(price: Price) -> str:
    if price.round_seconds is None:
        return "not priced: " + ("the actors are not" if price.actor_seconds is None else "the learner is not")
    return (f"at most {duration(price.rounds * price.round_seconds)}: {price.rounds} learning round(s) × "
            f"{duration(price.round_seconds)}")


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
    return (f"about {memory.peak / GiB:.1f} GiB {of} = ZeRO-2's states (2 + 14/N)Ψ, {memory.states / GiB:.1f} GiB, "
            f"+ the larger of the optimizer step's {per_parameter:.1f} B × Ψ/N, {memory.step / GiB:.1f} GiB (states "
            f"and step as measured at N = 1: {measured.start_gib:.1f} + {measured.step_gib:.1f} GiB for Ψ = "
            f"{measured.parameters / 1e9:.2f}B, {measured.gpu}, commit {measured.commit}), and the backward's "
            f"{memory.backward / GiB:.1f} GiB (not measured: activations of {memory.micro_batch_tokens:,} tokens under "
            f"gradient checkpointing, (2L + 34) × hidden bytes a token{logits})")
