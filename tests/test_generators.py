"""HFGenerator: μ log-probs are those of the sampled distribution; top-K set; EOS; seeds; batching."""

import warnings

import numpy as np
import pytest
import torch
from forward_probe import recording_forward

from dppo_oat.models import build_tiny_policy, toy_corpus
from dppo_oat.models.scoring import check_topk_set, max_logprob_error, teacher_forced_logprobs
from dppo_oat.rollout.generation import Generator
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import SamplingSettings

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(), seed=0)


@pytest.fixture(scope="module")
def prompts(policy):
    _, tokenizer = policy
    texts = toy_corpus(7, seed=11)
    return [tokenizer.encode(text)[: 6 + 3 * i] for i, text in enumerate(texts)]  # lengths differ: padding


def test_is_a_generator(policy):
    generator = HFGenerator(*policy)
    assert isinstance(generator, Generator)
    assert generator.max_topk == len(policy[1])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_teacher_forcing(policy, prompts, temperature):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=12, temperature=temperature, seed=1)
    completions = HFGenerator(model, tokenizer, batch_size=4).generate(prompts, settings)
    assert max_logprob_error(model, prompts, completions, temperature=temperature) <= TOLERANCE


def test_logprobs_with_top_p_are_the_nucleus_distribution(policy, prompts):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=12, temperature=0.8, top_p=0.5, seed=2)
    completions = HFGenerator(model, tokenizer).generate(prompts, settings)
    assert max_logprob_error(model, prompts, completions, temperature=0.8, top_p=0.5) <= TOLERANCE
    assert all(np.isfinite(c.logprobs).all() for c in completions)


def test_topk_set_is_topk_of_mu_plus_action(policy, prompts):
    model, tokenizer = policy
    k = 5
    settings = SamplingSettings(max_new_tokens=12, temperature=1.3, top_k_logprobs=k, seed=3)
    outside = 0
    for prompt, completion in zip(prompts, HFGenerator(model, tokenizer).generate(prompts, settings), strict=True):
        reference = teacher_forced_logprobs(model, prompt, completion.token_ids, temperature=1.3)
        outside += check_topk_set(reference, completion, k, atol=TOLERANCE)
    assert outside > 0  # the a_t-outside-top-K branch was exercised


def make_eos_likely(model, eos_id: int, prompts) -> None:
    """Point the (tied) EOS embedding along the mean final hidden state so that EOS gets a large logit."""
    with torch.no_grad():
        hidden = [model.model(torch.tensor([p])).last_hidden_state[0] for p in prompts]
        direction = torch.cat(hidden).mean(0)
        model.model.embed_tokens.weight[eos_id] = 3.0 * direction / direction.norm() ** 2


def test_stops_at_eos_and_keeps_it(prompts):
    model, tokenizer = build_tiny_policy(toy_corpus(), seed=0)
    make_eos_likely(model, tokenizer.eos_token_id, prompts)
    settings = SamplingSettings(max_new_tokens=16, seed=4)
    completions = HFGenerator(model, tokenizer).generate(prompts * 4, settings)
    reasons = {c.finish_reason for c in completions}
    assert reasons == {"stop", "length"}
    for completion in completions:
        eos_positions = [t for t, token in enumerate(completion.token_ids) if token == tokenizer.eos_token_id]
        if completion.finish_reason == "stop":
            assert eos_positions == [len(completion.token_ids) - 1]
            assert np.isfinite(completion.logprobs[-1])
            assert tokenizer.eos_token not in completion.text
        else:
            assert eos_positions == [] and len(completion.token_ids) == settings.max_new_tokens
    assert max_logprob_error(model, prompts * 4, completions) <= TOLERANCE


def test_extra_stop_ids_and_text_without_stop_token(policy, prompts):
    model, tokenizer = policy
    stops = list(range(3, len(tokenizer), 3))
    completions = HFGenerator(model, tokenizer, eos_token_ids=stops).generate(prompts, SamplingSettings(10, seed=5))
    for completion in completions:
        if completion.finish_reason == "stop":
            assert completion.token_ids[-1] in stops
            assert not set(completion.token_ids[:-1]) & set(stops)
            assert completion.text == tokenizer.decode(completion.token_ids[:-1], skip_special_tokens=True)
    assert any(c.finish_reason == "stop" for c in completions)


