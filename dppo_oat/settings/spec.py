"""A run's settings, in one place for the local and oat engines: the trust region, how episodes are played and sampled,
the advantage estimator and the update loop.

Each engine maps its own command line onto a :class:`RunSpec` exactly once (the local engine in
``engines/local/config.py``, the oat engine in ``engines/oat/args.py``); the trainer, the warm start, the oat actor
and the oat learner read the spec and nothing else. The flags DPPO adds to a command line are declared once, in
:class:`DPPOFlags`, which the local and oat engines' argument classes inherit, so a concept has one name everywhere
(``--trust-region``/``--trust_region``: tyro accepts either spelling).

Every settings class validates itself when built, so a bad value fails before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

import tyro

from dppo_oat.advantages import ADVANTAGE_MODES, AdvantageSettings
from dppo_oat.aggregation import AGGREGATIONS
from dppo_oat.ranges import check_float32
from dppo_oat.settings.docstrings import field_docstrings
from dppo_oat.settings.kinds import flag
from dppo_oat.trust_region import (
    INTEGER_FIELDS,
    NUMBER_FIELDS,
    PRESETS,
    RULE_TABLE,
    UNITS,
    TrustRegion,
    band_of,
    check_batch_serves,
)
from dppo_oat.trust_region.band_search import BAND_NAMES, check_target

TOKEN_EXPORT_MODES = ("none", "all")
"""``--token-export``: ``none`` (the default: nothing) or ``all`` (every trained token of every step,
:mod:`dppo_oat.run.token_export`)."""
DEFAULT_TOKEN_SAMPLES = 32
"""``--token-samples``: response tokens per RL step in ``tokens.jsonl`` (:mod:`dppo_oat.run.token_samples`), about
9 KB a step, so a 1,000-step run stays under 10 MB."""

PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
TEMPLATES = ("qwen3_game", "qwen3_general", "plain", "chat")
"""Prompt templates (see :mod:`dppo_oat.rollout.templates`)."""
FORMAT_ERROR_PENALTY = -0.1
"""Gem's reward for an unreadable action (``LanguageGameReward.format_error_reward``), also given to an episode
whose prompt no longer fits (a test checks that the two agree; the spec does not import Gem)."""
TRUST_REGION_OVERRIDES = NUMBER_FIELDS
"""The :class:`TrustRegion` fields a command line can override (flags ``--tr_<field>``): every numeric one
(:data:`~dppo_oat.trust_region.config.NUMBER_FIELDS`)."""
MAX_NAMED_READERS = 6
"""An override's help names the presets that read it when there are at most this many."""
OVERRIDE_FLAGS = tuple(f"tr_{name}" for name in TRUST_REGION_OVERRIDES)
"""The fields of the trust region's override flags (``--tr-delta`` ...), one per :data:`TRUST_REGION_OVERRIDES`."""
CALIBRATION_FLAGS = ("tr_calibrate", "tr_calibrate_like", "tr_calibrate_unit", "tr_calibrate_band",
                     "tr_calibrate_every")
"""The fields of the band calibration's flags."""
OVERRIDES_ABOUT = ("Each --tr-<field> replaces one number of the --trust-region preset (None: the preset's own); one "
                   "the preset does not read is refused.")
"""What the override flags' section of ``--help`` says of them all (their own help says what each number is)."""


def check_temperature(temperature: float, *, training: bool) -> None:
    """The one rule on a temperature T, wherever it is set: π_θ is ``softmax(logits / T)`` at the sampling
    temperature T (eq:dppo_obj's μ is the tempered policy), so T must be finite; training samples its episodes,
    so T > 0 there (greedy decoding, T = 0, has no μ); evaluation may decode greedily (T ≥ 0)."""
    if training and not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"training samples episodes: its temperature must be a finite number > 0 (greedy decoding "
                         f"has no μ), got {temperature}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample. ``temperature`` 0 is greedy (evaluation only: training samples). ``top_k_logprobs`` is the
    paper's K (0: do not return the top-K set); ``top_k`` restricts sampling to the k most likely tokens (-1: all)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k_logprobs: int = 0
    seed: int | None = None
    top_k: int = -1

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_temperature(self.temperature, training=False)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k_logprobs < 0:
            raise ValueError(f"top_k_logprobs must be >= 0, got {self.top_k_logprobs}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all tokens) or >= 1, got {self.top_k}")

    @property
    def truncates(self) -> bool:
        """True when top-p or top-k cuts the distribution (μ is then renormalised over the kept tokens)."""
        return self.top_p < 1.0 or self.top_k != -1

    @property
    def is_plain(self) -> bool:
        """True when sampling is from the model's own distribution (temperature 1, no top-p / top-k cut)."""
        return self.temperature == 1.0 and self.top_p == 1.0 and self.top_k == -1


