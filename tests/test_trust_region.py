"""The trust-region rules against hand-computed cases from the paper, and the unified gradient (eq:unified_grad)."""

import math
from pathlib import Path

import pytest
import torch

from dppo_oat.divergence.logprobs import topk_of_logprobs
from dppo_oat.trust_region import PRESETS, RULE_TABLE, TopK, TrustRegion, divergence_keep, policy_loss, ratio_keep

REPO = Path(__file__).resolve().parents[1]
RULES = {name: RULE_TABLE[TrustRegion.preset(name).rule] for name in PRESETS}
UNIFIED_WEIGHT_PRESETS = [name for name, rule in RULES.items() if rule.weight is None and rule.loss_term is None]
"""The presets whose gradient is the unified one with the IS weight of ``is_weight`` (no w_t or loss term of the
rule's own): every such preset of the registry, so a new one is covered."""


def expected_weight(tr, logp, mu, recomputed, mask):
    """w_t of IS_WEIGHTS, computed in probability space: min(π/μ, C), (π/π')·min(ρ, C) with ρ = π'/μ per token or
    the product over the row's response tokens, or π/π'."""
    r, r_prox, rho = torch.exp(logp - mu), torch.exp(logp - recomputed), torch.exp(recomputed - mu)
    if tr.is_weight == "behavior":
        return r.clamp(max=tr.is_cap)
    if tr.is_weight == "proximal":
        return r_prox
    if tr.is_weight == "decoupled_seq":
        rho = torch.where(mask, rho, 1.0).prod(-1, keepdim=True)
    return r_prox * rho.clamp(max=tr.is_cap)


def run_rule(preset, mu, pi, adv, recomputed=None, **overrides):
    """keep, divergence and IS-weighted gradient of one token under ``preset``."""
    tr = TrustRegion.preset(preset, **overrides)
    tr = tr.replace(k=1) if tr.uses_topk else tr  # a two-token vocabulary: TopK(μ, 1) ∪ {a_t}
    logp = torch.tensor([[math.log(pi)]], requires_grad=True)
    mu_logp = torch.tensor([[math.log(mu)]])
    recomputed_logp = torch.tensor([[math.log(recomputed if recomputed is not None else mu)]])
    topk = None
    if tr.uses_topk:  # a two-token vocabulary: the top-K set is the whole support, so top-K == binary
        ids = torch.tensor([[[0, 1]]])
        topk = TopK(
            ids=ids,
            behavior_logp=torch.tensor([[[math.log(mu), math.log1p(-mu)]]]),
            logp=torch.tensor([[[math.log(pi), math.log1p(-pi)]]]),
            valid=torch.ones(1, 1, 2, dtype=torch.bool),
        )
    out = policy_loss(
        logp, mu_logp, torch.tensor([[adv]]), torch.ones(1, 1, dtype=torch.bool), tr,
        recomputed_logp=recomputed_logp, topk=topk,
    )
    out.loss.sum().backward()
    return bool(out.keep.item()), out.divergence.item(), logp.grad.item()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_its_source_label_and_rows(name):
    """Each preset of the registry says where it comes from, its name and what its mask blocks, builds under its own
    name, has its row in docs/trust-region.md's table and is in the README's (its own row for the paper's presets,
    the others named in one row; both generated from PRESETS)."""
    preset = PRESETS[name]
    assert preset.source.strip() and preset.label.strip() and preset.blocks.strip(), name
    assert TrustRegion.preset(name).name == name
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    readme_table = readme[readme.index("<!-- generated:readme-presets -->"):readme.index("<!-- end generated:readme-")]
    regenerate = "run python scripts/docs_tables.py"
    assert f"`{name}`" in readme_table, f"README.md's presets table lacks {name}: {regenerate}"
    assert f"| `{name}` |" in (REPO / "docs/trust-region.md").read_text(encoding="utf-8"), (
        f"docs/trust-region.md has no row for {name}: {regenerate}")


def test_paper_defaults():
    assert TrustRegion.preset("dppo_binary_tv").delta == 0.15
    assert TrustRegion.preset("dppo_binary_kl").delta == 0.05
    assert TrustRegion.preset("dppo_topk_tv").k == 20
    assert TrustRegion.preset("grpo_clip_higher").eps_high == 0.28
    assert TrustRegion.preset("cispo").is_cap == 3.0 and TrustRegion.preset("minirl_tis").is_cap == 3.0
    assert math.isinf(TrustRegion.preset("pg_is").is_cap)
    assert TrustRegion.preset("mask_negative").delta == 0.5
    assert TrustRegion.preset("relax_both").alpha == 0.1
    assert TrustRegion.preset("minirl").needs_recompute and not TrustRegion.preset("dppo_binary_kl").needs_recompute