def test_seeded_sampling_is_deterministic_and_leaves_global_rng(policy, prompts):
    generator = HFGenerator(*policy)
    before = torch.get_rng_state()
    first = generator.generate(prompts, SamplingSettings(max_new_tokens=10, seed=7))
    assert torch.equal(before, torch.get_rng_state())
    generator.forget_prefixes()  # as every rollout starts: nothing cached by an earlier call is reused
    second = generator.generate(prompts, SamplingSettings(max_new_tokens=10, seed=7))
    other = generator.generate(prompts, SamplingSettings(max_new_tokens=10, seed=8))
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert [c.logprobs for c in first] == [c.logprobs for c in second]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]


def test_batched_equals_unbatched(policy, prompts):
    model, tokenizer = policy
    settings = SamplingSettings(max_new_tokens=10, temperature=1e-3, seed=9)  # ~argmax: same tokens either way
    batched = HFGenerator(model, tokenizer, batch_size=len(prompts)).generate(prompts, settings)
    single = HFGenerator(model, tokenizer, batch_size=1).generate(prompts, settings)
    assert [c.token_ids for c in batched] == [c.token_ids for c in single]
    for a, b in zip(batched, single, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOLERANCE)
    sampled = HFGenerator(model, tokenizer, batch_size=len(prompts)).generate(prompts, SamplingSettings(10, seed=9))
    assert max_logprob_error(model, prompts, sampled) <= TOLERANCE  # left-padded batch == unpadded forward


def test_update_weights_changes_the_policy(prompts):
    model, tokenizer = build_tiny_policy(toy_corpus(), seed=0)
    other, _ = build_tiny_policy(toy_corpus(), seed=1)
    generator = HFGenerator(model, tokenizer)
    generator.update_weights({k: v for k, v in other.state_dict().items() if k != "lm_head.weight"})
    completions = generator.generate(prompts, SamplingSettings(max_new_tokens=8, seed=0))
    assert max_logprob_error(other, prompts, completions) <= TOLERANCE
    with pytest.raises(KeyError):
        generator.update_weights({"model.norm.weight": other.model.norm.weight})


def test_refuses_k_beyond_vocabulary(policy, prompts):
    generator = HFGenerator(*policy)
    with pytest.raises(ValueError):
        generator.generate(prompts, SamplingSettings(max_new_tokens=2, top_k_logprobs=generator.max_topk + 1))


def test_vllm_sampling_params_carry_top_k_and_raw_logprobs_refuse_it():
    """Evaluation's --eval_top_k reaches vLLM; a raw-log-prob engine refuses top-k for training (μ would be wrong)."""
    from types import SimpleNamespace

    from dppo_oat.rollout.generation import check_logprob_semantics
    from dppo_oat.rollout.vllm_generator import sampling_params

    fake_vllm = SimpleNamespace(SamplingParams=lambda **kwargs: kwargs)
    settings = SamplingSettings(16, temperature=0.6, top_p=0.95, top_k=20, seed=3)
    params = sampling_params(fake_vllm, settings, 2, [7])
    assert (params["top_k"], params["top_p"], params["temperature"], params["seed"]) == (20, 0.95, 0.6, 5)
    check_logprob_semantics(SamplingSettings(16), processed_logprobs=False, engine="vLLM")
    with pytest.raises(ValueError, match="top_k=-1"):
        check_logprob_semantics(SamplingSettings(16, top_k=20), processed_logprobs=False, engine="vLLM")
    with pytest.raises(ValueError, match="top_k"):
        SamplingSettings(16, top_k=0)


def test_training_rollouts_take_the_sampling_loop_and_the_rest_generate(policy, prompts, monkeypatch):
    """Untruncated sampling at T > 0 never calls ``model.generate`` (the fast loop); greedy and top-p do."""
    model, tokenizer = policy
    calls = []
    original = model.generate
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1) or original(*a, **k))
    generator = HFGenerator(model, tokenizer)
    generator.generate(prompts, SamplingSettings(max_new_tokens=6, temperature=0.9, top_k_logprobs=3, seed=0))
    assert calls == []
    generator.generate(prompts, SamplingSettings(max_new_tokens=6, temperature=0.0))
    generator.generate(prompts, SamplingSettings(max_new_tokens=6, top_p=0.9, seed=0))
    assert len(calls) == 2


