"""The oat engine's preflight: what a GPU node's launch needs of the arguments, the files they name and the node,
checked before anything launches (as the verl engine's :mod:`~dppo_oat.engines.verl.preflight` checks verl's config
before its launch). Every refusal is one ``ValueError`` line that says what to change; nothing here imports oat.

- **Numbers** (:func:`check_numbers`): the ranges oat, DeepSpeed, vLLM, torch and NumPy accept where they take a
  flag's value (:data:`NUMBER_RULES`); out of them a launch fails after the models have loaded (a ZeRO stage 4,
  ``--eval_n 0``, ``--seed -1``), divides by zero (``--sync_params_every 0``, ``--logging_steps 0``) or trains on
  nonsense (a negative learning rate). NaN is refused in every numeric flag.
- **Files** (:func:`check_model_source`, :func:`check_save_path`): ``--pretrain`` (and ``--tokenizer``) where it
  names a local folder, and ``--save_path``.
- **The model** (:func:`check_context_lengths`, :func:`lora_target_problem`), where its ``config.json`` is readable
  here: vLLM's context length against the model's and the lengths a turn needs, and LoRA's ``--target_modules``
  against the modules of its architecture, matched as peft matches them.
- **The optimizer**: oat's learner builds DeepSpeed's ``FusedAdam`` (``DeepSpeedCPUAdam`` with ``--adam_offload``)
  when it starts. The lock's DeepSpeed 0.16.8 has no wheel: installed from source without ``DS_BUILD_FUSED_ADAM=1``
  it compiles the op just in time, at learner start, which needs the CUDA toolkit: ``nvcc`` under torch's
  ``CUDA_HOME``, of the CUDA version torch was built with (DeepSpeed accepts another minor version of CUDA 11 or 12),
  and ninja (importable and on PATH). Without them every learner fails after the models have loaded.
  :func:`optimizer_toolkit` reads the node, :func:`toolkit_problem` says what is missing, :func:`toolkit_line` is the
  dry run's line.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------------------------------------- the numbers


@dataclass(frozen=True)
class Accepts:
    """The values a numeric flag accepts: the interval from ``low`` to ``high`` (each end in it or not), whole numbers
    only where ``integer``, and the few values outside it that mean something (``also``: None, -1, ∞)."""

    low: float
    high: float = math.inf
    low_in: bool = True
    high_in: bool = False
    integer: bool = False
    also: tuple = ()
    meaning: str = ""
    """What the flag is, and what its ``also`` values mean (the message's parenthesis)."""

    def admits(self, value: object) -> bool:
        """Whether ``value`` is one of these (bools are not numbers here)."""
        if any(value is special or value == special for special in self.also):
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not float(value).is_integer():  # also refuses ∞ and NaN
            return False
        above = value >= self.low if self.low_in else value > self.low
        below = value <= self.high if self.high_in else value < self.high
        return above and below  # NaN is neither

    def requirement(self) -> str:
        """``an integer >= 1``, ``a finite number > 0``, ``a number in (0, 1]``, ``... or -1``."""
        if self.high == math.inf:
            kind = "an integer" if self.integer else "a finite number"
            text = f"{kind} {'>=' if self.low_in else '>'} {_number(self.low)}"
        else:
            kind = "an integer" if self.integer else "a number"
            text = (f"{kind} in {'[' if self.low_in else '('}{_number(self.low)}, {_number(self.high)}"
                    f"{']' if self.high_in else ')'}")
        return " or ".join([text, *(str(special) for special in self.also)])


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _whole(low: int, meaning: str, **more) -> Accepts:
    return Accepts(low, integer=True, meaning=meaning, **more)


NUMBER_RULES = {
    "gpus": _whole(1, "GPUs of the node that run an actor and a learner"),
    "sync_params_every": _whole(1, "learning rounds between weight broadcasts to vLLM; oat takes the round modulo it"),
    "eval_n": _whole(1, "episodes per evaluation seed, vLLM's n"),
    "logging_steps": _whole(1, "actor steps between oat's log lines; oat takes the step modulo it"),
    "num_prompt_epoch": _whole(1, "passes over the --max_train samples; 0 trains nothing"),
    "max_epochs": _whole(1, "oat lays its learning-rate schedule over max_train × max_epochs samples"),
    "max_save_num": _whole(1, "saved models kept; below 1 oat deletes the model it is saving, or fails"),
    "max_save_mem": _whole(1, "GB of saved models kept; below 1 oat deletes every saved model, or fails"),
    "shm_size_mb": _whole(1, "MB of oat's shared-memory store between actors and learners"),
    "prompt_max_length": _whole(1, "prompt tokens before an episode is ended"),
    "generate_max_length": _whole(1, "response tokens per turn"),
    "eval_generate_max_length": _whole(1, "response tokens per evaluation turn"),
    "max_model_len": _whole(1, "vLLM's context in tokens; None: the model's own", also=(None,)),
    "groups_per_step": _whole(1, "groups an actor plays per step; None: enough for one batch", also=(None,)),
    "max_turns": _whole(1, "turns an episode may take; None: the environment's own limit", also=(None,)),
    "eval_batch_size": _whole(1, "evaluation items per batch; -1: --rollout_batch_size_per_device", also=(-1,)),
    "logprob_chunk_size": _whole(1, "token rows per chunk of the logits path's log-softmax"),
    "zero_stage": Accepts(0, 3, high_in=True, integer=True, meaning="DeepSpeed's ZeRO stages"),
    "zpg": _whole(0, "DeepSpeed's ZeRO++ partition size"),
    "seed": Accepts(0, 2**32, integer=True, meaning="oat seeds NumPy with it, which takes [0, 2^32)"),
    "master_port": Accepts(0, 65535, high_in=True, integer=True, also=(None,),
                           meaning="the learners' rendezvous port; None or 0: a free one"),
    "buffer_clear_every": _whole(1, "learning rounds between clears of the learners' buffer; inf: never; oat takes "
                                    "the round modulo it", also=(math.inf,)),
    "learning_rate": Accepts(0, low_in=False, meaning="Adam's step size"),
    "max_norm": Accepts(0, meaning="the gradient norm DeepSpeed clips to; 0: no clipping"),
    "l2": Accepts(0, meaning="Adam's weight decay"),
    "adam_beta_1": Accepts(0, 1, meaning="Adam's first-moment decay"),
    "adam_beta_2": Accepts(0, 1, meaning="Adam's second-moment decay"),
    "lr_warmup_ratio": Accepts(0, 1, high_in=True, meaning="the fraction of the schedule spent warming up"),
    "max_step_adjustment": Accepts(0, low_in=False, meaning="scales the optimizer steps the schedule is laid over"),
    "vllm_gpu_ratio": Accepts(0, 1, low_in=False, high_in=True, meaning="the fraction of GPU memory vLLM takes"),
    "lora_dropout": Accepts(0, 1, high_in=True, meaning="torch's dropout probability"),
    "gamma": Accepts(0, 1, high_in=True, meaning="the discount of later rewards"),
}
"""Each numeric flag the oat engine reads (oat's and DPPO's) and the values oat, DeepSpeed, vLLM, torch and NumPy
take for it (out of them a launch fails after the models have loaded, divides by zero, or trains on nonsense); the
flags the plan, the run's spec and the trust region check are theirs (:mod:`~dppo_oat.engines.oat.plan`,
:class:`~dppo_oat.settings.spec.RunSpec`)."""


def check_numbers(args) -> None:
    """Refuse, in one line naming the flag and what it takes, NaN in any numeric flag of ``args`` and any value
    :data:`NUMBER_RULES` does not admit."""
    for name, value in vars(args).items():
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"--{name} is NaN: give a number")
    for name, accepts in NUMBER_RULES.items():
        value = getattr(args, name, accepts)  # a flag these arguments lack is not checked
        if value is not accepts and not accepts.admits(value):
            raise ValueError(f"--{name} must be {accepts.requirement()} ({accepts.meaning}), got {value!r}")


