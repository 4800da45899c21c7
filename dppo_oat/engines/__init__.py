"""Engines run the core: ``local`` (one process, any machine), ``oat`` (oat + vLLM + DeepSpeed on a GPU node) and
``verl`` (the core's trust regions as verl policy losses, for runs beyond one node)."""
