"""Faults at the Python API's boundary: ``TrustRegion`` and ``policy_loss`` refuse what they cannot use in one
``ValueError`` naming the field or input (as the command line does), and a non-finite input token never passes
silently into the loss."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dppo_oat import TopK, TrustRegion, policy_loss


@pytest.mark.fault("`TrustRegion.preset(\"tis\", name=123)`, `preset(\"drpo\", delta=\"0.1\")`, `delta=None`, "
                   "`preset(\"cppo\", k=True)`, or `TrustRegion(...)` with such a value",
                   "`ValueError` naming the field and the type it takes (never a `TypeError` from deep inside)")
@pytest.mark.parametrize("build, field", [
    (lambda: TrustRegion.preset("tis", name=123), "name"),
    (lambda: TrustRegion.preset("drpo", delta="0.1"), "delta"),
    (lambda: TrustRegion.preset("drpo", delta=None), "delta"),
    (lambda: TrustRegion.preset("cppo", k=True), "k"),
    (lambda: TrustRegion.preset("cppo", k=2.5), "k"),
    (lambda: TrustRegion(eps_low=False), "eps_low"),
    (lambda: TrustRegion(rule=["ratio"]), "rule"),
])
def test_a_trust_region_of_a_wrong_type_is_a_value_error_naming_the_field(build, field):
    with pytest.raises(ValueError, match=f"^{field} "):
        build()


@pytest.mark.fault("`TrustRegion.preset(\"sapo\", tau_pos=1e300)` (or `TrustRegion(...)` with a number float32 cannot "
                   "hold)", "`ValueError` naming the field: the loss computes in float32 (never an overflow after a "
                   "model loaded)")
@pytest.mark.parametrize("build, message", [
    (lambda: TrustRegion.preset("sapo", tau_pos=1e300), "tau_pos 1e+300 overflows float32"),
    (lambda: TrustRegion.preset("drpo", delta=1e-300), "delta 1e-300 underflows float32"),
    (lambda: TrustRegion(eps_high=-1e39), "eps_high -1e+39 overflows float32"),
])
def test_a_number_float32_cannot_hold_is_refused_by_the_trust_region_itself(build, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        build()
    assert TrustRegion.preset("pg_is").is_cap == math.inf  # ∞ keeps its meaning (no truncation)


@pytest.mark.fault("`TrustRegion.preset(\"sapo\", name=\"gspo\")`, `preset(\"ipo\", rule=\"ratio\")`: a preset whose "
                   "name or defining choice is changed", "another preset's name is refused in one `ValueError`; a "
                   "changed choice names the variant (`ipo+rule=ratio`), so the analysis labels it apart")
def test_a_preset_with_another_rule_says_so_in_its_name():
    with pytest.raises(ValueError, match="name='gspo' is another preset's"):
        TrustRegion.preset("sapo", name="gspo")
    assert TrustRegion.preset("ipo", rule="ratio").name == "ipo+rule=ratio"
    assert TrustRegion.preset("dppo_binary_kl_neg", mask_side="both").name == "dppo_binary_kl_neg+mask_side=both"
    assert TrustRegion.preset("dppo_binary_tv", mismatch_mask="token").name == "dppo_binary_tv+mismatch_mask=token"
    assert TrustRegion.preset("dppo_binary_tv", delta=0.2).name == "dppo_binary_tv"  # a number is a setting
    assert TrustRegion.preset("dppo_binary_tv", anchor="behavior").name == "dppo_binary_tv"  # unchanged choice
    assert TrustRegion.preset("sapo", name="my_sapo").name == "my_sapo"


@pytest.mark.fault("`TrustRegion.preset(\"ppo\", delta=0.2)`: a field the preset's rule never reads",
                   "`ValueError` naming the field and what the rule reads, as the command line refuses "
                   "`--tr-delta` there")
def test_a_preset_refuses_a_field_its_rule_never_reads():
    with pytest.raises(ValueError, match=r"delta: not read by the trust region ppo \(it reads .*eps_low"):
        TrustRegion.preset("ppo", delta=0.2)
    assert TrustRegion.preset("ppo").replace(delta=0.2).delta == 0.2  # replace() stays a plain copy


def batch(b=2, t=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen) - 0.1
    mu = logp + 0.05 * torch.randn(b, t, generator=gen)
    return logp.clamp(max=0), mu.clamp(max=0), torch.tensor([[1.0], [-1.0]])[:b], torch.ones(b, t, dtype=torch.bool)


@pytest.mark.fault("`policy_loss` on an empty batch (B = 0 or T = 0), with log-probs > 0, or with a top-K set whose "
                   "width is not K + 1",
                   "`ValueError` naming the input and what it must be (never a `RuntimeError` from `max()`)")
@pytest.mark.parametrize("case", ["empty rows", "empty tokens", "logp > 0", "mu > 0", "top-K width"])
def test_policy_loss_refuses_inputs_it_cannot_use(case):
    logp, mu, adv, mask = batch()
    tr, topk = TrustRegion.preset("dppo_binary_tv"), None
    if case == "empty rows":
        logp, mu, adv, mask = logp[:0], mu[:0], adv[:0], mask[:0]
    elif case == "empty tokens":
        logp, mu, mask = logp[:, :0], mu[:, :0], mask[:, :0]
    elif case == "logp > 0":
        logp = logp.clone()
        logp[0, 1] = 0.5
    elif case == "mu > 0":
        mu = mu.clone()
        mu[1, 2] = 2.0
    else:
        tr = TrustRegion.preset("dppo_topk_tv", k=3)
        shape = (*logp.shape, 3)  # K = 3 needs K + 1 = 4 slots
        topk = TopK(torch.zeros(shape, dtype=torch.long), torch.full(shape, -1.0), torch.full(shape, -1.0),
                    torch.ones(shape, dtype=torch.bool))
    fragment = {"empty rows": "no token", "empty tokens": "no token", "logp > 0": "logp", "mu > 0": "behavior_logp",
                "top-K width": "K + 1 = 4"}[case]
    with pytest.raises(ValueError, match=re.escape(fragment)):
        policy_loss(logp, mu, adv, mask, tr, topk=topk)


@pytest.mark.fault("`policy_loss` with a NaN or infinite log-prob (π_θ's or μ's) or advantage on a response token",
                   "that token is masked (`keep` False, loss and gradient 0) and counted in the `nonfinite` metric; "
                   "the other tokens' loss is as without it")
@pytest.mark.parametrize("where", ["logp", "behavior_logp", "advantages"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_input_token_is_masked_and_counted(where, value):
    logp, mu, adv, mask = batch()
    adv = adv.expand(-1, logp.shape[1]).clone()
    inputs = {"logp": logp.clone(), "behavior_logp": mu.clone(), "advantages": adv}
    inputs[where][0, 1] = value
    leaf = inputs["logp"].clone().requires_grad_()
    out = policy_loss(leaf, inputs["behavior_logp"], inputs["advantages"], mask, TrustRegion.preset("dppo_binary_tv"))
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(leaf.grad).all()
    assert not out.keep[0, 1] and out.loss[0, 1] == 0 and leaf.grad[0, 1] == 0
    assert out.metrics["nonfinite"] == 1 and all(math.isfinite(v) for v in out.metrics.values())
    others = mask.clone()
    others[0, 1] = False
    clean = policy_loss(logp, mu, adv, others, TrustRegion.preset("dppo_binary_tv"))
    assert torch.equal(out.loss[others], clean.loss[others])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([0.0, math.nan, math.inf, -math.inf, -0.5]), min_size=6, max_size=6),
       st.sampled_from(["dppo_binary_tv", "ppo", "cispo", "drpo", "m2po", "dppo_binary_tv_kl", "cppo_binary_tv"]))
def test_any_non_finite_input_gives_a_finite_loss_and_is_counted(noise, preset):
    logp, mu, adv, mask = batch()
    damage = torch.tensor(noise).reshape(2, 3)
    out = policy_loss(logp + damage, mu, adv, mask, TrustRegion.preset(preset))
    assert torch.isfinite(out.loss).all()
    assert out.metrics["nonfinite"] == int((~torch.isfinite(damage)).sum())


@pytest.mark.fault("`aggregate_loss` with a mask of 2s (or any value but 0 and 1), or a mask of another shape than "
                   "the loss",
                   "one `ValueError` naming the value or both shapes; never a loss whose tokens weigh twice, nor a "
                   "raw torch broadcasting error")
@pytest.mark.parametrize("mask, fragment", [
    (torch.full((2, 3), 2.0), "the mask holds 2.0"),
    (torch.tensor([[1, 0, -1], [1, 1, 1]]), "the mask holds -1"),
    (torch.ones(2, 4, dtype=torch.bool), "the loss [2, 3] and the mask [2, 4]"),
    (torch.ones(3, dtype=torch.bool), "the mask [3]"),
])
def test_aggregate_loss_refuses_a_mask_it_cannot_use(mask, fragment):
    from dppo_oat.aggregation import AGGREGATIONS, aggregate_loss

    for mode in AGGREGATIONS:
        with pytest.raises(ValueError) as excinfo:
            aggregate_loss(torch.ones(2, 3), mask, mode, norm_constant=4.0)
        assert fragment in str(excinfo.value) and "\n" not in str(excinfo.value)
    assert aggregate_loss(torch.ones(2, 3), torch.tensor([[1.0, 0.0, 1.0]] * 2), "token-mean").item() == 1.0


@pytest.mark.fault("`policy_loss(..., tr=\"sapo\")` (a preset's name) or `tr=None`",
                   "a name is its preset with its defaults; anything else is one `ValueError` naming `tr`")
def test_policy_loss_takes_a_presets_name_and_refuses_anything_else():
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.3]], requires_grad=True))
    mu, adv = torch.log(torch.tensor([[0.6, 0.4, 0.2]])), torch.tensor([[1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    by_name = policy_loss(logp, mu, adv, mask, "sapo")
    by_value = policy_loss(logp, mu, adv, mask, TrustRegion.preset("sapo"))
    assert torch.equal(by_name.loss, by_value.loss)
    with pytest.raises(ValueError, match="^tr must be a TrustRegion or a preset's name, got NoneType"):
        policy_loss(logp, mu, adv, mask, None)
    with pytest.raises(ValueError, match="unknown trust-region preset 'sapoo'"):
        policy_loss(logp, mu, adv, mask, "sapoo")


@pytest.mark.fault("`policy_loss(..., mask=response_mask, ...)` (the response tokens under the keyword M_t's name "
                   "would take)", "`TypeError` of one line naming `response_mask=` (the rule's mask M_t is "
                   "`PolicyLossOutput.keep`)")
def test_the_response_mask_keyword_is_response_mask():
    logp = torch.tensor([[0.5, 0.2]]).log()
    response = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"^policy_loss\(mask=\) is response_mask=") as error:
        policy_loss(logp, logp, torch.ones(1, 1), mask=response, tr="dppo_binary_tv")
    assert "\n" not in str(error.value)
    out = policy_loss(logp, logp, torch.ones(1, 1), response_mask=response, tr="dppo_binary_tv")
    assert out.keep.tolist() == [[True, True]]