DEFAULT_MAX_TURNS = 100
"""The turn cap of an episode whose env has no turn limit of its own (a ``max_turns`` attribute) when none is given
(``--max-turns``): an env that never ends its episodes would otherwise play one rollout forever."""


@dataclass(frozen=True)
class RolloutSettings:
    """How episodes are played. ``max_turns`` caps turns on top of the env's own limit (None: the env's own, else
    :data:`DEFAULT_MAX_TURNS`).

    ``wrappers`` are Gem's observation wrappers by name (``gem.wrappers.wrapper_factory``), e.g. ``concat``: the
    whole history of the episode in every prompt, as Gem's oat examples train games.
    """

    template: str = "qwen3_game"
    max_prompt_tokens: int = 2048
    max_turns: int | None = None
    success_threshold: float = 0.999
    penalty: float = FORMAT_ERROR_PENALTY
    env_seed: int = 42
    """Constructor seed of every slot (reasoning-gym builds its puzzle set from it; puzzles come from reset seeds)."""
    wrappers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ValueError(f"unknown prompt template {self.template!r}; choose one of: {', '.join(TEMPLATES)}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        check_wrappers(self.wrappers, self.template)


def check_wrappers(names: tuple[str, ...], template: str) -> None:
    """Every name is one of Gem's wrappers; the chat-template ones render the prompt themselves (template plain)."""
    if not names:
        return
    from gem.wrappers.wrapper_factory import TOKENIZER_REQUIRED, WRAPPER_FACTORY

    unknown = [name for name in names if name not in WRAPPER_FACTORY]
    if unknown:
        raise ValueError(f"unknown Gem wrapper(s) {unknown}; choose among: {', '.join(WRAPPER_FACTORY)}")
    chat = [name for name in names if name in TOKENIZER_REQUIRED]
    if chat and template != "plain":
        raise ValueError(f"wrapper {chat[0]} applies the chat template itself: use prompt template plain "
                         f"(got {template})")


@dataclass(frozen=True)
class UpdateSettings:
    """Knobs of the update loop (:func:`dppo_oat.learner.update.update_policy`)."""

    num_epochs: int = 1
    minibatch_size: int = 64
    micro_batch_size: int | None = None
    aggregation: str = "seq-mean-token-sum-norm"
    norm_constant: float | None = None
    scale_micro_batches: bool = True
    """Weigh each micro-batch loss by its share of the minibatch (False when the engine, like DeepSpeed, already
    averages over gradient-accumulation steps)."""
    temperature: float = 1.0
    """The learner's π_θ is ``softmax(logits / temperature)``: the rollout's sampling temperature (see RunSpec)."""

    def __post_init__(self) -> None:
        if self.num_epochs < 1 or self.minibatch_size < 1:
            raise ValueError(
                f"num_epochs and minibatch_size must be >= 1, got {self.num_epochs}, {self.minibatch_size}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        check_temperature(self.temperature, training=True)
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown loss aggregation {self.aggregation!r}; choose one of: {', '.join(AGGREGATIONS)}")
        if self.aggregation == "seq-mean-token-sum-norm" and not (self.norm_constant and self.norm_constant > 0):
            raise ValueError("seq-mean-token-sum-norm needs norm_constant > 0 (e.g. the max generation length)")


@dataclass(frozen=True)
class CalibrationSettings:
    """Band calibration during training (:func:`~dppo_oat.trust_region.band_search.calibrate`): the trust region's
    band is set on the first RL step's rollout batch (and again every ``every`` steps, on that step's batch:
    :class:`~dppo_oat.trust_region.held_band.HeldBand`; None: once) to block ``target`` of its A ≠ 0 tokens (or
    sequences: ``unit``) or as many as the preset ``like`` blocks there; ``band``: which band moves where a rule has
    two (:func:`~dppo_oat.trust_region.band_search.band_choices`; None: its default)."""

    target: float | None = None
    like: str | None = None
    unit: str = "token"
    band: str | None = None
    every: int | None = None

    def __post_init__(self) -> None:
        if (self.target is None) == (self.like is None):
            raise ValueError("calibration takes a target fraction or a preset to match: give one of them")
        if self.target is not None:
            check_target(self.target)
        if self.like is not None and self.like not in PRESETS:
            raise ValueError(f"unknown trust-region preset {self.like!r} to match; choose one of: {', '.join(PRESETS)}")
        if self.unit not in UNITS:
            raise ValueError(f"unknown calibration unit {self.unit!r}; choose one of: {', '.join(UNITS)}")
        if self.every is not None and (isinstance(self.every, bool) or not isinstance(self.every, int)
                                       or self.every < 1):
            raise ValueError(f"the band is set again every N >= 1 RL steps, got {self.every!r}")

    @property
    def reference(self) -> TrustRegion | None:
        """The trust region whose blocked fraction is the target (``like``), or None."""
        return None if self.like is None else TrustRegion.preset(self.like)

    def check_serves(self, tr: TrustRegion) -> None:
        """``tr`` has the band asked for, and the batch its update observes serves the reference: π_θ' only where
        ``tr`` recomputes it, a top-K divergence only ``tr``'s own."""
        band_of(tr, self.band)
        if self.reference is not None:
            own = {RULE_TABLE[tr.rule].divergence} if tr.uses_topk else set()
            check_batch_serves(self.reference, recomputed=tr.needs_recompute, topk=False, divergences=own)


@dataclass(frozen=True)
class RunSpec:
    """Everything a run's rollout and update need to know, built once per run by its engine."""

    trust_region: TrustRegion
    rollout: RolloutSettings
    sampling: SamplingSettings
    eval_rollout: RolloutSettings
    eval_sampling: SamplingSettings
    advantages: AdvantageSettings
    update: UpdateSettings
    calibration: CalibrationSettings | None = None
    """Band calibration on the first RL step (None: the trust region's band as given)."""

    def __post_init__(self) -> None:
        check_same_distribution(self.sampling, self.update)
        wanted = topk_logprobs_of(self.trust_region)
        if self.sampling.top_k_logprobs != wanted:
            raise ValueError(f"trust region {self.trust_region.name!r} needs top_k_logprobs={wanted}, "
                             f"the sampling settings ask for {self.sampling.top_k_logprobs}")
        if self.calibration is not None:
            self.calibration.check_serves(self.trust_region)


def check_same_distribution(sampling: SamplingSettings, update: UpdateSettings) -> None:
    """The trust region bounds the divergence between π_θ and μ, the distribution the rollout sampled from: the
    learner's π_θ must be that same distribution. Temperature is applied in the learner too (eq:dppo_obj's μ
    is the tempered policy); a top-p / top-k cut renormalises μ over a support the learner does not know, so
    training refuses it (evaluation may use it)."""
    check_temperature(sampling.temperature, training=True)
    if sampling.truncates:
        raise ValueError(
            f"training with top-p/top-k sampling (top_p={sampling.top_p}, top_k={sampling.top_k}) would compare π_θ "
            "over the whole vocabulary with μ renormalised over the kept tokens, so the trust region would be wrong: "
            "train with top_p 1 and top_k -1 (evaluation may use them)")
    if update.temperature != sampling.temperature:
        raise ValueError(f"the learner's temperature {update.temperature} differs from the sampling temperature "
                         f"{sampling.temperature}: π_θ and μ would be different distributions")


def without_markup(text: str) -> str:
    """A docstring as a flag's help shows it: no Sphinx roles, no reST double backticks."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text).replace("``", "")


def preset_help() -> str:
    """``--trust-region``'s help (its choices name every preset of :data:`~dppo_oat.trust_region.PRESETS`)."""
    return "Trust-region preset (docs/trust-region.md: each with its source)."


def override_help(name: str, doc: str) -> str:
    """The help of ``--tr-<name>``: the field's docstring, and the presets that read it when they are few (the
    flags' section, :data:`OVERRIDES_ABOUT`, says that each overrides the preset's number)."""
    readers = [preset for preset in PRESETS if name in TrustRegion.preset(preset).fields_read]
    named = f" Read by {', '.join(readers)}." if len(readers) <= MAX_NAMED_READERS else ""
    text = without_markup(doc)
    if text[:1].isascii():  # "divergence threshold δ" → "Divergence …", but "τ of the penalty" stays as it is
        text = text[:1].upper() + text[1:]
    return f"{text}{named}"


def trust_region_override_fields() -> list[tuple]:
    """``tr_<field>`` for every field of :data:`TRUST_REGION_OVERRIDES`, as ``make_dataclass`` takes them: optional,
    an integer or a real number (:data:`~dppo_oat.trust_region.config.INTEGER_FIELDS`), default None (not shown:
    :data:`OVERRIDES_ABOUT` says it for them all), its help from the field's docstring."""
    docs = field_docstrings(TrustRegion)
    return [(f"tr_{name}", Annotated[(int if name in INTEGER_FIELDS else float) | None,
                                     tyro.conf.arg(help=override_help(name, docs[name]), help_behavior_hint="")],
             dataclasses.field(default=None)) for name in TRUST_REGION_OVERRIDES]


@dataclass
class TrustRegionChoice:
    """The preset (the first of :class:`DPPOFlags`)."""

    trust_region: Annotated[PresetName, tyro.conf.arg(help=preset_help())] = "dppo_binary_tv"


TrustRegionFlags = dataclasses.make_dataclass("TrustRegionFlags", trust_region_override_fields(),
                                              bases=(TrustRegionChoice,))
"""The preset and one override flag per numeric :class:`TrustRegion` field, generated from the fields, so a field
added to :class:`TrustRegion` is a flag with its docstring as help."""


@dataclass
class DPPOFlags(TrustRegionFlags):
    """The command-line flags DPPO adds to an engine's own, declared once for the local and oat engines (tyro reads the
    docstrings below as help; the trust region's, :class:`TrustRegionFlags`, are generated from its fields). Engines
    override a default by declaring the field again."""

    env_ids: tuple[str, ...] = ("game:Sudoku-v0-easy",)
    """Gem env ids, assigned to groups round-robin."""
    env_module: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """A module (my_lab.envs) or file (path/to/my_envs.py) to import first, so that --env-ids can name the envs (and
    oracles) it registers (envs/README.md)."""
    prompt_template: str | None = None
    """How an observation becomes a prompt: qwen3_game, qwen3_general, plain or chat (see each engine's default)."""
    wrappers: tuple[str, ...] = ()
    """Gem observation wrappers by name, applied to every env (e.g. concat: the episode's history in each prompt)."""
    max_turns: int | None = None
    """Turn limit on top of the env's own. None: the env's own, else 100 (a warning says so when it binds)."""
    advantage_mode: Literal[ADVANTAGE_MODES] = "drgrpo"  # type: ignore[valid-type]
    """drgrpo (the paper's), grpo, rloo (group baselines of per-turn returns) or rebn (Gem's norm_return)."""
    turn_baseline: bool = False
    """Group baseline per turn index: compare turn t only with turn t of the group's other episodes."""
    loss_aggregation: Literal[AGGREGATIONS] | None = None  # type: ignore[valid-type]
    """How per-token losses are aggregated (see each engine's default)."""
    token_samples: int = flag(DEFAULT_TOKEN_SAMPLES, resumable=True, setting=False)
    """Response tokens per RL step written to tokens.jsonl for the clipped-token analysis (half of them tokens
    some rule blocked). 0: none."""
    token_export: Literal[TOKEN_EXPORT_MODES] = flag("none", resumable=True, setting=False)  # type: ignore[valid-type]
    """all: every trained token of each RL step (ids, mask, A, μ, π, ratio, entropy, masked sides) in
    token_exports/step_<step>.jsonl; none: nothing."""

    def check_logging(self) -> None:
        """The flags no settings class validates (one line each, before any model loads)."""
        if self.token_samples < 0:
            raise ValueError(f"--token-samples must be >= 0 (0: no tokens.jsonl), got {self.token_samples}")

    def build_trust_region(self, also_read: Iterable[str] = ()) -> TrustRegion:
        """The preset with the ``tr_*`` overrides that are set (the one mapping from flags to a trust region); an
        override that neither the preset's rule nor the engine (``also_read``, e.g. the local engine's divergence
        probe reads δ and K) ever reads (``--trust-region ppo --tr-delta 0.2``) is refused, not recorded, and so is
        one whose value does not fit float32 (``--tr-tau-pos 1e300``,
        :func:`~dppo_oat.ranges.check_float32`)."""
        overrides = {name: getattr(self, f"tr_{name}") for name in TRUST_REGION_OVERRIDES}
        overrides = {name: value for name, value in overrides.items() if value is not None}
        for name, value in overrides.items():  # TrustRegion's own checks take ranges, not float32's limits
            check_float32(f"--tr-{name.replace('_', '-')}", value)
        tr = TrustRegion.preset(self.trust_region).replace(**overrides)  # refused below where no rule reads them
        read = tr.fields_read | set(also_read)
        unread = [name for name in overrides if name not in read]
        if unread:
            flags = ", ".join(f"--tr-{name.replace('_', '-')}" for name in unread)
            raise ValueError(f"{flags}: not read by the trust region {self.trust_region} (it reads "
                             f"{', '.join(sorted(read))}): leave it out, or choose a preset that uses it")
        return tr

@dataclass
class CalibrationFlags:
    """The flags of band calibration while a run trains (:class:`CalibrationSettings`), for an engine that
    calibrates (the local engine's); tyro reads the docstrings below as help."""

    tr_calibrate: float | None = None
    """Set the band (δ, ε, τ_M2 or SAPO's τ) to block this fraction of the A ≠ 0 tokens of step 1's batch
    (docs/trust-region.md)."""
    tr_calibrate_like: Annotated[PresetName | None,  # type: ignore[valid-type]
                                 tyro.conf.arg(metavar="{None}|PRESET")] = None
    """Set the band (as --tr-calibrate) to block as many tokens as this preset (one of --trust-region's) blocks on
    that batch."""
    tr_calibrate_unit: Literal[UNITS] = "token"  # type: ignore[valid-type]
    """What --tr-calibrate counts: token (A ≠ 0 tokens) or sequence (responses whose every A ≠ 0 token is blocked)."""
    tr_calibrate_band: Literal[BAND_NAMES] | None = None  # type: ignore[valid-type]
    """Which band moves where a rule has two (TRM, opsm, VACO): delta, clip_range or both. None: δ."""
    tr_calibrate_every: int | None = None
    """Set the band again every N RL steps on that step's batch (1: hold the blocked share). None: once."""

    def calibration_settings(self, tr: TrustRegion) -> CalibrationSettings | None:
        """The band calibration the flags ask for on trust region ``tr`` (None: none), validated; an error names the
        flags."""
        names = [name for name in CALIBRATION_FLAGS if getattr(self, name) not in (None, "token")]
        if not names:
            return None
        try:
            settings = CalibrationSettings(self.tr_calibrate, self.tr_calibrate_like, self.tr_calibrate_unit,
                                           self.tr_calibrate_band, self.tr_calibrate_every)
            settings.check_serves(tr)
        except ValueError as error:
            raise ValueError(f"{', '.join('--' + name.replace('_', '-') for name in names)}: {error}") from None
        return settings


def topk_logprobs_of(trust_region: TrustRegion) -> int:
    """How many of μ's top log-probs the rollout must return per token for this trust region (its K, or 0)."""
    return trust_region.k if trust_region.uses_topk else 0


def split_ids(ids: tuple[str, ...]) -> tuple[str, ...]:
    """``ids`` without blanks, split at commas (``("a,b", "c")`` → ``("a", "b", "c")``)."""
    return tuple(part.strip() for item in ids for part in str(item).split(",") if part.strip())
