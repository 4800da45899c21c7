r"""Divergences between the behavior policy μ and the trained policy π, per token (sec:method_large_vocab).

Three estimates of the same quantity, each a lower bound of the next (app:divergence_lower_bounds):
binary (eq:binary_tv, eq:binary_kl) ≤ top-K (eq:topk_tv, eq:topk_kl) ≤ exact (full vocabulary).
All of them take log-probabilities and compute in fp32 (fp64 inputs stay fp64).

The binary ones compare the Bernoulli distributions (a_t, not a_t), the top-K ones the distributions over
A''_t = TopK(μ, K) ∪ {a_t} and one bucket for every other token:

$$
D^{\mathrm{TV}}_{\mathrm{bin}} = \big|\mu(a_t) - \pi(a_t)\big|, \qquad
D^{\mathrm{KL}}_{\mathrm{bin}} = \mu(a_t) \log \frac{\mu(a_t)}{\pi(a_t)}
    + \big(1 - \mu(a_t)\big) \log \frac{1 - \mu(a_t)}{1 - \pi(a_t)}
$$

$$
D^{\mathrm{TV}}_{\mathrm{top}K} = \frac{1}{2} \sum_{a \in A^{\prime\prime}_t} \big|\mu(a) - \pi(a)\big|, \qquad
D^{\mathrm{KL}}_{\mathrm{top}K} = \sum_{a \in A^{\prime\prime}_t} \mu(a) \log \frac{\mu(a)}{\pi(a)}
$$
"""

from __future__ import annotations

import math

import torch

from dppo_oat.divergence.logprobs import _row_chunks

OTHER_BUCKET_FLOOR = 1e-12
"""Lower clamp of the 'other' bucket mass of the top-K approximation (it is 1 − Σ p and may round below 0)."""



def _upcast(x: torch.Tensor) -> torch.Tensor:
    """At least fp32: bf16/fp16 log-probs are upcast, fp64 ones are kept."""
    return x if x.dtype == torch.float64 else x.float()


def _below_zero(logp: torch.Tensor) -> torch.Tensor:
    """Clamp log-probs to ``−tiny`` so that ``log(1 − p)`` is finite even for p = 1 (the KL is then large)."""
    return logp.clamp(max=-torch.finfo(logp.dtype).tiny)


def log1mexp(logp: torch.Tensor) -> torch.Tensor:
    """``log(1 − exp(logp))`` for ``logp < 0``, accurate for p near 0 and near 1 (Mächler, 2012)."""
    logp = _below_zero(logp)
    return torch.where(logp > -0.6931471805599453, torch.log(-torch.expm1(logp)), torch.log1p(-torch.exp(logp)))


