"""The trust-region field after DPPO, each preset against its source: a hand-computed case of mask and gradient, the
gradient against the loss as the source writes it, and how the sequence-level rules meet multi-turn samples.

IPO (prime-rl ``loss.py`` ``ipo_loss_fn``): −M·r·A + τ·log² r, M blocks |π − μ| > δ whatever A.
TRM-Max / TRM-Avg (verl ``rollout_corr_helper`` ``seq_max_k2`` / ``seq_mean_k3`` in bypass PPO-clip): PPO's clip on
π/μ, and a whole response masked when its max ½(log r)² or mean r − 1 − log r exceeds δ.
DeepSeek-V3.2's mask (TRL ``get_off_policy_mask``): keep iff A ≥ 0 or the response's mean log(μ/π) ≤ δ.
VACO (open-instruct PR #1755 ``compute_rho_correction``, ``vaco``): drop iff mean |π_θ' − μ| > δ and
sign(log π_θ'/μ)·A > 0; w = (π/π_θ')·min(π_θ'/μ, 2) under the clip of π/π_θ'.
GSPO (verl ``compute_policy_loss_gspo``): s_i = exp(mean log π/μ), PPO's clip on s_i, gradient s_i·A·∇log π.
SAPO (verl ``compute_policy_loss_sapo``): −f(r)·A, f(r) = σ(τ(r − 1))·4/τ.
MinPRO (arXiv 2601.22718, abstract): w_t = min_{j ≤ t} r_j.

A row of the loss is one turn (one response): every sequence-level rule decides a row from that row alone, so the
turns of one episode are masked, weighted and minimised over separately (``test_a_row_is_one_turn``).
"""

import math

import pytest
import test_later_presets as later_presets
import torch

from dppo_oat.trust_region import PRESETS, RULE_TABLE, TrustRegion, policy_loss, sapo_gate_slope

FIELD = ("ipo", "trm_max", "trm_avg", "opsm", "vaco", "gspo", "sapo", "minpro")
WITHOUT_TOPK = [name for name in PRESETS if not TrustRegion.preset(name).uses_topk]
"""Every preset of the registry that needs no top-K set (the batches here carry none)."""
ROW_LOCAL = [name for name in WITHOUT_TOPK if not RULE_TABLE[TrustRegion.preset(name).rule].reads_batch]
"""Every preset whose mask decides a row from that row alone: all but those whose rule declares it reads the whole
batch (M2PO's second moment)."""


def run(preset, mu, pi, adv, mask=None, recomputed=None, **overrides):
    """policy_loss on ``[B, T]`` probabilities (fp64 leaves); its output and the gradient on log π_θ."""
    logp = torch.tensor(pi, dtype=torch.float64).log().requires_grad_()
    mu_logp = torch.tensor(mu, dtype=torch.float64).log()
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    old = None if recomputed is None else torch.tensor(recomputed, dtype=torch.float64).log()
    out = policy_loss(logp, mu_logp, torch.tensor(adv, dtype=torch.float64), mask,
                      TrustRegion.preset(preset, **overrides), recomputed_logp=old)
    out.loss.sum().backward()
    return out, logp.grad


def assert_rows(actual, expected, rtol=1e-5):
    later_presets.assert_rows(actual, expected, rtol=rtol, atol=1e-7)


def random_batch(seed, b=8, t=10, spread=0.6):
    """test_later_presets' batch, at this file's size."""
    return later_presets.random_batch(seed, b, t, spread)


def our_gradient(tr, mu, logp, adv, mask):
    """∂(Σ policy loss)/∂ log π_θ under ``tr``."""
    ours = logp.clone().requires_grad_()
    policy_loss(ours, mu, adv, mask, tr).loss.sum().backward()
    return ours.grad


