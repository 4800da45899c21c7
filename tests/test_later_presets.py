"""DRPO, CPPO and M2PO against their sources' equations: hand-computed cases, each one's gradient against its loss
written out as its source writes it, the metrics each reports, and the bounds each guarantees (hypothesis).

DRPO (arXiv 2606.09821 eq. 8): J = Σ_t r_t·A_t − |A_t|·μ·(r_t − 1)²/(2δ); gradient weight (Table 1)
ω_t = 1 − sign(A_t(r_t − 1))·|π − μ|/δ.
CPPO (arXiv 2606.10968 eq. 8-10, 22, Algorithm 1): keep t iff A_t(r_t − 1) ≤ 0 or Z_t ≤ c_t, Z_t = w_t·D_t,
c_t = min(δ, δ + δ_b·W_{t−1} − S_{t−1}), w_t = 1 − (1 − w_min)(t − 1)/(T − 1), δ_b = clamp(P90(D), δ_b,min, 2δ_b,min).
M2PO (arXiv 2510.01161 eq. 4-5, Algorithm 1): among the tokens with A > 0 & r > 1 or A < 0 & r < 1, drop the largest
(log r)² until their mean is ≤ τ_M2; J = Σ M·r·A.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dppo_oat import divergence as div
from dppo_oat.trust_region import (
    PRESETS,
    TrustRegion,
    drpo_weight,
    policy_loss,
    position_weights,
    prefix_budget,
    trust_region_keep,
)

LATER = ("drpo", "cppo", "cppo_binary_tv", "m2po")


def run(preset, mu, pi, adv, mask=None, **overrides):
    """policy_loss on ``[B, T]`` probabilities (fp64 leaves); its output and the gradient on log π_θ."""
    logp = torch.tensor(pi, dtype=torch.float64).log().requires_grad_()
    mu_logp = torch.tensor(mu, dtype=torch.float64).log()
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    out = policy_loss(logp, mu_logp, torch.tensor(adv, dtype=torch.float64), mask,
                      TrustRegion.preset(preset, **overrides))
    out.loss.sum().backward()
    return out, logp.grad


def assert_rows(actual, expected, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=atol)


def random_batch(seed, b=6, t=12, spread=0.5):
    """μ over a range of probabilities, π_θ near it, mixed-sign A (one row 0), padding inside rows."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.log_softmax(2 * torch.randn(b, t, 6, generator=gen, dtype=torch.float64), -1)[..., 0]
    logp = (mu + spread * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-4)
    adv = torch.randn(b, 1, generator=gen, dtype=torch.float64).expand(b, t).clone()
    adv[0] = 0.0
    mask = torch.rand(b, t, generator=gen) > 0.2
    mask[:, 0] = False  # a prompt token before each response
    return mu, logp, adv, mask


def test_sources_and_defaults():
    drpo, cppo, cppo_bin, m2po = (TrustRegion.preset(name) for name in LATER)
    assert (drpo.rule, drpo.delta, drpo.is_cap, drpo.anchor) == ("drpo", 12.5, math.inf, "behavior")
    assert (cppo.rule, cppo.delta, cppo.k, cppo.w_min, cppo.delta_b) == ("cppo_topk_tv", 0.15, 20, 0.8, 0.02)
    assert (cppo_bin.rule, cppo_bin.delta, cppo_bin.w_min, cppo_bin.delta_b) == ("cppo_binary_tv", 0.15, 0.8, 0.02)
    assert (m2po.rule, m2po.tau_m2, m2po.is_cap) == ("m2po", 0.04, math.inf)
    assert cppo.uses_topk and not cppo_bin.uses_topk
    assert [TrustRegion.preset(n).couples_tokens for n in LATER] == [False, True, True, True]
    assert not any(TrustRegion.preset(n).needs_recompute for n in LATER)
    expected = {"drpo": ("2606.09821", "eq. 8", "Table 1", "δ = 12.5", "unirl/algorithms/drpo.py"),
                "cppo": ("2606.10968", "eq. 8-10", "eq. 22", "Algorithm 1", "K = 20", "unirl/algorithms/cppo.py"),
                "cppo_binary_tv": ("|π − μ|", "unirl/algorithms/cppo.py"),
                "m2po": ("2510.01161", "eq. 4", "Algorithm 1", "eq. 5", "0.04", "dp_actor.py")}
    for name, parts in expected.items():
        assert all(part in PRESETS[name].source for part in parts), (name, PRESETS[name].source)


