"""Band calibration (:mod:`dppo_oat.trust_region.band_search`): hand-computed bands, the mask it counts is
``policy_loss``'s, the achieved fraction sits at the step that crosses the target (hypothesis), and every refusal is
one line."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dppo_oat.trust_region import (
    BAND_RTOL,
    PRESETS,
    SOFT_BLOCK_LEVEL,
    CalibrationBatch,
    TopK,
    TrustRegion,
    band_choices,
    band_of,
    blocked_fraction,
    calibrate,
    policy_loss,
)
from dppo_oat.trust_region.band_search import blocked_tokens, prepare, scaled

TOPK_K = 3
CALIBRATED = [name for name in PRESETS if band_choices(TrustRegion.preset(name))]
"""The presets with a band to calibrate."""


def preset(name: str) -> TrustRegion:
    tr = TrustRegion.preset(name)
    return tr.replace(k=TOPK_K) if tr.uses_topk else tr


def batch_of(pi, mu, adv, mask=None, **extra) -> CalibrationBatch:
    """A batch from probabilities (``[B, T]`` lists) and per-row advantages."""
    logp = torch.tensor(pi, dtype=torch.float32).log()
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return CalibrationBatch(logp, torch.tensor(mu, dtype=torch.float32).log(),
                            torch.tensor(adv, dtype=torch.float32).reshape(len(pi), -1), mask, **extra)


def random_batch(seed: int, b: int = 6, t: int = 10, vocab: int = 6, spread: float = 0.6) -> CalibrationBatch:
    """μ, π_θ and π_θ' over a small vocabulary, the sampled tokens' log-probs and μ's top-K set, mixed-sign A (one
    row 0), padding inside rows."""
    gen = torch.Generator().manual_seed(seed)
    mu_all = torch.log_softmax(2 * torch.randn(b, t, vocab, generator=gen), -1)
    pi_all = torch.log_softmax(mu_all + spread * torch.randn(b, t, vocab, generator=gen), -1)
    recomputed_all = torch.log_softmax(mu_all + 0.3 * spread * torch.randn(b, t, vocab, generator=gen), -1)
    actions = torch.multinomial(mu_all.exp().reshape(-1, vocab), 1, generator=gen).reshape(b, t, 1)
    top = mu_all.topk(TOPK_K, dim=-1).indices
    extra = torch.where((top == actions).any(-1, keepdim=True), -1, actions)
    ids = torch.cat([top, extra], -1)
    safe = ids.clamp(min=0)
    topk = TopK(ids, mu_all.gather(-1, safe), pi_all.gather(-1, safe), ids != -1)
    adv = torch.randn(b, 1, generator=gen)
    adv[0] = 0.0
    mask = torch.rand(b, t, generator=gen) > 0.2
    mask[:, 0] = False
    picked = [x.gather(-1, actions).squeeze(-1) for x in (pi_all, mu_all, recomputed_all)]
    return CalibrationBatch(picked[0], picked[1], adv, mask, recomputed_logp=picked[2], topk=topk)


def loss_keep(tr: TrustRegion, batch: CalibrationBatch) -> torch.Tensor:
    return policy_loss(batch.logp, batch.behavior_logp, batch.advantages, batch.response, tr,
                       recomputed_logp=batch.recomputed_logp, topk=batch.topk).keep


def one_line(error) -> bool:
    return "\n" not in str(error.value) and str(error.value).strip() != ""


# --------------------------------------------------------------------------------------------- what is counted


@pytest.mark.parametrize("name", PRESETS)
def test_the_tokens_counted_as_blocked_are_those_policy_loss_blocks(name):
    """At every preset's own band, the blocked tokens are the A ≠ 0 response tokens whose ``keep`` is False in
    ``policy_loss`` (the rule's mask, the mismatch mask, non-finite tokens left out), top-K and π_θ' included."""
    tr = preset(name)
    for seed in range(3):
        batch = random_batch(seed)
        active = batch.response & (batch.advantages != 0).expand_as(batch.response)
        expected = active & ~loss_keep(tr, batch)
        assert torch.equal(blocked_tokens(tr, prepare(tr, batch)), expected), seed


def test_the_calibrated_band_blocks_what_the_run_logs_as_mask_fraction():
    """``mask/fraction`` of ``policy_loss`` under the calibrated band is the report's achieved fraction."""
    batch = random_batch(7, b=12, t=16)
    for name in ("dppo_binary_tv", "dppo_topk_kl", "cppo", "grpo_clip_higher", "trm_max", "vaco", "ipo", "m2po"):
        reachable = fraction_at(preset(name), batch, 0.5)  # what half the preset's band blocks
        tr, report = calibrate(preset(name), batch, reachable)
        metrics = policy_loss(batch.logp, batch.behavior_logp, batch.advantages, batch.response, tr,
                              recomputed_logp=batch.recomputed_logp, topk=batch.topk).metrics
        assert metrics["mask/fraction"] == pytest.approx(report.achieved, abs=1e-6), name


# --------------------------------------------------------------------------------------------- by hand

EIGHT_PI = [[0.9, 0.8, 0.7, 0.6, 0.45, 0.55, 0.3, 0.2]]
"""μ = 0.5 and A > 0 everywhere: DPPO-Binary-TV can block the five tokens whose π rose (|π − μ| 0.4, 0.3, 0.2, 0.1,
0.05), never the three whose π fell."""


def eight_tokens() -> CalibrationBatch:
    return batch_of(EIGHT_PI, [[0.5] * 8], [1.0])


def test_dppo_binary_tv_by_hand():
    """Blocked: D > δ. A target of 2 of 8 tokens puts δ at the third largest D (0.2, kept: the tightest δ that
    blocks 2), 4 of 8 at the fifth (0.05); 0.1 is nearer 1/8 than 0; 1/16 lies halfway and takes the side at or below
    it; 0 puts δ at the largest D; 5/8, the most any δ blocks, the loosest δ that blocks them all (just below the
    smallest, 0.05)."""
    tr = TrustRegion.preset("dppo_binary_tv")
    expected = {0.25: (0.2, 0.25), 0.5: (0.05, 0.5), 0.1: (0.4, 0.125), 0.0625: (0.4, 0.0), 0.0: (0.4, 0.0)}
    for target, (delta, achieved) in expected.items():
        calibrated, report = calibrate(tr, eight_tokens(), target)
        assert calibrated.delta == pytest.approx(delta, rel=1e-5) and report.achieved == achieved, target
        assert report.before == {"delta": 0.15} and report.after == {"delta": calibrated.delta}
        assert report.before_fraction == 3 / 8 and report.reachable == (0.0, 5 / 8) and report.counted == 8
    calibrated, report = calibrate(tr, eight_tokens(), 5 / 8)
    assert 0.05 * (1 - 1e-5) < calibrated.delta < 0.05 and report.achieved == 5 / 8


def test_a_band_that_already_blocks_the_target_stays():
    tr = TrustRegion.preset("dppo_binary_tv")
    calibrated, report = calibrate(tr, eight_tokens(), 3 / 8)
    assert calibrated == tr and report.achieved == report.before_fraction == 3 / 8


def test_the_clip_range_is_scaled_as_one_and_sequences_are_counted_whole():
    """GSPO's clip on s = exp(mean_t log r): four responses of 1, 2, 3 and 4 tokens with s = 1.01, 1.02, 1.05, 1.1
    (A > 0). Blocking the last (1 of 4 responses, 4 of 10 tokens) puts ε_high at 0.05 and ε_low at 0.75 of it (the
    preset's 3e-4 : 4e-4)."""
    ratios, lengths = (1.01, 1.02, 1.05, 1.1), (1, 2, 3, 4)
    pi = [[0.5 * r if j < n else 0.5 for j in range(4)] for r, n in zip(ratios, lengths, strict=True)]
    mask = [[j < n for j in range(4)] for n in lengths]
    batch = batch_of(pi, [[0.5] * 4] * 4, [1.0] * 4, mask)
    for unit, target in (("sequence", 0.25), ("token", 0.4)):
        calibrated, report = calibrate(TrustRegion.preset("gspo"), batch, target, unit=unit)
        assert calibrated.eps_high == pytest.approx(0.05, rel=1e-4) and report.achieved == pytest.approx(target)
        assert calibrated.eps_low / calibrated.eps_high == pytest.approx(0.75) and report.band == "clip_range"


def test_a_sequence_mask_moves_its_bound_and_keeps_its_clip():
    """TRM-Max, DeepSeek-V3.2's mask and VACO bound their sequences by δ: δ moves by default, the PPO clip only when
    asked (band ``clip_range``)."""
    batch = random_batch(3, b=12, t=16, spread=0.2)
    for name in ("trm_max", "trm_avg", "opsm", "vaco"):
        tr = preset(name)
        assert band_choices(tr) == ("delta", "clip_range", "both")
        for band, kept in (("delta", ("eps_low", "eps_high")), ("clip_range", ("delta",))):
            calls, base = [prepare(tr, batch)], blocked_fraction(tr, [prepare(tr, batch)])
            moved = [blocked_fraction(scaled(tr, band_of(tr, band), scale), calls) for scale in (0.1, 0.01, 3.0)]
            target = next(f for f in moved if f not in (base, 1.0))  # a target the band must move to
            calibrated, report = calibrate(tr, batch, target, band=None if band == "delta" else band)
            assert report.band == band and report.achieved == target and calibrated != tr
            assert all(getattr(calibrated, f) == getattr(tr, f) for f in kept), (name, band)


def test_both_bands_move_together_below_what_the_clip_alone_blocks():
    """TRM-Max's clip alone blocks more of this batch than the target, so no δ reaches it (refused, naming the
    fractions δ can give); band ``both`` scales δ, ε_low and ε_high by one factor, keeping their proportion, and
    reaches it. A rule with one band has no ``both``."""
    batch = random_batch(5, b=12, t=16, spread=0.6)
    tr = preset("trm_max")
    clip_alone = blocked_fraction(tr.replace(delta=1e9), [prepare(tr, batch)])
    assert clip_alone > 0.05
    target = clip_alone / 2
    with pytest.raises(ValueError, match="give a target in that range") as error:
        calibrate(tr, batch, target)
    assert one_line(error)
    calibrated, report = calibrate(tr, batch, target, band="both")
    assert report.band == "both" and set(report.after) == {"delta", "eps_low", "eps_high"}
    assert abs(report.achieved - target) < clip_alone / 2
    assert report.achieved == fraction_at(calibrated, batch, band="both")
    scale = calibrated.eps_high / tr.eps_high
    assert scale > 1 and calibrated.delta / tr.delta == pytest.approx(scale) \
        and calibrated.eps_low / tr.eps_low == pytest.approx(scale)
    with pytest.raises(ValueError, match="no band 'both'"):
        calibrate(preset("dppo_binary_tv"), batch, 0.1, band="both")


def test_sapo_counts_a_token_blocked_where_its_gate_halves_the_gradient():
    """f'(r) < 1/2 where τ|r − 1| > 2·ln(1 + √2) = e: with r = 1.5, 2 and 3 (A > 0), τ_pos = 1 blocks r = 3 alone;
    blocking 2 of 3 holds for τ_pos in (e, 2e], calibrated to its sharpest end 2e; τ_neg keeps its ratio."""
    edge = 2 * math.log1p(math.sqrt(2))
    calibrated, report = calibrate(TrustRegion.preset("sapo"), batch_of([[0.3, 0.4, 0.6]], [[0.2] * 3], [1.0]), 2 / 3)
    assert calibrated.tau_pos == pytest.approx(2 * edge, rel=1e-5) and calibrated.tau_pos <= 2 * edge
    assert calibrated.tau_neg / calibrated.tau_pos == pytest.approx(1.05) and report.soft
    assert report.achieved == pytest.approx(2 / 3) and report.before_fraction == pytest.approx(1 / 3)
    assert SOFT_BLOCK_LEVEL == 0.5 and "SAPO's gate is < 0.5" in report.line()


def test_m2po_calibrates_tau_m2_one_loss_call_at_a_time():
    """M2PO keeps the longest ascending prefix of (log r)² = 0.01, 0.04, 0.09, 0.16 whose mean is ≤ τ_M2: blocking 1
    of 4 puts τ_M2 at mean(0.01, 0.04, 0.09). A second loss call is masked on its own, as the update masks each."""
    logs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    first = CalibrationBatch(logs - 1.0, torch.full((1, 4), -1.0), torch.ones(1, 1),
                             torch.ones(1, 4, dtype=torch.bool))
    calibrated, report = calibrate(TrustRegion.preset("m2po"), first, 0.25)
    assert calibrated.tau_m2 == pytest.approx((0.01 + 0.04 + 0.09) / 3, rel=1e-4) and report.achieved == 0.25
    second = CalibrationBatch(torch.tensor([[-0.5, -1.0]]), torch.full((1, 2), -1.0), torch.ones(1, 1),
                              torch.ones(1, 2, dtype=torch.bool))
    calibrated, report = calibrate(TrustRegion.preset("m2po"), [first, second], 0.5)
    blocked = sum(int((~loss_keep(calibrated, b)).sum()) for b in (first, second))
    assert report.achieved == blocked / 6 and report.counted == 6


def test_match_a_reference_on_the_same_batch():
    """``like=``: the target is the fraction the reference blocks (its ``mask/fraction``), and the calibrated band
    blocks within one token of it."""
    batch = random_batch(11, b=16, t=20)
    reference = TrustRegion.preset("dppo_binary_kl")
    kl_fraction = policy_loss(batch.logp, batch.behavior_logp, batch.advantages, batch.response,
                              reference).metrics["mask/fraction"]
    calibrated, report = TrustRegion.preset("dppo_binary_tv").calibrate(batch, like=reference)
    assert report.like == "dppo_binary_kl" and report.target == pytest.approx(kl_fraction, abs=1e-6)
    assert abs(report.achieved - report.target) <= 1 / report.counted
    assert "dppo_binary_kl blocks" in report.line() and report.flags() == f"--tr-delta {calibrated.delta:.6g}"


# --------------------------------------------------------------------------------------------- properties


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(st.integers(1, 120), min_size=2, max_size=40, unique=True), target=st.floats(0, 0.999))
def test_the_achieved_fraction_is_within_half_a_token_of_any_reachable_target(steps, target):
    """Distinct divergences: every k/N is reachable, so the achieved fraction is within 1/(2N) of the target."""
    pi = [[0.5 + 0.004 * k for k in steps]]
    _, report = calibrate(TrustRegion.preset("dppo_binary_tv"), batch_of(pi, [[0.5] * len(steps)], [1.0]), target)
    assert abs(report.achieved - target) <= 1 / (2 * len(steps)) + 1e-12


