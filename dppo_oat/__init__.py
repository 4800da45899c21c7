"""dppo_oat: Divergence Proximal Policy Optimization for LLM RL.

The core (this package, engine-agnostic) holds the trust-region rules, the update loop, Gem rollouts and advantages;
``dppo_oat.engines`` holds the engines that call it: ``local`` (one process, CPU or one GPU), ``oat`` (oat + vLLM +
DeepSpeed on one GPU node) and ``verl`` (the trust region as a verl policy loss, beyond one node).
"""


from __future__ import annotations

import importlib

__all__ = ["PRESETS", "PolicyLossOutput", "TopK", "TrustRegion", "policy_loss"]
__version__ = "0.2.0"


def __getattr__(name: str):
    """The core's names, imported from :mod:`dppo_oat.trust_region` on first use: importing the package itself runs
    nothing heavy, so a command line (``python -m dppo_oat.train``) handles Ctrl-C from its first instruction."""
    if name not in __all__:
        raise AttributeError(f"module 'dppo_oat' has no attribute {name!r}")
    value = getattr(importlib.import_module("dppo_oat.trust_region"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