# --------------------------------------------------------------------------------------------- DRPO


def test_drpo_by_hand():
    """δ = 0.2, μ = 0.5, A = +1 unless said. π = 0.6: r 1.2, ω = 1 − 0.1/0.2 = 0.5, ∂L/∂log π = −r·A·ω = −0.6,
    L = −1.2 + 0.5·0.2²/0.4 = −1.15. π = 0.7 is the boundary |π − μ| = δ: ω = 0, no gradient, L = −1.4 + 0.2 = −1.2
    (the minimum). π = 0.8 is beyond: ω = −0.5, the gradient turns corrective (+0.8), L = −1.6 + 0.45 = −1.15.
    π = 0.4 moves back toward μ: ω = 1.5, −0.8·1.5 = −1.2, L = −0.8 + 0.05 = −0.75. π = 0.4 with A = −1 moves away
    downward: ω = 0.5, +0.8·0.5 = 0.4, L = 0.8 + 0.05 = 0.85. μ = 1e-4 → π = 1e-2 (r = 100): ω = 1 − 0.0099/0.2
    = 0.9505 stays bounded, −100·0.9505 = −95.05, L = −100 + 1e-4·99²/0.4 = −97.54975."""
    mu = [[0.5, 0.5, 0.5, 0.5, 0.5, 1e-4]]
    pi = [[0.6, 0.7, 0.8, 0.4, 0.4, 1e-2]]
    adv = [[1.0, 1.0, 1.0, 1.0, -1.0, 1.0]]
    out, grad = run("drpo", mu, pi, adv, delta=0.2)
    assert out.keep.all()  # DRPO never masks
    assert_rows(grad, [[-0.6, 0.0, 0.8, -1.2, 0.4, -95.05]])
    assert_rows(out.loss.detach(), [[-1.15, -1.2, -1.15, -0.75, 0.85, -97.54975]])
    m = out.metrics
    assert m["drpo/weight_mean"] == pytest.approx((0.5 + 0 - 0.5 + 1.5 + 0.5 + 0.9505) / 6, rel=1e-5)
    assert m["drpo/weight_min"] == pytest.approx(-0.5, rel=1e-5)
    assert m["drpo/corrective_fraction"] == pytest.approx(1 / 6)
    assert m["mask/fraction"] == 0.0 and m["divergence/max"] == pytest.approx(0.3, rel=1e-5)  # binary TV


def test_drpo_at_the_papers_delta():
    """δ = 12.5 (§4): μ = 0.5 → π = 0.8, A = +1: ω = 1 − 0.3/12.5 = 0.976, ∂L/∂log π = −1.6·0.976 = −1.5616."""
    _, grad = run("drpo", [[0.5]], [[0.8]], [[1.0]])
    assert grad.item() == pytest.approx(-1.5616, rel=1e-5)


def drpo_objective_as_the_paper_writes_it(logp, mu_logp, adv, mask, delta):
    """−(r_t·A_t − |A_t|/(2δ)·μ(y_t|s_t)·(r_t − 1)²) per response token, r_t = π/μ in probability space."""
    pi, mu = logp.exp(), mu_logp.exp()
    r = pi / mu
    return torch.where(mask, -(r * adv - adv.abs() / (2 * delta) * mu * (r - 1) ** 2), 0.0)