def fraction_at(tr: TrustRegion, batch: CalibrationBatch, scale: float = 1.0, band: str | None = None) -> float:
    """What ``tr`` with its band (``band``: None, its default) scaled by ``scale`` blocks on ``batch``."""
    band = band_of(tr, band)
    return blocked_fraction(scaled(tr, band, scale), [prepare(tr, batch)], soft=band.soft)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(CALIBRATED), seed=st.integers(0, 50), low=st.floats(-6, 6), width=st.floats(0, 6),
       which=st.integers(0, 2))
def test_the_blocked_fraction_is_monotone_in_the_band(name, seed, low, width, which):
    """A wider hard band blocks no more (each band a rule has, and both together); a larger SAPO τ blocks no
    less."""
    tr, batch = preset(name), random_batch(seed, spread=1.0)
    choices = band_choices(tr)
    band = choices[which % len(choices)]
    narrow, wide = fraction_at(tr, batch, 10 ** low, band), fraction_at(tr, batch, 10 ** (low + width), band)
    assert (wide >= narrow) if tr.rule == "sapo" else (wide <= narrow)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(CALIBRATED), seed=st.integers(0, 50), target=st.floats(0, 0.6))
def test_the_calibrated_band_sits_at_the_step_that_crosses_the_target(name, seed, target):
    """Where the target is reachable, it lies between the fractions just inside and just outside the calibrated band
    (at most :data:`BAND_RTOL` away), and the achieved fraction is one of them."""
    tr, batch = preset(name), random_batch(seed, b=8, t=12, spread=1.0)
    try:
        calibrated, report = calibrate(tr, batch, target)
    except ValueError as error:
        assert "give a target in that range" in str(error) or "π_θ equals μ" in str(error)
        return
    assert report.achieved == fraction_at(calibrated, batch)
    if calibrated != tr:  # else the preset's band already blocked the target
        around = [fraction_at(calibrated, batch, 1 + sign * 3 * BAND_RTOL) for sign in (-1, 1)]
        assert min(around) <= target <= max(around) and report.achieved in around


