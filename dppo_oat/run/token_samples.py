"""Per-token samples of the update, for the clipped-token analysis (app:clipped_tokens, sec:training_efficiency).

Every RL step, the local and oat engines write a bounded sample of the step's response tokens to ``tokens.jsonl``: each
token decoded, with μ(a_t), π_θ(a_t) of the forward pass whose loss first used the token (the π its mask was decided on:
the first epoch's; later minibatches of a rollout batch see the policy after the earlier ones' steps), the advantage,
the entropy, the run's own keep decision and the divergence its rule thresholded, and what three reference rules would
have decided on the same token: PPO's ratio clip (ε = 0.2), GRPO-ClipHigher's (ε_low 0.2, ε_high 0.28) and
DPPO-Binary-TV (δ = 0.15, eq:binary_tv), all anchored on μ. (The rollout's turn samples the update learns from are
another thing: :mod:`dppo_oat.update_batch`.)

Only tokens with A ≠ 0 are sampled: a token with A = 0 has no gradient, so no rule can block it. Blocked tokens are
rare (a few in a thousand), so a uniform sample would hold almost none. The sample is *stratified*: up to half of
the ``per_step`` slots go to tokens that any of the four rules blocks, the rest to the other tokens; within each
stratum tokens are drawn uniformly without replacement (priority sampling: the smallest of i.i.d. uniform keys, kept
micro-batch by micro-batch, so nothing of size ``[N, T]`` is kept). Each row carries ``weight`` = tokens in its
stratum ÷ tokens sampled from it, so weighted shares estimate shares over every response token (A ≠ 0) of the step
(:func:`dppo_oat.analysis.tokens.masked_by_bucket` uses them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from dppo_oat.divergence.estimates import binary_tv
from dppo_oat.settings.spec import DEFAULT_TOKEN_SAMPLES
from dppo_oat.trust_region import (
    MAX_LOG_RATIO,
    SHADOW_CLIP_RANGES,
    PolicyLossOutput,
    divergence_keep,
    ratio_keep,
)

REFERENCE_CLIPS = {f"{preset}_masked": clip_range for preset, clip_range in SHADOW_CLIP_RANGES.items()}
"""The ratio clips every sample is also judged by, those of the shadow-mask metrics: PPO (eq:ppo-clip, ε = 0.2) and
GRPO-ClipHigher (0.2, 0.28)."""
REFERENCE_DELTA = 0.15
"""δ of the reference DPPO-Binary-TV decision (``dppo_masked``), the paper's default (eq:binary_tv)."""
FLOAT_FIELDS = ("mu", "pi", "advantage", "entropy", "divergence")
MASK_FIELDS = ("masked", *REFERENCE_CLIPS, "dppo_masked")
"""``masked`` is the run's own rule; the others are the reference rules' decisions."""