@pytest.mark.parametrize("delta", [12.5, 0.2])
@pytest.mark.parametrize("seed", range(3))
def test_drpo_gradient_and_value_are_the_papers(delta, seed):
    mu, logp, adv, mask = random_batch(seed)
    ours = logp.clone().requires_grad_()
    out = policy_loss(ours, mu, adv, mask, TrustRegion.preset("drpo", delta=delta))
    out.loss.sum().backward()
    theirs = logp.clone().requires_grad_()
    paper = drpo_objective_as_the_paper_writes_it(theirs, mu, adv, mask, delta)
    paper.sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.loss.detach().double(), paper.detach(), rtol=1e-4, atol=1e-5)
    # the closed form of eq. 9: −r·A·ω with ω of Table 1
    r, weight = (logp - mu).exp(), drpo_weight(logp.exp(), mu.exp(), adv, delta)
    torch.testing.assert_close(ours.grad, torch.where(mask, -r * adv * weight, 0.0), rtol=1e-4, atol=1e-5)
    assert (theirs.grad[mask & (adv != 0)] != 0).all()


@settings(max_examples=200, deadline=None)
@given(mu=st.floats(1e-6, 1 - 1e-6), pi=st.floats(1e-6, 1 - 1e-6), adv=st.floats(-5, 5),
       delta=st.floats(0.05, 20.0))
def test_drpo_weight_is_bounded_and_the_gradient_is_r_a_weight(mu, pi, adv, delta):
    """ω ∈ [1 − 1/δ, 1 + 1/δ] whatever μ (SPO's 1 − |r − 1|/ε is not), below 1 exactly when the token moves away
    from μ in the direction A pushes, and the loss's gradient is −r·A·ω."""
    out, grad = run("drpo", [[mu]], [[pi]], [[adv]], delta=delta)
    weight = drpo_weight(torch.tensor(pi, dtype=torch.float64), torch.tensor(mu, dtype=torch.float64),
                         torch.tensor(adv, dtype=torch.float64), delta).item()
    assert 1 - 1 / delta - 1e-12 <= weight <= 1 + 1 / delta + 1e-12
    if adv * (pi - mu) > 0 and abs(pi - mu) > 1e-9:
        assert weight < 1
    r = math.exp(math.log(pi) - math.log(mu))
    assert grad.item() == pytest.approx(-r * adv * weight, rel=1e-4, abs=1e-6 * max(1.0, r * abs(adv)))
    assert math.isfinite(out.loss.item())


# --------------------------------------------------------------------------------------------- CPPO