def test_sampling_loop_draws_from_mu(policy):
    """The first token's empirical frequencies over many draws match exp(log μ) that the loop reports."""
    model, tokenizer = policy
    prompt = tokenizer.encode(toy_corpus(1, seed=5)[0])[:8]
    completions = HFGenerator(model, tokenizer, batch_size=512).generate(
        [prompt] * 4000, SamplingSettings(max_new_tokens=1, temperature=1.5, seed=3))
    first = np.array([c.token_ids[0] for c in completions])
    mu = {token: np.exp(c.logprobs[0]) for token, c in zip(first, completions, strict=True)}
    for token, probability in sorted(mu.items(), key=lambda item: -item[1])[:5]:
        assert abs((first == token).mean() - probability) < 4 * np.sqrt(probability * (1 - probability) / 4000)


def test_shared_prefix_length_leaves_every_row_a_token_of_its_own():
    from dppo_oat.rollout.decode import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5, 6]]) == 3
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter keeps its last token
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 9, 3], [1, 2, 3]]) == 0  # under the minimum
    assert shared_prefix_length([[1, 2, 3, 4]]) == 0


def test_a_shared_prefix_is_prefilled_once_and_changes_nothing(policy, prompts, monkeypatch):
    """Prompts that start alike (a template's header): the header goes through the model once (a batch-1 forward),
    μ is still the model's distribution (teacher forcing), and draws and log-probs are those of the plain prefill."""
    import dppo_oat.rollout.hf_generator as hf_generator

    model, tokenizer = policy
    header = tokenizer.encode(toy_corpus(1, seed=21)[0])[:9]
    shared = [header + prompt for prompt in prompts]
    settings = SamplingSettings(max_new_tokens=10, temperature=1.0, seed=4, top_k_logprobs=3)
    generator = HFGenerator(model, tokenizer)
    widths = recording_forward(model, monkeypatch)
    with_prefix = generator.generate(shared, settings)
    monkeypatch.undo()
    assert widths[0][0] == 1 and widths[0][1] >= len(header) and widths[1][0] == len(prompts)
    assert max_logprob_error(model, shared, with_prefix) <= TOLERANCE

    monkeypatch.setattr(hf_generator, "shared_prefix_length", lambda prompts: 0)
    generator.forget_prefixes()
    widths = recording_forward(model, monkeypatch)
    plain = generator.generate(shared, settings)
    assert widths[0][0] == len(prompts)
    assert [c.token_ids for c in with_prefix] == [c.token_ids for c in plain]
    for a, b in zip(with_prefix, plain, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)


SMALL = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=8)


def small_model(name: str, **overrides):
    """A randomly initialised two-layer model of a Hugging Face architecture (fp32, eval)."""
    import transformers

    config = getattr(transformers, f"{name}Config")(**{**SMALL, **overrides})
    torch.manual_seed(0)
    return getattr(transformers, f"{name}ForCausalLM")(config).eval()


@pytest.mark.parametrize("name", ["Qwen3", "Qwen2", "Llama", "Mistral", "Gemma"])
def test_direct_forward_is_the_models_own_forward_on_padded_rows_after_a_past(name):
    """Two left-padded rows, prefilled in three calls (a past, a chunk, one token): every next-token logit equals
    the model's own forward on the whole sequence (up to float rounding of other shapes)."""
    from dppo_oat.rollout.decode import left_padded_positions
    from dppo_oat.rollout.direct_forward import KVBuffer, direct_forward, runs_direct

    model = small_model(name, **({"sliding_window": None} if name == "Mistral" else {}))
    assert runs_direct(model)
    input_ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    positions = left_padded_positions(attention_mask)
    with torch.inference_mode():
        expected = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
        buffer = KVBuffer(2, 4, input_ids.device)  # too small: the buffer grows
        for start, end in [(0, 5), (5, 8), (8, 9)]:
            with warnings.catch_warnings():  # no deprecated argument (each call would pay for its warning)
                warnings.simplefilter("error")
                logits = direct_forward(model, buffer, input_ids[:, start:end], positions[:, start:end],
                                        attention_mask[:, start:end].bool())
            torch.testing.assert_close(logits, expected[:, end - 1], atol=1e-5, rtol=1e-5)
    assert buffer.width == 9 and torch.equal(buffer.valid[:, :9], attention_mask.bool())


