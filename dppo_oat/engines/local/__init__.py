"""The local engine: one process, a Hugging Face (or vLLM) generator, a plain torch optimizer, the core's loop."""

from dppo_oat.engines.local.config import TrainConfig, WarmStartConfig

__all__ = ["TrainConfig", "WarmStartConfig"]