# --------------------------------------------------------------------------------------------- refusals


@pytest.mark.fault("`TrustRegion.calibrate` on a rule that blocks no token (`pg_is`, `cispo`, `minpro`, `drpo`)",
                   "refused in one line: it has no band to calibrate; choose a preset whose mask has one")
@pytest.mark.parametrize("name", ["pg_is", "cispo", "minpro", "drpo"])
def test_a_rule_without_a_band_is_refused(name):
    with pytest.raises(ValueError, match="has no band to calibrate") as error:
        TrustRegion.preset(name).calibrate(eight_tokens(), 0.1)
    assert one_line(error)


@pytest.fixture
def declared_rules():
    """Two rules registered for one test: one that reads δ for its loss term alone (no threshold), one with a soft
    gate on a field it reads (``soft_gate``); and a preset of each. Removed after it."""
    from dppo_oat.trust_region import PRESETS, RULE_TABLE, Preset, Rule, register_rule

    def keep_all(x, tr):
        return torch.ones_like(x.response)

    def half_gate(x, tr):
        return torch.exp(-tr.tau_pos * (x.logp - x.anchor_logp).abs())

    def delta_term(logp, x, tr):
        return tr.delta * logp

    register_rule("weighted_only", Rule("binary_tv", keep_all, reads=("delta",), loss_term=delta_term))
    register_rule("gated_only", Rule("ratio", keep_all, reads=("tau_pos",), soft_gate=half_gate))
    PRESETS["weighted_only"] = Preset({"rule": "weighted_only", "delta": 0.2}, "a test's rule")
    PRESETS["gated_only"] = Preset({"rule": "gated_only", "tau_pos": 1.0}, "a test's rule")
    try:
        yield
    finally:
        for name in ("weighted_only", "gated_only"):
            del RULE_TABLE[name], PRESETS[name]


