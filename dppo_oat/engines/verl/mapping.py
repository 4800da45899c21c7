"""The core's trust regions in verl's terms: which presets verl can run, how verl's actor config sets their numbers,
which of verl's operating modes anchors them correctly, and the Hydra overrides that ask for all of it.

This module imports nothing of verl (the package's ``__init__`` does, to register the losses): a config is read
through ``.get``/attributes, which verl's ``ActorConfig`` (a ``BaseConfig``), an OmegaConf ``DictConfig`` and a plain
``dict`` all answer.

verl 0.9.1 facts this module relies on (paths inside the ``verl`` package):

- ``workers/config/actor.py``: ``ActorConfig.clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high`` (PPO's ε; verl's own
  ``dppo_tv``/``dppo_kl`` read them as δ), ``clip_ratio_c`` (dual-clip bound; the TIS cap C of verl's
  ``dppo_tv``/``dppo_kl``) and ``tau_pos``/``tau_neg`` (SAPO's temperatures). No field for α or K.
- ``trainer/ppo/v1/trainer_base.py`` (``_compute_old_log_prob``): with ``algorithm.rollout_correction.bypass_mode``
  the actor's ``old_log_probs`` are the rollout engine's ``rollout_log_probs`` (μ); otherwise they are recomputed by
  the trainer (π_θ') and, with ``rollout_correction.rollout_is``, ``rollout_is_weights`` carry π_θ'/μ to the loss.
- ``trainer/ppo/rollout_corr_helper.py``: token IS weights are ``exp(clamp(log π_θ' − log μ, ±SAFETY_BOUND))``
  truncated at ``rollout_is_threshold`` (``SAFETY_BOUND = 20``).
- ``workers/rollout/vllm_rollout/vllm_async_server.py``: the rollout asks vLLM for ``logprobs = 0`` and keeps the
  sampled token's log-prob only; the actor hands the loss log π_θ(a_t) only. No top-K set reaches a policy loss.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dppo_oat.ranges import check_float32
from dppo_oat.trust_region import PRESETS, RULE_TABLE, TrustRegion

LOSS_PREFIX = "dppo_oat."
"""verl's ``policy_loss.loss_mode`` of preset ``p`` is ``dppo_oat.p``."""
METRIC_PREFIX = "dppo/"
"""The core's metrics go to verl under this prefix (verl's trainer adds ``actor/`` in front of every actor metric)."""
EXTERNAL_LIB = "dppo_oat.engines.verl"
"""What ``actor_rollout_ref.model.external_lib`` imports in every worker that builds the model config."""
SAFETY_BOUND = 20.0
"""verl's clamp of log IS weights (``rollout_corr_helper.SAFETY_BOUND``): weights up to e^20 are exact."""
UNTRUNCATED_IS = math.exp(SAFETY_BOUND)
"""A ``rollout_is_threshold`` at least this large truncates no token IS weight."""

def carries_delta_in_clip(rule) -> bool:
    """True when verl's ``clip_ratio_low``/``clip_ratio_high`` carry the rule's δ (as in verl's ``dppo_tv`` and
    ``dppo_kl``): its threshold is δ, or it has no threshold and reads δ (DRPO's regularizer weight)."""
    return rule.threshold == "delta" or (rule.threshold is None and "delta" in rule.reads)


DELTA_RULES = tuple(name for name, rule in RULE_TABLE.items() if carries_delta_in_clip(rule))
"""Rules whose δ is verl's ``clip_ratio_low``/``clip_ratio_high`` (:func:`carries_delta_in_clip`)."""
EPS_RULES = tuple(name for name, rule in RULE_TABLE.items() if rule.threshold == "clip_range")
"""Rules whose thresholds are PPO's ε_low/ε_high: verl's ``clip_ratio_low``/``clip_ratio_high``."""
SEQUENCE_DELTA = "rollout_rs_threshold"
"""Where verl's config carries the δ of a ratio rule's sequence mask (TRM-Max/Avg, DeepSeek-V3.2's mask, VACO):
``algorithm.rollout_correction.rollout_rs_threshold``, the threshold of verl's own sequence rejection sampling (TRM's
δ is exactly it), with ``rollout_rs=null``: the loss masks the responses, verl does not mask them again."""