# --- sec:method_limitations: μ = 1e-4 → π = 1e-2 (A > 0) and μ = 0.99 → π = 0.80 (A < 0)


def test_worked_example_low_probability_token():
    keep_ppo, d_ppo, _ = run_rule("ppo", 1e-4, 1e-2, +1.0)
    keep_dppo, d_tv, _ = run_rule("dppo_binary_tv", 1e-4, 1e-2, +1.0)
    assert not keep_ppo and d_ppo == pytest.approx(99.0, rel=1e-4)  # r = 100: PPO clips it
    assert keep_dppo and d_tv == pytest.approx(0.0099, abs=1e-6)  # only 0.0099 of mass moved: DPPO keeps it


def test_worked_example_high_probability_token():
    keep_ppo, d_ppo, _ = run_rule("ppo", 0.99, 0.80, -1.0)
    keep_dppo, d_tv, _ = run_rule("dppo_binary_tv", 0.99, 0.80, -1.0)
    assert keep_ppo and d_ppo == pytest.approx(1 - 0.80 / 0.99, rel=1e-4)  # r ≈ 0.808 is inside [0.8, 1.2]
    assert not keep_dppo and d_tv == pytest.approx(0.19, abs=1e-6)  # 0.19 > δ = 0.15 and moving away: blocked


# --- every preset on crafted tokens. Columns: (μ, π, A, π_θ' or None) -> expected keep, computed by hand.
# up: μ=0.5 → π=0.9 (r=1.8, TV 0.4, KL_bin 0.511)    down: μ=0.9 → π=0.3 (r=0.33, TV 0.6)
# low_up: worked example (TV 0.0099, KL_bin 0.0095)  high_down: μ=0.99 → π=0.8 (TV 0.19, KL_bin 0.181)
# low_down: μ=0.05 → π=0.01 (r=0.2, TV 0.04, KL_bin 0.0375)
# drift: μ=0.5, π_θ'=0.9, π=0.95 (r=1.9 vs μ; r'=1.056 and TV' 0.05 vs π_θ')
CASES = {
    "up+": (0.5, 0.9, +1.0, None),
    "up-": (0.5, 0.9, -1.0, None),
    "down-": (0.9, 0.3, -1.0, None),
    "down+": (0.9, 0.3, +1.0, None),
    "low_up+": (1e-4, 1e-2, +1.0, None),
    "high_down-": (0.99, 0.80, -1.0, None),
    "low_down-": (0.05, 0.01, -1.0, None),
    "drift+": (0.5, 0.95, +1.0, 0.9),
}
EXPECTED_KEEP = {  # case order: up+ up- down- down+ low_up+ high_down- low_down- drift+
    "ppo":                      (0, 1, 0, 1, 0, 1, 0, 0),
    "grpo_clip_higher":         (0, 1, 0, 1, 0, 1, 0, 0),
    "cispo":                    (1, 1, 1, 1, 1, 1, 1, 1),
    "pg_is":                    (1, 1, 1, 1, 1, 1, 1, 1),
    "minirl":                   (0, 1, 0, 1, 0, 1, 0, 1),
    "minirl_tis":               (0, 1, 0, 1, 0, 1, 0, 1),
    "dppo_binary_tv":           (0, 1, 0, 1, 1, 0, 1, 0),
    "dppo_binary_kl":           (0, 1, 0, 1, 1, 0, 1, 0),
    "dppo_topk_tv":             (0, 1, 0, 1, 1, 0, 1, 0),
    "dppo_topk_kl":             (0, 1, 0, 1, 1, 0, 1, 0),
    "dppo_binary_tv_recompute": (0, 1, 0, 1, 1, 0, 1, 1),
    "dppo_binary_kl_recompute": (0, 1, 0, 1, 1, 0, 1, 1),
    "mask_negative":            (1, 1, 0, 1, 1, 1, 1, 1),
    "relax_low":                (0, 1, 0, 1, 0, 1, 1, 0),
    "relax_high":               (0, 1, 0, 1, 1, 1, 0, 0),
    "relax_both":               (0, 1, 0, 1, 1, 1, 1, 0),
    # PPO (ε 0.2) on π_θ/π_θ' (= π_θ/μ but for drift+); drift+ has ρ = π_θ'/μ = 1.8: inside IcePop's and AReaL's
    # bands, outside the geometric mask's [0.99, 1.01]. prime-rl: binary TV with δ = 0.2 keeps high_down- (TV 0.19)
    "tis":                      (0, 1, 0, 1, 0, 1, 0, 1),
    "seq_tis":                  (0, 1, 0, 1, 0, 1, 0, 1),
    "icepop":                   (0, 1, 0, 1, 0, 1, 0, 1),
    "seq_geo_mask":             (0, 1, 0, 1, 0, 1, 0, 0),
    "decoupled_ppo":            (0, 1, 0, 1, 0, 1, 0, 1),
    "dppo_binary_tv_kl":        (0, 1, 0, 1, 1, 1, 1, 0),
}


