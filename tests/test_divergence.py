"""Divergence estimates: closed forms, and binary ≤ top-K ≤ exact (app:divergence_lower_bounds) as properties."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dppo_oat import divergence as div
from dppo_oat.divergence.logprobs import entropy_chunked, gather_logprobs_chunked, topk_of_logprobs

TOL = 1e-9
"""The ordering is a mathematical property: it is checked in fp64 (the divergence functions keep fp64 inputs)."""
FP32_TOL = {"tv": 1e-5, "kl": 1e-2}
"""In fp32 (how the trust region runs) the top-K 'other' bucket is known to ~1e-7 absolute; when π's tail is ~1e-6
and μ's is not, its log (in the KL) is off by a few percent. TV takes no log and stays within 1e-5."""


@st.composite
def distribution_pairs(draw):
    """Two distributions over a small vocabulary, with mass spread, peaked near 1, or with tiny entries."""
    vocab = draw(st.integers(2, 40))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0, 20.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    mu_logits = rng.normal(size=vocab) * scale
    shift = rng.normal(size=vocab) * draw(st.sampled_from([0.0, 0.01, 0.5, 3.0]))
    if draw(st.booleans()):  # push one entry toward probability 1 (within ~1e-7 at scale 20)
        mu_logits[rng.integers(vocab)] += 20.0
    sampled = int(rng.integers(vocab))
    k = draw(st.integers(1, vocab))
    mu = torch.tensor(mu_logits, dtype=torch.float64).log_softmax(-1)
    pi = torch.tensor(mu_logits + shift, dtype=torch.float64).log_softmax(-1)
    return mu, pi, sampled, k


def three_estimates(mu, pi, sampled, k, kind, dtype=torch.float64):
    mu, pi = mu.to(dtype), pi.to(dtype)
    ids, mu_k = topk_of_logprobs(mu, torch.tensor(sampled), k)
    pi_k = torch.where(ids >= 0, pi.gather(-1, ids.clamp(min=0)), -math.inf)
    valid = ids >= 0
    if kind == "tv":
        binary = div.binary_tv(mu[sampled], pi[sampled])
        topk = div.topk_tv(mu_k, pi_k, valid)
        exact = div.exact_tv(mu.unsqueeze(0), pi.unsqueeze(0))[0]
    else:
        binary = div.binary_kl(mu[sampled], pi[sampled])
        topk = div.topk_kl(mu_k, pi_k, valid)
        exact = div.exact_kl(mu.unsqueeze(0), pi.unsqueeze(0))[0]
    return binary.item(), topk.item(), exact.item()


@settings(max_examples=300, deadline=None)
@given(distribution_pairs())
def test_tv_binary_le_topk_le_exact(pair):
    binary, topk, exact = three_estimates(*pair, "tv")
    assert 0 <= binary <= topk + TOL and topk <= exact + TOL
    assert exact <= 1 + TOL


@settings(max_examples=300, deadline=None)
@given(distribution_pairs())
def test_kl_binary_le_topk_le_exact(pair):
    binary, topk, exact = three_estimates(*pair, "kl")
    assert 0 <= binary <= topk + TOL * max(1, topk) and topk <= exact + TOL * max(1, exact)


@settings(max_examples=100, deadline=None)
@given(distribution_pairs())
def test_topk_is_exact_when_the_set_covers_the_vocabulary(pair):
    mu, pi, sampled, _ = pair
    for kind in ("tv", "kl"):
        _, topk, exact = three_estimates(mu, pi, sampled, mu.shape[-1], kind)
        assert topk == pytest.approx(exact, abs=1e-9, rel=1e-7)


@settings(max_examples=200, deadline=None)
@given(distribution_pairs())
def test_fp32_estimates_stay_close_to_fp64(pair):
    for kind in ("tv", "kl"):
        exact64 = three_estimates(*pair, kind)
        got32 = three_estimates(*pair, kind, dtype=torch.float32)
        assert all(math.isfinite(x) and x >= 0 for x in got32)
        assert got32 == pytest.approx(exact64, abs=FP32_TOL[kind], rel=1e-3)


def test_binary_closed_forms():
    mu, pi = torch.tensor(0.99).log(), torch.tensor(0.80).log()
    assert div.binary_tv(mu, pi).item() == pytest.approx(0.19, abs=1e-6)
    kl = 0.99 * math.log(0.99 / 0.8) + 0.01 * math.log(0.01 / 0.2)
    assert div.binary_kl(mu, pi).item() == pytest.approx(kl, rel=1e-5)


def test_topk_tv_by_hand():
    # μ = (0.5, 0.3, 0.2), π = (0.4, 0.4, 0.2); K = 1, sampled token 1: A' = {0, 1}, other = {2}
    mu = torch.tensor([0.5, 0.3, 0.2]).log()
    pi = torch.tensor([0.4, 0.4, 0.2]).log()
    ids, mu_k = topk_of_logprobs(mu, torch.tensor(1), 1)
    assert ids.tolist() == [0, 1]  # the paper's set: TopK(μ, 1) ∪ {a_t} has K + 1 members
    tv = div.topk_tv(mu_k, pi[ids], ids >= 0)
    assert tv.item() == pytest.approx(0.5 * (0.1 + 0.1 + 0.0), abs=1e-6)
    ids_inside, _ = topk_of_logprobs(mu, torch.tensor(0), 1)
    assert ids_inside.tolist() == [0, -1]  # a_t already in the top K: the extra slot is unused


def test_binary_kl_is_finite_at_the_edges():
    edges = torch.tensor([-60.0, -20.0, -1e-7, 0.0, math.log1p(-1e-7)])
    mu, pi = torch.meshgrid(edges, edges, indexing="ij")
    kl = div.binary_kl(mu, pi)
    assert torch.isfinite(kl).all() and (kl >= 0).all()
    assert torch.isfinite(div.binary_tv(mu, pi)).all()


def test_exact_divergences_are_chunk_invariant():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 17, 50, generator=gen), torch.randn(3, 17, 50, generator=gen)
    for fn in (div.exact_tv, div.exact_kl):
        torch.testing.assert_close(fn(a, b, chunk_size=5), fn(a, b, chunk_size=10_000))
    full = a.log_softmax(-1)
    torch.testing.assert_close(div.exact_kl(a, b), (full.exp() * (full - b.log_softmax(-1))).sum(-1))


def test_gather_logprobs_chunked_matches_log_softmax_with_gradient():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 9, 31, generator=gen, requires_grad=True)
    ids = torch.randint(31, (2, 9, 4), generator=gen)
    ids[0, 0, -1] = -1
    got = gather_logprobs_chunked(logits, ids, chunk_size=4)
    ref = logits.log_softmax(-1).gather(-1, ids.clamp(min=0))
    assert got[0, 0, -1] == -math.inf
    torch.testing.assert_close(got[ids >= 0], ref[ids >= 0])
    single = gather_logprobs_chunked(logits, ids[..., 0], chunk_size=3)
    torch.testing.assert_close(single, ref[..., 0])
    single.sum().backward()
    ref_grad = torch.autograd.grad(logits.log_softmax(-1).gather(-1, ids[..., :1]).sum(), logits)[0]
    torch.testing.assert_close(logits.grad, ref_grad)


def test_entropy_chunked():
    logits = torch.randn(4, 6, 13)
    p = logits.softmax(-1)
    torch.testing.assert_close(entropy_chunked(logits, chunk_size=5), -(p * p.log()).sum(-1))