def reads_sequence_delta(tr: TrustRegion) -> bool:
    """True for a ratio rule that also reads δ (a sequence mask on top of PPO's clip): its δ is verl's
    :data:`SEQUENCE_DELTA` (read now: a rule registered after this module counts too)."""
    return RULE_TABLE[tr.rule].threshold == "clip_range" and "delta" in tr.fields_read


def loss_name(preset: str) -> str:
    """verl's ``loss_mode`` for a preset of :data:`~dppo_oat.trust_region.PRESETS`."""
    return LOSS_PREFIX + preset


def preset_of(loss_mode: str) -> str | None:
    """The preset behind a ``loss_mode`` of this adapter, or None for verl's own losses."""
    return loss_mode[len(LOSS_PREFIX):] if loss_mode.startswith(LOSS_PREFIX) else None


def refusal(preset: str) -> str | None:
    """Why verl 0.9.1 cannot run ``preset`` faithfully (one line), or None when it can."""
    try:
        tr = TrustRegion.preset(preset)
    except ValueError as error:
        return f"{loss_name(preset)}: the preset does not build ({error})"
    if tr.uses_topk:
        instead = " or ".join(loss_name(name) for name in binary_alternatives(tr))
        return (f"{loss_name(preset)} is refused: top-K rules need μ's top-{tr.k} log-probs per token, and "
                "verl 0.9.1's rollout keeps only the sampled token's log-prob (vLLM logprobs=0) while its actor hands "
                f"the loss log π_θ(a_t) only; use {instead}")
    if tr.anchor not in ("behavior", "recompute"):
        return f"{loss_name(preset)} is refused: verl has no log-probs for the anchor {tr.anchor!r}"
    return None


def binary_alternatives(tr: TrustRegion) -> list[str]:
    """The presets to run instead of top-K rule ``tr``: DPPO's binary TV and KL for DPPO's top-K rules, else the
    presets of the rule's binary twin (:attr:`~dppo_oat.trust_region.Rule.binary_twin`: ``cppo`` →
    ``cppo_binary_tv``)."""
    if RULE_TABLE[tr.rule].keep is RULE_TABLE["binary_tv"].keep:  # DPPO's mask
        return ["dppo_binary_tv", "dppo_binary_kl"]
    binary = RULE_TABLE[tr.rule].binary_twin
    return [name for name, preset in PRESETS.items() if preset.fields.get("rule") == binary]


def supported_presets() -> dict[str, str | None]:
    """Every preset of the core at this moment, with its refusal (None: registered). Read at call time, so presets
    added to :data:`~dppo_oat.trust_region.PRESETS` before the adapter is imported are covered."""
    return {name: refusal(name) for name in PRESETS}


# --------------------------------------------------------------------------------------------- verl config -> core


def _field(config: Any, name: str, default: Any = None) -> Any:
    """``config.name`` for a dataclass, DictConfig or dict alike."""
    if isinstance(config, dict):
        return config.get(name, default)
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(name, default)
    return getattr(config, name, default)


def clip_range(config: Any) -> tuple[float, float]:
    """(low, high) of verl's clip fields, ``clip_ratio`` standing in for an unset side (core_algos.py's
    ``compute_policy_loss_dppo_tv`` and ``compute_policy_loss_vanilla`` read them the same way)."""
    ratio = _field(config, "clip_ratio", 0.2)
    low, high = _field(config, "clip_ratio_low"), _field(config, "clip_ratio_high")
    return float(ratio if low is None else low), float(ratio if high is None else high)


VERL_FIELDS = {"tau_pos": "tau_pos", "tau_neg": "tau_neg"}
"""TrustRegion fields verl's ``ActorConfig`` carries under their own name (SAPO's temperatures)."""