@pytest.mark.parametrize("preset", EXPECTED_KEEP)
def test_every_preset_masks_crafted_tokens_as_the_paper_says(preset):
    got = tuple(int(run_rule(preset, *case)[0]) for case in CASES.values())
    assert got == EXPECTED_KEEP[preset], dict(zip(CASES, got, strict=True))


@pytest.mark.parametrize("preset", EXPECTED_KEEP)
def test_gradient_is_the_unified_formula_on_crafted_tokens(preset):
    """M·w·A, plus the KL penalty's 2τ·log(π/μ) (dppo_binary_tv_kl)."""
    tr = TrustRegion.preset(preset)
    for (mu, pi, adv, recomputed), expected_keep in zip(CASES.values(), EXPECTED_KEEP[preset], strict=True):
        _, _, grad = run_rule(preset, mu, pi, adv, recomputed)
        logs = [torch.tensor([[math.log(p)]], dtype=torch.float64) for p in (pi, mu, recomputed or mu)]
        weight = expected_weight(tr, *logs, torch.ones(1, 1, dtype=torch.bool)).item()
        expected = -expected_keep * weight * adv + 2 * tr.kl_tau * math.log(pi / mu)
        assert grad == pytest.approx(expected, rel=1e-5)


def test_is_weight_is_truncated_at_c():
    _, _, grad = run_rule("cispo", 1e-4, 1e-2, +1.0)  # r = 100, C = 3
    assert grad == pytest.approx(-3.0)
    _, _, grad = run_rule("pg_is", 1e-4, 1e-2, +1.0)
    assert grad == pytest.approx(-100.0, rel=1e-4)


def random_batch(seed, b=4, t=7, low=-8.0):
    gen = torch.Generator().manual_seed(seed)
    mu = torch.empty(b, t).uniform_(low, 0, generator=gen)
    logp = (mu + torch.randn(b, t, generator=gen) * 0.7).clamp(max=-1e-4)
    recomputed = (mu + torch.randn(b, t, generator=gen) * 0.2).clamp(max=-1e-4)
    adv = torch.randn(b, t, generator=gen)
    adv[0, :3] = 0.0
    mask = torch.rand(b, t, generator=gen) > 0.2
    return logp, mu, recomputed, adv, mask


def random_topk(logp, mu, seed, k=3, vocab=11):
    """A consistent top-K set for [B, T] tokens: full random distributions whose sampled-token entries are
    overwritten so that they hold exactly ``mu`` and ``logp``."""
    gen = torch.Generator().manual_seed(seed)
    b, t = logp.shape
    sampled = torch.randint(vocab, (b, t), generator=gen)
    full_mu = _with_entry(torch.randn(b, t, vocab, generator=gen).log_softmax(-1), sampled, mu)
    full_pi = _with_entry(torch.randn(b, t, vocab, generator=gen).log_softmax(-1), sampled, logp)
    ids, mu_k = topk_of_logprobs(full_mu, sampled, k)
    pi_k = torch.where(ids >= 0, full_pi.gather(-1, ids.clamp(min=0)), -math.inf)
    return TopK(ids=ids, behavior_logp=mu_k, logp=pi_k, valid=ids >= 0)


def _with_entry(full_logp, ids, entry_logp):
    """Set log p(ids) = entry_logp and rescale the other entries so the distribution still sums to 1."""
    p = full_logp.exp()
    p.scatter_(-1, ids.unsqueeze(-1), 0.0)
    p = p / p.sum(-1, keepdim=True) * (1 - entry_logp.exp()).unsqueeze(-1)
    p.scatter_(-1, ids.unsqueeze(-1), entry_logp.exp().unsqueeze(-1))
    return p.log()