# ------------------------------------------------------------------------------------------------------------ the files


def looks_local(name: str) -> bool:
    """A model name that can only be a path here: absolute, starting with ``.`` or ``~``, or inside a folder that
    exists here (``models/qwen`` where ``models/`` is one). Any other name may be a hub id (``org/name``)."""
    if name.startswith(("/", ".", "~")):
        return True
    parent = Path(name).parent
    return parent != Path(".") and parent.is_dir()


def check_model_source(flag: str, name: str, *, model: bool = True) -> None:
    """``--pretrain`` (``model``) or ``--tokenizer``, which oat's learner and vLLM load as given (no ``~``
    expansion): a folder here must hold a model (the local engine's check: a ``config.json`` object and weights); a
    name that looks local (:func:`looks_local`) must be a folder here; any other name must be a hub id. Whether the
    hub, or the node's cache, has that id is not asked: a dry run stays offline, and it may plan a node other than
    the machine it runs on."""
    path = Path(name)
    if path.is_dir():
        if model:
            from dppo_oat.models.directory import check_model_directory  # one rule for every engine

            check_model_directory(name, path)
        return
    if path.exists():
        raise ValueError(f"{flag} {name} is a file: give the folder that holds the model's config.json")
    if looks_local(name):
        tilde = " (oat and vLLM take the path as given: write $HOME for ~)" if name.startswith("~") else ""
        raise ValueError(f"{flag} {name}: no such folder here{tilde}: give the model's folder, or a hub id "
                         "(org/name)")
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except ValueError as error:  # huggingface_hub's HFValidationError
        reason = " ".join(str(error).split())
        raise ValueError(f"{flag} {name!r} is neither a folder here nor a hub id ({reason})") from None


