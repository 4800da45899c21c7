"""Faithfulness, end to end, as a skeptic would check it: the rollout engine samples each token at the μ it reports.

On the shipped Sudoku policy and on its int4 rollout copy, at a fixed real prompt (a first turn and the start of a
sampled answer, up to the digit the policy is least sure of), the HF generator draws the next token many times on
both of its paths: the direct-forward sampling loop (what training samples with; 6·10⁴ draws per case, in three
batches of 2·10⁴, fp32 and int4, temperatures 1.0 and 1.5) and ``model.generate`` (10⁴ draws per case, the int4
copy at both temperatures; its full prefill of every row costs about 25 times the loop's). Pearson's chi-square
compares the counts with the μ the engine reported for that prompt, on coarse cells: each token of μ ≥ 1% alone, the
rest pooled (four cells here), so that a bias on one likely token is not spread over the many degrees of freedom
of rare ones. The log μ reported with each draw is compared with that μ; the reported μ is itself checked against a
plain forward of the model that sampled, and the int4 copy against the quantised learner.

A planted bias of one percentage point on the int4 copy's second most likely token (drawn at μ + 0.01, reported at
μ) fails the chi-square in the loop at both temperatures, and the test's power against it is computed (the
noncentral chi-square): at least 0.999 at each. With 2·10⁴ draws and a cell for every token expected five times,
the same plant passed at temperature 1.5 (power about 0.05, 59 cells). The file runs in about 70 s on two shared
cores (each case of the loop under 10 s, each of ``generate`` about 12 s).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2, ncx2

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import SHIPPED_POLICIES, policy_cache_key
from dppo_oat.models.scoring import teacher_forced_logprobs
from dppo_oat.models.tiny import load_policy
from dppo_oat.rollout import decode as decode_module
from dppo_oat.rollout.episodes import EpisodeCollector
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.rollout_copy import rollout_copy, rollout_state_dict
from dppo_oat.settings.spec import RolloutSettings, SamplingSettings
from envs import ensure_registered

DRAWS = {"direct": 60_000, "generate": 10_000}
"""Draws per case (one prompt, one model, one path, one temperature), by sampling path."""
BATCH = 20_000
"""Draws per call of the generator (each call a seed of its own): the rows of one call share its memory."""
LEVEL = 1e-4
"""The chi-square test's level per case (six cases: a false alarm about once in 1,700 suites, were the seeds
not fixed)."""
PLANT = 0.01
"""The planted defect: one token drawn with probability μ(a) + 0.01 (the others scaled down), μ still reported."""
TEMPERATURES = (1.0, 1.5)
CASES = [("direct", name, temperature) for name in ("fp32", "int4") for temperature in TEMPERATURES] + [
    ("generate", "int4", temperature) for temperature in TEMPERATURES]
"""(path, model, temperature) of every case."""
MIN_SHARE = 0.01
"""Tokens with μ under this share are pooled into one cell: the test's degrees of freedom go to the likely tokens."""
MIN_EXPECTED = 5.0
"""A cell expected fewer times than this is merged into another (Pearson's approximation needs ~5 per cell)."""
MIN_POWER = 0.999
"""The chi-square's power against the planted one-point bias, at :data:`LEVEL`, in each planted case."""


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
    generator = HFGenerator(model, tokenizer, batch_size=min(BATCH, DRAWS[path]))
    assert generator.runs_direct  # the tiny policy runs on the loop; "generate" forces the other path
    generator.runs_direct = path == "direct"
    generator.prefix_cache = None
    return generator


def draw_tokens(model, tokenizer, prompt, temperature: float, path: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``DRAWS[path]`` next tokens at ``prompt`` and the log μ reported with each, in calls of :data:`BATCH` draws
    seeded ``seed``, ``seed + 1``, ..."""
    generator, tokens, logprobs = sampler(model, tokenizer, path), [], []
    for call, start in enumerate(range(0, DRAWS[path], BATCH)):
        rows = min(BATCH, DRAWS[path] - start)
        completions = generator.generate([prompt] * rows, SamplingSettings(1, temperature, seed=seed + call))
        tokens += [c.token_ids[0] for c in completions]
        logprobs += [c.logprobs[0] for c in completions]
    return np.array(tokens), np.array(logprobs, dtype=np.float64)


def pearson_cells(counts: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Observed and expected counts, each token of μ ≥ :data:`MIN_SHARE` (and expected at least
    :data:`MIN_EXPECTED` times) in a cell of its own and the others pooled into one cell (itself merged into the
    smallest other cell when it is expected fewer than :data:`MIN_EXPECTED` times)."""
    keep = expected >= max(MIN_EXPECTED, MIN_SHARE * expected.sum())
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


def planted_power(mu: np.ndarray, token: int, draws: int) -> float:
    """The chi-square's power at :data:`LEVEL` against the plant on ``token`` at ``draws`` draws: the noncentral
    chi-square of its cells (:func:`pearson_cells`), noncentrality draws·Σ (p′ − p)²/p."""
    biased = planted_distribution(torch.tensor(mu), token).numpy()
    observed, expected = pearson_cells(biased * draws, mu * draws)
    cells = len(expected) - 1
    return float(ncx2.sf(chi2.isf(LEVEL, cells), cells, ((observed - expected) ** 2 / expected).sum()))


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
        original = decode_module.sample_at

        def biased_sample(logprobs, uniforms):
            return original(planted_distribution(logprobs.exp(), token).log(), uniforms)

        monkeypatch.setattr(decode_module, "sample_at", biased_sample)
    else:
        original_multinomial = torch.multinomial

        def biased_multinomial(probs, num_samples, *args, **kwargs):
            return original_multinomial(planted_distribution(probs, token), num_samples, *args, **kwargs)

        monkeypatch.setattr(torch, "multinomial", biased_multinomial)


@pytest.mark.parametrize("path, name, temperature", CASES)
def test_the_engine_samples_each_token_at_the_mu_it_reports(policies, path, name, temperature):
    models, tokenizer, prompt = policies
    mu, p_value, gap = sampling_case(models, tokenizer, prompt, name, temperature, path, seed=7)
    assert (mu >= MIN_SHARE).sum() >= 3  # a prompt with several likely tokens: the test has cells
    assert gap < 1e-5, f"the log μ reported with a draw differs from the reported distribution by {gap}"
    assert p_value > LEVEL, f"{name}, {path}, T {temperature}: draws do not follow the reported μ (p {p_value:.2g})"


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_a_planted_one_point_bias_on_one_token_fails_the_chi_square(policies, monkeypatch, temperature):
    """The plant: the int4 copy's second most likely token drawn at μ + 0.01 by the sampling loop, its μ reported
    unchanged; the case is the loop's at the temperature, which passes unplanted. The test's power against it is at
    least :data:`MIN_POWER`, so the seeded draw failing it is not luck."""
    models, tokenizer, prompt = policies
    mu = reported_mu(models["int4"], tokenizer, prompt, temperature, "direct")
    token = int(np.argsort(mu)[-2])
    assert planted_power(mu, token, DRAWS["direct"]) >= MIN_POWER
    plant(monkeypatch, "direct", token)
    tokens, _ = draw_tokens(models["int4"], tokenizer, prompt, temperature, "direct", seed=7)
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
