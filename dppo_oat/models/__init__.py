"""Small policies that build offline: a byte-level BPE tokenizer and a tiny Qwen3 causal LM."""

from dppo_oat.models.scoring import max_logprob_error, nucleus_log_softmax, teacher_forced_logprobs
from dppo_oat.models.tiny import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    build_tiny_policy,
    count_parameters,
    load_policy,
    save_policy,
    tiny_qwen3_config,
    toy_corpus,
    train_bpe_tokenizer,
)

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_tiny_policy",
    "count_parameters",
    "load_policy",
    "max_logprob_error",
    "nucleus_log_softmax",
    "save_policy",
    "teacher_forced_logprobs",
    "tiny_qwen3_config",
    "toy_corpus",
    "train_bpe_tokenizer",
]
