"""dppo_oat: Divergence Proximal Policy Optimization for LLM RL.

The core (this package, engine-agnostic) holds the trust-region rules, the update loop, Gem rollouts and advantages;
``dppo_oat.engines`` holds the engines that call it: ``local`` (one process, CPU or one GPU), ``oat`` (oat + vLLM +
DeepSpeed on one GPU node) and ``verl`` (the trust region as a verl policy loss, beyond one node).
"""

from dppo_oat.trust_region import PRESETS, PolicyLossOutput, TopK, TrustRegion, policy_loss

__all__ = ["PRESETS", "PolicyLossOutput", "TopK", "TrustRegion", "policy_loss"]
__version__ = "0.1.0"