@pytest.mark.parametrize("preset", UNIFIED_WEIGHT_PRESETS)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_gradient_identity_on_random_batches(preset, per_token_adv):
    """The gradient is (−M·w·A + 2τ·log(π/μ))·∇log π; the value is −M·w·A + τ·log²(π/μ)."""
    tr = TrustRegion.preset(preset)
    logp, mu, recomputed, adv, mask = random_batch(seed=len(preset))
    if not per_token_adv:
        adv = adv[:, :1]
    tr = tr.replace(k=3) if tr.uses_topk else tr  # random_topk's K
    topk = random_topk(logp, mu, seed=1, k=tr.k) if tr.uses_topk else None
    logp = logp.clone().requires_grad_()
    out = policy_loss(logp, mu, adv, mask, tr, recomputed_logp=recomputed, topk=topk)
    out.loss.sum().backward()
    policy_term = -out.keep.float() * expected_weight(tr, logp.detach(), mu, recomputed, mask) * adv.expand_as(mu)
    log_ratio = logp.detach() - mu
    expected_grad = policy_term + 2 * tr.kl_tau * log_ratio
    torch.testing.assert_close(logp.grad, torch.where(mask, expected_grad, 0.0), rtol=1e-5, atol=1e-6)
    assert not out.keep[~mask].any() and (out.loss[~mask] == 0).all()
    expected_value = policy_term + tr.kl_tau * log_ratio.square()
    torch.testing.assert_close(out.loss.detach(), torch.where(mask, expected_value, 0.0))


def test_divergence_abs_ratio_minus_one_reproduces_ppo():
    logp, mu, _, adv, _ = random_batch(seed=3, b=64, t=64, low=-3.0)
    ratio = (logp - mu).exp()
    for eps in (0.1, 0.2, 0.3):
        assert torch.equal(divergence_keep(ratio, adv, (ratio - 1).abs(), eps), ratio_keep(ratio, adv, eps, eps))
    tr = TrustRegion.preset("ppo")
    out = policy_loss(logp, mu, adv, torch.ones_like(mu, dtype=torch.bool), tr)
    assert torch.equal(out.keep, divergence_keep(ratio, adv, (ratio - 1).abs(), 0.2))
    torch.testing.assert_close(out.divergence, (ratio - 1).abs())