def clip_fields(tr: TrustRegion) -> tuple[str, ...]:
    """The TrustRegion fields verl's ``clip_ratio_low``/``clip_ratio_high`` carry for ``tr``'s rule: ε_low/ε_high of a
    clip range, or δ (:func:`carries_delta_in_clip`); none for the others (read now: a rule registered after this
    module counts too)."""
    rule = RULE_TABLE[tr.rule]
    if rule.threshold == "clip_range":
        return ("eps_low", "eps_high")
    return ("delta",) if carries_delta_in_clip(rule) else ()


def verl_settable_fields(tr: TrustRegion) -> tuple[str, ...]:
    """The TrustRegion fields of ``tr`` that verl's actor config carries (the rest are the preset's): its threshold
    (ε_low/ε_high or δ from the clip fields), the δ of a ratio rule's sequence mask (:data:`SEQUENCE_DELTA`), C from
    ``clip_ratio_c`` when the rule reads it, and the fields of :data:`VERL_FIELDS` it reads."""
    fields = clip_fields(tr)
    fields += ("delta",) if reads_sequence_delta(tr) else ()  # from rollout_rs_threshold (SEQUENCE_DELTA)
    read = tr.fields_read
    fields += ("is_cap",) if "is_cap" in read else ()
    return fields + tuple(name for name in VERL_FIELDS if name in read)


def verl_overrides_of(tr: TrustRegion, config: Any) -> dict[str, float]:
    """The TrustRegion fields that verl's actor ``config`` sets for ``tr``'s rule (:func:`verl_settable_fields`).

    DPPO's rules have one δ (eq:dppo_obj); verl's ``dppo_tv`` allows one per side, so unequal sides are refused.
    """
    low, high = clip_range(config)
    settable = verl_settable_fields(tr)
    fields = {name: float(_field(config, VERL_FIELDS[name], getattr(tr, name))) for name in settable
              if name in VERL_FIELDS}
    if "is_cap" in settable:
        fields["is_cap"] = float(_field(config, "clip_ratio_c", tr.is_cap))
    verl_names = {**VERL_FIELDS, "is_cap": "clip_ratio_c"}
    for name, value in {**fields, "clip_ratio_low": low, "clip_ratio_high": high}.items():
        check_float32(f"actor_rollout_ref.actor.{verl_names.get(name, name)}", value)
    if "eps_low" in settable:
        fields.update(eps_low=low, eps_high=high)
    if reads_sequence_delta(tr):
        fields.update(sequence_delta_of(tr, config))
    elif "delta" in settable:
        if low != high:
            raise ValueError(f"{loss_name(tr.name)} has one threshold δ (eq:dppo_obj): set actor.clip_ratio_low = "
                             f"actor.clip_ratio_high (got {low} and {high})")
        fields["delta"] = low
    return fields


def sequence_delta_of(tr: TrustRegion, config: Any) -> dict[str, float]:
    """``{"delta": rollout_rs_threshold}`` of the actor's rollout correction (:data:`SEQUENCE_DELTA`), ``{}`` when it
    is unset (the preset's δ); a threshold that is not one positive number (verl's ``"lower_upper"`` form) is a
    ``ValueError``."""
    value = _field(rollout_correction_of(config), SEQUENCE_DELTA)
    if value is None:
        return {}
    try:
        delta = float(value)
    except (TypeError, ValueError):
        delta = math.nan
    if not (delta > 0 and math.isfinite(delta)):
        raise ValueError(f"{loss_name(tr.name)} reads its sequence mask's δ from algorithm.rollout_correction."
                         f"{SEQUENCE_DELTA}: give one finite number > 0 (got {value!r})")
    check_float32(f"algorithm.rollout_correction.{SEQUENCE_DELTA}", delta)
    return {"delta": delta}