def check_save_path(save_path: str) -> None:
    """``--save_path``: oat's learner makes ``<save_path>/<run>_<start time>`` in it (as given: no ``~`` expansion)
    before anything else, which fails where ``save_path`` or a folder above it is a file, or the nearest folder that
    exists cannot be written. Makes nothing."""
    path = Path(save_path).absolute()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if existing == path and not path.is_dir():
        raise ValueError(f"--save_path {save_path} is a file: give a folder (oat writes each run into "
                         "<save_path>/<run>_<start time>)")
    if not existing.is_dir():
        raise ValueError(f"--save_path {save_path} cannot be made: {existing} is a file: give another --save_path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--save_path {save_path} cannot be written here ({existing} is not writable): give a folder "
                         "you can write")


# ------------------------------------------------------------------------------------------------------------ the model

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
"""The ``config.json`` keys vLLM 0.8.4 reads a model's context length from (the smallest one given)."""


def context_limit(config: dict) -> int | None:
    """The longest ``--max_model_len`` vLLM 0.8.4 takes for a model of ``config`` (its ``_get_and_verify_max_len``:
    the smallest of :data:`CONTEXT_KEYS`, ``model_max_length`` where given, times the RoPE scaling factor); None
    where the config gives no length (vLLM then takes ``--max_model_len`` as it is)."""
    lengths = [config[key] for key in CONTEXT_KEYS if isinstance(config.get(key), (int, float))]
    if not lengths:
        return None
    limit = config["model_max_length"] if isinstance(config.get("model_max_length"), (int, float)) else min(lengths)
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and "gemma3" not in str(config.get("model_type", "")):
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in ("su", "longrope", "llama3"):
            if kind == "yarn" and "original_max_position_embeddings" in scaling:
                limit = scaling["original_max_position_embeddings"]
            limit *= scaling.get("factor", 1.0)
    return int(limit)


def check_context_lengths(args, config: dict | None, model: str) -> None:
    """vLLM's context (``--max_model_len``, else the model's own from ``config``) holds the longest turn DPPO lets
    through: ``--prompt_max_length`` prompt tokens, then ``--generate_max_length`` (``--eval_generate_max_length`` when
    evaluating) response tokens (else vLLM cuts such a turn short, or refuses its prompt mid-run); and
    ``--max_model_len`` is no longer than the model's context, which vLLM refuses when the actors start (unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``). Without a readable ``config``, only the first is checked, against
    ``--max_model_len``."""
    limit = None if config is None else context_limit(config)
    given = args.max_model_len
    allowed = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true")
    if given is not None and limit is not None and given > limit and not allowed:
        raise ValueError(f"--max_model_len {given} is longer than {model}'s context ({limit} tokens, from its "
                         f"config.json), which vLLM refuses when the actors start: give --max_model_len {limit} or "
                         "less (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")
    context = given if given is not None else limit
    flag, response = max(("--generate_max_length", args.generate_max_length),
                         ("--eval_generate_max_length", args.eval_generate_max_length), key=lambda item: item[1])
    needed = args.prompt_max_length + response
    if context is None or needed <= context:
        return
    fixes = [f"give --max_model_len {needed}"] if limit is None or needed <= limit else []
    fixes.append(f"lower --prompt_max_length to {context - response}" if context > response else f"lower {flag}")
    where = f"--max_model_len {given}" if given is not None else f"{model}'s context ({context} tokens)"
    raise ValueError(f"{where} is shorter than the longest turn, --prompt_max_length {args.prompt_max_length} + {flag} "
                     f"{response} = {needed} tokens: vLLM would cut such a turn short, or refuse its prompt mid-run; "
                     f"{' or '.join(fixes)}")


