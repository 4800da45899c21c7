"""Settings of the oat engine's tests (``make test-oat``; marked ``oat``, skipped where oat is not installed).

dm-launchpad cannot be installed on Python >= 3.11, so ``launchpad_stub/`` (a recorder of the program oat builds, which
the rehearsal also runs with a minimal local launcher, ``launchpad_stub/launchpad/local_runner.py``) is put on
``sys.path`` when the real one is missing. vLLM runs in-process on the CPU with a 1 GiB KV cache.
"""

import importlib.util
import os
import sys
from pathlib import Path

if importlib.util.find_spec("launchpad") is None:
    sys.path.insert(0, str(Path(__file__).parent / "launchpad_stub"))

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest


@pytest.fixture(scope="session")
def tiny_policy():
    """The core's tiny Qwen3 policy and tokenizer (built offline)."""
    from dppo_oat.models import build_tiny_policy, toy_corpus

    return build_tiny_policy(toy_corpus(200), seed=0, vocab_size=300)


@pytest.fixture(scope="session")
def tiny_policy_dir(tiny_policy, tmp_path_factory):
    """The tiny policy saved as a model directory (what ``--pretrain`` names on a GPU node)."""
    from dppo_oat.models import save_policy

    return str(save_policy(*tiny_policy, tmp_path_factory.mktemp("tiny_policy")))


@pytest.fixture(scope="session")
def oat_on_cpu():
    """What oat's GPU-only learner set-up needs on a CPU, patched for the session (the DPPO classes need none of it):

    - ``torch.cuda.set_device`` is a no-op (oat's DeepspeedStrategy.setup_distributed selects the learner's GPU);
    - DeepSpeed's CPU shared-memory collective is marked unavailable: it is JIT-compiled (~75 s) on the first
      ``init_distributed`` and a one-process group never uses it.
    """
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "set_device", lambda *args, **kwargs: None)
        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is not None:
            patch.setitem(deepspeed.ops.__compatible_ops__, builder.NAME, False)
        yield


@pytest.fixture(scope="session")
def gpu_node():
    """A context in which ``torch.cuda.device_count()`` reports ``n`` GPUs: oat's argument validation and program
    builder count them."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def visible(n: int = 8):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.cuda, "device_count", lambda: n)
            patch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # n GPUs, none named by the environment
            yield

    return visible

