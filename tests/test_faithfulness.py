"""Faithfulness, end to end, as a skeptic would check it: the rollout engine samples each token at the μ it reports.

On the shipped Sudoku policy and on its int4 rollout copy, at a fixed real prompt (a first turn and the start of a
sampled answer, up to the digit the policy is least sure of), the HF generator draws the next token many times on
both of its paths: the direct-forward sampling loop (what training samples with; 2·10⁴ draws per case, fp32 and
int4, temperatures 1.0 and 1.5) and ``model.generate`` (10⁴ draws per case, the int4 copy at both temperatures; its
full prefill of every row costs about 25 times the loop's). Pearson's chi-square compares the counts with the μ
the engine reported for that prompt, and the log μ reported with each draw with that μ; the reported μ is itself
checked against a plain forward of the model that sampled, and the int4 copy against the quantised learner. A
planted bias of one percentage point on the int4 copy's second most likely token (drawn at μ + 0.01, reported at
μ), in the loop at 2·10⁴ draws, fails the chi-square.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import SHIPPED_POLICIES, policy_cache_key
from dppo_oat.models.scoring import teacher_forced_logprobs
from dppo_oat.models.tiny import load_policy
from dppo_oat.rollout import decode as decode_module
from dppo_oat.rollout.episodes import EpisodeCollector
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.precision import rollout_copy, rollout_state_dict
from dppo_oat.spec import RolloutSettings, SamplingSettings
from envs import ensure_registered

DRAWS = {"direct": 20_000, "generate": 10_000}
"""Draws per case (one prompt, one model, one path, one temperature), by sampling path."""
LEVEL = 1e-4
"""The chi-square test's level per case (six cases: a false alarm about once in 1,700 suites, were the seeds
not fixed)."""
PLANT = 0.01
"""The planted defect: one token drawn with probability μ(a) + 0.01 (the others scaled down), μ still reported."""
TEMPERATURES = (1.0, 1.5)
CASES = [("direct", name, temperature) for name in ("fp32", "int4") for temperature in TEMPERATURES] + [
    ("generate", "int4", temperature) for temperature in TEMPERATURES]
"""(path, model, temperature) of every case."""
MIN_EXPECTED = 5.0
"""Tokens expected fewer times than this are pooled into one cell (Pearson's approximation needs ~5 per cell)."""


@pytest.fixture(scope="module")
def policies():
    """The shipped Sudoku policy (the learner), its int4 rollout copy, its tokenizer and a fixed prompt: a real
    first-turn prompt and the start of a sampled answer, up to the position of the first digit the policy chooses
    between several (the most uncertain of the answer's positions)."""
    config = TrainConfig()
    learner, tokenizer = load_policy(SHIPPED_POLICIES / policy_cache_key(
        config.env_ids[0], config.template, config.warm_start, config.warm_start_seed))
    ensure_registered(config.env_ids[0])
    collector = EpisodeCollector(list(config.env_ids), 1, 1, tokenizer,
                                 RolloutSettings(template=config.template, max_prompt_tokens=config.max_prompt_tokens))
    try:
        sample = collector.collect(HFGenerator(learner, tokenizer), SamplingSettings(12, 1.0, seed=1), [100]).samples[0]
    finally:
        collector.close()
    prompt = least_certain_prefix(learner, sample.prompt_ids, sample.response_ids)
    return {"fp32": learner, "int4": rollout_copy(learner, "int4")}, tokenizer, prompt


def least_certain_prefix(model, prompt, response) -> list[int]:
    """``prompt`` and the start of ``response`` up to its position of highest next-token entropy under ``model``."""
    logprobs = teacher_forced_logprobs(model, prompt, response)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return list(prompt) + list(response[: int(entropy.argmax())])


def reported_mu(model, tokenizer, prompt, temperature: float, path: str) -> np.ndarray:
    """The whole next-token μ the engine reports at ``prompt`` (its top-K arrays with K = the vocabulary)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = sampler(model, tokenizer, path)
    completion = generator.generate([prompt], SamplingSettings(1, temperature, top_k_logprobs=vocab, seed=0))[0]
    ids, logprobs = completion.topk_ids[0], completion.topk_logprobs[0].astype(np.float64)
    assert sorted(ids[:vocab]) == list(range(vocab))  # K = V: the first V slots are the whole vocabulary
    mu = np.zeros(vocab)
    mu[ids[:vocab]] = np.exp(logprobs[:vocab])  # the last slot holds a_t only when it is outside the top K
    return mu


def sampler(model, tokenizer, path: str) -> HFGenerator:
    """An HF generator on ``path``: its direct-forward sampling loop, or ``model.generate``."""
    generator = HFGenerator(model, tokenizer, batch_size=DRAWS[path])
    assert generator.runs_direct  # the tiny policy runs on the loop; "generate" forces the other path
    generator.runs_direct = path == "direct"
    generator.prefix_cache = None
    return generator


def draw_tokens(model, tokenizer, prompt, temperature: float, path: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``DRAWS[path]`` next tokens at ``prompt`` and the log μ reported with each."""
    completions = sampler(model, tokenizer, path).generate([prompt] * DRAWS[path],
                                                           SamplingSettings(1, temperature, seed=seed))
    return (np.array([c.token_ids[0] for c in completions]),
            np.array([c.logprobs[0] for c in completions], dtype=np.float64))


def pearson_cells(counts: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Observed and expected counts with every token expected fewer than :data:`MIN_EXPECTED` times pooled into
    one cell (itself merged into the smallest other cell when it is still that small)."""
    keep = expected >= MIN_EXPECTED
    observed, wanted = list(counts[keep]), list(expected[keep])
    rest_observed, rest_expected = counts[~keep].sum(), expected[~keep].sum()
    if rest_expected >= MIN_EXPECTED or not wanted:
        observed.append(rest_observed)
        wanted.append(rest_expected)
    else:
        smallest = int(np.argmin(wanted))
        observed[smallest] += rest_observed
        wanted[smallest] += rest_expected
    return np.asarray(observed, dtype=np.float64), np.asarray(wanted, dtype=np.float64)


def chi_square_p(tokens: np.ndarray, mu: np.ndarray) -> float:
    """Pearson's chi-square p-value of the drawn ``tokens`` against the reported distribution ``mu``."""
    counts = np.bincount(tokens, minlength=len(mu))
    observed, expected = pearson_cells(counts, mu * len(tokens))
    statistic = ((observed - expected) ** 2 / expected).sum()
    return float(chi2.sf(statistic, df=len(observed) - 1))


def sampling_case(models, tokenizer, prompt, name: str, temperature: float, path: str, seed: int):
    """One case: the reported μ, the draws' p-value against it, and the largest gap between the log μ reported
    with each draw and that μ (the same distribution, token by token)."""
    model = models[name]
    mu = reported_mu(model, tokenizer, prompt, temperature, path)
    tokens, logprobs = draw_tokens(model, tokenizer, prompt, temperature, path, seed)
    gap = float(np.abs(np.exp(logprobs) - mu[tokens]).max())
    return mu, chi_square_p(tokens, mu), gap


def planted_distribution(probs: torch.Tensor, token: int) -> torch.Tensor:
    """``probs [..., V]`` with :data:`PLANT` more mass on ``token`` and the others scaled down to make room."""
    others = (1 - probs[..., token : token + 1] - PLANT) / (1 - probs[..., token : token + 1])
    biased = probs * others
    biased[..., token] = probs[..., token] + PLANT
    return biased


def plant(monkeypatch, path: str, token: int) -> None:
    """Bias the draw of ``path`` toward ``token`` while the engine still reports the unbiased μ."""
    if path == "direct":
        original = decode_module.inverse_cdf_sample

        def biased_sample(logprobs, draw_order=None, generator=None):
            return original(planted_distribution(logprobs.exp(), token).log(), draw_order, generator)

        monkeypatch.setattr(decode_module, "inverse_cdf_sample", biased_sample)
    else:
        original_multinomial = torch.multinomial

        def biased_multinomial(probs, num_samples, *args, **kwargs):
            return original_multinomial(planted_distribution(probs, token), num_samples, *args, **kwargs)

        monkeypatch.setattr(torch, "multinomial", biased_multinomial)


@pytest.mark.parametrize("path, name, temperature", CASES)
def test_the_engine_samples_each_token_at_the_mu_it_reports(policies, path, name, temperature):
    models, tokenizer, prompt = policies
    mu, p_value, gap = sampling_case(models, tokenizer, prompt, name, temperature, path, seed=7)
    assert (mu * DRAWS[path] >= MIN_EXPECTED).sum() >= 3  # a prompt with several likely tokens: the test has cells
    assert gap < 1e-5, f"the log μ reported with a draw differs from the reported distribution by {gap}"
    assert p_value > LEVEL, f"{name}, {path}, T {temperature}: draws do not follow the reported μ (p {p_value:.2g})"


def test_a_planted_one_point_bias_on_one_token_fails_the_chi_square(policies, monkeypatch):
    """The plant: the int4 copy's second most likely token drawn at μ + 0.01 by the sampling loop, its μ reported
    unchanged; the case is the loop's at temperature 1.0, which passes unplanted."""
    models, tokenizer, prompt = policies
    mu = reported_mu(models["int4"], tokenizer, prompt, 1.0, "direct")
    token = int(np.argsort(mu)[-2])
    plant(monkeypatch, "direct", token)
    tokens, _ = draw_tokens(models["int4"], tokenizer, prompt, 1.0, "direct", seed=7)
    assert abs((tokens == token).mean() - mu[token] - PLANT) < 5 * np.sqrt(mu[token] / len(tokens))  # it took
    assert chi_square_p(tokens, mu) < LEVEL


def test_the_reported_mu_is_a_plain_forward_of_the_model_that_sampled(policies):
    """The μ the engine reports is the tempered softmax of a plain forward of its model, and the int4 copy is the
    learner's weights quantised."""
    models, tokenizer, prompt = policies
    quantised = rollout_state_dict(models["fp32"].state_dict(), "int4")
    assert all(torch.equal(quantised[name], tensor) for name, tensor in models["int4"].state_dict().items())
    for name, model in models.items():
        for temperature in TEMPERATURES:
            with torch.no_grad():
                forward = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].float() / temperature, -1)
            reported = reported_mu(model, tokenizer, prompt, temperature, "direct")
            assert np.abs(reported - forward.exp().numpy()).max() < 1e-5, (name, temperature)