def lora_layer_classes() -> tuple[type, ...]:
    """The module classes peft 0.15's LoRA wraps (its ``dispatch_default``); a target of any other class fails
    ``get_peft_model``."""
    import torch
    from transformers.pytorch_utils import Conv1D

    nn = torch.nn
    return nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, Conv1D, nn.MultiheadAttention


def architecture_modules(config: dict) -> list[tuple[str, object]] | None:
    """``(name, module)`` of every module of the causal LM that ``config`` describes, built on the meta device (no
    weights, no memory): the names peft matches ``--target_modules`` against. None where transformers cannot build it
    here (an unknown model type, or one whose code comes with the model)."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    except Exception:  # whatever transformers cannot build offline is left to the launch
        return None
    return list(model.named_modules())


def check_lora_targets(target_modules, modules: list[tuple[str, object]], model: str) -> None:
    """``--target_modules`` against ``modules`` (:func:`architecture_modules`), matched as peft matches them: a name
    ``t`` matches the module ``key == t`` or any ``key`` ending in ``.t`` (a string is a regular expression the whole
    key must match). peft fails when nothing matches or a match is of a class LoRA cannot wrap
    (:func:`lora_layer_classes`), and silently skips a name that matches nothing, which is refused here too (a
    misspelt name would leave those layers untrained). None (peft's default for the model type) and the string
    ``all-linear`` (peft's shorthand for every linear layer) are not checked."""
    if target_modules is None or (isinstance(target_modules, str) and target_modules.lower() == "all-linear"):
        return
    layers = lora_layer_classes()
    wrappable = sorted({key.rsplit(".", 1)[-1] for key, module in modules if key and isinstance(module, layers)})
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    if not names:
        raise ValueError(f"--target_modules names no module: name {model}'s layers to adapt ({', '.join(wrappable)})")
    for name in names:
        matched = [(key, module) for key, module in modules if key and _peft_matches(target_modules, name, key)]
        if not matched:
            raise ValueError(f"--target_modules {name}: {model} has no module of that name; its layers LoRA can "
                             f"adapt are {', '.join(wrappable)}")
        other = next(((key, module) for key, module in matched if not isinstance(module, layers)), None)
        if other is not None:
            raise ValueError(f"--target_modules {name} matches {other[0]}, a {type(other[1]).__name__}, which LoRA "
                             f"cannot adapt: name layers among {', '.join(wrappable)}")


def _peft_matches(target_modules, name: str, key: str) -> bool:
    """peft 0.15's ``check_target_module_exists`` for one name of ``target_modules`` (no layer selection)."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, key) is not None
    return key == name or key.endswith(f".{name}")


# -------------------------------------------------------------------------------------------------------- the optimizer

DEEPSPEED_MINOR_MISMATCH_OK = {
    11: ("11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8"),
    12: ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8"),
}
"""DeepSpeed 0.16.8's ``cuda_minor_mismatch_ok``: toolkit and torch CUDA versions it accepts together."""


@dataclass(frozen=True)
class OptimizerToolkit:
    """How the learner's Adam op can be had on this machine."""

    op: str
    """DeepSpeed's op name: ``fused_adam``, or ``cpu_adam`` with ``--adam_offload``."""
    prebuilt: bool
    """Compiled when DeepSpeed was installed (``DS_BUILD_FUSED_ADAM=1``): nothing is compiled at start-up."""
    torch_cuda: str | None
    """``torch.version.cuda`` (None: a CPU build of torch)."""
    cuda_home: str | None
    """torch's ``CUDA_HOME`` (``$CUDA_HOME``, else the folder of ``nvcc`` on PATH, else /usr/local/cuda)."""
    nvcc_release: str | None
    """``major.minor`` of ``$CUDA_HOME/bin/nvcc -V`` (None: no nvcc there)."""
    ninja: bool
    skip_cuda_check: bool = False
    """``DS_SKIP_CUDA_CHECK=1``: DeepSpeed compiles whatever the versions."""

    @property
    def name(self) -> str:
        return "DeepSpeedCPUAdam (--adam_offload)" if self.op == "cpu_adam" else "FusedAdam"

    @property
    def build_variable(self) -> str:
        """DeepSpeed's install-time switch that prebuilds this op."""
        return f"DS_BUILD_{self.op.upper()}=1"


def toolkit_problem(toolkit: OptimizerToolkit) -> str | None:
    """Why DeepSpeed could not build the op at learner start, as one line that says what to do; None if it can, or
    if this torch has no CUDA (not a GPU node: oat's own check refuses a launch there)."""
    if toolkit.prebuilt or toolkit.torch_cuda is None:
        return None
    where = f"DeepSpeed's {toolkit.name} is not prebuilt and is compiled at learner start"
    if toolkit.cuda_home is None or toolkit.nvcc_release is None:
        return (f"{where}, which needs the CUDA {toolkit.torch_cuda} toolkit (nvcc): install it and set CUDA_HOME, "
                f"or reinstall DeepSpeed with {toolkit.build_variable} where one is")
    if not toolkit.ninja:
        return (f"{where}, which needs ninja, importable and on PATH: pip install ninja, and put that "
                "environment's bin folder on PATH")
    torch_release = ".".join(toolkit.torch_cuda.split(".")[:2])
    if not (toolkit.skip_cuda_check or cuda_versions_compatible(toolkit.nvcc_release, torch_release)):
        return (f"{where}, and nvcc {toolkit.nvcc_release} ({toolkit.cuda_home}) does not match torch's CUDA "
                f"{torch_release}: point CUDA_HOME at a CUDA {torch_release} toolkit (or set DS_SKIP_CUDA_CHECK=1)")
    return None


def cuda_versions_compatible(nvcc_release: str, torch_release: str) -> bool:
    """DeepSpeed's ``assert_no_cuda_mismatch``: equal ``major.minor``, or both in its list for that major."""
    if nvcc_release == torch_release:
        return True
    accepted = DEEPSPEED_MINOR_MISMATCH_OK.get(int(nvcc_release.split(".")[0]), ())
    return nvcc_release in accepted and torch_release in accepted


def toolkit_line(toolkit: OptimizerToolkit) -> str:
    """The dry run's line: prebuilt, compiled at start with which nvcc, or what is missing on this machine."""
    if toolkit.prebuilt:
        return f"optimizer: DeepSpeed {toolkit.name}, prebuilt"
    if toolkit.torch_cuda is None:
        return (f"optimizer: DeepSpeed {toolkit.name}, not prebuilt: compiled at learner start, which needs the CUDA "
                "toolkit (nvcc) on the node; this torch has no CUDA, so the launch on the node checks it")
    problem = toolkit_problem(toolkit)
    if problem is None:
        return (f"optimizer: DeepSpeed {toolkit.name}, compiled at learner start (a minute or two, then cached) with "
                f"nvcc {toolkit.nvcc_release} ({toolkit.cuda_home})")
    return f"optimizer: cannot be compiled on this machine, and a launch here refuses: {problem}"


def optimizer_toolkit(adam_offload: bool) -> OptimizerToolkit:
    """This machine's answer for the learner's Adam op (reads files and runs ``nvcc -V``; imports no DeepSpeed)."""
    import torch
    import torch.utils.cpp_extension

    op = "cpu_adam" if adam_offload else "fused_adam"
    cuda_home = torch.utils.cpp_extension.CUDA_HOME
    return OptimizerToolkit(
        op=op, prebuilt=deepspeed_prebuilt_ops().get(op, False), torch_cuda=torch.version.cuda, cuda_home=cuda_home,
        nvcc_release=nvcc_release(cuda_home), ninja=ninja_available(),
        skip_cuda_check=os.environ.get("DS_SKIP_CUDA_CHECK", "0") == "1",
    )


def ninja_available() -> bool:
    """DeepSpeed imports the ``ninja`` module, and torch's extension builder runs ``ninja`` from PATH."""
    return importlib.util.find_spec("ninja") is not None and shutil.which("ninja") is not None


def deepspeed_prebuilt_ops() -> dict:
    """DeepSpeed's ``installed_ops`` (which ops were compiled at install), read from its installed
    ``git_version_info_installed.py`` without importing DeepSpeed; empty if DeepSpeed is not installed."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "git_version_info_installed.py"
    if not path.is_file():
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "installed_ops" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def nvcc_release(cuda_home: str | None) -> str | None:
    """``major.minor`` that ``<cuda_home>/bin/nvcc -V`` reports, as DeepSpeed reads it; None without one."""
    nvcc = Path(cuda_home or "") / "bin" / "nvcc"
    if cuda_home is None or not (nvcc.is_file() or shutil.which(str(nvcc))):
        return None
    try:
        output = subprocess.run([str(nvcc), "-V"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", output)
    return f"{found.group(1)}.{found.group(2)}" if found else None