# Four rows of three columns; CPPO-Binary-TV with δ 0.15, w_min 0.8, δ_b 0.02 (so δ_b^seq = 0.04 on every row:
# each row's P90 of D exceeds 2·δ_b).
# row 0, A = +1, all moving up: D = 0.10, 0.14, 0.12; w = 1, 0.9, 0.8; Z = 0.10, 0.126, 0.096.
#   t=1: c = 0.15 ≥ 0.10, kept. t=2: c = min(0.15, 0.15 + 0.04·1 − 0.10) = 0.09 < 0.126, blocked by the budget
#   (DPPO keeps D = 0.14 ≤ 0.15). t=3: c = 0.15 + 0.04·1.9 − 0.226 = 0 < 0.096, blocked.
# row 1, A = −1, a prompt token first: t=1 moves up (μ 0.2 → π 0.9, back toward μ in A's sense) and is kept, but its
#   Z = 0.7 spends the budget: t=2 (0.5 → 0.45, away, D = 0.05, w = 0.8, Z = 0.04) meets c = 0.19 − 0.7 < 0: blocked.
# row 2, A = +1, padding last: t=1 π = μ; t=2 D = 0.18 > δ but w = 0.8: Z = 0.144 ≤ c = 0.15: kept (DPPO blocks it).
# row 3, A = +1, one token: D = 0.18 with w = 1: blocked.
CPPO_MU = [[0.5, 0.5, 0.5], [0.3, 0.2, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]
CPPO_PI = [[0.6, 0.64, 0.62], [0.3, 0.9, 0.45], [0.5, 0.68, 0.5], [0.68, 0.5, 0.5]]
CPPO_ADV = [[1.0], [-1.0], [1.0], [1.0]]
CPPO_MASK = [[1, 1, 1], [0, 1, 1], [1, 1, 0], [1, 0, 0]]


def test_cppo_by_hand():
    out, grad = run("cppo_binary_tv", CPPO_MU, CPPO_PI, CPPO_ADV, CPPO_MASK)
    assert out.keep.tolist() == [[True, False, False], [False, True, False], [True, True, False],
                                 [False, False, False]]
    assert_rows(grad, [[-1.2, 0.0, 0.0], [0.0, 4.5, 0.0], [-1.0, -1.36, 0.0], [0.0, 0.0, 0.0]])  # −M·r·A
    dppo, _ = run("dppo_binary_tv", CPPO_MU, CPPO_PI, CPPO_ADV, CPPO_MASK)
    assert dppo.keep.tolist() == [[True, True, True], [False, True, True], [True, False, False],
                                  [False, False, False]]
    m = out.metrics
    assert m["mask/fraction"] == pytest.approx(4 / 8)  # 8 response tokens with A ≠ 0
    assert m["cppo/budget_mask_fraction"] == pytest.approx(3 / 8)  # row 0 t=2, t=3 and row 1 t=2 had Z ≤ δ
    assert m["cppo/delta_b_mean"] == pytest.approx(0.04)


def test_cppo_position_weights_and_budget():
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    expected = [[1.0, 0.95, 0.9, 0.85, 0.8], [0.0, 1.0, 0.8, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0], [0.0] * 5]
    torch.testing.assert_close(position_weights(mask, 0.8), torch.tensor(expected, dtype=torch.float64))
    # P90 of 0.01..0.05 (numpy's linear interpolation: 0.046) inside [0.02, 0.04] → 0.04; of 0.01, 0.02 → 0.019
    # → floor 0.02; a lone 0.03 stays; an empty row gets the floor
    divergence = torch.tensor([[0.01, 0.02, 0.03, 0.04, 0.05], [9.0, 0.01, 0.02, 9.0, 9.0], [9.0, 9.0, 0.03, 9.0, 9.0],
                               [9.0] * 5])
    budget = prefix_budget(divergence, mask, 0.02).squeeze(-1)
    torch.testing.assert_close(budget, torch.tensor([0.04, 0.02, 0.03, 0.02], dtype=torch.float64))


def cppo_mask_as_the_paper_writes_it(divergence, ratio, adv, mask, delta, w_min, delta_b, margins=None):
    """Eq. 8-10 and 22 token by token: per response, w_t = 1 − (1 − w_min)(t − 1)/(T − 1), Z_t = w_t·D_t, keep t iff
    A_t(r_t − 1) ≤ 0 or Z_t ≤ min(δ, δ + δ_b^seq·W_{t−1} − S_{t−1}), then S_t, W_t accumulate. ``margins``: a dict
    that receives c_t − Z_t by (row, column)."""
    keep = np.zeros(mask.shape, dtype=bool)
    for row in range(mask.shape[0]):
        columns = [j for j in range(mask.shape[1]) if mask[row, j]]
        if not columns:
            continue
        d = [float(divergence[row, j]) for j in columns]
        budget = min(max(float(np.quantile(d, 0.9)), delta_b), 2 * delta_b)
        length, s_prev, w_prev = len(columns), 0.0, 0.0
        for t, j in enumerate(columns, start=1):
            w = 1.0 - (1.0 - w_min) * (t - 1) / max(length - 1, 1)
            z = w * d[t - 1]
            toward = float(adv[row, j]) * (float(ratio[row, j]) - 1.0) <= 0.0
            c = min(delta, delta + budget * w_prev - s_prev)
            keep[row, j] = toward or z <= c
            if margins is not None:
                margins[row, j] = c - z
            s_prev += z
            w_prev += w
    return torch.from_numpy(keep)


@pytest.mark.parametrize("preset", ["cppo_binary_tv", "cppo"])
@pytest.mark.parametrize("seed", range(4))
def test_cppo_gradient_is_the_papers(preset, seed):
    """The loss is DPPO's surrogate −Σ M_t·r_t·A_t (C = ∞) under the mask of eq. 8-10, and the case exercises the
    budget (some tokens blocked that DPPO would keep)."""
    tr = TrustRegion.preset(preset).replace(k=3)  # K read by the top-K one only
    mu, logp, adv, mask = random_batch(seed)
    topk = None
    if tr.uses_topk:
        from test_trust_region import random_topk

        topk = random_topk(logp.float(), mu.float(), seed=seed)
        divergence = div.topk_tv(topk.behavior_logp, topk.logp, topk.valid)
    else:
        divergence = div.binary_tv(mu.float(), logp.float())
    ratio = (logp - mu).exp()
    paper_keep = cppo_mask_as_the_paper_writes_it(divergence, ratio, adv, mask, tr.delta, tr.w_min, tr.delta_b)
    ours = logp.clone().requires_grad_()
    out = policy_loss(ours, mu, adv, mask, tr, topk=topk)
    out.loss.sum().backward()
    assert torch.equal(out.keep, paper_keep & mask)
    theirs = logp.clone().requires_grad_()
    torch.where(paper_keep & mask, -(theirs.exp() / mu.exp()) * adv, 0.0).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)
    dppo = TrustRegion.preset("dppo_topk_tv" if tr.uses_topk else "dppo_binary_tv").replace(k=3)
    assert (policy_loss(logp, mu, adv, mask, dppo, topk=topk).keep & ~out.keep).any(), "the budget binds"