def trust_region_for(preset: str, config: Any) -> TrustRegion:
    """``preset`` with δ/ε/C from verl's actor ``config`` where verl has a field, the preset's values otherwise."""
    tr = TrustRegion.preset(preset)
    return tr.replace(**verl_overrides_of(tr, config))


def describe(tr: TrustRegion) -> str:
    """``tr`` in one line: its rule, the fields verl's config set, and every other field off the defaults."""
    default = TrustRegion()
    shown = [f"rule={tr.rule}"] + [f"{name}={getattr(tr, name)}" for name in verl_settable_fields(tr)]
    for field in dataclasses.fields(TrustRegion):
        name = field.name
        if name not in ("rule", "name") + verl_settable_fields(tr) and getattr(tr, name) != getattr(default, name):
            shown.append(f"{name}={getattr(tr, name)}")
    return ", ".join(shown)


# --------------------------------------------------------------------------------------------- anchoring


def rollout_correction_of(config: Any) -> Any:
    """The rollout-correction settings the actor sees: ``policy_loss.rollout_correction``, which the launch mirrors
    from ``algorithm.rollout_correction`` (the actor config carries no ``algorithm`` section)."""
    policy_loss = _field(config, "policy_loss", {}) or {}
    return _field(policy_loss, "rollout_correction", {}) or {}


def _threshold_upper(spec: Any) -> float | None:
    """The upper bound of a ``rollout_is_threshold`` (float or ``"upper"``), None for IcePop's ``"lower_upper"``."""
    if isinstance(spec, str) and "_" in spec:
        return None
    return float(spec)


def anchoring_problem(tr: TrustRegion, correction: Any) -> str | None:
    """Why verl's rollout-correction settings would not give ``tr`` its anchor (one line), or None.

    Rules that read μ only need bypass mode (``old_log_prob`` = μ). Rules that also read π_θ' (anchor, decoupled IS
    weight or mismatch mask: ``TrustRegion.needs_recompute``) need decoupled mode with untruncated token IS weights
    π_θ'/μ, from which μ is recovered, e.g. for the IS weight min(π_θ/μ, C) of eq:unified_grad.
    """
    bypass = bool(_field(correction, "bypass_mode", False))
    where = "algorithm.rollout_correction (mirrored into actor.policy_loss.rollout_correction)"
    if reads_sequence_delta(tr) and _field(correction, "rollout_rs") is not None:
        return (f"{loss_name(tr.name)} masks whole responses itself, with δ = {SEQUENCE_DELTA}: set rollout_rs=null "
                f"in {where} (verl's own rejection sampling, rollout_rs={_field(correction, 'rollout_rs')}, would "
                "mask them a second time)")
    if not tr.needs_recompute:
        if not bypass:
            return f"{loss_name(tr.name)} is anchored on μ: set bypass_mode=true in {where}"
        return None
    if bypass:
        return f"{loss_name(tr.name)} reads the recomputed π_θ': set bypass_mode=false in {where}"
    level = _field(correction, "rollout_is")
    upper = _threshold_upper(_field(correction, "rollout_is_threshold", 2.0))
    if level != "token" or upper is None or upper < UNTRUNCATED_IS or _field(correction, "rollout_is_batch_normalize"):
        return (f"{loss_name(tr.name)} needs μ beside π_θ': set rollout_is=token, rollout_is_threshold=inf and "
                f"rollout_is_batch_normalize=false in {where}")
    return None


# --------------------------------------------------------------------------------------------- core -> verl overrides


def _number(value: float) -> str:
    """A float as Hydra's override grammar writes it (``inf`` for ∞)."""
    return "inf" if math.isinf(value) else repr(float(value))


