"""The core's mismatch diagnostics under verl's names equal verl's own ``rollout_corr`` metrics on the same log-probs
(``compute_offpolicy_metrics``; ``compute_is_metrics``'s effective sample size of untruncated token weights)."""

import math

import pytest
import torch

pytestmark = pytest.mark.verl
pytest.importorskip("verl.trainer.ppo.core_algos")  # not just "verl": that name also finds this tests/verl folder

from dppo_oat.trust_region import mismatch_diagnostics  # noqa: E402  (after pytest.importorskip)


@pytest.mark.parametrize("seed", range(3))
def test_rollout_corr_metrics_equal_verls(seed):
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics, compute_rollout_correction_weights

    g = torch.Generator().manual_seed(seed)
    mu = torch.log_softmax(2 * torch.randn(8, 20, 6, generator=g, dtype=torch.float64), -1)[..., 0]
    logp = (mu + 0.3 * torch.randn(8, 20, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    mask = torch.rand(8, 20, generator=g) > 0.2
    mask[:, 0] = True  # every row has a response token (verl averages sequences over every row)
    theirs = compute_offpolicy_metrics(old_log_prob=logp, rollout_log_prob=mu, response_mask=mask.double())
    weights, is_metrics = compute_rollout_correction_weights(log_ratio=logp - mu, response_mask=mask.double(),
                                                             rollout_is="token", rollout_is_threshold=1e6)
    ours = mismatch_diagnostics(logp, mu, mask, (logp - mu).exp())
    for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "training_ppl", "rollout_ppl", "log_ppl_diff", "ppl_ratio"):
        assert float(ours[f"rollout_corr/{name}"]) == pytest.approx(theirs[name], rel=1e-6), name
    assert float(ours["rollout_corr/rollout_is_eff_sample_size"]) == pytest.approx(
        is_metrics["rollout_is_eff_sample_size"], rel=1e-6)
    assert math.isfinite(float(ours["rollout_corr/k3_kl_seq"]))