def test_what_a_rule_declares_decides_its_band(declared_rules):
    """No list names a rule: one without a threshold (whose δ weighs a loss term) has no band; a soft gate's band is
    the fields the rule reads, a token blocked where its gate is below one half."""
    from dppo_oat.trust_region.band_search import GATE_BAND, band_choices

    with pytest.raises(ValueError, match="weighted_only has no band to calibrate.*its delta weighs its loss term"):
        TrustRegion.preset("weighted_only").calibrate(eight_tokens(), 0.1)
    gated = TrustRegion.preset("gated_only")
    assert band_choices(gated) == (GATE_BAND,)
    batch = batch_of([[0.5, 0.2, 0.9]], [[0.25, 0.2, 0.3]], [1.0])  # |log r|: ln 2, 0, ln 3
    calibrated, report = gated.calibrate(batch, 1 / 3)
    assert report.band == GATE_BAND and report.achieved == pytest.approx(1 / 3)
    # exp(−τ·ln 3) < ½ ≤ exp(−τ·ln 2): τ in (ln 2 / ln 3, 1]
    assert math.log(2) / math.log(3) < calibrated.tau_pos <= 1.0 + 1e-4


def test_a_soft_gate_on_a_rule_with_a_threshold_is_refused():
    from dppo_oat.trust_region import Rule, register_rule

    with pytest.raises(ValueError, match="soft gate: its band is the fields it reads"):
        register_rule("never_registered", Rule("ratio", lambda x, tr: x.response, threshold="clip_range",
                                               soft_gate=lambda x, tr: x.response.float()))