def test_models_whose_forward_does_more_are_sampled_with_generate(policy, prompts):
    """A sliding window, eager attention or a forward that changes the logits after the LM head fail
    :func:`runs_direct`; the generator then samples with ``generate`` and caches no prefixes, and μ is still the
    model's."""
    from transformers import Qwen3ForCausalLM

    from dppo_oat.rollout.direct_forward import KVBuffer, runs_direct

    class CappedLogits(Qwen3ForCausalLM):
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            output.logits = 3.0 * torch.tanh(output.logits / 3.0)
            return output

    assert not runs_direct(small_model("Mistral", sliding_window=12))
    capped = CappedLogits(small_model("Qwen3").config).eval()
    assert not runs_direct(capped)
    eager = small_model("Qwen3")
    eager.config._attn_implementation = "eager"
    assert not runs_direct(eager)
    refusing = small_model("Qwen3")  # a layer that does not take the buffer (another library version's signature)
    layer_forward = refusing.model.layers[0].forward

    def refuses_the_buffer(hidden, *args, **kwargs):
        if any(isinstance(value, KVBuffer) for value in kwargs.values()):
            raise TypeError("forward() got an unexpected keyword argument")
        return layer_forward(hidden, *args, **kwargs)

    refusing.model.layers[0].forward = refuses_the_buffer
    assert not runs_direct(refusing)

    tokenizer = policy[1]
    model = small_model("Mistral", sliding_window=12, vocab_size=len(tokenizer))
    generator = HFGenerator(model, tokenizer, batch_size=4)
    assert not generator.runs_direct and generator.prefix_cache is None
    completions = generator.generate(prompts, SamplingSettings(temperature=1.0, max_new_tokens=6, seed=0))
    assert max_logprob_error(model, prompts, completions, temperature=1.0) <= TOLERANCE


def cdf_uniforms(values) -> torch.Tensor:
    """Uniforms ``[B, 1]`` in the dtype the sampling loop draws them in on the CPU."""
    from dppo_oat.rollout.decode import exact_dtype

    return torch.as_tensor(values, dtype=exact_dtype(torch.device("cpu"))).reshape(-1, 1)


def test_inverse_cdf_sampling_draws_from_the_distribution_and_never_a_zero_probability_token():
    from dppo_oat.rollout.decode import sample_at

    probabilities = torch.tensor([0.1, 0.0, 0.25, 0.65, 0.0])  # zero-probability tokens inside and at the end
    logprobs = probabilities.log().expand(100_000, -1)
    uniforms = cdf_uniforms(torch.rand(len(logprobs), generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    counts = torch.bincount(sample_at(logprobs, uniforms), minlength=5).double()
    assert counts[1] == 0 and counts[4] == 0
    expected = probabilities.double() * len(logprobs)
    chi_square = float((((counts - expected) ** 2)[expected > 0] / expected[expected > 0]).sum())
    assert chi_square < 13.8  # χ²(2 dof) at p = 0.001
    single = torch.tensor([[0.0, float("-inf")]])  # all mass on one token
    assert sample_at(single, cdf_uniforms([0.0])).item() == sample_at(single, cdf_uniforms([0.999999])).item() == 0


def test_inverse_cdf_sampling_draws_each_rare_token_of_a_large_vocabulary_on_its_own_interval():
    """Qwen's 151,936 tokens, one at 0.999 and the others sharing 0.001 (about 6.6e-9 each, under float32's step of
    2^-24 near 1): a uniform in the middle of a rare token's interval of the exact cumulative draws that token. In
    float32 most of them could never be drawn and others would be drawn at many times their μ."""
    from dppo_oat.rollout.decode import sample_at

    vocabulary, rows = 151_936, 64
    logits = torch.zeros(1, vocabulary)
    logits[0, 0] = float(np.log(0.999 * (vocabulary - 1) / 0.001))
    logprobs = torch.log_softmax(logits, dim=-1).expand(rows, -1)
    cumulative = np.cumsum(np.exp(logprobs[0].numpy().astype(np.float64)))
    tokens = np.linspace(1, vocabulary - 1, rows).astype(np.int64)  # rare tokens across the whole tail
    middles = (cumulative[tokens - 1] + cumulative[tokens]) / 2 / cumulative[-1]
    np.testing.assert_array_equal(sample_at(logprobs, cdf_uniforms(middles)).numpy(), tokens)
