"""dppo_oat: Divergence Proximal Policy Optimization for LLM RL.

The core (this package, engine-agnostic) holds the trust-region rules, the update loop, Gem rollouts and advantages;
``dppo_oat.engines`` holds the local (single-process CPU/GPU) engine and the oat engine, which call the core.
"""

from dppo_oat.trust_region import PRESETS, PolicyLossOutput, TopK, TrustRegion, policy_loss

__all__ = ["PRESETS", "PolicyLossOutput", "TopK", "TrustRegion", "policy_loss"]
__version__ = "0.1.0"