@pytest.mark.fault("`TrustRegion.calibrate` with a target outside [0, 1)",
                   "refused in one line: a target is the fraction of tokens to block, in [0, 1)")
@pytest.mark.parametrize("target", [-0.1, 1.0, 1.5, math.nan])
def test_a_target_outside_zero_one_is_refused(target):
    with pytest.raises(ValueError, match=r"in \[0, 1\)") as error:
        TrustRegion.preset("dppo_binary_tv").calibrate(eight_tokens(), target)
    assert one_line(error)


@pytest.mark.fault("`TrustRegion.calibrate` on a batch whose π_θ equals μ (the first minibatch of an on-policy "
                   "batch)",
                   "refused in one line: no band blocks anything; calibrate on a batch after an optimizer step, or "
                   "with a stale or mismatched μ")
def test_a_batch_whose_pi_is_mu_is_refused():
    same = batch_of([[0.3, 0.6, 0.9]], [[0.3, 0.6, 0.9]], [1.0])
    rounding = batch_of([[0.3, 0.6, 0.9 * (1 + 1e-6)]], [[0.3, 0.6, 0.9]], [1.0])  # |log r| of 1e-6 is rounding
    for batch in (same, rounding):
        for name in ("dppo_binary_tv", "ppo", "gspo", "sapo"):
            with pytest.raises(ValueError, match="π_θ equals μ on this batch") as error:
                TrustRegion.preset(name).calibrate(batch, 0.1)
            assert one_line(error)


