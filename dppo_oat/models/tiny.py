"""A tiny Qwen3-architecture policy and its byte-level BPE tokenizer, built without the model hub.

The defaults (hidden 128, 2 layers, 4 heads x 32, 4 KV heads, FFN 512, tied embeddings, vocab 512) give a
~0.59M-parameter fp32 model that samples a Sudoku move in milliseconds on a CPU; the larger named shapes of
:mod:`dppo_oat.models.shapes` are built here too (:func:`build_shaped_policy`). Everything is saved with
``save_pretrained`` so that a directory can be cached on disk and opened by Hugging Face or vLLM.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from dppo_oat.models.shapes import FIXED_SHAPES, PADDED_VOCAB_SIZE

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN)
"""Special tokens in id order: padding, turn start, end of turn (the EOS a policy emits to stop)."""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen-style chat template: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message."""

TINY_QWEN3_DEFAULTS = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    intermediate_size=512,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)


def _train_raw_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str]) -> Tokenizer:
    """Train a byte-level BPE ``tokenizers.Tokenizer``: every byte is in the alphabet, so any text encodes."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 512,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    *,
    pad_token: str = PAD_TOKEN,
    eos_token: str = EOS_TOKEN,
    chat_template: str = CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``, with pad/eos tokens, left padding and a chat template.

    The vocabulary holds the special tokens, the 256 byte symbols and up to ``vocab_size`` in merges (fewer when
    the texts are too small to need them): use ``len(tokenizer)`` as the model's vocabulary size.
    """
    missing = {pad_token, eos_token} - set(special_tokens)
    if missing:
        raise ValueError(f"special_tokens must include the pad and eos tokens; missing {sorted(missing)}")
    raw = _train_raw_bpe(texts, vocab_size, special_tokens)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token=pad_token,
        eos_token=eos_token,
        additional_special_tokens=[t for t in special_tokens if t not in (pad_token, eos_token)],
        padding_side="left",
        chat_template=chat_template,
    )


def tiny_qwen3_config(vocab_size: int, **overrides) -> Qwen3Config:
    """Config of the tiny Qwen3 policy (see ``TINY_QWEN3_DEFAULTS``); keyword overrides win."""
    settings = {**TINY_QWEN3_DEFAULTS, **overrides}
    return Qwen3Config(vocab_size=vocab_size, **settings)


def _token_ids_config(tokenizer: PreTrainedTokenizerFast) -> dict:
    """The pad/eos/bos ids the model config and its generation config must carry."""
    return dict(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )


def build_tiny_model(config: Qwen3Config, seed: int) -> Qwen3ForCausalLM:
    """A freshly initialised fp32 ``Qwen3ForCausalLM``, deterministic in ``seed``; the global RNG is untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.to(torch.float32)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    return model.eval()


def build_tiny_policy(
    texts: Iterable[str], seed: int = 0, *, vocab_size: int = 512, padded_vocab_size: int | None = None, **overrides
) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """Train a tokenizer on ``texts`` and build a tiny Qwen3 whose vocabulary is exactly the tokenizer's.

    ``overrides`` go to :func:`tiny_qwen3_config` (e.g. ``hidden_size=64, num_hidden_layers=4``);
    ``padded_vocab_size`` pads the tokenizer to that many entries first (:func:`pad_vocabulary`).
    """
    tokenizer = train_bpe_tokenizer(texts, vocab_size=vocab_size)
    if padded_vocab_size is not None:
        pad_vocabulary(tokenizer, padded_vocab_size)
    config = tiny_qwen3_config(len(tokenizer), **{**_token_ids_config(tokenizer), **overrides})
    return build_tiny_model(config, seed), tokenizer


RESERVED_TOKEN = "<|reserved_{}|>"
"""The reserved tokens that pad a vocabulary (:func:`pad_vocabulary`), numbered from 0."""


def pad_vocabulary(tokenizer: PreTrainedTokenizerFast, size: int) -> PreTrainedTokenizerFast:
    """Pad ``tokenizer`` in place with special reserved tokens (:data:`RESERVED_TOKEN`) to exactly ``size`` entries.

    A BPE trained on a small corpus stops merging long before a real vocabulary's size (a game's demonstrations have
    a few hundred distinct words): the reserved ids make the vocabulary, and with it the embedding and the LM head,
    the size of a real model's. Text never encodes to them and decoding skips them as special tokens; the policy
    learns to give them no probability, as a real model does its unused ids."""
    missing = size - len(tokenizer)
    if missing < 0:
        raise ValueError(f"the tokenizer already has {len(tokenizer)} entries, more than the {size} to pad it to")
    tokenizer.add_tokens([RESERVED_TOKEN.format(index) for index in range(missing)], special_tokens=True)
    return tokenizer


def build_shaped_policy(texts: Iterable[str], seed: int, shape: str, *, vocab_size: int, hidden_size: int,
                        num_layers: int) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """The built-in policy of a named ``shape`` (:mod:`dppo_oat.models.shapes`): ``tiny`` of ``hidden_size`` and
    ``num_layers``, else the shape's fixed architecture over its padded vocabulary; a tokenizer of ``vocab_size``
    BPE merges on ``texts`` either way."""
    if shape == "tiny":
        return build_tiny_policy(texts, seed=seed, vocab_size=vocab_size, hidden_size=hidden_size,
                                 num_hidden_layers=num_layers)
    if shape not in FIXED_SHAPES:
        raise ValueError(f"unknown policy shape {shape!r}; choose one of: tiny, {', '.join(FIXED_SHAPES)}")
    return build_tiny_policy(texts, seed=seed, vocab_size=vocab_size, padded_vocab_size=PADDED_VOCAB_SIZE[shape],
                             **FIXED_SHAPES[shape])


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings count once)."""
    return sum(p.numel() for p in model.parameters())


def save_policy(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """Write model (safetensors), generation config and tokenizer into ``directory``; returns it."""
    from transformers.utils import logging as hf_logging

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # a one-shard progress bar would only clutter the trainer's output
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    portable_tokenizer_config(directory / "tokenizer_config.json")
    return directory


def portable_tokenizer_config(path: Path) -> None:
    """Rewrite a saved ``tokenizer_config.json`` in the form that transformers 4.51 (the GPU node's, oat's pin) and
    transformers 5 both read as the same tokenizer: transformers 5 names the class ``TokenizersBackend`` (unknown
    to 4.51) and lists ``extra_special_tokens`` (4.51 takes a mapping there); ``PreTrainedTokenizerFast`` and
    ``additional_special_tokens`` mean the same in both."""
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    if isinstance(config.get("extra_special_tokens"), list):
        config["additional_special_tokens"] = config.pop("extra_special_tokens")
    path.write_text(json.dumps(config, indent=2) + "\n")


def weights_dtype(dtype: torch.dtype) -> dict:
    """``from_pretrained``'s keyword for the weights' dtype: ``dtype`` from transformers 4.56 on, ``torch_dtype``
    before it (the GPU node's transformers 4.51 passes an unknown ``dtype`` on to the model's constructor)."""
    import transformers
    from packaging.version import Version

    return {"dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype": dtype}


def load_policy(directory: str | Path) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """Open a directory written by :func:`save_policy` (fp32, eval mode)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar over a tiny model's 24 tensors would only clutter the trainer's output
    model = Qwen3ForCausalLM.from_pretrained(directory, **weights_dtype(torch.float32))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    return model.eval(), tokenizer


def toy_corpus(n_texts: int = 300, seed: int = 0) -> list[str]:
    """Deterministic Sudoku-like texts (4x4 boards, ``\\boxed{r c v}`` moves) to train a tokenizer offline."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n_texts):
        rows = [" ".join(rng.choice("1234.") for _ in range(4)) for _ in range(4)]
        move = " ".join(str(rng.randint(1, 4)) for _ in range(3))
        texts.append("Board:\n" + "\n".join(rows) + f"\nMove: \\boxed{{{move}}}")
    return texts
