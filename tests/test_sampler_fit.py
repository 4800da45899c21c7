"""Every sampler draws from μ = softmax(logits / T) at T = 1.5, with the power to see a 1% relative bias of the top
token; planting that bias in the same sampler makes the same check fail.

The check (:func:`fit`) takes N = 2^17 = 131,072 draws from one fixed distribution whose top token has
p = 0.9 at T = 1.5, and applies two tests, each at α = 5e-5:

- the top token's count, by the equal-tailed exact binomial test (p-value ``2·min(P(X ≤ k), P(X ≥ k))``);
- the whole distribution, by Pearson's χ² (the tokens expected fewer than 5 times pooled in one bin).

A sampler that draws from μ is rejected with probability ≤ 1e-4 (the two α together; the χ²'s is asymptotic).

Power against p → p' = 1.01 p (the other tokens scaled to fill 1 − p'): the top token's count moves by
δ = 0.01·p·N, with standard deviation σ₀ = √(N·p(1−p)) under μ and σ₁ = √(N·p'(1−p')) under the bias. The binomial
test rejects beyond z₀ = 4.056 σ₀ (a tail of 2.5e-5), so it rejects with probability ≥ 0.999 (z₁ = 3.090) when
δ ≥ z₀σ₀ + z₁σ₁, i.e. when

    N ≥ ((4.056·√(p(1−p)) + 3.090·√(p'(1−p'))) / (0.01·p))²  =  54,728 at p = 0.9,  125,973 at p = 0.8.

N = 131,072 exceeds both: the exact power is 1 − 1e-12 at p = 0.9 and 0.9994 at p = 0.8 (0.9991 against
p → 0.99 p) (:func:`test_the_draws_detect_a_one_percent_bias_of_any_top_token_of_probability_0_8_or_more`). A top
token of smaller probability needs N to grow as (1 − p)/p.

Each sampler's draws are i.i.d. from one μ: :func:`test_draw_tokens_draws_from_mu` calls
:func:`~dppo_oat.rollout.decode.draw_tokens` (every draw of the sampling loop, eager or in a graph) once on N rows of
the fixed logits; the generator tests run :class:`~dppo_oat.rollout.hf_generator.HFGenerator` (the local engine's
sampler) on a policy whose next-token logits are the fixed logits at every position of every prompt (all its token
embeddings are one vector, so every position's hidden state is the same; its LM head maps that state to the fixed
logits), 2,048 prompts × 64 tokens. Each sampler is seeded, so each test's outcome is fixed.

The planted bias replaces the distribution a draw inverts (:func:`~dppo_oat.rollout.decode.sample_at`'s input;
``torch.multinomial``'s for ``model.generate``) by the biased one, while μ is still computed and reported as before:
the silent kind of bias, the one only the draws' frequencies show.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats

from dppo_oat.models import build_tiny_policy, toy_corpus
from dppo_oat.rollout import decode as decode_module
from dppo_oat.rollout.cuda_graphs import GraphCache
from dppo_oat.rollout.decode import draw_tokens
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import SamplingSettings

TEMPERATURE = 1.5
DRAWS = 2**17
"""N: the draws of each check (module docstring)."""
ALPHA = 5e-5
"""The level of each of the check's two tests: 1e-4 together."""
BIAS = 1.01
"""The planted bias: the top token's probability times 1.01."""
TOP, TOP_PROBABILITY = 37, 0.9
"""The fixed logits' top token and its probability at :data:`TEMPERATURE`."""
NEVER = -60.0
"""The logit of the special tokens (pad, turn start, EOS): probability ~1e-18 at T = 1.5, so no row stops."""
VOCABULARY = 276
""":func:`test_draw_tokens_draws_from_mu`'s vocabulary: the tiny policy's."""
ROWS, STEPS = 2048, 64
"""The generator tests' prompts and tokens per prompt: ROWS × STEPS = :data:`DRAWS`."""


