"""What oat 0.2.4 runs on CUDA only, replaced for a CPU (``--on_cpu``, :mod:`~dppo_oat.engines.oat.on_cpu`).

oat 0.2.4 assumes CUDA in a few calls that have nothing to compute on a CPU; each is replaced by a function here,
in the process that needs it (the launcher, the learner's, the actor's), and nothing else is. What is replaced,
line by line (oat-llm 0.2.4):

- ``oat/interface.py:38`` and ``oat/args.py:313`` count GPUs with ``torch.cuda.device_count()``, 0 on a CPU: the
  launcher counts one (:func:`count_one_gpu`);
- ``oat/utils/distributed.py:171``, the actor's end of the weight broadcast, receives each parameter into
  ``torch.empty(shape, dtype=dtype, device="cuda")``: here into CPU memory (:func:`receive_weight_on_cpu`, otherwise
  the same three lines; under ``--fp16`` on vLLM 0.8.x, whose CPU backend has no float16 kernels and runs in
  float32, the float16 weights are widened, exactly, before vLLM loads them);
- ``oat/learners/base.py:242`` asks for an NCCL group when actors and learners are not collocated
  (``--asynchronous``), which a CPU lacks: gloo, as collocated ones use (:func:`gloo_for_nccl`);
- ``torch.cuda.synchronize`` (``learners/base.py`` 273, 496; ``algorithms/ppo.py``) raises without a GPU, and
  ``torch.cuda.set_device`` (``utils/deepspeed.py:251``) selects one: no-ops in the learner;
  ``torch.cuda.current_device`` (``utils/deepspeed.py`` 589–650, where the strategy moves tensors before a
  collective) names the CPU;
- ``DeepspeedStrategy.create_optimizer`` builds DeepSpeed's CUDA ``FusedAdam``: torch's ``AdamW`` over oat's own
  parameter groups (the same AdamW update);
- DeepSpeed's CPU shared-memory collective is JIT-compiled (~75 s) on first use and a one-learner group never uses
  it: marked unavailable.

``torch.cuda.empty_cache``, ``memory_allocated`` and ``manual_seed_all`` need nothing: they do nothing while CUDA is
not initialised. Not rehearsed by any of this: the NCCL and CUDA-IPC transports, vLLM's sleep mode, several GPUs.
"""

from __future__ import annotations

import functools

CPU_GPUS = 1
"""The GPUs ``--on_cpu`` plans for: one actor and one learner, collocated or not."""


def count_one_gpu() -> None:
    """oat's launcher and argument validation count the node's GPUs: one, on a CPU."""
    import torch

    torch.cuda.device_count = lambda: CPU_GPUS


def gloo_for_nccl() -> None:
    """oat's weight-sync group asks for NCCL when actors and learners are not collocated: gloo here."""
    import oat.utils.distributed as oat_distributed
    from torch.distributed import Backend

    helper = oat_distributed._new_process_group_helper
    if getattr(helper, "gloo_for_nccl", False):
        return

    @functools.wraps(helper)
    def with_gloo(*args, **kwargs):
        if len(args) > 3 and args[3] == Backend.NCCL:
            args = (*args[:3], Backend(Backend.GLOO), *args[4:])
        return helper(*args, **kwargs)

    with_gloo.gloo_for_nccl = True
    oat_distributed._new_process_group_helper = with_gloo


def learner_without_cuda() -> None:
    """The learner's CUDA calls listed in the module docstring, replaced in this process."""
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
    gloo_for_nccl()


def torch_adamw(self, model, **kwargs):
    """``DeepspeedStrategy.create_optimizer`` with torch's AdamW in place of CUDA FusedAdam (same parameter groups)."""
    import torch
    from oat.model import LLM
    from oat.utils.deepspeed import get_optimizer_grouped_parameters

    if isinstance(model, LLM):
        model = model.model
    return torch.optim.AdamW(get_optimizer_grouped_parameters(model, kwargs["weight_decay"]), **kwargs)


def receive_weight_on_cpu(self, name, dtype, shape, cuda_ipc_handles=None, empty_cache=False):
    """oat's ``WorkerWrap.update_weight`` (it runs in the vLLM worker) with the received tensor in CPU memory:
    one parameter of the learner's broadcast (rank 0 of the weight-sync group), loaded by vLLM's ``load_weights``."""
    import torch
    from oat.utils.distributed import torch_type_codec

    dtype = torch_type_codec(dtype)
    widened = dtype == torch.float16 and self.model_config.dtype == torch.float32  # --fp16 on vLLM 0.8.x's CPU
    if dtype != self.model_config.dtype and not widened:
        raise TypeError(f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}")
    if cuda_ipc_handles:
        raise NotImplementedError("CUDA IPC handles cannot be opened on a CPU")
    weight = torch.empty(shape, dtype=dtype, device="cpu")
    torch.distributed.broadcast(weight, 0, group=self._model_update_group)
    self.model_runner.model.load_weights(weights=[(name, weight.to(self.model_config.dtype))])


def actor_without_cuda() -> None:
    """The actor's CUDA calls listed in the module docstring, replaced in this process."""
    from oat.utils.distributed import WorkerWrap

    WorkerWrap.update_weight = receive_weight_on_cpu
    gloo_for_nccl()
