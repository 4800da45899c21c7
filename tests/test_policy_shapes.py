"""--warm-start.shape: qwen3-100m is a ~100M-parameter Qwen3 over a 32,768-entry vocabulary (the trained BPE padded
with reserved tokens) and tiny-8k the tiny architecture over 8,192 entries, each with its own cache key, refused where
it makes no sense; tiny stays the default, key included."""

from dataclasses import replace

import pytest
import torch
from test_faults import one_error
from transformers import Qwen3ForCausalLM

from dppo_oat.engines.local.config import TrainConfig, WarmStartConfig
from dppo_oat.engines.local.policy import policy_cache_key
from dppo_oat.models.shapes import FIXED_SHAPES, PADDED_VOCAB_SIZE
from dppo_oat.models.tiny import (
    RESERVED_TOKEN,
    build_shaped_policy,
    count_parameters,
    pad_vocabulary,
    tiny_qwen3_config,
    toy_corpus,
    train_bpe_tokenizer,
)


def test_qwen3_100m_has_about_100m_parameters_and_a_32k_vocabulary():
    config = tiny_qwen3_config(PADDED_VOCAB_SIZE["qwen3-100m"], **FIXED_SHAPES["qwen3-100m"])
    with torch.device("meta"):  # the shape, without its 400 MB of weights
        model = Qwen3ForCausalLM(config)
    assert model.config.vocab_size == 32_768
    assert 95e6 <= count_parameters(model) <= 105e6, count_parameters(model)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied: counted once


def test_tiny_8k_is_the_default_tiny_architecture_over_8192_entries():
    texts = toy_corpus(300)
    tiny, _ = build_shaped_policy(texts, 0, "tiny", vocab_size=512, hidden_size=128, num_layers=2)
    padded, tokenizer = build_shaped_policy(texts, 0, "tiny-8k", vocab_size=512, hidden_size=128, num_layers=2)
    assert len(tokenizer) == 8_192 == padded.config.vocab_size
    same = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "tie_word_embeddings")
    assert all(getattr(padded.config, name) == getattr(tiny.config, name) for name in same)


def test_a_padded_tokenizer_round_trips_and_the_models_embedding_matches_it(tmp_path):
    texts = toy_corpus(300)
    model, tokenizer = build_shaped_policy(texts, 0, "qwen3-100m", vocab_size=512, hidden_size=128, num_layers=2)
    assert len(tokenizer) == 32_768 == model.get_input_embeddings().num_embeddings == model.config.vocab_size
    assert tokenizer.convert_ids_to_tokens(32_767).startswith("<|reserved_")
    for text in texts[:20]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert max(ids) < len(train_bpe_tokenizer(texts, vocab_size=512))  # text never encodes to a reserved id
        assert tokenizer.decode([*ids, 32_767, 30_000], skip_special_tokens=True) == text
    tokenizer.save_pretrained(tmp_path)
    from transformers import PreTrainedTokenizerFast

    reloaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert len(reloaded) == 32_768 and reloaded(texts[0])["input_ids"] == tokenizer(texts[0])["input_ids"]


def test_padding_to_fewer_entries_than_the_tokenizer_has_is_refused():
    tokenizer = train_bpe_tokenizer(toy_corpus(50), vocab_size=64)
    size = len(tokenizer)
    assert len(pad_vocabulary(tokenizer, size)) == size  # nothing to pad
    with pytest.raises(ValueError, match="more than the 10 to pad it to"):
        pad_vocabulary(tokenizer, 10)
    assert RESERVED_TOKEN.format(0) == "<|reserved_0|>"


def test_every_shape_has_its_own_cache_key_and_tiny_keeps_the_shipped_one():
    config = TrainConfig()

    def key(warm_start):
        return policy_cache_key(config.env_ids[0], config.template, warm_start, 0)

    tiny, big = key(WarmStartConfig()), key(replace(WarmStartConfig(), shape="qwen3-100m"))
    assert tiny == "tiny-game_Sudoku-v0-easy-compact-wrong-1ed8e576263b"  # the shipped policy's folder
    assert big.startswith("qwen3-100m-game_Sudoku-v0-easy-compact-wrong-") and big.split("-")[-1] != tiny.split("-")[-1]
    padded = key(replace(WarmStartConfig(), shape="tiny-8k"))
    assert padded.startswith("tiny-8k-game_Sudoku") and padded.split("-")[-1] not in (tiny.split("-")[-1],
                                                                                      big.split("-")[-1])


@pytest.mark.fault("`--warm-start.shape qwen3-100m` with `--warm-start.hidden-size` / `--warm-start.num-layers`, "
                   "with `--pretrain`, or with more BPE merges than its 32,768 entries hold",
                   "one line, before any model")
@pytest.mark.parametrize("flags, fragments", [
    (["--warm-start.num-layers", "4"], ["--warm-start.num-layers size the tiny shape", "leave them out"]),
    (["--pretrain", "/nonexistent"], ["--warm-start.shape qwen3-100m shapes the built-in policy"]),
    (["--warm-start.vocab-size", "40000"], ["at most 32509 merges fit in the 32768-entry vocabulary"]),
])
def test_a_shape_with_flags_it_ignores_is_one_line_before_any_model(flags, fragments, tmp_path, capsys, no_model):
    one_error(capsys, ["--runs-dir", str(tmp_path), "--warm-start.shape", "qwen3-100m", *flags], 2, *fragments)
    assert not any(tmp_path.iterdir())