def fixed_logits(vocabulary: int, never: tuple[int, ...] = (0, 1, 2)) -> torch.Tensor:
    """float32 logits ``[V]``: N(0, 1) (seeded), ``never`` at :data:`NEVER`, and :data:`TOP` raised to probability
    :data:`TOP_PROBABILITY` at :data:`TEMPERATURE`."""
    logits = torch.randn(vocabulary, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    logits[list(never)] = NEVER
    logits[TOP] = float("-inf")
    others = torch.logsumexp(logits / TEMPERATURE, dim=0)
    logits[TOP] = TEMPERATURE * (others + np.log(TOP_PROBABILITY / (1 - TOP_PROBABILITY)))
    return logits.float()


def mu(logits: torch.Tensor) -> np.ndarray:
    """μ = softmax(logits / T) in float64: the reference the draws are tested against."""
    return torch.softmax(logits.double() / TEMPERATURE, dim=-1).numpy()


# --- the check ---------------------------------------------------------------------------------------------------


def top_token_pvalue(count: int, draws: int, probability: float) -> float:
    """The equal-tailed exact binomial test's p-value of ``count`` top tokens in ``draws``."""
    below, above = stats.binom.cdf(count, draws, probability), stats.binom.sf(count - 1, draws, probability)
    return float(min(1.0, 2 * min(below, above)))


def chi_square_pvalue(counts: np.ndarray, probabilities: np.ndarray) -> float:
    """Pearson's χ² p-value of token ``counts`` against ``probabilities``, the tokens expected fewer than 5 times
    pooled in one bin (a drawn token of probability 0 rejects outright)."""
    expected = probabilities * counts.sum()
    if counts[expected == 0].any():
        return 0.0
    large = expected >= 5
    observed = np.append(counts[large], counts[~large].sum()).astype(np.float64)
    wanted = np.append(expected[large], expected[~large].sum())
    wanted *= observed.sum() / wanted.sum()  # exact totals for scipy (rounding of the float64 probabilities)
    return float(stats.chisquare(observed, wanted).pvalue)


@dataclass
class Fit:
    """The check's two p-values for a sample of tokens."""

    top: float
    chi_square: float

    @property
    def rejects(self) -> bool:
        return min(self.top, self.chi_square) <= ALPHA


def fit(tokens: np.ndarray, probabilities: np.ndarray) -> Fit:
    """The check: :data:`DRAWS` ``tokens`` against ``probabilities`` (μ), top token and whole distribution."""
    assert len(tokens) == DRAWS
    counts = np.bincount(tokens, minlength=len(probabilities))
    top = int(np.argmax(probabilities))
    return Fit(top_token_pvalue(int(counts[top]), DRAWS, float(probabilities[top])),
               chi_square_pvalue(counts, probabilities))


def check(tokens: np.ndarray, probabilities: np.ndarray, planted: bool) -> None:
    """The draws pass the check, or, with the planted bias, its top-token test rejects them."""
    result = fit(tokens, probabilities)
    if planted:
        assert result.top <= ALPHA, f"a 1% bias of the top token went unseen: {result}"
    else:
        assert not result.rejects, f"the draws are not from μ: {result}"


# --- the planted bias --------------------------------------------------------------------------------------------


def biased(probabilities: torch.Tensor) -> torch.Tensor:
    """Each row's top token's probability times :data:`BIAS`, the other tokens scaled to fill the rest (float64)."""
    probabilities = probabilities.double()
    top = probabilities.argmax(dim=-1, keepdim=True)
    p = probabilities.gather(-1, top)
    return (probabilities * (1 - BIAS * p) / (1 - p)).scatter(-1, top, BIAS * p)


def plant_bias(monkeypatch) -> None:
    """Every draw of the sampling loop (eager or in a graph) and of ``model.generate`` inverts the biased
    distribution; μ is computed and reported as before."""
    sample_at, multinomial = decode_module.sample_at, torch.multinomial

    def biased_sample_at(logprobs, uniforms):
        return sample_at(biased(logprobs.exp()).log(), uniforms)

    def biased_multinomial(probabilities, *args, **kwargs):
        return multinomial(biased(probabilities).to(probabilities.dtype), *args, **kwargs)

    monkeypatch.setattr(decode_module, "sample_at", biased_sample_at)
    monkeypatch.setattr(torch, "multinomial", biased_multinomial)


# --- the samplers ------------------------------------------------------------------------------------------------


def test_the_draws_detect_a_one_percent_bias_of_any_top_token_of_probability_0_8_or_more():
    """The module docstring's numbers, from the binomial distribution itself: the top-token test's level is at most
    α, and its power against p → 1.01 p and p → 0.99 p is at least 0.999 for p = 0.8 and p = 0.9."""

    def power(p: float, q: float) -> tuple[float, float]:
        counts = np.arange(DRAWS + 1)
        pvalues = 2 * np.minimum(stats.binom.cdf(counts, DRAWS, p), stats.binom.sf(counts - 1, DRAWS, p))
        rejected = pvalues <= ALPHA
        return float(stats.binom.pmf(counts, DRAWS, p)[rejected].sum()), \
            float(stats.binom.pmf(counts, DRAWS, q)[rejected].sum())

    for p in (0.8, TOP_PROBABILITY):
        for factor in (BIAS, 2 - BIAS):
            level, detected = power(p, factor * p)
            assert level <= ALPHA and detected >= 0.999, (p, factor, level, detected)
    z0, z1 = stats.norm.isf(ALPHA / 2), stats.norm.isf(1e-3)
    needed = {p: ((z0 * np.sqrt(p * (1 - p)) + z1 * np.sqrt(BIAS * p * (1 - BIAS * p))) / (0.01 * p)) ** 2
              for p in (0.8, 0.9)}
    assert round(needed[0.9]) == 54_728 and round(needed[0.8]) == 125_973 and DRAWS > max(needed.values())


@pytest.mark.parametrize("planted", [False, True], ids=["sampler", "planted_bias"])
def test_draw_tokens_draws_from_mu(planted, monkeypatch):
    """:func:`draw_tokens` on N rows of the fixed logits at T = 1.5, in one call, passes the check, and reports μ;
    with the top token biased by 1%, the same check rejects it."""
    if planted:
        plant_bias(monkeypatch)
    logits = fixed_logits(VOCABULARY)
    uniforms = torch.rand((DRAWS, 1), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logprobs, tokens, _ = draw_tokens(logits.expand(DRAWS, -1), uniforms, torch.zeros(DRAWS, dtype=torch.bool),
                                      temperature=TEMPERATURE, pad_id=0, stop_ids=torch.tensor([2]))
    np.testing.assert_allclose(logprobs[0].exp().double().numpy(), mu(logits), rtol=1e-5, atol=1e-12)
    check(tokens.numpy(), mu(logits), planted)


@pytest.fixture(scope="module")
def fixed_policy():
    """A tiny policy whose next-token logits are :func:`fixed_logits` wherever it is asked (module docstring), its
    tokenizer, μ of its logits and :data:`ROWS` prompts of 3 to 9 tokens."""
    model, tokenizer = build_tiny_policy(toy_corpus(), seed=0, tie_word_embeddings=False, hidden_size=32,
                                         intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16)
    never = (tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.eos_token_id)
    target = fixed_logits(len(tokenizer), never).double()
    prompts = [tokenizer.encode(text)[: 3 + row % 7] for row, text in enumerate(toy_corpus(ROWS, seed=1))]
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight
        embedding.copy_(embedding[5].expand_as(embedding))  # row 5: not the padding row, which is zero
        state = model.model(torch.tensor([prompts[0]])).last_hidden_state[0, -1].double()
        model.lm_head.weight.copy_(target[:, None] * state[None, :] / (state @ state))
        logits = [model(torch.tensor([prompt])).logits[0] for prompt in prompts[:5]]
    for row in logits:  # every position of every prompt: the same logits, up to float rounding
        torch.testing.assert_close(row, target.float().expand_as(row), atol=1e-4, rtol=0)
    return model, tokenizer, mu(logits[0][-1]), prompts


SAMPLERS = ["eager", "sampling_in_graph", "generate"]
"""The generator's sampling paths at T = 1.5: its sampling loop decoding eagerly (the local engine's), the loop on
a decode graph that samples too (run on the CPU by the graph's step, as ``tests/test_graph_sampling.py`` does), and
``model.generate`` (a model the loop does not run)."""


def generator_for(sampler: str, model, tokenizer) -> HFGenerator:
    generator = HFGenerator(model, tokenizer, batch_size=ROWS)
    if sampler == "sampling_in_graph":
        generator.graphs = GraphCache(capture=lambda graph: graph.forward, device_types=("cpu",))
    elif sampler == "generate":
        generator.runs_direct = False
    return generator


@pytest.mark.parametrize("planted", [False, True], ids=["sampler", "planted_bias"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_generator_draws_from_mu(sampler, planted, fixed_policy, monkeypatch):
    """:data:`ROWS` × :data:`STEPS` tokens of :class:`HFGenerator` at T = 1.5 from the policy of fixed logits pass
    the check, each with the μ it reports; with the top token biased by 1%, the same check rejects them."""
    model, tokenizer, probabilities, prompts = fixed_policy
    if planted:
        plant_bias(monkeypatch)
    generator = generator_for(sampler, model, tokenizer)
    completions = generator.generate(prompts, SamplingSettings(max_new_tokens=STEPS, temperature=TEMPERATURE,
                                                               seed=3))
    expected_step = {"eager": "EagerStep", "sampling_in_graph": "SampledStep", "generate": None}[sampler]
    assert dict(generator.decode_steps) == ({expected_step: 1} if expected_step else {})
    tokens = np.concatenate([completion.token_ids for completion in completions])
    reported = np.exp(np.concatenate([completion.logprobs for completion in completions]))
    np.testing.assert_allclose(reported, probabilities[tokens], rtol=1e-4)
    check(tokens, probabilities, planted)