def test_topk_rule_equals_binary_on_a_two_token_vocabulary():
    for mu, pi in ((0.3, 0.7), (0.99, 0.8), (1e-4, 1e-2)):
        assert run_rule("dppo_topk_tv", mu, pi, 1.0)[1] == pytest.approx(
            run_rule("dppo_binary_tv", mu, pi, 1.0)[1], rel=1e-5
        )


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_no_nan_or_inf_at_extreme_probabilities(preset):
    tr = TrustRegion.preset(preset)
    tr = tr.replace(k=1) if tr.uses_topk else tr  # a two-token vocabulary
    near_one = math.log1p(-1e-7)
    values = torch.tensor([-60.0, -30.0, -1e-7, near_one, -1.0, 0.0])
    logp, mu = torch.meshgrid(values, values, indexing="ij")
    logp, mu = logp.reshape(1, -1).clone(), mu.reshape(1, -1)
    adv = torch.tensor([[1.0, -1.0]]).repeat_interleave(logp.shape[1] // 2, dim=1)
    topk = None
    if tr.uses_topk:

        def other(x):
            return torch.log(-torch.expm1(x.clamp(max=-1e-7)))

        topk = TopK(
            ids=torch.tensor([0, 1]).expand(1, logp.shape[1], 2),
            behavior_logp=torch.stack([mu, other(mu)], -1), logp=torch.stack([logp, other(logp)], -1),
            valid=torch.ones(1, logp.shape[1], 2, dtype=torch.bool),
        )
    logp.requires_grad_()
    out = policy_loss(logp, mu, adv, torch.ones_like(mu, dtype=torch.bool), tr, recomputed_logp=mu, topk=topk)
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(logp.grad).all()
    assert torch.isfinite(out.divergence).all()
    assert all(math.isfinite(v) for v in out.metrics.values()), out.metrics


def test_metrics_split_by_sign_and_shadow_buckets():
    # four tokens: A>0 blocked (low μ, r=100), A<0 kept, A=0 (excluded from fractions), A<0 bad update
    mu = torch.log(torch.tensor([[1e-4, 0.5, 0.5, 0.9]]))
    logp = torch.log(torch.tensor([[1e-2, 0.45, 0.5, 0.3]]))
    adv = torch.tensor([[1.0, -1.0, 0.0, -1.0]])
    out = policy_loss(logp, mu, adv, torch.ones(1, 4, dtype=torch.bool), TrustRegion.preset("dppo_binary_tv"))
    m = out.metrics
    assert out.keep.tolist() == [[True, True, True, False]]
    assert m["mask/fraction"] == pytest.approx(1 / 3)
    assert m["mask/fraction_pos_adv"] == 0.0 and m["mask/fraction_neg_adv"] == pytest.approx(0.5)
    assert m["bad_update/fraction"] == pytest.approx(1 / 3)  # μ − π = 0.6 ≥ 0.5 with A < 0
    assert m["mismatch/abs_diff_max"] == pytest.approx(0.6)
    assert m["shadow/ppo/mask_fraction"] == pytest.approx(2 / 3)  # r = 100 (A>0) and r = 1/3 (A<0)
    assert m["shadow/ppo/mask_fraction_mu_lt_0.1"] == 1.0
    assert m["shadow/ppo/mask_fraction_mu_0.1_0.5"] == 0.0  # μ = 0.5 falls in the next bucket
    assert m["shadow/ppo/mask_fraction_mu_ge_0.5"] == pytest.approx(0.5)
    assert m["tokens"] == 4
    # the blocked token's cell (A<0, μ = 0.9 > π = 0.3, μ ≥ 0.5) and the tokens whose binary KL to μ exceeds 0.05
    assert m["mask_cell/neg_adv_mu_above_mu_ge_0.5"] == pytest.approx(1 / 3)
    assert sum(v for k, v in m.items() if k.startswith("mask_cell/")) == pytest.approx(m["mask/fraction"])
    assert m["over_delta/neg_adv_mu_above"] == pytest.approx(1 / 3)  # KL(0.9 ‖ 0.3) = 0.79
    assert m["over_delta/pos_adv_mu_below"] == 0.0  # KL(1e-4 ‖ 1e-2) = 0.0095 and KL(0.5 ‖ 0.45) = 0.005: under δ
    assert m["over_delta/neg_adv_mu_below"] == m["over_delta/pos_adv_mu_above"] == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"delta": 0.0}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"eps_low": -0.1}, "eps_low"),
        ({"is_cap": 0.0}, "is_cap"),
        ({"rule": "clip"}, "unknown rule"),
        ({"anchor": "old"}, "unknown anchor"),
        ({"rule": "topk_tv", "k": 0}, "k >= 1"),
        ({"rule": "binary_tv", "relax": "low"}, "relax"),
        ({"alpha": 1.5}, "alpha"),
        ({"delta": math.nan}, "NaN"),
        ({"rule": "topk_kl", "anchor": "recompute"}, "anchored on μ"),
        ({"is_weight": "sequence"}, "unknown is_weight"),
        ({"mismatch_mask": "geo"}, "unknown mismatch_mask"),
        ({"mismatch_low": 1.01, "mismatch_high": 0.99}, "mismatch band"),
        ({"mismatch_low": -0.5}, "mismatch band"),
        ({"mismatch_high": math.nan}, "NaN"),
        ({"kl_tau": -1e-3}, "kl_tau"),
        ({"kl_tau": math.inf}, "kl_tau"),
    ],
)
def test_invalid_trust_regions_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrustRegion(**kwargs)


def test_preset_overrides_and_unknown_names():
    tr = TrustRegion.preset("dppo_binary_tv", delta=0.2)
    assert tr.delta == 0.2 and tr.rule == "binary_tv"
    assert TrustRegion.preset("cispo", is_cap=math.inf).is_cap == math.inf
    with pytest.raises(ValueError, match="unknown trust-region preset 'dpo'"):
        TrustRegion.preset("dpo")
    with pytest.raises(ValueError, match="unknown TrustRegion field"):
        TrustRegion.preset("ppo", epsilon=0.1)
    with pytest.raises(ValueError, match="delta"):
        TrustRegion.preset("dppo_binary_kl", delta=0)


def test_missing_inputs_raise():
    logp, mu, _, adv, mask = random_batch(seed=0)
    with pytest.raises(ValueError, match="recomputed_logp"):
        policy_loss(logp, mu, adv, mask, TrustRegion.preset("minirl"))
    with pytest.raises(ValueError, match="top-K"):
        policy_loss(logp, mu, adv, mask, TrustRegion.preset("dppo_topk_kl"))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, mu, adv[:, :2], mask, TrustRegion.preset("ppo"))


