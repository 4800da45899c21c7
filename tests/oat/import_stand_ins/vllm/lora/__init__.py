"""Part of the vLLM import stand-in (see ``vllm/__init__.py``)."""
