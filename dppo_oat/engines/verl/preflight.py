"""The verl engine's preflight, before a launch: compose verl's own Hydra config with the launch's overrides (no Ray,
no GPU) and check that every worker will register the loss and anchor it as its preset says.

The actor config is built as verl's workers build it (``verl.utils.config.omega_conf_to_dataclass`` in
``workers/engine_workers.py``), so what is checked here is what the loss will read.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from typing import Any

from dppo_oat.engines.verl.mapping import (
    EXTERNAL_LIB,
    anchoring_problem,
    describe,
    loss_name,
    preset_of,
    refusal,
    rollout_correction_of,
    trust_region_for,
)

MIRRORED_FIELDS = ("bypass_mode", "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                   "rollout_rs_threshold")
"""Fields of ``algorithm.rollout_correction`` that the actor's mirror must repeat (the loss checks the mirror)."""


def verl_config_dir() -> str:
    """verl's packaged Hydra configs (``verl/trainer/config``, where ``main_ppo`` finds ``ppo_trainer.yaml``)."""
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def first_line(error: BaseException) -> str:
    """An exception's message in one line (Hydra's and OmegaConf's span several, with a link or a key path)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "; ".join(lines[:2]) if lines else type(error).__name__


def config_errors() -> tuple[type[BaseException], ...]:
    """What Hydra, OmegaConf and verl's config classes raise for a config they refuse."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return HydraException, OmegaConfBaseException, AssertionError, TypeError


def check_syntax(overrides: Sequence[str]) -> None:
    """Every override parses in Hydra's grammar; ``ValueError`` naming the first that does not."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as error:
            raise ValueError(f"the override {override!r} is not Hydra's KEY=VALUE syntax "
                             f"({first_line(error)})") from None


def compose(overrides: Sequence[str], config_name: str = "ppo_trainer"):
    """verl's ``main_ppo`` config with ``overrides``, interpolations resolved (as its TaskRunner resolves them);
    ``ValueError`` with one line for an override Hydra cannot parse or the config refuses."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    check_syntax(overrides)
    try:
        with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
            config = hydra_compose(config_name=config_name, overrides=list(overrides))
        OmegaConf.resolve(config)
    except config_errors() as error:
        raise ValueError(f"verl's config does not take these overrides: {first_line(error)}") from None
    return config


def _external_libs(model_config) -> list[str]:
    libs = model_config.get("external_lib") or []
    return [libs] if isinstance(libs, str) else list(libs)


def _check_plumbing(config) -> None:
    """The trainer, the import of the adapter in the workers, and the rollout log-probs (μ) the anchors need."""
    if not config.trainer.get("use_v1", False):
        raise ValueError("set trainer.use_v1=true: verl's legacy trainer rewrites loss_mode to bypass_mode in bypass "
                         "mode (rollout_corr_helper.apply_bypass_mode)")
    if EXTERNAL_LIB not in _external_libs(config.actor_rollout_ref.model):
        raise ValueError(f"set actor_rollout_ref.model.external_lib={EXTERNAL_LIB}: without it verl's workers never "
                         "register the dppo_oat losses")
    if not config.actor_rollout_ref.rollout.get("calculate_log_probs", False):
        raise ValueError("set actor_rollout_ref.rollout.calculate_log_probs=true: every anchor needs μ from the "
                         "rollout")


def _check_mirror(config, actor) -> None:
    """``actor.policy_loss.rollout_correction`` must repeat ``algorithm.rollout_correction``."""
    wanted, seen = config.algorithm.get("rollout_correction") or {}, rollout_correction_of(actor)
    for field in MIRRORED_FIELDS:
        if wanted.get(field) != seen.get(field):
            raise ValueError("mirror the rollout correction into the actor: "
                             "+actor_rollout_ref.actor.policy_loss.rollout_correction=${algorithm.rollout_correction} "
                             f"({field}: {wanted.get(field)!r} in algorithm, {seen.get(field)!r} in the actor)")


def _verl_checked_actor(config) -> tuple[Any, list[str]]:
    """verl's own ``validate_config`` (as ``main_ppo`` runs it before Ray starts), then the actor config as verl's
    workers build it, with the lines verl printed meanwhile (held back: verl says its checks passed before this
    module's checks ran); ``ValueError`` with one line where verl refuses the config."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            validate_config(config=config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
            actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    except (*config_errors(), ValueError) as error:
        raise ValueError(f"verl refuses the config: {first_line(error)}") from None
    return actor, [line for line in printed.getvalue().splitlines() if line.strip()]


def check(config, verl_said: list[str] | None = None) -> str:
    """One line on what the run's loss will do, or ValueError with one line on what to change. Runs verl's own
    ``validate_config`` first, as ``verl.trainer.main_ppo.main`` does before it starts Ray; what verl printed is
    appended to ``verl_said`` only when every check passed (verl says its own checks passed before these ran)."""
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    preset = preset_of(loss_mode)
    reason = None if preset is None else refusal(preset)
    if reason:  # an unknown or refused dppo_oat loss, named before verl's own checks
        raise ValueError(reason)
    actor, verl_lines = _verl_checked_actor(config)
    if preset is None:
        (verl_said if verl_said is not None else []).extend(verl_lines)
        return f"loss_mode {loss_mode} is verl's own: nothing of dppo_oat to check"
    _check_plumbing(config)
    _check_mirror(config, actor)
    tr = trust_region_for(preset, actor)
    problem = anchoring_problem(tr, rollout_correction_of(actor))
    if problem:
        raise ValueError(problem)
    mode = "decoupled mode (old_log_prob = π_θ')" if tr.needs_recompute else "bypass mode (old_log_prob = μ)"
    (verl_said if verl_said is not None else []).extend(verl_lines)
    return f"{loss_name(preset)}: {describe(tr)} in {mode}"