def float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


# A band is 0 or a number float32 holds as a normal one: TrustRegion refuses one it would underflow (1e-41).
rows = st.integers(1, 9).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.01, 0.99), min_size=n, max_size=n),
    st.lists(st.floats(0.01, 0.99), min_size=n, max_size=n)))


@settings(max_examples=150, deadline=None)
@given(row=rows, adv=st.sampled_from([-1.0, 1.0]), delta=st.floats(0.02, 0.5), w_min=st.floats(0.1, 1.0),
       delta_b=st.one_of(st.just(0.0), st.floats(1e-9, 0.2)))
@example(row=([0.875, 0.01, 0.5], [0.25, 0.010000000000000002, 0.5]), adv=1.0, delta=0.5, w_min=1.0, delta_b=0.0)
def test_cppo_bounds(row, adv, delta, w_min, delta_b):
    """Every kept token that moves away from μ has Z_t ≤ δ (so D_t ≤ δ/w_t ≤ δ/w_min) and keeps its prefix within
    budget, S_t ≤ δ + δ_b^seq·W_{t−1}; a token moving back is always kept; the mask is eq. 8-10's. Whether a token
    moves is judged in float32, as the loss sees π and μ (0.01 and 0.01 + 2e-18 are one number there: it does not
    move, whatever its prefix holds)."""
    mu, pi = row
    tr = TrustRegion.preset("cppo_binary_tv", delta=delta, w_min=w_min, delta_b=delta_b)
    out, _ = run("cppo_binary_tv", [mu], [pi], [[adv]], delta=delta, w_min=w_min, delta_b=delta_b)
    keep = out.keep[0].tolist()
    d = out.divergence[0].tolist()  # |π − μ| as the loss computes it (fp32)
    mask = torch.ones(1, len(mu), dtype=torch.bool)
    budget = prefix_budget(torch.tensor([d], dtype=torch.float64), mask, delta_b).item()
    weights = position_weights(mask, w_min)[0].tolist()
    s_prev = w_prev = 0.0
    for t, (m, p) in enumerate(zip(mu, pi, strict=True)):
        z = weights[t] * d[t]
        if adv * (float32(p) - float32(m)) <= 0:
            assert keep[t]
        elif keep[t]:
            assert z <= delta + 1e-6 and d[t] <= delta / w_min + 1e-6
            assert s_prev + z <= delta + budget * w_prev + 1e-6
        s_prev, w_prev = s_prev + z, w_prev + weights[t]
    ratio = torch.tensor([pi]).double() / torch.tensor([mu]).double()  # of the float32 values the loss sees
    margins = {}
    expected = cppo_mask_as_the_paper_writes_it(torch.tensor([d]), ratio, torch.full((1, len(mu)), adv), mask.numpy(),
                                                tr.delta, tr.w_min, tr.delta_b, margins)
    decided = [t for t in range(len(mu)) if abs(margins[0, t]) > 1e-9]  # not a tie up to rounding
    assert [keep[t] for t in decided] == [bool(expected[0, t]) for t in decided]


