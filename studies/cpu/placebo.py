"""The mechanism's placebos. v5's is sign-matched: it blocks a random set of tokens of one half of a μ-anchored
mask, at the rate int4's mask blocked that half, with an fp32 sampler. v6's is cell-matched (below).

Under the int4 copy at one gradient step per rollout, DPPO-Binary-KL's mask blocked tokens in two cells only: its
A<0 half (Â < 0 where μ > π) and its A>0 half (Â > 0 where μ < π). The ``placebo`` experiment asks whether blocking
that many tokens of one half costs learning by itself, whichever tokens they are: with an fp32 sampler (μ is the
learner's own policy, so no token is over- or under-weighted by an engine), :func:`placebo_keep` blocks, in every
loss call, a uniformly random set of the tokens with the half's sign of Â in each μ bucket
(:data:`~dppo_oat.trust_region.metrics.MU_BUCKETS`), as many as int4's mask blocked there on average
(:data:`PLACEBO_RATES`, a share of the call's A ≠ 0 tokens). With an fp32 sampler μ and π differ only by rounding,
so the side of μ − π picks nothing and the placebo ignores it.

v6 (``placebo_cells``) matches int4's mask cell by cell, under the int4 sampler itself: :func:`int4_cells_keep`
blocks random tokens of int4's own two cells (Â < 0 where μ > π, Â > 0 where μ < π) at the rates int4's mask blocked
each, per μ bucket; its control :func:`other_cells_keep` blocks the other two cells (Â < 0 where μ < π, Â > 0
where μ > π) at the same rates. π is the loss call's π_θ, which at one step per rollout is the learner's weights
that the int4 copy was made from, as for the mask.

The rules and their presets (``placebo_neg``, ``placebo_pos``, ``placebo_cells``, ``placebo_cells_other``) are the
study's own, not the package's: they are registered by :func:`register` in the training process this module starts
(``python -m studies.cpu.placebo`` takes ``python -m dppo_oat.train``'s flags), never on import, so nothing else that
imports the study sees them.
"""

from __future__ import annotations

import hashlib
import math
import sys

import torch

PLACEBO_RULE = "placebo_cell"
"""The rule's name in :data:`~dppo_oat.trust_region.registry.RULE_TABLE` (in the training process only)."""
PLACEBO_PRESETS = {"placebo_neg": "negative", "placebo_pos": "positive"}
"""The study's two placebo presets and the half each blocks (their ``mask_side``)."""
PLACEBO_LABELS = {"placebo_neg": "Placebo A<0 (random, int4's rate)",
                  "placebo_pos": "Placebo A>0 (random, int4's rate)",
                  "placebo_cells": "Placebo in int4's cells (random, int4's rates)",
                  "placebo_cells_other": "Placebo in the other cells (random, int4's rates)"}
"""Their names in the report."""
CELL_PLACEBO_RULES = {"placebo_cells": "placebo_int4_cells", "placebo_cells_other": "placebo_other_cells"}
"""v6's two cell placebos (presets) and their rules (:func:`int4_cells_keep`, :func:`other_cells_keep`)."""
STUDY_PRESETS = (*PLACEBO_PRESETS, *CELL_PLACEBO_RULES)
"""Every preset this module registers: a run of one is played by ``python -m studies.cpu.placebo``."""
PLACEBO_RATES = {
    "negative": {"mu_lt_0.1": 0.0000434, "mu_0.1_0.5": 0.002418, "mu_ge_0.5": 0.007889},
    "positive": {"mu_lt_0.1": 0.0000796, "mu_0.1_0.5": 0.001534, "mu_ge_0.5": 0.002486},
}
"""Per half and μ bucket, the share of the A ≠ 0 tokens DPPO-Binary-KL's mask blocked there under the int4 copy
(``mask_cell/neg_adv_mu_above_*`` and ``mask_cell/pos_adv_mu_below_*`` of its ``mech-int4`` runs, means over their
50 steps and 8 seeds; 1.035% and 0.410% over the buckets), measured before the placebo's runs
(``tests/test_cpu_study.py`` recomputes them from the packed runs)."""


def call_seed(x) -> int:
    """A seed drawn from one loss call's own numbers (log μ and Â of its tokens): the same call gives the same
    placebo, so a resumed run repeats it, and every call draws anew."""
    digest = hashlib.blake2b(digest_size=8)
    for tensor in (x.behavior_logp, x.advantages, x.response):
        digest.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") & (2**63 - 1)


def stochastic_count(expected: float, generator: torch.Generator) -> int:
    """``expected`` rounded down, plus one with probability its fractional part: an unbiased whole count."""
    whole = math.floor(expected)
    return whole + int(torch.rand((), generator=generator).item() < expected - whole)


