"""The training–inference mismatch presets against their definitions: hand-computed cases of each, and each one's
gradient against its source's loss written out as that source computes it (PPO's min of the two surrogates, the IS
weight multiplied onto the loss, the masks applied to the loss mask).

ρ_t = π_θ'(a_t)/μ(a_t) is the training engine's old policy over the rollout engine's; r'_t = π_θ/π_θ'.
"""

import math

import pytest
import torch

from dppo_oat.trust_region import PRESETS, TrustRegion, band_keep, policy_loss

MISMATCH_PRESETS = ("tis", "seq_tis", "icepop", "seq_geo_mask", "decoupled_ppo", "dppo_binary_tv_kl")


def run(preset, mu, recomputed, pi, adv, mask=None):
    """policy_loss on ``[B, T]`` probabilities; returns its output and the gradient on log π_θ."""

    def as_log(rows):
        return torch.tensor(rows, dtype=torch.float32).log()

    logp = as_log(pi).requires_grad_()
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    out = policy_loss(logp, as_log(mu), torch.tensor(adv), mask, TrustRegion.preset(preset),
                      recomputed_logp=None if recomputed is None else as_log(recomputed))
    out.loss.sum().backward()
    return out, logp.grad


def assert_rows(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------- definitions


def test_sources_name_their_file_and_defaults():
    expected = {
        "tis": ("off_policy_correction_utils.py", "token_tis_ratio_clip_high 2.0", "--tis-clip 2.0"),
        "seq_tis": ("off_policy_correction_utils.py", "sequence_tis_ratio_clip_high 5.0"),
        "icepop": ("openrlhf/models/loss.py", "[0.5, 5.0]"),
        "seq_geo_mask": ("off_policy_correction_utils.py", "geo_mask_low 0.99", "geo_mask_high 1.01"),
        "decoupled_ppo": ("areal/utils/functional/functional.py", "upper 5.0", "eps_clip 0.2"),
        "dppo_binary_tv_kl": ("src/prime_rl/trainer/rl/loss.py", "kl_tau 1e-3", "0.2"),
    }
    for name, parts in expected.items():
        assert all(part in PRESETS[name].source for part in parts), (name, PRESETS[name].source)


def test_defaults_of_each_source():
    tis, seq_tis, icepop = (TrustRegion.preset(n) for n in ("tis", "seq_tis", "icepop"))
    geo, areal, prime = (TrustRegion.preset(n) for n in ("seq_geo_mask", "decoupled_ppo", "dppo_binary_tv_kl"))
    for tr in (tis, seq_tis, icepop, geo, areal):  # PPO's clip, ε = 0.2, on the recomputed old policy
        assert (tr.rule, tr.eps_low, tr.eps_high, tr.anchor) == ("ratio", 0.2, 0.2, "recompute")
        assert tr.needs_recompute
    assert (tis.is_weight, tis.is_cap) == ("decoupled_token", 2.0)
    assert (seq_tis.is_weight, seq_tis.is_cap) == ("decoupled_seq", 5.0)
    assert (icepop.mismatch_mask, icepop.mismatch_low, icepop.mismatch_high) == ("token", 0.5, 5.0)
    assert (geo.is_weight, geo.mismatch_mask) == ("proximal", "seq_geo")
    assert (geo.mismatch_low, geo.mismatch_high) == (0.99, 1.01)
    assert (areal.mismatch_mask, areal.mismatch_low, areal.mismatch_high) == ("token", 0.0, 5.0)
    assert math.isinf(icepop.is_cap) and math.isinf(areal.is_cap)
    assert (prime.rule, prime.delta, prime.kl_tau, prime.anchor) == ("binary_tv", 0.2, 1e-3, "behavior")
    assert math.isinf(prime.is_cap) and not prime.needs_recompute


def test_tis_truncates_the_token_ratio_of_the_old_policy_at_2():
    # ρ = 1, 3, 0.75, 1; r' = 1.1, 1, 1, 1.3 (A > 0: PPO blocks r' > 1.2)
    out, grad = run("tis", mu=[[0.5, 0.2, 0.4, 0.5]], recomputed=[[0.5, 0.6, 0.3, 0.5]],
                    pi=[[0.55, 0.6, 0.3, 0.65]], adv=[[1.0]])
    assert out.keep.tolist() == [[True, True, True, False]]
    assert_rows(grad, [[-1.1 * 1.0, -1.0 * 2.0, -1.0 * 0.75, 0.0]])  # −r'·min(ρ, 2)·A
    assert out.metrics["is/truncated_fraction"] == pytest.approx(1 / 4)


def test_seq_tis_truncates_the_product_over_the_response_at_5():
    # row 0: ρ = 2, 2, 2 → ∏ = 8 → 5; row 1: ρ = 1.5, 1.2 → 1.8, and a padding token with ρ = 90 that must not count
    out, grad = run("seq_tis", mu=[[0.1, 0.2, 0.3], [0.4, 0.5, 0.01]], recomputed=[[0.2, 0.4, 0.6], [0.6, 0.6, 0.9]],
                    pi=[[0.2, 0.4, 0.6], [0.6, 0.66, 0.9]], adv=[[1.0], [-1.0]], mask=[[1, 1, 1], [1, 1, 0]])
    assert_rows(grad, [[-5.0, -5.0, -5.0], [1.8 * 1.0, 1.8 * 1.1, 0.0]])  # −r'·min(∏ρ, 5)·A
    assert out.metrics["is/truncated_fraction"] == pytest.approx(3 / 5)


def test_icepop_masks_tokens_whose_ratio_leaves_half_to_five():
    # ρ = 0.4 (masked), 0.6, 4.5, 5.5 (masked); π_θ = π_θ', so w = r'·ρ = π_θ/μ = ρ
    out, grad = run("icepop", mu=[[0.5, 0.5, 0.1, 0.1]], recomputed=[[0.2, 0.3, 0.45, 0.55]],
                    pi=[[0.2, 0.3, 0.45, 0.55]], adv=[[1.0]])
    assert out.keep.tolist() == [[False, True, True, False]]
    assert_rows(grad, [[0.0, -0.6, -4.5, 0.0]])


def test_the_band_is_closed():
    """IcePop (OpenRLHF: ``vllm_is >= low & vllm_is <= high``), AReaL (``metric <= upper``) and SkyRL's geometric
    mask (masked only when ``> high`` or ``< low``) all keep a ratio on the boundary."""
    log_ratio = torch.tensor([0.5, 5.0, 0.49, 5.01], dtype=torch.float64).log()
    assert band_keep(log_ratio, 0.5, 5.0).tolist() == [True, True, False, False]
    assert band_keep(log_ratio, 0.0, 5.0).tolist() == [True, True, True, False]


def test_seq_geo_mask_masks_whole_responses_by_the_geometric_mean():
    # row 0: ρ = 1.2, 1/1.2, 1 → geometric mean 1: kept although two tokens are far outside the band; w = r'
    # row 1: ρ = 1.02, 1.02 → 1.02: masked; its padding token (ρ = 1/1.0404) would bring the mean to 1 if it counted
    # row 2: one token, ρ = 1.005: kept (A < 0, r' = 1)
    mu = [[0.5, 0.6, 0.3], [0.5, 0.25, 0.5], [0.4, 0.5, 0.5]]
    recomputed = [[0.6, 0.5, 0.3], [0.51, 0.255, 0.5 / 1.0404], [0.402, 0.5, 0.5]]
    pi = [[0.6, 0.55, 0.27], [0.51, 0.255, 0.5 / 1.0404], [0.402, 0.5, 0.5]]
    out, grad = run("seq_geo_mask", mu, recomputed, pi, adv=[[1.0], [1.0], [-1.0]],
                    mask=[[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    assert out.keep.tolist() == [[True, True, True], [False, False, False], [True, False, False]]
    assert_rows(grad, [[-1.0, -1.1, -0.9], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # −r'·A, no correction toward μ


def test_decoupled_ppo_masks_old_policy_ratios_above_five_only():
    # ρ = 0.1 (kept: no lower bound), 4, 6 (masked); r' = 1, 1.1, 1; the A < 0 token has r' = 0.7 < 0.8: PPO blocks it
    out, grad = run("decoupled_ppo", mu=[[0.5, 0.1, 0.1, 0.5]], recomputed=[[0.05, 0.4, 0.6, 0.5]],
                    pi=[[0.05, 0.44, 0.6, 0.35]], adv=[[1.0, 1.0, 1.0, -1.0]])
    assert out.keep.tolist() == [[True, True, False, False]]
    assert_rows(grad, [[-0.1, -4.4, 0.0, 0.0]])  # −(π_θ/π_prox)·(π_prox/μ)·A = −(π_θ/μ)·A


def test_dppo_binary_tv_kl_is_prime_rls_loss():
    """Binary TV on π − μ (δ = 0.2) and τ·log²(π/μ) on every response token, blocked or not (τ = 1e-3)."""
    tau = 1e-3
    mu, pi = [[0.5, 0.5, 0.5, 0.5, 0.5]], [[0.75, 0.65, 0.25, 0.75, 0.9]]
    adv = [[1.0, 1.0, -1.0, -1.0, 1.0]]
    out, grad = run("dppo_binary_tv_kl", mu, None, pi, adv, mask=[[1, 1, 1, 1, 0]])
    assert out.keep.tolist() == [[False, True, False, True, False]]  # TV 0.25 (A>0, up), 0.15, 0.25 (A<0, down)
    log_r = [math.log(1.5), math.log(1.3), math.log(0.5), math.log(1.5)]
    assert_rows(grad, [[2 * tau * log_r[0], -1.3 + 2 * tau * log_r[1], 2 * tau * log_r[2], 1.5 + 2 * tau * log_r[3],
                        0.0]])
    assert_rows(out.loss.detach(), [[tau * log_r[0] ** 2, -1.3 + tau * log_r[1] ** 2, tau * log_r[2] ** 2,
                                     1.5 + tau * log_r[3] ** 2, 0.0]])


@pytest.mark.parametrize("preset", [name for name in PRESETS if TrustRegion.preset(name).needs_recompute])
def test_old_policy_presets_need_the_recomputed_log_probs(preset):
    logp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="recomputed_logp"):
        policy_loss(logp, logp, torch.ones(1, 1), torch.ones(1, 2, dtype=torch.bool), TrustRegion.preset(preset))


def test_shadow_masks_of_icepop_and_the_geometric_mask():
    """Every run (here DPPO-Binary-TV, which never recomputes π_θ') reports what IcePop and the geometric sequence
    mask would have masked, read on π_θ/μ. Row 0: π/μ = 3, 0.4 (IcePop masks the second; geometric mean √1.2 ≈ 1.095:
    the geometric mask drops the row); row 1: π = μ."""
    mu, pi = [[0.15, 0.5], [0.6, 0.3]], [[0.45, 0.2], [0.6, 0.3]]
    out, _ = run("dppo_binary_tv", mu, None, pi, adv=[[1.0], [-1.0]])
    m = out.metrics
    assert m["shadow/icepop/mask_fraction"] == pytest.approx(1 / 4)
    assert m["shadow/icepop/mask_fraction_mu_ge_0.5"] == pytest.approx(1 / 2)  # μ = 0.5 (masked) and 0.6
    assert m["shadow/icepop/mask_fraction_mu_0.1_0.5"] == 0.0 and m["shadow/icepop/mask_fraction_mu_lt_0.1"] == 0.0
    assert m["shadow/seq_geo_mask/mask_fraction"] == pytest.approx(2 / 4)
    assert m["shadow/seq_geo_mask/mask_fraction_mu_0.1_0.5"] == pytest.approx(1 / 2)  # μ = 0.15 (masked) and 0.3
    assert m["shadow/seq_geo_mask/sequence_fraction"] == pytest.approx(1 / 2)


# --------------------------------------------------------------------------------------------- against the sources


def ppo_clip_loss(logp, old_logp, adv, eps=0.2):
    """PPO's per-token loss as SkyRL's ``ppo_policy_loss`` and OpenRLHF's ``PolicyLoss`` write it (AReaL's max of
    the negated surrogates is the same): −min(r·A, clip(r, 1 − ε, 1 + ε)·A), r = π_θ/π_old."""
    ratio = torch.exp(logp - old_logp)
    return -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)


def source_loss(preset, logp, old_logp, rollout_logp, adv, mask):
    """Each preset's per-token loss (masked-out tokens 0) as its source computes it."""
    rho = torch.exp(old_logp - rollout_logp)
    ppo = ppo_clip_loss(logp, old_logp, adv)
    if preset == "tis":  # SkyRL compute_tis_ratio, token: loss × min(ρ, 2)
        return torch.where(mask, ppo * rho.clamp(max=2.0), 0.0)
    if preset == "seq_tis":  # SkyRL compute_tis_ratio, sequence: loss × min(exp(Σ log ρ), 5)
        seq = torch.exp(torch.where(mask, old_logp - rollout_logp, 0.0).sum(-1, keepdim=True))
        return torch.where(mask, ppo * seq.clamp(max=5.0), 0.0)
    if preset == "icepop":  # OpenRLHF: loss × ρ·1[0.5 ≤ ρ ≤ 5]
        return torch.where(mask, ppo * rho * ((rho >= 0.5) & (rho <= 5.0)), 0.0)
    if preset == "seq_geo_mask":  # SkyRL compute_sequence_mask, geometric: loss mask × 1[0.99 ≤ geo ≤ 1.01]
        geo = torch.exp(torch.where(mask, old_logp - rollout_logp, 0.0).sum(-1, keepdim=True) / mask.sum(-1, True))
        return torch.where(mask & (geo >= 0.99) & (geo <= 1.01), ppo, 0.0)
    if preset == "decoupled_ppo":  # AReaL: loss × ρ on tokens with ρ ≤ 5 (rejection sampling: token, mask)
        return torch.where(mask & (rho <= 5.0), ppo * rho, 0.0)
    # prime-rl default_loss_fn: −keep·A·r + τ·log²r, keep from π − μ against ±0.2 by the sign of A
    diff = logp.exp() - rollout_logp.exp()
    keep = ~torch.where(adv > 0, diff > 0.2, diff < -0.2)
    log_r = logp - rollout_logp
    return torch.where(mask, -keep.double() * adv * torch.exp(log_r) + 1e-3 * log_r**2, 0.0)


@pytest.mark.parametrize("preset", MISMATCH_PRESETS)
def test_gradient_equals_the_sources_loss(preset):
    gen = torch.Generator().manual_seed(len(preset))
    b, t = 6, 9
    mu = torch.empty(b, t, dtype=torch.float64).uniform_(-4, -0.05, generator=gen)
    noise = 0.004 if preset == "seq_geo_mask" else 0.5  # so that the geometric band both keeps and drops rows
    old = (mu + noise * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    logp = (old + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(b, 1, generator=gen, dtype=torch.float64).expand(b, t)
    mask = torch.rand(b, t, generator=gen) > 0.15
    mask[:, 0] = True

    ours = logp.clone().requires_grad_()
    out = policy_loss(ours, mu, adv, mask, TrustRegion.preset(preset), recomputed_logp=old)
    out.loss.sum().backward()
    theirs = logp.clone().requires_grad_()
    source_loss(preset, theirs, old, mu, adv, mask).sum().backward()
    torch.testing.assert_close(ours.grad.float(), theirs.grad.float(), rtol=1e-4, atol=1e-6)
    assert 0 < out.keep[mask].float().mean() < 1  # the case exercises both the kept and the blocked branch


def test_run_labels_name_the_mismatch_overrides():
    from dppo_oat.analysis.runs import variant_name

    assert variant_name("icepop", {}) == "IcePop"
    assert variant_name("dppo_binary_tv_kl", {"kl_tau": 0.01}) == "DPPO-Binary-TV + KL (τ=0.01)"
    wide = {"mismatch_low": 0.98, "mismatch_high": math.inf}
    assert variant_name("seq_geo_mask", wide) == "Seq-Geo-Mask (ρ_low=0.98, ρ_high=∞)"
    assert variant_name("dppo_binary_tv", {"mismatch_low": 0.3}) == "DPPO-Binary-TV"  # no mismatch mask: unused