@pytest.mark.parametrize("cppo, dppo", [("cppo_binary_tv", "dppo_binary_tv"), ("cppo", "dppo_topk_tv")])
def test_cppo_without_position_weights_or_budget_is_dppo(cppo, dppo):
    """w_min = 1 and a budget too large to bind leave c_t = δ: DPPO's mask (eq:dppo_obj), top-K and binary."""
    from test_trust_region import random_topk

    mu, logp, adv, mask = random_batch(5, b=8, t=20)
    topk = random_topk(logp.float(), mu.float(), seed=5) if "topk" in dppo else None
    ours = policy_loss(logp, mu, adv, mask, TrustRegion.preset(cppo, w_min=1.0, delta_b=1e6).replace(k=3), topk=topk)
    theirs = policy_loss(logp, mu, adv, mask, TrustRegion.preset(dppo).replace(k=3), topk=topk)
    assert torch.equal(ours.keep, theirs.keep) and (~theirs.keep & mask).any()


def test_cppo_ignores_what_lies_off_the_response():
    """Prompt tokens and padding change neither the positions nor the budget: the same response in a wider row,
    shifted, is masked the same."""
    mu, pi = [0.5, 0.5, 0.5], [0.6, 0.64, 0.62]
    narrow, _ = run("cppo_binary_tv", [mu], [pi], [[1.0]])
    wide, _ = run("cppo_binary_tv", [[0.1, 0.9] + mu + [0.2]], [[0.9, 0.1] + pi + [0.9]], [[1.0]],
                  mask=[[0, 0, 1, 1, 1, 0]])
    assert wide.keep[0, 2:5].tolist() == narrow.keep[0].tolist() == [True, False, False]


# --------------------------------------------------------------------------------------------- M2PO

# μ = 0.5 everywhere, log r = 0.1, 0.2, −0.3, 0.5, −0.6, 0.4 with A = +1, +1, −1, +1, +1, 0. The trust-region tokens
# are the first four ((log r)² = 0.01, 0.04, 0.09, 0.25): mean 0.0975 > 0.04 → drop 0.25: 0.14/3 = 0.0467 > 0.04 →
# drop 0.09: 0.05/2 = 0.025 ≤ 0.04, stop. Token 5 (A > 0, r < 1) and token 6 (A = 0) are no trust-region tokens.
M2PO_LOG_R = [0.1, 0.2, -0.3, 0.5, -0.6, 0.4]
M2PO_ADV = [[1.0, 1.0, -1.0, 1.0, 1.0, 0.0]]


def test_m2po_by_hand():
    pi = [[0.5 * math.exp(x) for x in M2PO_LOG_R]]
    out, grad = run("m2po", [[0.5] * 6], pi, M2PO_ADV)
    assert out.keep.tolist() == [[True, True, False, False, True, True]]
    assert_rows(grad, [[-math.exp(0.1), -math.exp(0.2), 0.0, 0.0, -math.exp(-0.6), 0.0]])  # −M·r·A
    m = out.metrics
    assert m["m2po/m2_before"] == pytest.approx(0.0975, rel=1e-5)
    assert m["m2po/m2_after"] == pytest.approx(0.025, rel=1e-5)
    assert m["m2po/masked_fraction"] == pytest.approx(2 / 6)
    assert m["m2po/trust_region_fraction"] == pytest.approx(4 / 6)
    assert m["divergence/mean"] == pytest.approx(0.91 / 6, rel=1e-5)  # eq. 4's M̂2 over every token


