"""The divergence probe on a real (tiny) model's batch: binary ≤ top-K ≤ exact per token, zero for μ = π, and the
exact TV equal to ½ Σ |μ − π| computed by hand."""

import pytest
import torch

from dppo_oat.divergence.probe import divergence_estimates, probe_metrics, response_actions, response_logits
from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
from dppo_oat.update_batch import TurnSample, build_update_batch


@pytest.fixture(scope="module")
def policy_and_batch():
    torch.manual_seed(0)
    model, tokenizer = build_tiny_policy(toy_corpus(), seed=0, vocab_size=300, hidden_size=32,
                                         num_hidden_layers=1)
    samples = []
    for i, (prompt, answer) in enumerate([("Sudoku 4x4\n1 . 3 4\nMove:", " \\boxed{1 2 2}"),
                                          ("Sudoku 4x4\n. 2 3 4\nMove:", " \\boxed{1 1 1}")]):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        samples.append(TurnSample(prompt_ids, response_ids, [-1.0] * len(response_ids), 0.0, False, False, 0,
                                  "test", i, str(i), "stop"))
    batch = build_update_batch(samples, [1.0, -1.0], tokenizer.pad_token_id)
    return model.eval(), batch


def perturbed(model, scale: float, seed: int):
    other = type(model)(model.config)
    other.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return other.eval()


def test_binary_below_topk_below_exact_on_real_logits(policy_and_batch):
    model, batch = policy_and_batch
    mu_logits = response_logits(model, batch)
    pi_logits = response_logits(perturbed(model, 0.05, seed=1), batch)
    actions = response_actions(batch)
    assert mu_logits.shape == (int(batch.response_mask.sum()), model.config.vocab_size)
    est = divergence_estimates(mu_logits, pi_logits, actions, k=5)
    tol = 1e-6
    for d in ("tv", "kl"):
        assert torch.all(est[f"binary_{d}"] <= est[f"topk_{d}"] + tol)
        assert torch.all(est[f"topk_{d}"] <= est[f"exact_{d}"] + tol)
        assert est[f"exact_{d}"].max() > 0
    by_hand = 0.5 * (mu_logits.softmax(-1) - pi_logits.softmax(-1)).abs().sum(-1)
    torch.testing.assert_close(est["exact_tv"], by_hand, rtol=1e-5, atol=1e-6)


def test_identical_policies_have_zero_divergence(policy_and_batch):
    model, batch = policy_and_batch
    logits = response_logits(model, batch)
    est = divergence_estimates(logits, logits.clone(), response_actions(batch), k=3)
    for values in est.values():
        assert values.abs().max() < 1e-5
    metrics = probe_metrics(est, delta=0.15)
    assert metrics["probe/exact_tv_above_delta"] == 0.0 and metrics["probe/exact_kl_max"] < 1e-5


def test_probe_metrics_fractions_and_ratios():
    est = {"binary_tv": torch.tensor([0.1, 0.2]), "topk_tv": torch.tensor([0.1, 0.3]),
           "exact_tv": torch.tensor([0.2, 0.4]), "binary_kl": torch.tensor([0.0, 0.0]),
           "topk_kl": torch.tensor([0.0, 0.1]), "exact_kl": torch.tensor([0.1, 0.1])}
    metrics = probe_metrics(est, delta=0.15)
    assert metrics["probe/binary_tv_above_delta"] == 0.5 and metrics["probe/exact_tv_above_delta"] == 1.0
    assert metrics["probe/binary_tv_mean"] == pytest.approx(0.15)
    assert metrics["probe/topk_kl_mean"] == pytest.approx(0.05)
    assert metrics["probe/exact_tv_max"] == pytest.approx(0.4)
