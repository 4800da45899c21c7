"""The named shapes of the built-in policy (``--warm-start.shape``): a Qwen3 architecture each, built without the hub.

``tiny`` is sized by the warm start's own flags over the tokenizer's vocabulary (:mod:`dppo_oat.models.tiny`);
``tiny-8k`` is the default tiny architecture over a vocabulary padded to 8,192 entries (a few hundred of them the
tokenizer's, the rest reserved tokens no text uses), so that a top-K divergence (K = 20) can leave mass outside its
K tokens as a real vocabulary's does; ``qwen3-100m`` is a fixed ~100M-parameter Qwen3 whose vocabulary, 32,768 entries,
is the size of a real tokenizer's, so that its LM head costs on a GPU what a real model's does. Kept apart from the
model code so that the command line reads the names without importing transformers.
"""

from __future__ import annotations

from typing import Literal

PolicyShape = Literal["tiny", "tiny-8k", "qwen3-100m"]

FIXED_SHAPES = {
    "tiny-8k": dict(hidden_size=128, num_hidden_layers=2),  # the tiny shape's defaults
    "qwen3-100m": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=2048,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
}
"""Shapes whose architecture no warm-start flag changes: Qwen3 config fields over the tiny defaults (qwen3-100m:
grouped-query attention, 3 query heads per key-value head, a SwiGLU MLP 8/3 as wide as the model, the embedding
tied to the LM head)."""

PADDED_VOCAB_SIZE = {"tiny-8k": 8_192, "qwen3-100m": 32_768}
"""The vocabulary a shape's model has exactly: the trained tokenizer's, padded with reserved tokens."""
