"""Fixtures of the verl engine's tests (``make test-verl``; marked ``verl``, skipped where verl is not installed).

verl is imported inside the fixtures only, so that collecting this folder without verl (the main suite) imports
nothing of it.
"""

import math

import pytest


@pytest.fixture(scope="session")
def verl_adapter():
    """The adapter, imported (which registers the losses in verl's registry)."""
    pytest.importorskip("verl.trainer.ppo.core_algos")  # not just "verl": that name also finds this tests/verl folder
    import dppo_oat.engines.verl as adapter

    return adapter


@pytest.fixture(scope="session")
def actor_config(verl_adapter):
    """``actor_config(loss_mode, low, high, c, bypass=True, actor=None, **correction)``: a real verl ``ActorConfig``
    (``actor``: more of its fields, e.g. ``tau_pos``) whose ``policy_loss.rollout_correction`` is the mirror the launch
    writes."""
    from verl.trainer.config import RolloutCorrectionConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    def build(loss_mode, low=0.2, high=0.2, c=math.inf, bypass=True, actor=None, **correction):
        correction = {"rollout_is": None, **correction}
        policy_loss = PolicyLossConfig(loss_mode=loss_mode, rollout_correction=RolloutCorrectionConfig(
            bypass_mode=bypass, **correction))
        return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=low,
                           clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c, policy_loss=policy_loss,
                           **(actor or {}))

    return build
