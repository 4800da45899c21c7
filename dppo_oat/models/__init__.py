"""Small policies that build offline: a byte-level BPE tokenizer and a tiny Qwen3 causal LM.

The names below load their module (and transformers) when first used, so importing :mod:`dppo_oat.models.shapes`
(the configuration does, for ``--help`` too) loads no model code.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "max_logprob_error": "scoring",
    "nucleus_log_softmax": "scoring",
    "teacher_forced_logprobs": "scoring",
    **{name: "tiny" for name in ("CHAT_TEMPLATE", "EOS_TOKEN", "PAD_TOKEN", "SPECIAL_TOKENS", "build_tiny_policy",
                                 "count_parameters", "load_policy", "save_policy", "tiny_qwen3_config", "toy_corpus",
                                 "train_bpe_tokenizer")},
}
"""Each public name → the module of this package that defines it."""

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    """``dppo_oat.models.<name>`` (PEP 562): the name from its own module, imported on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
