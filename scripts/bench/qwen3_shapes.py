"""Qwen3 shapes with random weights for the GPU benchmarks (built from a ``transformers`` config, no hub)."""

from __future__ import annotations

import torch

from dppo_oat.models.shapes import FIXED_SHAPES, PADDED_VOCAB_SIZE

ARCHITECTURE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size")
SHAPES = {
    "qwen3-100m": dict(vocab_size=PADDED_VOCAB_SIZE["qwen3-100m"],
                       **{key: FIXED_SHAPES["qwen3-100m"][key] for key in ARCHITECTURE}),
    "qwen3-1.7b": dict(vocab_size=151_936, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=6144),
    "smoke": dict(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, intermediate_size=128),
}
"""``qwen3-100m``: the policy shape of ``--warm-start.shape qwen3-100m`` (~100.7M parameters, 25.2M of them the tied
embedding, a 32,768-token vocabulary); ``qwen3-1.7b``: Qwen3-1.7B's architecture (1.72B parameters, 0.31B of them
the tied embedding of 151,936 tokens), where a decode step's time is mostly the reading of its weights; ``smoke``: the
same architecture at a size a CPU runs in seconds."""


def random_qwen3(shape: str, seed: int, device: str = "cpu", **token_ids):
    """A ``Qwen3ForCausalLM`` of :data:`SHAPES` ``[shape]`` (tied embeddings) with weights drawn from ``seed``,
    built on ``device`` (a large shape initialises there in seconds; the weights depend on the device's generator);
    ``token_ids``: its pad/eos/bos ids, for ``generate``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=8192, **token_ids)
    target = torch.device(device)
    with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []), target:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    for name, value in token_ids.items():
        setattr(model.generation_config, name, value)
    return model
