"""π against μ, per token: log-probabilities from logits, the divergences between the two policies, and the probe
that compares the divergences' estimates on real batches (sec:method_large_vocab).

- :mod:`~dppo_oat.divergence.estimates`: binary ≤ top-K ≤ exact TV and KL, re-exported here: the trust region reads
  them as ``dppo_oat.divergence.<name>``, where a test may replace one;
- :mod:`~dppo_oat.divergence.logprobs`: log-probs, entropies and μ's top-K set from logits, chunked over tokens;
- :mod:`~dppo_oat.divergence.probe`: ``--probe-every``'s binary vs top-K vs exact divergence on a step's batch.
"""

from dppo_oat.divergence.estimates import (  # noqa: F401  (re-exported: the package's names)
    EXACT_CHUNK_ELEMENTS,
    OTHER_BUCKET_FLOOR,
    binary_kl,
    binary_tv,
    exact_kl,
    exact_tv,
    log1mexp,
    topk_kl,
    topk_tv,
)
