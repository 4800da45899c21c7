"""The verl engine: every trust region of the core as a verl policy loss, for runs beyond one GPU node.

Importing this package where verl is installed registers ``dppo_oat.<preset>`` in verl's policy-loss registry
(``verl.trainer.ppo.core_algos.register_policy_loss``) for every preset of
:data:`~dppo_oat.trust_region.PRESETS` that verl can run, and records the others in :data:`REFUSED` with a one-line
reason. verl's workers import it through ``actor_rollout_ref.model.external_lib=dppo_oat.engines.verl``. Where verl
is not installed the package imports all the same (registering nothing): the mapping and the command line's
``list`` and ``overrides`` need no verl.

- :mod:`~dppo_oat.engines.verl.mapping`: presets ⇄ verl's actor config and operating modes (imports no verl);
- :mod:`~dppo_oat.engines.verl.loss`: the policy-loss functions and their registration;
- :mod:`~dppo_oat.engines.verl.preflight`: compose verl's Hydra config with a launch's overrides and check it;
- ``python -m dppo_oat.engines.verl list | overrides PRESET | check OVERRIDES...``: the same from a shell.
"""

import importlib.util


def verl_installed() -> bool:
    """Whether verl's package is importable here (a folder named ``verl`` on the path, such as ``tests/verl``, is a
    namespace package without an origin, not verl)."""
    spec = importlib.util.find_spec("verl")
    return spec is not None and spec.origin is not None


VERL_INSTALLED = verl_installed()
"""Whether verl can be imported here (the losses are registered only then)."""
INSTALL_HINT = "pip install 'dppo_oat[verl]'"

if VERL_INSTALLED:
    from dppo_oat.engines.verl.loss import REFUSED, REGISTERED, make_policy_loss, register_all

    register_all()
    __all__ = ["REFUSED", "REGISTERED", "VERL_INSTALLED", "make_policy_loss", "register_all"]
else:
    __all__ = ["VERL_INSTALLED"]
