"""Write the saved int4 batch of ``tests/test_faithfulness_dppo.py``: one real rollout batch of the shipped Sudoku
policy's int4 rollout copy, as the local engine builds it for the update (the learner's inputs and the copy's log μ,
with Dr.GRPO advantages), at the default run's settings with ``--trust-region dppo_binary_kl --rollout-dtype int4``.

    python scripts/faithfulness_batch.py      # rewrites tests/data/int4_batch.pt (about 0.1 MB)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from dppo_oat.advantages import sample_advantages
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.policy import SHIPPED_POLICIES, policy_cache_key
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.models.tiny import load_policy
from dppo_oat.rollout.episodes import EpisodeCollector
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.precision import rollout_copy
from dppo_oat.samples import build_update_batch
from envs import ensure_registered

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "int4_batch.pt"
GROUPS, GROUP_SIZE, SEEDS = 4, 4, (300, 301, 302, 303)
"""Four groups of four episodes on training seeds kept apart from the study's and the tests' others."""


def main() -> None:
    config = TrainConfig(trust_region="dppo_binary_kl", rollout_dtype="int4", groups_per_step=GROUPS,
                         group_size=GROUP_SIZE, run_dir="/tmp/unused")
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
    torch.save({"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "response_mask": batch.response_mask, "behavior_logp": batch.behavior_logp,
                "advantages": batch.advantages, "temperature": update.temperature,
                "aggregation": update.aggregation, "norm_constant": update.norm_constant,
                "env_id": config.env_ids[0]}, OUT)
    print(f"{OUT}: {len(batch)} turns, {int(batch.response_mask.sum())} response tokens")


if __name__ == "__main__":
    main()
