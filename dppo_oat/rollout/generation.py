"""The generator interface: prompt token ids + sampling settings -> completions with μ log-probs.

DPPO's mask compares π_θ with the behavior policy μ that actually sampled each token, so every generator must
report, for each generated token, log μ(a_t|s_t) *of the distribution it sampled from* and, when asked, the paper's
top-K set ``TopK(μ(·|s_t), K) ∪ {a_t}`` (sec:method_topk) with μ's log-probs on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from dppo_oat.settings.spec import SamplingSettings


@dataclass
class Completion:
    """One sampled continuation.

    ``logprobs[t]`` is log μ(token_ids[t] | prompt, token_ids[:t]) under the distribution actually sampled from.
    ``topk_ids``/``topk_logprobs`` are ``[T, K+1]`` arrays: the K most likely ids under μ, then a_t in the last slot
    when it is not among them, else :data:`TOPK_PAD_ID` (log-prob ``-inf``) there.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.logprobs)} log-probs")
        if (self.topk_ids is None) != (self.topk_logprobs is None):
            raise ValueError("topk_ids and topk_logprobs come together")
        if self.topk_ids is not None and self.topk_ids.shape[0] != len(self.token_ids):
            raise ValueError(f"top-K has {self.topk_ids.shape[0]} rows for {len(self.token_ids)} tokens")


@runtime_checkable
class Generator(Protocol):
    """Anything that samples completions for batches of tokenized prompts."""

    max_topk: int
    """Largest K for which the generator can return the top-K set."""

    def generate(self, prompts: Sequence[Sequence[int]], settings: SamplingSettings) -> list[Completion]:
        """One completion per prompt, in order."""
        ...

    def update_weights(self, state_dict: dict) -> None:
        """Load new policy weights in place (after a learner step)."""
        ...


def check_logprob_semantics(settings: SamplingSettings, *, processed_logprobs: bool, engine: str) -> None:
    """Refuse settings under which the engine's log-probs would not be those of the sampled distribution.

    Engines that report raw (pre-temperature, pre-top-p/top-k) log-probs would make the trust region compare the
    wrong distributions (vLLM 0.8.4 does this), so they must sample at temperature 1 without top-p / top-k.
    """
    if processed_logprobs or settings.is_plain:
        return
    raise ValueError(
        f"{engine} reports raw log-probs (before temperature/top-p/top-k), so μ would not be the sampling "
        f"distribution: use temperature=1, top_p=1 and top_k=-1 (got temperature={settings.temperature}, "
        f"top_p={settings.top_p}, top_k={settings.top_k})"
    )