def binary_tv(behavior_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """eq:binary_tv: ``|μ(a_t) − π(a_t)|``, the TV of the Bernoulli (a_t, not a_t) distributions."""
    return (_upcast(behavior_logp).exp() - _upcast(logp).exp()).abs()


def binary_kl(behavior_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """eq:binary_kl: KL of Bernoulli(μ(a_t)) to Bernoulli(π(a_t)), in log space for p near 0 and 1."""
    mu_logp = _below_zero(_upcast(behavior_logp))
    pi_logp = _below_zero(_upcast(logp))
    mu = mu_logp.exp()
    kl = mu * (mu_logp - pi_logp) + (1 - mu) * (log1mexp(mu_logp) - log1mexp(pi_logp))
    return kl.clamp(min=0.0)


def _masked_probs(logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``exp(logp)`` on valid slots, 0 elsewhere (in place on a fresh fp32 buffer: top-K tensors are large)."""
    return _upcast(logp).masked_fill(~valid, float("-inf")).exp_()


def _other_mass(probs: torch.Tensor) -> torch.Tensor:
    """Mass of the 'other' bucket, ``1 − Σ_{A'} p`` (clamped at :data:`OTHER_BUCKET_FLOOR`)."""
    return (1 - probs.sum(-1)).clamp_(min=OTHER_BUCKET_FLOOR)


def topk_tv(behavior_logp: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """eq:topk_tv: ``½ Σ_{a ∈ A''} |p_μ(a) − p_π(a)|`` over the top-K set plus the 'other' bucket.

    Inputs are ``[..., K']`` log-probs of μ and π at the same ids; ``valid`` marks used slots.
    """
    mu, pi = _masked_probs(behavior_logp, valid), _masked_probs(logp, valid)
    other_gap = (_other_mass(mu) - _other_mass(pi)).abs_()
    return 0.5 * (mu.sub_(pi).abs_().sum(-1) + other_gap)


def _log_other_mass(logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``log(1 − Σ_{A'} p)`` via log-sum-exp and :func:`log1mexp`: accurate even when the tail is ~1e-7, where
    ``1 − Σ p`` in fp32 would lose most digits (the KL takes its log)."""
    log_mass = torch.logsumexp(_upcast(logp).masked_fill(~valid, float("-inf")), dim=-1)
    return log1mexp(log_mass).clamp_(min=math.log(OTHER_BUCKET_FLOOR))


def topk_kl(behavior_logp: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """eq:topk_kl: ``Σ_{a ∈ A''} p_μ(a) log(p_μ(a) / p_π(a))`` over the top-K set plus the 'other' bucket."""
    mu = _masked_probs(behavior_logp, valid)
    log_ratio = (_upcast(behavior_logp) - _upcast(logp)).masked_fill_(~valid, 0.0)
    mu_log_other, pi_log_other = _log_other_mass(behavior_logp, valid), _log_other_mass(logp, valid)
    kl = mu.mul_(log_ratio).sum(-1) + mu_log_other.exp() * (mu_log_other - pi_log_other)
    return kl.clamp_(min=0.0)


EXACT_CHUNK_ELEMENTS = 1 << 24
"""Default chunk of the exact divergences: rows × vocabulary ≤ 16M elements (64 MB per fp32 temporary)."""


def _exact_divergence(behavior_logits, logits, chunk_size, per_chunk):
    if behavior_logits.shape != logits.shape:
        raise ValueError(f"logit shapes differ: {tuple(behavior_logits.shape)} vs {tuple(logits.shape)}")
    chunk_size = chunk_size or max(1, EXACT_CHUNK_ELEMENTS // logits.shape[-1])
    mu_rows = behavior_logits.reshape(-1, logits.shape[-1])
    pi_rows = logits.reshape(-1, logits.shape[-1])
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out = torch.empty(mu_rows.shape[0], dtype=dtype, device=logits.device)
    for rows in _row_chunks(mu_rows.shape[0], chunk_size):
        mu_logp = torch.log_softmax(_upcast(mu_rows[rows]), dim=-1)
        pi_logp = torch.log_softmax(_upcast(pi_rows[rows]), dim=-1)
        out[rows] = per_chunk(mu_logp, pi_logp)
    return out.reshape(logits.shape[:-1])


def exact_tv(
    behavior_logits: torch.Tensor, logits: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """True ``D_TV(μ(·|s_t) ‖ π(·|s_t)) = ½ Σ_a |μ(a) − π(a)|`` over the full vocabulary, chunked over tokens
    (``chunk_size`` rows at a time; default: :data:`EXACT_CHUNK_ELEMENTS` / vocabulary)."""
    return _exact_divergence(
        behavior_logits, logits, chunk_size, lambda mu, pi: 0.5 * (mu.exp() - pi.exp()).abs().sum(-1)
    )


def exact_kl(
    behavior_logits: torch.Tensor, logits: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """True ``D_KL(μ(·|s_t) ‖ π(·|s_t))`` over the full vocabulary, chunked over tokens."""
    return _exact_divergence(behavior_logits, logits, chunk_size, _kl_of_logprobs)


def _kl_of_logprobs(mu_logp: torch.Tensor, pi_logp: torch.Tensor) -> torch.Tensor:
    mu = mu_logp.exp()
    terms = torch.where(mu > 0, mu * (mu_logp - pi_logp), 0.0)
    return terms.sum(-1).clamp(min=0.0)