def block_at_rates(x, cells, generator: torch.Generator) -> torch.Tensor:
    """M_t that blocks, in each of ``cells`` (``(tokens, half)``: a ``[B, T]`` mask of the call's tokens and the
    half of :data:`PLACEBO_RATES` whose rates it takes) and each μ bucket, a uniformly random set of the response
    tokens there, as many as the rate × the call's A ≠ 0 tokens (rounded stochastically; all of them when there are
    fewer)."""
    from dppo_oat.trust_region.metrics import MU_BUCKETS

    active = int((x.response & (x.advantages != 0)).sum())
    mu = x.behavior_logp.exp()
    keep = torch.ones_like(x.response, dtype=torch.bool)
    for tokens, half in cells:
        for low, high, bucket in MU_BUCKETS:
            cell = (x.response & tokens & (mu >= low) & (mu < high)).flatten().nonzero().squeeze(-1)
            count = min(len(cell), stochastic_count(PLACEBO_RATES[half][bucket] * active, generator))
            chosen = cell[torch.randperm(len(cell), generator=generator)[:count]]
            keep.view(-1)[chosen.to(keep.device)] = False
    return keep


def placebo_keep(x, tr) -> torch.Tensor:
    """M_t of the v5 placebo: True but on a uniformly random set of the response tokens with Â of
    ``tr.mask_side``'s sign, in each μ bucket as many as :data:`PLACEBO_RATES` × the call's A ≠ 0 tokens, drawn
    from :func:`call_seed` (:func:`block_at_rates`)."""
    if tr.mask_side not in PLACEBO_RATES:
        raise ValueError(f"the placebo blocks one half: mask_side negative or positive, got {tr.mask_side!r}")
    signed = x.advantages < 0 if tr.mask_side == "negative" else x.advantages > 0
    return block_at_rates(x, [(signed, tr.mask_side)], torch.Generator().manual_seed(call_seed(x)))


def int4_cells(x, own: bool) -> list[tuple[torch.Tensor, str]]:
    """The two cells of the sign of Â × the side of μ − π that int4's mask blocked (``own``: Â < 0 where μ > π at
    the A<0 half's rates, Â > 0 where μ < π at the A>0 half's) or the other two at the same rates (Â < 0 where
    μ < π, Â > 0 where μ > π); tokens where μ = π are in none."""
    above, below = x.behavior_logp > x.logp, x.behavior_logp < x.logp
    negative, positive = x.advantages < 0, x.advantages > 0
    if own:
        return [(negative & above, "negative"), (positive & below, "positive")]
    return [(negative & below, "negative"), (positive & above, "positive")]


def int4_cells_keep(x, tr) -> torch.Tensor:
    """M_t of ``placebo_cells``: random tokens of int4's own two cells at its mask's rates (:func:`int4_cells`)."""
    return block_at_rates(x, int4_cells(x, own=True), torch.Generator().manual_seed(call_seed(x)))


def other_cells_keep(x, tr) -> torch.Tensor:
    """M_t of ``placebo_cells_other``: random tokens of the other two cells at the same rates (its control)."""
    return block_at_rates(x, int4_cells(x, own=False), torch.Generator().manual_seed(call_seed(x)))


FREEZES_PRESET_CHOICES = "dppo_oat.settings.spec"
"""The module whose import reads the presets into the command line's ``--trust-region`` choices (its
``PresetName``): a preset added after it is imported is not one of them."""


def register() -> None:
    """Add the placebo rule and its two presets to the package's tables, in this process, before
    :data:`FREEZES_PRESET_CHOICES` is imported (else :class:`RuntimeError`: the command line would refuse them)."""
    from dppo_oat.trust_region.presets import PRESETS, Preset
    from dppo_oat.trust_region.registry import RULE_TABLE, register_rule

    if FREEZES_PRESET_CHOICES in sys.modules:
        raise RuntimeError(f"register the placebo before {FREEZES_PRESET_CHOICES} is imported: its --trust-region "
                           "choices are fixed then")
    if PLACEBO_RULE not in RULE_TABLE:
        register_rule(PLACEBO_RULE, divergence="binary_kl", reads_mask_side=True, couples_tokens=True,
                      reads_batch=True)(placebo_keep)
    for rule, keep in zip(CELL_PLACEBO_RULES.values(), (int4_cells_keep, other_cells_keep), strict=True):
        if rule not in RULE_TABLE:
            register_rule(rule, divergence="binary_kl", couples_tokens=True, reads_batch=True)(keep)
    for name, side in PLACEBO_PRESETS.items():
        PRESETS[name] = Preset({"rule": PLACEBO_RULE, "mask_side": side}, "the CPU study's sign-matched placebo "
                               "(studies/cpu/placebo.py)", label=PLACEBO_LABELS[name],
                               blocks=f"random Â {'<' if side == 'negative' else '>'} 0 tokens at int4's rate per μ "
                                      "bucket")
    for name, rule in CELL_PLACEBO_RULES.items():
        cells = "int4's two cells" if name == "placebo_cells" else "the two cells int4's mask left"
        PRESETS[name] = Preset({"rule": rule}, "the CPU study's cell-matched placebo (studies/cpu/placebo.py)",
                               label=PLACEBO_LABELS[name], blocks=f"random tokens of {cells} at int4's rates per μ "
                                                                  "bucket")


def main(argv=None) -> None:
    """``python -m dppo_oat.train`` with the placebo presets registered."""
    import dppo_oat.trust_region  # noqa: F401  (the package's rules first, then the study's)

    register()
    from dppo_oat.train import main as train_main

    train_main(argv)


if __name__ == "__main__":
    main()
