"""DPPO's update rebuilt from the paper's formulas, outside ``dppo_oat/trust_region/``, on one saved int4 batch.

``tests/data/int4_batch.pt`` (``scripts/faithfulness_batch.py``) is a real rollout batch of the shipped Sudoku
policy's int4 rollout copy: the learner's inputs, the copy's log μ and Dr.GRPO advantages, with 16 probe tokens
whose log μ puts their binary KL at δ(1 ± 1%) in both halves the mask blocks (and just over δ in the two cells it
never blocks), so that a threshold a few percent off blocks other tokens. This test recomputes,
from eq:binary_kl and eq:dppo_obj alone (a plain forward of the learner, float64 arithmetic, nothing of
``dppo_oat.trust_region`` or ``dppo_oat.divergence``), every token's binary KL D, its ratio r = π_θ/μ, DPPO's mask
M and the per-token objective M·r·Â, and the gradient of the Dr.GRPO-aggregated objective; the engine's own update
path (the fused head, micro-batches, :func:`~dppo_oat.learner.update.update_policy`) must give the same mask, weights
and gradient. Planted defects make the comparison fail: the binary KL taken the other way round (KL(π‖μ)), and the
mask's threshold 2% (or 10%) off δ either way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import SHIPPED_POLICIES, policy_cache_key
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.update import update_policy
from dppo_oat.models.tiny import load_policy
from dppo_oat.rollout.rollout_copy import rollout_copy
from dppo_oat.trust_region import policy_loss, rules
from dppo_oat.update_batch import UpdateBatch

BATCH = Path(__file__).resolve().parent / "data" / "int4_batch.pt"
DELTA = 0.05
"""DPPO-Binary-KL's δ (the paper's, for every experiment)."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The learner (the shipped policy), the saved batch and the engine's update settings for it."""
    data = torch.load(BATCH)
    config = TrainConfig(trust_region="dppo_binary_kl", rollout_dtype="int4",
                         runs_dir=str(tmp_path_factory.mktemp("runs")))
    spec, _ = validate_config(config)
    learner, _ = load_policy(SHIPPED_POLICIES / policy_cache_key(
        config.env_ids[0], config.template, config.warm_start, config.warm_start_seed))
    batch = UpdateBatch(data["input_ids"], data["attention_mask"], data["response_mask"], data["behavior_logp"],
                        data["advantages"])
    settings = replace(spec.update, minibatch_size=len(batch))
    assert (settings.temperature, settings.aggregation, settings.norm_constant) == (
        data["temperature"], data["aggregation"], data["norm_constant"])
    return learner, batch, settings, spec.trust_region


@pytest.fixture(scope="module")
def probes():
    """The saved batch's probe tokens: ``[n, 2]`` (row, position), their D/δ as placed, and whether DPPO's mask
    blocks each."""
    data = torch.load(BATCH)
    return data["probe_index"], data["probe_factor"], data["probe_blocks"]


