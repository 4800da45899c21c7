"""Write the saved int4 batch of ``tests/test_faithfulness_dppo.py``: one real rollout batch of the shipped Sudoku
policy's int4 rollout copy, as the local engine builds it for the update (the learner's inputs and the copy's log μ,
with Dr.GRPO advantages), at the default run's settings with ``--trust-region dppo_binary_kl --rollout-dtype int4``,
and probe tokens at the mask's threshold.

    python scripts/faithfulness_batch.py      # rewrites tests/data/int4_batch.pt (about 0.1 MB)

A real batch holds few tokens near δ, so a mask whose threshold is off by a few percent blocks the same tokens on it.
The probes (:data:`PROBES`) are response tokens of the batch whose log μ is set, against the learner's π in float64,
so that their binary KL (eq:binary_kl) sits at δ(1 − 1%) and δ(1 + 1%) in both halves the mask can block (Â > 0
where r = π/μ > 1, Â < 0 where r < 1), and at δ(1 + 1%) in the two cells it never blocks. The batch records them
(``probe_index``, ``probe_factor``, ``probe_blocks``); every other token keeps the int4 copy's log μ.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch
from scipy.optimize import brentq

from dppo_oat.advantages import sample_advantages
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import SHIPPED_POLICIES, policy_cache_key
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.models.tiny import load_policy
from dppo_oat.rollout.episodes import EpisodeCollector
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.rollout_copy import rollout_copy
from dppo_oat.update_batch import build_update_batch
from envs import ensure_registered

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "int4_batch.pt"
GROUPS, GROUP_SIZE, SEEDS = 4, 4, (300, 301, 302, 303)
"""Four groups of four episodes on training seeds kept apart from the study's and the tests' others."""
PROBES = ((1, "mu_below", 0.99, 3), (1, "mu_below", 1.01, 3), (-1, "mu_above", 0.99, 3), (-1, "mu_above", 1.01, 3),
          (1, "mu_above", 1.01, 2), (-1, "mu_below", 1.01, 2))
"""``(sign of Â, side of μ against π, D/δ, tokens)``: the two halves DPPO's mask blocks (Â > 0 with μ < π, so
r > 1; Â < 0 with μ > π) on both sides of δ, then the two cells it never blocks just over δ."""
PI_RANGE = (0.1, 0.9)
"""Probe tokens are those whose learner π lies here: μ can then be set on either side of π at a binary KL of δ."""


def binary_kl(mu: float, pi: float) -> float:
    """eq:binary_kl, KL(μ‖π) of the two-outcome distributions (a_t, not a_t), in float64."""
    return mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi))


def probe_mu(pi: float, target: float, side: str) -> float:
    """The μ on ``side`` of ``pi`` (``mu_below``: μ < π) whose binary KL to ``pi`` is ``target``."""
    low, high = (1e-12, pi - 1e-12) if side == "mu_below" else (pi + 1e-12, 1 - 1e-12)
    return brentq(lambda mu: binary_kl(mu, pi) - target, low, high, xtol=1e-15, rtol=1e-15)


def learner_probs(model, data: dict, temperature: float) -> torch.Tensor:
    """``[N, L−1]`` π(a_t) of the learner, from one plain forward in float64 (as the faithfulness test rebuilds it)."""
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits[:, :-1].double()
    return torch.log_softmax(logits / temperature, -1).gather(-1, data["input_ids"][:, 1:, None])[..., 0].exp()


def place_probes(data: dict, pi: torch.Tensor, delta: float) -> dict:
    """``data`` with the probes of :data:`PROBES` placed: the first response tokens (row-major) of each sign of Â
    whose π lies in :data:`PI_RANGE`, their log μ set by :func:`probe_mu`; with ``probe_index`` ``[n, 2]``,
    ``probe_factor`` (D/δ) and ``probe_blocks`` (whether DPPO's mask blocks the probe)."""
    advantages = data["advantages"].expand_as(pi)
    candidates = data["response_mask"] & (pi > PI_RANGE[0]) & (pi < PI_RANGE[1])
    free = {sign: iter(torch.nonzero(candidates & (advantages * sign > 0)).tolist()) for sign in (1, -1)}
    behavior_logp, index, factors, blocks = data["behavior_logp"].clone(), [], [], []
    for sign, side, factor, count in PROBES:
        for _ in range(count):
            row, position = next(free[sign])
            mu = probe_mu(float(pi[row, position]), factor * delta, side)
            behavior_logp[row, position] = math.log(mu)
            index.append((row, position))
            factors.append(factor)
            blocks.append(factor > 1 and (sign > 0) == (side == "mu_below"))
    return {**data, "behavior_logp": behavior_logp, "probe_index": torch.tensor(index),
            "probe_factor": torch.tensor(factors, dtype=torch.float64), "probe_blocks": torch.tensor(blocks)}


def main() -> None:
    config = TrainConfig(trust_region="dppo_binary_kl", rollout_dtype="int4", groups_per_step=GROUPS,
                         group_size=GROUP_SIZE, runs_dir="/tmp/unused")
    spec, _ = validate_config(config)
    learner, tokenizer = load_policy(SHIPPED_POLICIES / policy_cache_key(
        config.env_ids[0], config.template, config.warm_start, config.warm_start_seed))
    ensure_registered(config.env_ids[0])
    collector = EpisodeCollector(list(config.env_ids), GROUPS, GROUP_SIZE, tokenizer, spec.rollout)
    try:
        rollout = collector.collect(HFGenerator(rollout_copy(learner, "int4"), tokenizer),
                                    replace(spec.sampling, seed=5), list(SEEDS))
    finally:
        collector.close()
    advantages = sample_advantages(rollout.samples, spec.advantages)
    batch = build_update_batch(rollout.samples, advantages, tokenizer.pad_token_id, with_topk=False)
    update = spec.update
    data = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
            "response_mask": batch.response_mask, "behavior_logp": batch.behavior_logp,
            "advantages": batch.advantages, "temperature": update.temperature,
            "aggregation": update.aggregation, "norm_constant": update.norm_constant, "env_id": config.env_ids[0]}
    data = place_probes(data, learner_probs(learner, data, update.temperature), spec.trust_region.delta)
    torch.save(data, OUT)
    print(f"{OUT}: {len(batch)} turns, {int(batch.response_mask.sum())} response tokens, "
          f"{len(data['probe_index'])} of them probes at δ(1 ± 1%)")


if __name__ == "__main__":
    main()