def test_an_unknown_divergence_blocks_a_move_away_but_not_a_move_back():
    """A NaN D (e.g. from a damaged μ) is no licence to move further from μ."""
    ratio = torch.tensor([0.2, 1.5, 0.2, 1.5])
    advantages = torch.tensor([-1.0, 1.0, 1.0, -1.0])  # away, away, back, back
    keep = divergence_keep(ratio, advantages, torch.full((4,), float("nan")), delta=0.15)
    assert keep.tolist() == [False, False, True, True]


UNREAD_PERTURBATION = {"delta": 0.37, "eps_low": 0.05, "eps_high": 0.9, "is_cap": 1.5, "alpha": 0.8, "k": 3,
                       "mismatch_low": 0.9, "mismatch_high": 1.05, "kl_tau": 0.3}
"""Values far from every preset's, to change a loss that reads them."""


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_field_a_rule_does_not_read_changes_nothing(preset):
    """``fields_read`` decides which ``--tr-*`` overrides are refused: every field outside it must leave the loss,
    its gradient and the mask exactly as they were."""
    gen = torch.Generator().manual_seed(3)
    logp_all = torch.randn(4, 9, 32, generator=gen).log_softmax(-1)
    ids = torch.randint(0, 32, (4, 9), generator=gen)
    logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    mu_all = (logp_all + 0.6 * torch.randn(4, 9, 32, generator=gen)).log_softmax(-1)
    mu = mu_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    recomputed = (logp + mu) / 2
    advantages = torch.tensor([[1.0], [-1.0], [0.5], [-0.3]])
    mask = torch.ones(4, 9, dtype=torch.bool)
    base = TrustRegion.preset(preset)

    def loss_of(tr):
        lp = logp.clone().requires_grad_()
        topk = None
        if tr.uses_topk:
            topk_ids, topk_mu = topk_of_logprobs(mu_all, ids, tr.k)
            topk = TopK(topk_ids, topk_mu, logp_all.gather(-1, topk_ids.clamp(min=0)), topk_ids >= 0)
        out = policy_loss(lp, mu, advantages, mask, tr, recomputed_logp=recomputed, topk=topk)
        out.loss.sum().backward()
        return out.loss.detach(), out.keep, lp.grad

    expected = loss_of(base)
    for name in sorted(set(UNREAD_PERTURBATION) - base.fields_read):
        got = loss_of(base.replace(**{name: UNREAD_PERTURBATION[name]}))  # preset() refuses an unread field
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), f"{preset} reads {name} after all"


def test_the_paper_knobs_are_read_where_the_paper_uses_them():
    assert {"delta"} <= TrustRegion.preset("dppo_binary_tv").fields_read
    assert {"delta", "k"} <= TrustRegion.preset("dppo_topk_kl").fields_read
    assert {"eps_low", "eps_high"} <= TrustRegion.preset("ppo").fields_read
    assert "delta" not in TrustRegion.preset("ppo").fields_read and "k" not in TrustRegion.preset("cispo").fields_read
    assert "alpha" in TrustRegion.preset("relax_both").fields_read
    assert {"mismatch_low", "mismatch_high"} <= TrustRegion.preset("icepop").fields_read


@pytest.mark.parametrize("adv, pi, blocked_by", [(1.0, 0.9, "positive"), (-1.0, 0.1, "negative")])
def test_each_half_of_the_mask_blocks_only_its_own_side(adv, pi, blocked_by):
    """μ = 0.5: π = 0.9 with A > 0 (r > 1) is the positive half's token, π = 0.1 with A < 0 (r < 1) the negative's."""
    for preset, side in (("dppo_binary_kl", "both"), ("dppo_binary_kl_neg", "negative"),
                         ("dppo_binary_kl_pos", "positive")):
        keep, _, grad = run_rule(preset, 0.5, pi, adv)
        assert keep == (side not in ("both", blocked_by)), (preset, adv)
        assert (grad == 0) == (not keep)


def test_only_a_divergence_rule_has_halves():
    with pytest.raises(ValueError, match="mask_side='negative' keeps one half of a divergence mask"):
        TrustRegion.preset("pg_is", mask_side="negative")
    with pytest.raises(ValueError, match="mask_side"):
        TrustRegion.preset("dppo_binary_kl", mask_side="left")