def test_sources_and_defaults():
    expected = {
        "ipo": ({"rule": "ipo", "delta": 0.1, "kl_tau": 1e-3}, ("ipo_loss_fn", "ipo_threshold 0.1", "kl_tau 1e-3")),
        "trm_max": ({"rule": "trm_max", "eps_low": 0.2, "eps_high": 0.2, "delta": 2.5},
                    ("2512.23075", "seq_max_k2", "rollout_corr_helper.py", "run_qwen2_5_7b_fsdp_multi_rs.sh",
                     "not read")),
        "trm_avg": ({"rule": "trm_avg", "delta": 0.01}, ("bypass_ppo_clip_k3_rs", "seq_mean_k3", "0.01")),
        "opsm": ({"rule": "opsm", "delta": 0.5, "eps_low": 0.2}, ("get_off_policy_mask", "paper_index.md", "0.5")),
        "vaco": ({"rule": "vaco", "anchor": "recompute", "is_weight": "decoupled_token", "is_cap": 2.0,
                  "eps_high": 0.272, "delta": 0.3}, ("2603.01365", "could not be read", "compute_rho_correction",
                                                     "test_vaco_tv_divergence")),
        "gspo": ({"rule": "gspo", "eps_low": 3e-4, "eps_high": 4e-4}, ("compute_policy_loss_gspo", "3e-4")),
        "sapo": ({"rule": "sapo", "tau_pos": 1.0, "tau_neg": 1.05}, ("compute_policy_loss_sapo", "1.05")),
        "minpro": ({"rule": "minpro"}, ("2601.22718", "abstract", "not verified")),
    }
    for name, (fields, parts) in expected.items():
        tr = TrustRegion.preset(name)
        assert all(getattr(tr, key) == value for key, value in fields.items()), name
        assert all(part in PRESETS[name].source for part in parts), (name, PRESETS[name].source)
    assert [TrustRegion.preset(n).needs_recompute for n in FIELD] == [n == "vaco" for n in FIELD]
    # the rules that set w_t themselves read no C; SAPO reads its two temperatures
    assert "is_cap" not in TrustRegion.preset("gspo").fields_read
    assert TrustRegion.preset("sapo").fields_read == {"tau_pos", "tau_neg", "kl_tau"}
    assert TrustRegion.preset("minpro").fields_read == {"kl_tau"}


# --------------------------------------------------------------------------------------------- IPO


def test_ipo_by_hand():
    """δ = 0.1, τ = 1e-3, μ = 0.5. π = 0.55, A = +1: in the band, −r·A + 2τ·log r = −1.1 + 1.906e-4. π = 0.7: |Δ| 0.2,
    masked: only 2τ·log 1.4 = 6.729e-4. π = 0.3, A = +1 moves back toward μ: DPPO keeps it, the symmetric band masks
    it (2τ·log 0.6 = −1.0217e-3). π = 0.45, A = −1: 0.9 − 2.107e-4."""
    mu = [[0.5, 0.5, 0.5, 0.5]]
    pi = [[0.55, 0.7, 0.3, 0.45]]
    adv = [[1.0, 1.0, 1.0, -1.0]]
    out, grad = run("ipo", mu, pi, adv)
    assert out.keep.tolist() == [[True, False, False, True]]
    assert_rows(grad, [[-1.1 + 1.9062036e-4, 6.7294447e-4, -1.02165125e-3, 0.9 - 2.1072103e-4]])
    dppo, _ = run("dppo_binary_tv", mu, pi, adv, delta=0.1)
    assert dppo.keep.tolist() == [[True, False, True, True]]  # the direction DPPO lets through


