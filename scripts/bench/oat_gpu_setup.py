"""What oat's learner needs to run on a stock CUDA image (no vLLM, no flash-attn, no pyarrow 11, DeepSpeed without
prebuilt ops), for ``oat_learner_step.py --device cuda``. Each function says what it changes; the bench records every
one of them in its row.

- :func:`compile_fused_adam`: DeepSpeed's ``FusedAdam`` JIT-compiled by the device's nvcc once, in the parent
  process, into ``TORCH_EXTENSIONS_DIR`` (the learners then load the build), timed; a failure is reported, not raised.
- :func:`use_torch_fused_adamw`: where that compile failed, oat's optimizer becomes torch's fused AdamW over oat's own
  parameter groups (the same AdamW update; DeepSpeed's ZeRO supports it).
- :func:`attention_implementation` / :func:`use_sdpa_for_eager`: oat loads its model with flash-attn 2 under
  ``--flash_attn`` and with ``eager`` attention otherwise; where flash-attn is not installed, the learners load it
  with PyTorch's ``sdpa`` instead of ``eager`` (flash kernels; ``eager`` materialises every ``[L, L]`` score matrix).
- :func:`header_dirs_for_extensions`: where the CUDA toolkit lacks the library headers torch's extension headers
  include (``cusparse.h``, ...), the include folders of the pip-installed NVIDIA libraries beside torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

EXTENSION_HEADERS = ("cusparse.h", "cublas_v2.h", "cusolverDn.h")
"""Headers that ``ATen/cuda/CUDAContext.h`` includes from the CUDA libraries (not from nvcc's own folder)."""


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def attention_implementation(flash_available: bool) -> str:
    """The attention the learners run: oat's flash-attn 2 where it is installed, else PyTorch's sdpa."""
    return "flash_attention_2" if flash_available else "sdpa"


def use_sdpa_for_eager() -> None:
    """oat's ``Actor`` loads with ``attn_implementation="eager"`` without ``--flash_attn``: load with ``sdpa`` instead
    (``AutoModelForCausalLM.from_pretrained`` wrapped in this process; every other argument unchanged)."""
    import transformers

    original = transformers.AutoModelForCausalLM.from_pretrained.__func__
    auto = transformers.AutoModelForCausalLM

    def from_pretrained(cls, *args, **kwargs):
        if kwargs.get("attn_implementation") == "eager":
            kwargs["attn_implementation"] = "sdpa"
        return original(cls, *args, **kwargs)

    auto.from_pretrained = classmethod(from_pretrained)


def header_dirs_for_extensions(cuda_home: str | None, site_dirs: list[str]) -> list[str]:
    """The ``nvidia/*/include`` folders under ``site_dirs`` that hold a header of :data:`EXTENSION_HEADERS`, when
    ``cuda_home/include`` lacks one of them; else none."""
    if cuda_home and all((Path(cuda_home) / "include" / name).exists() for name in EXTENSION_HEADERS):
        return []
    found = []
    for site in site_dirs:
        for include in sorted(Path(site).glob("nvidia/*/include")):
            if any((include / name).exists() for name in EXTENSION_HEADERS) and str(include) not in found:
                found.append(str(include))
    return found


def add_header_dirs() -> list[str]:
    """Prepend :func:`header_dirs_for_extensions` to ``CPATH`` (read by nvcc's host compiler and by g++) for this
    process and the learners it spawns; the folders added."""
    from torch.utils.cpp_extension import CUDA_HOME

    dirs = header_dirs_for_extensions(CUDA_HOME, [p for p in sys.path if p.endswith("-packages")])
    if dirs:
        os.environ["CPATH"] = os.pathsep.join([*dirs, *filter(None, [os.environ.get("CPATH")])])
    return dirs


def compile_fused_adam() -> dict:
    """JIT-compile DeepSpeed's ``FusedAdam`` for the visible GPU: ``{"compiled", "seconds", "error",
    "header_dirs_added"}`` (``error``: the exception's last line, when it failed)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    added = add_header_dirs()
    start = time.perf_counter()
    try:
        from deepspeed.ops.op_builder import FusedAdamBuilder

        FusedAdamBuilder().load(verbose=False)
    except Exception as error:
        lines = [line for line in str(error).strip().splitlines() if line.strip()] or [type(error).__name__]
        return {"compiled": False, "seconds": time.perf_counter() - start, "error": lines[-1][:300],
                "header_dirs_added": added}
    return {"compiled": True, "seconds": time.perf_counter() - start, "error": None, "header_dirs_added": added}


def use_torch_fused_adamw() -> None:
    """oat's ``DeepspeedStrategy.create_optimizer`` with torch's fused AdamW in place of DeepSpeed's ``FusedAdam``
    (oat's parameter groups and arguments)."""
    import torch
    from oat.model import LLM
    from oat.utils.deepspeed import DeepspeedStrategy, get_optimizer_grouped_parameters

    def create_optimizer(self, model, **kwargs):
        if isinstance(model, LLM):
            model = model.model
        groups = get_optimizer_grouped_parameters(model, kwargs["weight_decay"])
        return torch.optim.AdamW(groups, fused=True, **kwargs)

    DeepspeedStrategy.create_optimizer = create_optimizer