def reference_masks(logp: torch.Tensor, behavior_logp: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """What PPO's and GRPO-ClipHigher's ratio clips and DPPO-Binary-TV (δ = 0.15) block among the response tokens
    ``mask``, all anchored on μ (eq:ppo-clip, eq:dppo_obj with eq:binary_tv). Inputs detached ``[B, T]``."""
    ratio = (logp - behavior_logp).clamp(max=MAX_LOG_RATIO).exp()
    blocked = {name: mask & ~ratio_keep(ratio, advantages, low, high) for name, (low, high) in REFERENCE_CLIPS.items()}
    tv = binary_tv(behavior_logp, logp)
    blocked["dppo_masked"] = mask & ~divergence_keep(ratio, advantages, tv, REFERENCE_DELTA)
    return blocked


def token_fields(micro_rows: torch.Tensor, micro, logp: torch.Tensor, entropy: torch.Tensor | None,
                 result: PolicyLossOutput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Every response token with A ≠ 0 of one micro-batch as flat CPU columns, and which of them any rule blocked.

    ``micro_rows`` are the micro-batch's rows in the rollout batch; ``position`` counts tokens within a response.
    """
    lp, mu = logp.detach().float(), micro.behavior_logp.float()
    adv = micro.advantages.float().expand_as(lp)
    mask = micro.response_mask.bool() & (adv != 0)  # A = 0: no gradient, nothing for any rule to block
    masks = {"masked": mask & ~result.keep, **reference_masks(lp, mu, adv, mask)}
    any_blocked = torch.stack(list(masks.values())).any(0)[mask]
    columns = {
        "row": micro_rows.to(mask.device).unsqueeze(1).expand_as(mask),
        "position": micro.response_mask.long().cumsum(1) - 1,
        "token_id": micro.input_ids[:, 1: mask.shape[1] + 1],
        "mu": mu.exp(), "pi": lp.exp(), "advantage": adv,
        "entropy": entropy.float() if entropy is not None else torch.full_like(lp, math.nan),
        "divergence": result.divergence.float(), **masks,
    }
    return any_blocked.cpu(), {name: value[mask].cpu() for name, value in columns.items()}


class TokenSampler:
    """A stratified sample of one rollout batch's response tokens (see the module docstring); the update loop
    calls :meth:`observe` for every micro-batch of its first epoch, the engine then writes :meth:`rows`."""

    def __init__(self, per_step: int = DEFAULT_TOKEN_SAMPLES, *, seed: int = 0) -> None:
        if per_step < 0:
            raise ValueError(f"token samples per step must be >= 0, got {per_step}")
        self.per_step = per_step
        self.generator = torch.Generator().manual_seed(seed)
        self.strata: dict[str, dict[str, torch.Tensor]] = {}
        self.population = {"blocked": 0, "other": 0}

    def observe(self, micro_rows: torch.Tensor, micro, logp: torch.Tensor, entropy: torch.Tensor | None,
                result: PolicyLossOutput) -> None:
        """Offer one micro-batch's response tokens (π_θ from this forward pass) to the sample."""
        if self.per_step == 0:
            return
        blocked, columns = token_fields(micro_rows, micro, logp, entropy, result)
        keys = torch.rand(blocked.shape, generator=self.generator, device="cpu")  # the sample lives on the host
        for stratum, members in (("blocked", blocked), ("other", ~blocked)):
            self.population[stratum] += int(members.sum())
            offered = {name: value[members] for name, value in columns.items()}
            offered["key"] = keys[members]
            self.strata[stratum] = _smallest_keys(_concat(self.strata.get(stratum), offered), self.per_step)

    def rows(self, step: int, decode: Callable[[list[int]], list[str]],
             turns: Sequence[int] | None = None) -> list[dict]:
        """The sample as ``tokens.jsonl`` rows: half the slots (or more, when the other stratum is short) for each
        stratum, ``decode`` turning token ids into text, ``turns[row]`` the turn index of each sample."""
        sizes = _stratum_sizes(self.per_step, {s: len(c["key"]) for s, c in self.strata.items()})
        rows = []
        for stratum, size in sizes.items():
            chosen = _smallest_keys(self.strata[stratum], size)
            weight = self.population[stratum] / max(size, 1)
            texts = decode(chosen["token_id"].tolist())
            for i, text in enumerate(texts):
                rows.append(_row(step, text, chosen, i, stratum, weight, turns))
        return rows


def _row(step: int, text: str, chosen: dict, i: int, stratum: str, weight: float, turns) -> dict:
    row_index = int(chosen["row"][i])
    row = {"step": step, "token": text, "token_id": int(chosen["token_id"][i]),
           "turn": int(turns[row_index]) if turns is not None else None, "position": int(chosen["position"][i])}
    row.update({name: _rounded(float(chosen[name][i])) for name in FLOAT_FIELDS})
    row.update({name: bool(chosen[name][i]) for name in MASK_FIELDS})
    row.update(stratum=stratum, weight=round(weight, 3))
    return row


def _rounded(value: float) -> float | None:
    """6 significant digits (JSON has no NaN: a missing entropy is null)."""
    return float(f"{value:.6g}") if math.isfinite(value) else None


def _stratum_sizes(per_step: int, available: dict[str, int]) -> dict[str, int]:
    """Half of ``per_step`` for blocked tokens, the rest for the others; slots one stratum cannot fill go to the
    other."""
    blocked = min(available.get("blocked", 0), per_step // 2)
    other = min(available.get("other", 0), per_step - blocked)
    blocked = min(available.get("blocked", 0), per_step - other)
    return {name: size for name, size in (("blocked", blocked), ("other", other)) if size > 0}


def _concat(kept: dict[str, torch.Tensor] | None, offered: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if kept is None:
        return offered
    return {name: torch.cat([kept[name], offered[name]]) for name in offered}


def _smallest_keys(columns: dict[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
    """The ``size`` entries with the smallest keys: a uniform sample without replacement of everything offered."""
    if len(columns["key"]) <= size:
        return columns
    order = torch.topk(columns["key"], size, largest=False).indices
    return {name: value[order] for name, value in columns.items()}


def decode_each(tokenizer) -> Callable[[list[int]], list[str]]:
    """Token ids → their text one by one (a Hugging Face tokenizer), special tokens included, as the paper lists
    clipped tokens."""
    return lambda ids: [tokenizer.decode([token_id]) for token_id in ids]