@pytest.mark.parametrize("seed", range(3))
def test_ipo_gradient_is_prime_rls(seed):
    mu, logp, adv, mask = random_batch(seed)
    ours = our_gradient(TrustRegion.preset("ipo"), mu, logp, adv, mask)
    theirs = logp.clone().requires_grad_()
    log_ratio = theirs - mu
    keep = mask & ~((theirs.detach().exp() - mu.exp()).abs() > 0.1)
    (-(keep * adv * log_ratio.exp()) + 1e-3 * (mask * log_ratio ** 2)).sum().backward()  # ipo_loss_fn, adv_tau 1
    torch.testing.assert_close(ours, theirs.grad, rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------------------------- TRM


def test_trm_max_by_hand():
    """δ = 2.5 (|log r| ≤ √5 ≈ 2.24), ε = 0.2. Row 0: 0.01 → 0.2 (log r = log 20, k2 = 4.49 > 2.5): the whole row
    is masked, its second token (r = 1) too. Row 1: r = 1.1 and 0.9, A = +1: kept, −r·A. Row 2: 0.1 → 0.3 (r = 3, k2 =
    0.60): the sequence passes but PPO's clip blocks r = 3 > 1.2 with A > 0; its r = 1 token stays."""
    mu = [[0.01, 0.5], [0.5, 0.5], [0.1, 0.2]]
    pi = [[0.2, 0.5], [0.55, 0.45], [0.3, 0.2]]
    out, grad = run("trm_max", mu, pi, [[1.0], [1.0], [1.0]])
    assert out.keep.tolist() == [[False, False], [True, True], [False, True]]
    assert_rows(grad, [[0.0, 0.0], [-1.1, -0.9], [0.0, -1.0]])
    assert out.metrics["trm/seq_masked_fraction"] == pytest.approx(1 / 3)


def test_trm_avg_is_a_mean_over_the_response():
    """δ = 0.01: r = 1.16 has k3 = 0.16 − log 1.16 = 0.01158. Beside an r = 1 token the row's mean is 0.00579 and it
    is kept (−1.16, −1); alone in its row the same token is masked."""
    mu = [[0.5, 0.5], [0.5, 0.5]]
    pi = [[0.58, 0.5], [0.58, 0.5]]
    out, grad = run("trm_avg", mu, pi, [[1.0], [1.0]], mask=[[1, 1], [1, 0]])
    assert out.keep.tolist() == [[True, True], [False, False]]
    assert_rows(grad, [[-1.16, -1.0], [0.0, 0.0]])
    assert out.metrics["divergence/max"] == pytest.approx(0.16 - math.log(1.16), rel=1e-4)  # k3 is the D_t reported


# --------------------------------------------------------------------------------------------- DeepSeek-V3.2


def test_off_policy_sequence_mask_by_hand():
    """δ = 0.5, ε = 0.2. Row 0, A = −1: mean log(μ/π) = (log 5 + 0)/2 = 0.80 > δ: the whole response is dropped. Row
    1, the same tokens with A = +1: the mask never drops A ≥ 0 (and PPO keeps r = 0.2 < 1 for A > 0): −0.2, −1.
    Row 2, A = −1: mean log(5/3)/2 = 0.26 ≤ δ passes; PPO's clip blocks r = 0.6 < 0.8, keeps r = 1: 0, +1."""
    mu = [[0.5, 0.5]] * 3
    pi = [[0.1, 0.5], [0.1, 0.5], [0.3, 0.5]]
    out, grad = run("opsm", mu, pi, [[-1.0], [1.0], [-1.0]])
    assert out.keep.tolist() == [[False, False], [True, True], [False, True]]
    assert_rows(grad, [[0.0, 0.0], [-0.2, -1.0], [0.0, 1.0]])
    assert out.metrics["opsm/seq_masked_fraction"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("seed", range(3))
def test_off_policy_sequence_mask_is_trls(seed):
    """The mask of TRL's ``get_off_policy_mask`` (sampling logps μ, per_token_logps π_θ), times PPO's clip on π/μ."""
    mu, logp, adv, mask = random_batch(seed, spread=1.2)
    out = policy_loss(logp, mu, adv, mask, TrustRegion.preset("opsm"))
    kl = ((mu - logp) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    trl_keep = (adv >= 0) | (kl <= 0.5)
    ratio = (logp - mu).exp()
    ppo_keep = ~(((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8)))
    assert torch.equal(out.keep, mask & trl_keep & ppo_keep)
    assert (mask & ~trl_keep).any(), "the case exercises the sequence mask"


# --------------------------------------------------------------------------------------------- VACO


def test_vaco_by_hand():
    """open-instruct's own case (test_vaco_tv_divergence), δ = 0.3, with π_θ = 1.1·π_θ' on row 0's tokens. Row 0:
    mean |π' − μ| = 0.1: kept, w = (π/π')·min(0.8, 2) = 0.88. Row 1: 0.5 > δ, A > 0 and π' > μ (moving away): dropped.
    Row 2: the same divergence but A < 0 moves back toward μ: kept, w = 1·min(6, 2) = 2 (the source's clamp at 2)."""
    mu = [[0.5] * 3, [0.1] * 3, [0.1] * 3]
    old = [[0.4] * 3, [0.6] * 3, [0.6] * 3]
    pi = [[0.44] * 3, [0.6] * 3, [0.6] * 3]
    out, grad = run("vaco", mu, pi, [[1.0], [1.0], [-1.0]], recomputed=old)
    assert out.keep.tolist() == [[True] * 3, [False] * 3, [True] * 3]
    assert_rows(grad, [[-0.88] * 3, [0.0] * 3, [2.0] * 3])
    assert out.metrics["vaco/seq_masked_fraction"] == pytest.approx(1 / 3)


def test_vaco_clips_pi_over_pi_prime():
    """DAPO's clip on π/π' (ε_high 0.272): π = 1.3·π' with A > 0 is blocked though its sequence is in the band."""
    out, grad = run("vaco", [[0.5]], [[0.52]], [[1.0]], recomputed=[[0.4]])
    assert out.keep.tolist() == [[False]] and grad.item() == 0.0


# --------------------------------------------------------------------------------------------- GSPO


def test_gspo_by_hand():
    """ε = 0.1 each side. Row 0, A = +1, r = 1.2 and 1: s = √1.2 = 1.0954 ≤ 1.1: both tokens get −s·A. Row 1, r = 1.5
    and 1: s = 1.2247 > 1.1 with A > 0: both blocked. Row 2, A = −1, r = 0.5 and 1: s = 0.7071 < 0.9: blocked. Row
    3, A = −1, r = 1.5 and 1: s > 1 moves back: +s on both."""
    mu = [[0.5, 0.5]] * 4
    pi = [[0.6, 0.5], [0.75, 0.5], [0.25, 0.5], [0.75, 0.5]]
    out, grad = run("gspo", mu, pi, [[1.0], [1.0], [-1.0], [-1.0]], eps_low=0.1, eps_high=0.1)
    assert out.keep.tolist() == [[True, True], [False, False], [False, False], [True, True]]
    s12, s15 = math.sqrt(1.2), math.sqrt(1.5)
    assert_rows(grad, [[-s12, -s12], [0.0, 0.0], [0.0, 0.0], [s15, s15]])
    assert out.metrics["gspo/weight_mean"] == pytest.approx((2 * s12 + 4 * s15 + 2 * math.sqrt(0.5)) / 8, rel=1e-6)


def gspo_as_verl_writes_it(logp, mu, adv, mask, eps_low, eps_high):
    """verl ``compute_policy_loss_gspo``'s per-token loss before aggregation."""
    seq = ((logp - mu) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_s = (logp - logp.detach() + seq.detach().unsqueeze(-1)).clamp(max=10.0)
    s = log_s.exp()
    return torch.where(mask, torch.maximum(-adv * s, -adv * s.clamp(1 - eps_low, 1 + eps_high)), 0.0)


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.05, 0.05)])
@pytest.mark.parametrize("seed", range(3))
def test_gspo_gradient_is_verls(seed, eps):
    mu, logp, adv, mask = random_batch(seed, spread=0.05)
    ours = our_gradient(TrustRegion.preset("gspo", eps_low=eps[0], eps_high=eps[1]), mu, logp, adv, mask)
    theirs = logp.clone().requires_grad_()
    gspo_as_verl_writes_it(theirs, mu, adv, mask, *eps).sum().backward()
    torch.testing.assert_close(ours, theirs.grad, rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------------------------- SAPO


def test_sapo_by_hand():
    """τ_pos 1, τ_neg 1.05. r = 1: σ = ½, slope 1: −A. r = 2, A = +1: 4σ(1)(1 − σ(1)) = 0.786448, w = 1.572895. r = 0.5,
    A = −1 (τ = 1.05): slope 0.934140, w = 0.467070, +0.467070. Nothing is masked."""
    out, grad = run("sapo", [[0.3, 0.3, 0.4]], [[0.3, 0.6, 0.2]], [[1.0, 1.0, -1.0]])
    assert out.keep.all()
    assert_rows(grad, [[-1.0, -1.5728954660, 0.4670699116]])
    assert sapo_gate_slope(torch.tensor(1.0), torch.tensor(-1.0), 1.0, 1.05).item() == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(3))
def test_sapo_gradient_is_verls(seed):
    """The gradient of verl's −σ(τ(r − 1))·4/τ·A (``compute_policy_loss_sapo``) on every response token."""
    mu, logp, adv, mask = random_batch(seed)
    ours = our_gradient(TrustRegion.preset("sapo"), mu, logp, adv, mask)
    theirs = logp.clone().requires_grad_()
    ratio = (theirs - mu).clamp(-20, 20).exp()
    tau = torch.where(adv > 0, 1.0, 1.05)
    torch.where(mask, -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv, 0.0).sum().backward()
    torch.testing.assert_close(ours, theirs.grad, rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------------------------- MinPRO


def test_minpro_by_hand():
    """Row 0, r = 1.2, 0.5, 1.5: w = 1.2, 0.5, 0.5 (the 0.5 of token 2 holds for token 3), −w·A. Row 1, a prompt
    token first, r = 2, 1: w = 2, 1 (the prompt token is no part of the prefix)."""
    mu = [[0.5, 0.5, 0.5], [0.9, 0.25, 0.5]]
    pi = [[0.6, 0.25, 0.75], [0.1, 0.5, 0.5]]
    out, grad = run("minpro", mu, pi, [[1.0], [1.0]], mask=[[1, 1, 1], [0, 1, 1]])
    assert out.keep.tolist() == [[True] * 3, [False, True, True]]
    assert_rows(grad, [[-1.2, -0.5, -0.5], [0.0, -2.0, -1.0]])
    assert out.metrics["minpro/weight_min"] == pytest.approx(0.5)


# --------------------------------------------------------------------------------------------- multi-turn


@pytest.mark.parametrize("preset", ROW_LOCAL)
def test_a_row_is_one_turn(preset):
    """The turns of one episode are rows of the loss: each sequence-level rule decides a row from that row alone, so
    the batch's mask and gradient equal those of each row on its own (a turn that drifted from μ does not mask the
    episode's other turns)."""
    mu, logp, adv, mask = random_batch(5, spread=1.0)
    tr = TrustRegion.preset(preset)
    old = (logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
           if tr.needs_recompute else None)
    whole = logp.clone().requires_grad_()
    out = policy_loss(whole, mu, adv, mask, tr, recomputed_logp=old)
    out.loss.sum().backward()
    for row in range(len(logp)):
        alone = logp[row: row + 1].clone().requires_grad_()
        one = policy_loss(alone, mu[row: row + 1], adv[row: row + 1], mask[row: row + 1], tr,
                          recomputed_logp=None if old is None else old[row: row + 1])
        one.loss.sum().backward()
        assert torch.equal(one.keep, out.keep[row: row + 1]), (preset, row)
        torch.testing.assert_close(alone.grad, whole.grad[row: row + 1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("preset", WITHOUT_TOPK)
def test_finite_and_masked_off_the_response(preset):
    mu, logp, adv, mask = random_batch(7, spread=3.0)
    tr = TrustRegion.preset(preset)
    ours = logp.clone().requires_grad_()
    out = policy_loss(ours, mu, adv, mask, tr, recomputed_logp=logp - 0.5 if tr.needs_recompute else None)
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(ours.grad).all()
    assert (ours.grad[~mask] == 0).all() and not out.keep[~mask].any()
    assert all(math.isfinite(value) for value in out.metrics.values())