@pytest.mark.fault("`TrustRegion.calibrate` with a target no band reaches on the batch",
                   "refused in one line naming the fractions any band blocks there")
def test_a_target_no_band_reaches_is_refused_with_the_reachable_range():
    with pytest.raises(ValueError, match="blocks between 0 and 0.625 of them; give a target in that range") as error:
        TrustRegion.preset("dppo_binary_tv").calibrate(eight_tokens(), 0.7)
    assert one_line(error)
    no_advantage = batch_of(EIGHT_PI, [[0.5] * 8], [0.0])
    with pytest.raises(ValueError, match="no response token with A ≠ 0"):
        TrustRegion.preset("dppo_binary_tv").calibrate(no_advantage, 0.1)


@pytest.mark.fault("`TrustRegion.calibrate` of a top-K rule, or a mask on π_θ', on a batch without μ's top-K set "
                   "or π_θ'",
                   "refused in one line naming what the batch lacks")
def test_a_batch_without_what_the_mask_reads_is_refused():
    for name, lacks in (("dppo_topk_tv", "μ's top-K set"), ("vaco", "recomputed π_θ'"), ("icepop", "recomputed π_θ'")):
        with pytest.raises(ValueError, match=lacks) as error:
            preset(name).calibrate(eight_tokens(), 0.1)
        assert one_line(error)


@pytest.mark.fault("`TrustRegion.calibrate` with both a target and a reference to match, neither, or a band the "
                   "rule lacks",
                   "refused in one line saying what to give")
def test_conflicting_calibration_requests_are_refused():
    tr = TrustRegion.preset("dppo_binary_tv")
    for kwargs, message in (({"target": 0.1, "like": TrustRegion.preset("ppo")}, "give one of them"),
                            ({}, "give one of them"), ({"target": 0.1, "band": "tau_m2"}, "no band 'tau_m2'"),
                            ({"target": 0.1, "unit": "row"}, "unknown calibration unit")):
        with pytest.raises(ValueError, match=message) as error:
            calibrate(tr, eight_tokens(), **kwargs)
        assert one_line(error)
    with pytest.raises(ValueError, match="finite value > 0"):
        TrustRegion.preset("m2po", tau_m2=math.inf).calibrate(eight_tokens(), 0.1)


@pytest.mark.fault("`TrustRegion.calibrate` / `calibrate` on log-probs above 0, on a batch built from lists, with "
                   "`like=` a preset's name, or on a batch whose every log-prob is NaN",
                   "log-probs above 0 and inputs that are no numbers are one `ValueError` (as `policy_loss`'s); "
                   "lists become tensors and a preset's name is taken, as `policy_loss` takes it; an all-NaN batch is "
                   "named as such")
def test_the_calibration_api_takes_what_policy_loss_takes_and_refuses_what_it_refuses():
    from dppo_oat.trust_region import calibrate

    with pytest.raises(ValueError, match=r"^behavior_logp holds values > 0 \(up to 0.2\)") as error:
        CalibrationBatch([[-0.5, -1.0]], [[0.2, -1.0]], [[1.0]], [[True, True]])
    assert one_line(error)
    with pytest.raises(ValueError, match="logp must be a tensor .*got str"):
        CalibrationBatch("nope", [[-0.5]], [[1.0]], [[True]])
    listed = CalibrationBatch([[-0.5, -1.0, -2.0]], [[-0.9, -1.0, -1.0]], [[-1.0]], [[True, True, True]])
    assert listed.logp.dtype == torch.float32 and listed.response.dtype == torch.bool
    by_name = calibrate("dppo_binary_tv", listed, like="dppo_binary_kl")
    by_object = calibrate(TrustRegion.preset("dppo_binary_tv"), listed, like=TrustRegion.preset("dppo_binary_kl"))
    assert by_name[0] == by_object[0] and by_name[1].like == "dppo_binary_kl"
    nan = torch.full((1, 3), math.nan)
    with pytest.raises(ValueError, match="every response token of the batch has a non-finite input") as error:
        TrustRegion.preset("dppo_binary_tv").calibrate(CalibrationBatch(nan, nan, torch.ones(1, 1),
                                                                        torch.ones(1, 3, dtype=torch.bool)), 0.1)
    assert one_line(error)
