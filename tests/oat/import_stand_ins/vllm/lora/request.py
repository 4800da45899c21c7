"""Part of the vLLM import stand-in (see ``vllm/__init__.py``): oat's actors import ``LoRARequest`` from here."""

from vllm import _Unavailable


class LoRARequest(_Unavailable):
    """oat's actors build one for LoRA generation; a learner never does."""
