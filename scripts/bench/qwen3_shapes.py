"""Qwen3 shapes with random weights for the GPU benchmarks (built from a ``transformers`` config, no hub)."""

from __future__ import annotations

import torch

from dppo_oat.models.shapes import FIXED_SHAPES, PADDED_VOCAB_SIZE

ARCHITECTURE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size")
SHAPES = {
    "qwen3-100m": dict(vocab_size=PADDED_VOCAB_SIZE["qwen3-100m"],
                       **{key: FIXED_SHAPES["qwen3-100m"][key] for key in ARCHITECTURE}),
    "smoke": dict(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, intermediate_size=128),
}
"""``qwen3-100m``: the policy shape of ``--warm-start.shape qwen3-100m`` (~100.7M parameters, 25.2M of them the tied
embedding, a 32,768-token vocabulary); ``smoke``: the same architecture at a size a CPU runs in seconds."""


def random_qwen3(shape: str, seed: int, **token_ids):
    """A ``Qwen3ForCausalLM`` of :data:`SHAPES` ``[shape]`` (tied embeddings) with weights drawn from ``seed``;
    ``token_ids``: its pad/eos/bos ids, for ``generate``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=8192, **token_ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    for name, value in token_ids.items():
        setattr(model.generation_config, name, value)
    return model