def at(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``tensor [N, T]`` at the ``[n, 2]`` (row, position) pairs of ``index``."""
    return tensor[index[:, 0], index[:, 1]]


def plain_logprobs(model, batch: UpdateBatch, temperature: float) -> torch.Tensor:
    """``[N, L−1]`` log π(a_t) from one plain forward: softmax(logits / T) at every predicted token."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].double()
    return torch.log_softmax(logits / temperature, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]


def paper_binary_kl(mu: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """eq:binary_kl: μ log(μ/π) + (1 − μ) log((1 − μ)/(1 − π)), in float64."""
    return mu * torch.log(mu / pi) + (1 - mu) * torch.log((1 - mu) / (1 - pi))


def paper_mask(mu, pi, advantages, divergence, delta: float) -> torch.Tensor:
    """eq:dppo_obj's M_t: 0 where (Â > 0, r > 1, D > δ) or (Â < 0, r < 1, D > δ), else 1."""
    ratio = pi / mu
    blocked = ((advantages > 0) & (ratio > 1) & (divergence > delta)) | \
        ((advantages < 0) & (ratio < 1) & (divergence > delta))
    return ~blocked


def paper_terms(model, batch: UpdateBatch, temperature: float) -> dict[str, torch.Tensor]:
    """Per token (float64): log π, D, M, r = π/μ (DPPO's IS weight, untruncated) and the objective M·r·Â."""
    logp = plain_logprobs(model, batch, temperature)
    mu_logp = batch.behavior_logp.double()
    mu, pi = mu_logp.exp(), logp.detach().exp()
    advantages = batch.advantages.double().expand_as(logp)
    divergence = paper_binary_kl(mu, pi)
    mask = paper_mask(mu, pi, advantages, divergence, DELTA) & batch.response_mask.bool()
    ratio = torch.exp(logp - mu_logp)
    return {"logp": logp, "divergence": divergence, "mask": mask, "ratio": ratio.detach(),
            "objective": torch.where(mask, ratio * advantages, 0.0)}


def paper_gradient(model, batch: UpdateBatch, temperature: float, norm_constant: float) -> dict[str, torch.Tensor]:
    """∇ of −(1/#responses) Σ_responses Σ_t M_t r_t Â_t / norm_constant (Dr.GRPO's aggregation), by autograd."""
    model.zero_grad(set_to_none=True)
    objective = paper_terms(model, batch, temperature)["objective"]
    present = batch.response_mask.bool().any(-1)
    loss = -(objective.sum(-1)[present] / norm_constant).mean()
    loss.backward()
    return {name: parameter.grad.detach().double().clone() for name, parameter in model.named_parameters()
            if parameter.grad is not None}


def engine_terms(model, batch: UpdateBatch, settings, tr) -> dict[str, torch.Tensor]:
    """What the engine decides on the batch: its mask, divergence and per-token M·w·Â (the loss's value, negated),
    from the fused-head forward and :func:`policy_loss`."""
    with torch.no_grad():
        out = causal_lm_forward(model, settings=settings)(batch, False)
        result = policy_loss(out.logp, batch.behavior_logp, batch.advantages, batch.response_mask, tr)
    return {"mask": result.keep & batch.response_mask.bool(), "divergence": result.divergence.double(),
            "objective": -result.loss.double()}


def engine_gradient(model, batch: UpdateBatch, settings, tr) -> dict[str, torch.Tensor]:
    """The gradient the engine's update applies: :func:`update_policy` over one minibatch, caught at its step."""
    model.zero_grad(set_to_none=True)
    caught = {}

    def catch() -> dict:
        caught.update({name: p.grad.detach().double().clone() for name, p in model.named_parameters()
                       if p.grad is not None})
        return {}

    forward = causal_lm_forward(model, settings=settings)
    update_policy(batch, tr, forward, lambda loss: loss.backward(), catch, settings)
    return caught


def mismatches(model, batch: UpdateBatch, settings, tr) -> list[str]:
    """Every way the engine's mask, divergence, weights or gradient differ from the paper's rebuild."""
    paper, engine = paper_terms(model, batch, settings.temperature), engine_terms(model, batch, settings, tr)
    response = batch.response_mask.bool()
    problems = []
    if not torch.equal(paper["mask"], engine["mask"]):
        problems.append(f"masks differ on {int((paper['mask'] ^ engine['mask']).sum())} tokens")
    divergence_gap = (paper["divergence"] - engine["divergence"])[response].abs().max().item()
    if divergence_gap > 1e-5:
        problems.append(f"binary KL differs by up to {divergence_gap:.2g}")
    objective_gap = (paper["objective"].detach() - engine["objective"])[response].abs().max().item()
    if objective_gap > 1e-5:
        problems.append(f"M·w·Â differs by up to {objective_gap:.2g}")
    expected = paper_gradient(model, batch, settings.temperature, settings.norm_constant)
    got = engine_gradient(model, batch, settings, tr)
    scale = max(g.abs().max().item() for g in expected.values())
    gradient_gap = max((expected[name] - got[name]).abs().max().item() for name in expected) / scale
    if set(expected) != set(got) or gradient_gap > 1e-4:
        problems.append(f"gradients differ by up to {gradient_gap:.2g} of the largest entry")
    return problems


def test_the_saved_batch_is_the_int4_copy_of_the_shipped_policy(saved, probes):
    """Its log μ, but at the probes, is a plain forward of the learner's int4 copy (so the rebuild below is of a
    real int4 batch), and the int4 copy's μ differs from the learner's π enough for DPPO's mask to act."""
    learner, batch, settings, _ = saved
    response = batch.response_mask.bool().clone()
    response[probes[0][:, 0], probes[0][:, 1]] = False
    with torch.no_grad():
        copy_logp = plain_logprobs(rollout_copy(learner, "int4"), batch, settings.temperature)
        learner_logp = plain_logprobs(learner, batch, settings.temperature)
    assert (copy_logp - batch.behavior_logp.double())[response].abs().max() < 1e-4
    assert (learner_logp.exp() - copy_logp.exp())[response].abs().mean() > 1e-3


def test_dppo_on_the_int4_batch_is_the_papers_mask_weights_and_gradient(saved):
    learner, batch, settings, tr = saved
    assert tr.name == "dppo_binary_kl" and tr.delta == DELTA and tr.anchor == "behavior"
    with torch.no_grad():
        blocked = int((batch.response_mask.bool() & ~paper_terms(learner, batch, settings.temperature)["mask"]).sum())
    assert blocked >= 5, f"the mask blocks only {blocked} tokens: no test of it"
    assert mismatches(learner, batch, settings, tr) == []


def test_the_rebuild_catches_a_binary_kl_taken_the_other_way_round(saved, monkeypatch):
    """The plant: eq:binary_kl with μ and π swapped, a one-line slip the engine's own tests might share."""
    from dppo_oat import divergence

    learner, batch, settings, tr = saved
    original = divergence.binary_kl
    monkeypatch.setattr(divergence, "binary_kl", lambda behavior_logp, logp: original(logp, behavior_logp))
    problems = mismatches(learner, batch, settings, tr)
    assert any(problem.startswith("masks differ") for problem in problems), problems
    assert any(problem.startswith("binary KL differs") for problem in problems), problems


def test_the_batch_holds_tokens_at_delta_on_both_sides_of_both_halves(saved, probes):
    """By the paper's rebuild (not by the script that placed them): the probes' D is δ·(1 ± 1%) to within 0.01% of
    δ, each half the mask blocks (Â > 0 & r > 1, Â < 0 & r < 1) has probes on both sides of δ, and the paper's mask
    blocks exactly the probes over δ in those halves."""
    learner, batch, settings, _ = saved
    index, factor, blocks = probes
    with torch.no_grad():
        terms = paper_terms(learner, batch, settings.temperature)
    divergence, ratio = at(terms["divergence"], index), at(terms["ratio"], index)
    advantages = at(batch.advantages.double().expand_as(terms["ratio"]), index)
    assert (divergence / DELTA - factor).abs().max() < 1e-4
    cells = {(bool(a > 0), bool(r > 1), bool(f > 1)) for a, r, f in zip(advantages, ratio, factor, strict=True)}
    for half in ((True, True), (False, False)):  # Â > 0 & r > 1; Â < 0 & r < 1
        assert {(*half, False), (*half, True)} <= cells, half
    assert torch.equal(~at(terms["mask"], index), blocks)
    assert int(blocks.sum()) == 6 and int((~blocks & (factor < 1)).sum()) == 6


@pytest.mark.parametrize("factor", [1.02, 0.98, 1.1, 0.9])
def test_the_rebuild_catches_a_threshold_a_few_percent_off(saved, probes, monkeypatch, factor):
    """The plant: the engine's mask compares D with δ·``factor`` instead of δ. Over δ (1.02, 1.1) it lets the
    probes at δ(1 + 1%) through; under it (0.98, 0.9) it blocks those at δ(1 − 1%): the masks differ on them."""
    learner, batch, settings, tr = saved
    original = rules.divergence_keep
    monkeypatch.setattr(rules, "divergence_keep", lambda ratio, advantages, divergence, delta, side="both": original(
        ratio, advantages, divergence, delta * factor, side))
    problems = mismatches(learner, batch, settings, tr)
    differ = [problem for problem in problems if problem.startswith("masks differ")]
    assert differ, problems
    assert int(differ[0].split()[3]) >= 6  # at least the six probes on that side of δ
