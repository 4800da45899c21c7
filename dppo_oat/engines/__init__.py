"""Engines run the core: ``local`` (one process, any machine) and ``oat`` (oat + vLLM + DeepSpeed on a GPU node)."""