def test_m2po_masks_by_the_batch():
    """(log r)² = 0.09 alone is over τ_M2 = 0.04 and masked; in a batch with three tokens at 0.01 (another row) the
    mean is 0.03 and nothing is masked: only outliers of the batch are."""
    alone, _ = run("m2po", [[0.5]], [[0.5 * math.exp(0.3)]], [[1.0]])
    assert alone.keep.tolist() == [[False]]
    batch, _ = run("m2po", [[0.5, 0.5], [0.5, 0.5]], [[0.5 * math.exp(0.3), 0.5 * math.exp(0.1)],
                                                     [0.5 * math.exp(0.1), 0.5 * math.exp(0.1)]], [[1.0], [1.0]])
    assert batch.keep.all() and batch.metrics["m2po/m2_after"] == pytest.approx(0.03, rel=1e-5)


def m2po_mask_as_the_paper_writes_it(log_ratio, adv, mask, tau):
    """Algorithm 1 verbatim: M ← True; T ← the trust-region tokens; while mean_{i∈T} M̂2_i > τ: j ← argmax_{i∈T}
    M̂2_i; M_j ← False; T ← T \\ {j}."""
    values = log_ratio.square().reshape(-1).tolist()
    flat_adv, flat_log_r, flat_mask = adv.reshape(-1).tolist(), log_ratio.reshape(-1).tolist(), mask.reshape(-1)
    keep = [True] * len(values)
    trust = [i for i in range(len(values)) if flat_mask[i] and ((flat_adv[i] > 0 and flat_log_r[i] > 0)
                                                                 or (flat_adv[i] < 0 and flat_log_r[i] < 0))]
    while trust and sum(values[i] for i in trust) / len(trust) > tau:
        j = max(trust, key=lambda i: values[i])
        keep[j] = False
        trust.remove(j)
    return torch.tensor(keep).reshape(mask.shape)


@pytest.mark.parametrize("seed", range(4))
def test_m2po_gradient_is_the_papers(seed):
    """Eq. 5: J = Σ M_{i,t}·(π_θ/π_behav)·A_{i,t} under Algorithm 1's mask (its 1/Σ|o_i| is the token-mean
    aggregation, which counts masked tokens)."""
    mu, logp, adv, mask = random_batch(seed, spread=0.3)
    log_ratio = (logp.float() - mu.float()).double()  # as the loss computes it (fp32)
    paper_keep = m2po_mask_as_the_paper_writes_it(log_ratio, adv, mask, 0.04) & mask
    ours = logp.clone().requires_grad_()
    out = policy_loss(ours, mu, adv, mask, TrustRegion.preset("m2po"))
    out.loss.sum().backward()
    assert torch.equal(out.keep, paper_keep)
    assert 0 < (~paper_keep & mask).sum() < mask.sum() / 2, "the case masks some tokens, not most"
    theirs = logp.clone().requires_grad_()
    torch.where(paper_keep, -(theirs.exp() / mu.exp()) * adv, 0.0).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)


@settings(max_examples=150, deadline=None)
@given(log_r=st.lists(st.floats(-2.0, 2.0), min_size=1, max_size=30), signs=st.lists(st.sampled_from([-1.0, 0.0, 1.0]),
       min_size=30, max_size=30), tau=st.one_of(st.just(0.0), st.floats(1e-9, 0.5)))
def test_m2po_bounds(log_r, signs, tau):
    """After the mask the trust-region tokens' M̂2 is ≤ τ_M2 (or none is left), the masked ones are the largest, as
    few as possible (putting back the smallest masked one breaks the bound), and no other token is masked."""
    n = len(log_r)
    mu = [[0.1] * n]
    pi = [[0.1 * math.exp(x) for x in log_r]]  # ≤ 0.74: log-probabilities
    adv = [signs[:n]]
    out, _ = run("m2po", mu, pi, adv, tau_m2=tau)
    keep = out.keep[0].tolist()
    lr = (torch.tensor(pi, dtype=torch.float64).log().float()
          - torch.tensor(mu, dtype=torch.float64).log().float()).double()[0].tolist()
    values = [x * x for x in lr]
    trust = [i for i in range(n) if (adv[0][i] > 0 and lr[i] > 0) or (adv[0][i] < 0 and lr[i] < 0)]
    assert all(keep[i] for i in range(n) if i not in trust)
    kept = [values[i] for i in trust if keep[i]]
    masked = [values[i] for i in trust if not keep[i]]
    if kept:
        assert sum(kept) / len(kept) <= tau + 1e-9
    if masked:
        assert min(masked) >= max(kept, default=-1.0) - 1e-12
        assert (sum(kept) + min(masked)) / (len(kept) + 1) > tau - 1e-9


