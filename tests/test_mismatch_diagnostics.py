"""The mismatch diagnostics every engine logs (``dppo_oat.trust_region.mismatch_diagnostics``), under the names of
verl's ``rollout_corr`` metrics and SkyRL's ``rollout_train_logprobs_abs_diff_*``: a hand-computed case, the
definitions as those sources write them on random batches, and the first-step variants of a rollout batch's summary.
(``tests/verl/test_verl_diagnostics.py`` compares them with verl's own functions.)"""

import math

import pytest
import torch

from dppo_oat.learner.update import summarize_steps
from dppo_oat.trust_region import TrustRegion, mismatch_diagnostics, policy_loss

NAMES = ("rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/k3_kl_seq", "rollout_corr/chi2_token",
         "rollout_corr/chi2_seq", "rollout_corr/training_ppl", "rollout_corr/rollout_ppl", "rollout_corr/log_ppl_diff",
         "rollout_corr/ppl_ratio", "rollout_corr/rollout_is_eff_sample_size",
         "policy/rollout_train_logprobs_abs_diff_mean", "policy/rollout_train_logprobs_abs_diff_std",
         "policy/rollout_train_logprobs_abs_diff_max", "mismatch/abs_diff_std")


def test_by_hand():
    """μ = 0.5, 0.5 and π = 0.25, 0.5 (r = 0.5, 1), one row, w = r (DPPO, C = ∞). kl = (log 2 + 0)/2; k3 = 0.5 − 1 −
    log 0.5 = 0.19315 and 0 (mean 0.09657, sequence sum 0.19315); χ²: (0.25 + 1)/2 − 1 = −0.375 per token, 0.5² − 1
    = −0.75 per sequence; perplexities exp((log 4 + log 2)/2) = 2√2 and 2, ratio √2, log ratio log 2 / 2; ESS
    0.75²/0.625 = 0.9; |log π − log μ| = log 2, 0: mean log 2 / 2, std log 2/√2, max log 2; |π − μ| std 0.25/√2."""
    logp = torch.tensor([[0.25, 0.5]]).log()
    mu = torch.tensor([[0.5, 0.5]]).log()
    out = policy_loss(logp, mu, torch.ones(1, 1), torch.ones(1, 2, dtype=torch.bool),
                      TrustRegion.preset("dppo_binary_tv"))
    k3 = 0.5 - 1 - math.log(0.5)
    expected = {"rollout_corr/kl": math.log(2) / 2, "rollout_corr/k3_kl": k3 / 2, "rollout_corr/k3_kl_seq": k3,
                "rollout_corr/chi2_token": -0.375, "rollout_corr/chi2_seq": -0.75,
                "rollout_corr/training_ppl": 2 * math.sqrt(2), "rollout_corr/rollout_ppl": 2.0,
                "rollout_corr/log_ppl_diff": math.log(2) / 2, "rollout_corr/ppl_ratio": math.sqrt(2),
                "rollout_corr/rollout_is_eff_sample_size": 0.9,
                "policy/rollout_train_logprobs_abs_diff_mean": math.log(2) / 2,
                "policy/rollout_train_logprobs_abs_diff_std": math.log(2) / math.sqrt(2),
                "policy/rollout_train_logprobs_abs_diff_max": math.log(2), "mismatch/abs_diff_std": 0.25 / math.sqrt(2)}
    for name, value in expected.items():
        assert out.metrics[name] == pytest.approx(value, rel=1e-5), name


def random_batch(seed, b=6, t=9):
    g = torch.Generator().manual_seed(seed)
    mu = torch.log_softmax(2 * torch.randn(b, t, 7, generator=g, dtype=torch.float64), -1)[..., 0]
    logp = (mu + 0.4 * torch.randn(b, t, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    mask = torch.rand(b, t, generator=g) > 0.25
    mask[:, 0] = True
    return logp, mu, mask


@pytest.mark.parametrize("seed", range(4))
def test_the_sources_definitions(seed):
    """verl's ``compute_offpolicy_metrics`` / ``compute_is_metrics`` and SkyRL's trainer, written out with their own
    operations (boolean indexing, per-row loops)."""
    logp, mu, mask = random_batch(seed)
    weight = (logp - mu).exp().clamp(max=2.0)
    got = {k: float(v) for k, v in mismatch_diagnostics(logp, mu, mask, weight).items()}
    assert set(got) == set(NAMES)
    lr = (logp - mu)[mask]
    assert got["rollout_corr/kl"] == pytest.approx(float((-lr).mean()))
    assert got["rollout_corr/k3_kl"] == pytest.approx(float((lr.exp() - lr - 1).mean()))
    assert got["rollout_corr/chi2_token"] == pytest.approx(float((2 * lr).exp().mean() - 1))
    rows = [(logp[i][mask[i]], mu[i][mask[i]]) for i in range(len(logp))]
    assert got["rollout_corr/chi2_seq"] == pytest.approx(sum(float((2 * (p - m).sum()).exp()) for p, m in rows)
                                                         / len(rows) - 1)
    assert got["rollout_corr/k3_kl_seq"] == pytest.approx(sum(float(((p - m).exp() - (p - m) - 1).sum())
                                                              for p, m in rows) / len(rows))
    assert got["rollout_corr/training_ppl"] == pytest.approx(sum(float((-p.mean()).exp()) for p, _ in rows) / len(rows))
    assert got["rollout_corr/ppl_ratio"] == pytest.approx(sum(float((m.mean() - p.mean()).exp()) for p, m in rows)
                                                          / len(rows))
    w = weight[mask]
    assert got["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(float(1 / ((w / w.mean()) ** 2).mean()))
    diff = lr.abs()
    assert got["policy/rollout_train_logprobs_abs_diff_std"] == pytest.approx(float(diff.std()))
    assert got["policy/rollout_train_logprobs_abs_diff_max"] == pytest.approx(float(diff.max()))
    assert got["mismatch/abs_diff_std"] == pytest.approx(float((logp.exp() - mu.exp())[mask].abs().std()))


def test_on_policy_is_zero_and_finite_when_empty():
    logp, _, mask = random_batch(1)
    got = mismatch_diagnostics(logp, logp, mask, torch.ones_like(logp))
    for name in NAMES:
        expected = 1.0 if name in ("rollout_corr/rollout_is_eff_sample_size", "rollout_corr/ppl_ratio") else 0.0
        if name.endswith("_ppl"):
            continue
        assert float(got[name]) == pytest.approx(expected, abs=1e-12), name
    empty = mismatch_diagnostics(logp, logp - 1, torch.zeros_like(mask), torch.ones_like(logp))
    assert all(math.isfinite(float(v)) for v in empty.values())


def test_the_first_step_of_a_rollout_batch_is_reported_apart():
    history = [{"rollout_corr/k3_kl": 0.01, "mismatch/abs_diff_mean": 0.1,
                "policy/rollout_train_logprobs_abs_diff_max": 2.0},
               {"rollout_corr/k3_kl": 0.03, "mismatch/abs_diff_mean": 0.3,
                "policy/rollout_train_logprobs_abs_diff_max": 1.0}]
    summary = summarize_steps(history)
    assert summary["rollout_corr/k3_kl"] == pytest.approx(0.02) and summary["rollout_corr/first_k3_kl"] == 0.01
    assert summary["mismatch/first_abs_diff_mean"] == 0.1
    assert summary["policy/rollout_train_logprobs_abs_diff_max"] == 2.0  # a max over the steps