def _check_field_names(preset: str, fields: dict) -> None:
    """Every name of ``fields`` is a numeric TrustRegion field; another is one ValueError that names the field meant
    (``tr_delta`` → ``delta``) or, for calibration's flags, the offline route."""
    from dppo_oat.trust_region import NUMBER_FIELDS

    for name in fields:
        if name in NUMBER_FIELDS:
            continue
        bare = name.removeprefix("tr_").replace("-", "_")
        hint = f": write {bare}=" if bare in NUMBER_FIELDS else ""
        if bare.startswith("calibrate"):
            hint = (": verl does not calibrate a band while it trains; calibrate offline (python -m dppo_oat.calibrate "
                    "on a run's token export) and pass the band it prints (delta=...)")
        raise ValueError(f"{loss_name(preset)}: {name} is no TrustRegion field (FIELD=VALUE names one of "
                         f"{', '.join(NUMBER_FIELDS)}){hint}")


def hydra_overrides(preset: str, **fields: float) -> list[str]:
    """The ``verl.trainer.main_ppo`` overrides that run ``preset`` (with TrustRegion ``fields`` changed, e.g.
    ``delta=0.2``) with its numbers and its anchor.

    They import the adapter in every worker (``external_lib``), pick the loss, write δ/ε/C into verl's fields
    (:func:`verl_settable_fields`), choose bypass mode (μ only) or decoupled mode with untruncated token IS weights
    (μ and π_θ'), and mirror ``algorithm.rollout_correction`` into the actor's ``policy_loss`` so the loss can check it.
    """
    reason = refusal(preset)
    if reason:
        raise ValueError(reason)
    tr = TrustRegion.preset(preset)
    _check_field_names(preset, fields)
    unsettable = sorted(set(fields) - set(verl_settable_fields(tr)))
    if unsettable:
        settable = ", ".join(verl_settable_fields(tr)) or "none"
        raise ValueError(f"{loss_name(preset)}: verl's config has no field for {', '.join(unsettable)} (settable: "
                         f"{settable}); on verl the preset's value holds (the local and oat engines take "
                         f"--tr-{unsettable[0].replace('_', '-')})")
    for name, value in fields.items():
        check_float32(f"{loss_name(preset)}: {name}", value)
    tr = tr.replace(**fields)
    actor = "actor_rollout_ref.actor."
    out = [f"actor_rollout_ref.model.external_lib={EXTERNAL_LIB}", f"{actor}policy_loss.loss_mode={loss_name(preset)}"]
    sides = {("eps_low", "eps_high"): (tr.eps_low, tr.eps_high), ("delta",): (tr.delta, tr.delta)}.get(clip_fields(tr))
    if sides is not None:  # the clip fields carry the rule's ε_low/ε_high, or δ on both sides
        out += [f"{actor}clip_ratio_low={_number(sides[0])}", f"{actor}clip_ratio_high={_number(sides[1])}"]
    if "is_cap" in verl_settable_fields(tr):
        out.append(f"{actor}clip_ratio_c={_number(tr.is_cap)}")
    out += [f"{actor}{VERL_FIELDS[name]}={_number(getattr(tr, name))}" for name in verl_settable_fields(tr)
            if name in VERL_FIELDS]
    out += _mode_overrides(tr)
    if reads_sequence_delta(tr):  # the loss masks the responses; verl's own rejection sampling stays off
        corr = "algorithm.rollout_correction."
        out += [f"{corr}rollout_rs=null", f"{corr}{SEQUENCE_DELTA}={_number(tr.delta)}"]
    out.append(f"+{actor}policy_loss.rollout_correction=${{algorithm.rollout_correction}}")
    return out


def _mode_overrides(tr: TrustRegion) -> list[str]:
    """Bypass mode for rules that read μ only, decoupled mode with untruncated token IS weights for those that also
    read π_θ' (``TrustRegion.needs_recompute``)."""
    corr = "algorithm.rollout_correction."
    common = ["actor_rollout_ref.rollout.calculate_log_probs=true", f"{corr}rollout_is_batch_normalize=false"]
    if not tr.needs_recompute:
        return common + [f"{corr}bypass_mode=true", f"{corr}rollout_is=null"]
    return common + [f"{corr}bypass_mode=false", f"{corr}rollout_is=token", f"{corr}rollout_is_threshold=inf"]