# --------------------------------------------------------------------------------------------- all four


@pytest.mark.parametrize("kwargs, message", [
    ({"w_min": 0.0}, "w_min"), ({"w_min": 1.5}, "w_min"), ({"w_min": math.nan}, "NaN"),
    ({"delta_b": -0.1}, "delta_b"), ({"delta_b": math.inf}, "delta_b"),
    ({"tau_m2": -0.01}, "tau_m2"), ({"tau_m2": math.nan}, "NaN"),
])
def test_invalid_new_fields_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrustRegion(**kwargs)


def test_a_coupled_mask_needs_the_response_mask():
    logp = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="response mask"):
        trust_region_keep(TrustRegion.preset("m2po"), logp, logp, logp, torch.ones(1, 3))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_new_fields_change_nothing_where_they_are_not_read(preset):
    """w_min, δ_b and τ_M2 are read by CPPO and M2PO only (``fields_read``); elsewhere they leave the loss, its
    gradient and the mask exactly as they were."""
    from test_trust_region import random_batch as batch_of
    from test_trust_region import random_topk

    logp, mu, recomputed, adv, mask = batch_of(seed=9)
    base = TrustRegion.preset(preset)
    base = base.replace(k=3) if base.uses_topk else base  # random_topk's K
    topk = random_topk(logp, mu, seed=2, k=3) if base.uses_topk else None

    def loss_of(tr):
        lp = logp.clone().requires_grad_()
        out = policy_loss(lp, mu, adv, mask, tr, recomputed_logp=recomputed, topk=topk)
        out.loss.sum().backward()
        return out.loss.detach(), out.keep, lp.grad

    expected = loss_of(base)
    perturbation = {"w_min": 0.3, "delta_b": 0.5, "tau_m2": 0.001}
    for name in sorted(set(perturbation) - base.fields_read):
        got = loss_of(base.replace(**{name: perturbation[name]}))
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), f"{preset} reads {name} after all"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_no_nan_or_inf_at_extreme_probabilities(preset):
    """Two rows, one with A > 0 and one with A < 0, of every pair of extreme log-probabilities (the masks that read
    a whole row or the batch see them together); every preset of the registry."""
    tr = TrustRegion.preset(preset).replace(k=1)  # a two-token vocabulary: TopK(μ, 1) ∪ {a_t}
    near_one = math.log1p(-1e-7)
    values = torch.tensor([-60.0, -30.0, -1e-7, near_one, -1.0, 0.0])
    logp, mu = torch.meshgrid(values, values, indexing="ij")
    logp, mu = logp.reshape(2, -1).clone(), mu.reshape(2, -1)
    adv = torch.tensor([[1.0], [-1.0]])
    topk = None
    if tr.uses_topk:
        from dppo_oat.trust_region import TopK


        def other(x):
            return torch.log(-torch.expm1(x.clamp(max=-1e-7)))

        topk = TopK(ids=torch.tensor([0, 1]).expand(2, logp.shape[1], 2),
                    behavior_logp=torch.stack([mu, other(mu)], -1), logp=torch.stack([logp, other(logp)], -1),
                    valid=torch.ones(2, logp.shape[1], 2, dtype=torch.bool))
    logp.requires_grad_()
    out = policy_loss(logp, mu, adv, torch.ones_like(mu, dtype=torch.bool), tr, topk=topk,
                      recomputed_logp=mu if tr.needs_recompute else None)
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values()), out.metrics
