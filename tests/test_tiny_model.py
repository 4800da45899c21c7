"""The offline tiny policy: BPE tokenizer, Qwen3 model, save/load round trip."""

import pytest
import torch

from dppo_oat.models import (
    EOS_TOKEN,
    PAD_TOKEN,
    build_tiny_policy,
    count_parameters,
    load_policy,
    save_policy,
    tiny_qwen3_config,
    toy_corpus,
    train_bpe_tokenizer,
)


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(), seed=0)


def test_tokenizer_round_trips_text_even_unseen_bytes():
    tokenizer = train_bpe_tokenizer(toy_corpus(), vocab_size=300)
    for text in toy_corpus(5, seed=1) + ["héllo wörld ✓ \t\n{}"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tokenizer_has_eos_pad_and_left_padding():
    tokenizer = train_bpe_tokenizer(toy_corpus())
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.pad_token == PAD_TOKEN
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert tokenizer.padding_side == "left"
    assert len(tokenizer) <= 512 + 3


def test_vocab_size_is_respected_on_a_rich_corpus():
    texts = [f"sample {i} of words: {' '.join(str(j * i) for j in range(20))}" for i in range(400)] + toy_corpus()
    assert len(train_bpe_tokenizer(texts, vocab_size=512)) == 512


def test_chat_template_renders_qwen_style():
    tokenizer = train_bpe_tokenizer(toy_corpus())
    messages = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "Board"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = "<|im_start|>system\nSolve.<|im_end|>\n<|im_start|>user\nBoard<|im_end|>\n<|im_start|>assistant\n"
    assert text == expected
    ids = tokenizer.encode(text)
    assert ids.count(tokenizer.eos_token_id) == 2  # <|im_end|> is one token, the EOS


def test_model_matches_tokenizer_and_parameter_budget(policy):
    model, tokenizer = policy
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings
    assert model.dtype == torch.float32
    # 2 layers x ~262k + vocab x 128 (tied): ~0.59M at vocab 512
    expected = 2 * (4 * 128 * 128 + 3 * 128 * 512 + 2 * 128 + 2 * 32) + len(tokenizer) * 128 + 128
    assert count_parameters(model) == expected


def test_reference_size_at_vocab_512():
    config = tiny_qwen3_config(512)
    from transformers import Qwen3ForCausalLM

    assert 0.58e6 < count_parameters(Qwen3ForCausalLM(config)) < 0.60e6


def test_same_seed_same_weights():
    first, _ = build_tiny_policy(toy_corpus(), seed=3)
    second, _ = build_tiny_policy(toy_corpus(), seed=3)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_overrides_reach_the_config():
    model, _ = build_tiny_policy(toy_corpus(), seed=0, hidden_size=64, num_hidden_layers=3)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 3


def test_save_load_round_trip_gives_identical_logits(policy, tmp_path):
    model, tokenizer = policy
    save_policy(model, tokenizer, tmp_path / "policy")
    loaded_model, loaded_tokenizer = load_policy(tmp_path / "policy")
    ids = torch.tensor([tokenizer.encode(toy_corpus(1, seed=5)[0])])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded_model(ids).logits)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert loaded_tokenizer.eos_token_id == tokenizer.eos_token_id
    assert loaded_tokenizer.pad_token_id == tokenizer.pad_token_id
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
