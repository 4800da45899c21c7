"""Benchmark of the trust-region core; prints one JSON object.

- ``binary_vs_ppo`` / ``topk_vs_ppo``: median time of ``policy_loss`` (forward, with its metrics) under
  ``dppo_binary_tv`` / ``dppo_topk_tv`` divided by ``ppo``, at B=64, T=4096, K=20, interleaved in one process.
  Targets: ≤ 1.05 and ≤ 1.3.
- ``chunked_peak_mem_ratio``: extra peak memory of a naive full-vocabulary TV (two [N, V] log-softmaxes) divided by
  the chunked :func:`dppo_oat.divergence.exact_tv`, V = 151,936. Measured on the GPU (``max_memory_allocated``) when
  there is one, else as peak RSS growth of a fresh subprocess. Target: ≥ 10.

Usage: ``python scripts/bench/trust_region.py [--repeats 15] [--tokens 4096]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from dppo_oat.divergence.logprobs import topk_of_logprobs
from dppo_oat.trust_region import TopK, TrustRegion, policy_loss

VOCAB = 151_936


def make_batch(b: int, t: int, k: int, device: str):
    gen = torch.Generator(device="cpu").manual_seed(0)
    mu = torch.empty(b, t).uniform_(-6, -1e-3, generator=gen)
    logp = (mu + 0.1 * torch.randn(b, t, generator=gen)).clamp(max=-1e-4)
    adv = torch.randn(b, 1, generator=gen)
    mask = torch.rand(b, t, generator=gen) > 0.1
    # a top-K set of K+1 slots with plausible log-probs (sampled token outside the top K about half the time)
    top_mu = torch.randn(b, t, k, generator=gen).log_softmax(-1) - 0.01
    ids, top_mu = topk_of_logprobs(torch.cat([top_mu, mu.unsqueeze(-1)], -1), torch.full((b, t), k), k)
    topk = TopK(ids=ids, behavior_logp=top_mu, logp=top_mu + 0.05, valid=ids >= 0)

    def move(x):
        return x.to(device)

    topk = TopK(move(topk.ids), move(topk.behavior_logp), move(topk.logp), move(topk.valid))
    return move(logp), move(mu), move(adv), move(mask), topk


def time_policy_loss(b: int, t: int, k: int, repeats: int, device: str) -> dict:
    logp, mu, adv, mask, topk = make_batch(b, t, k, device)
    presets = {name: TrustRegion.preset(name) for name in ("ppo", "dppo_binary_tv", "dppo_topk_tv")}
    times = {name: [] for name in presets}
    for i in range(repeats + 2):  # interleaved; the first two rounds are warm-up
        for name, tr in presets.items():
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            policy_loss(logp, mu, adv, mask, tr, topk=topk if tr.uses_topk else None)
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "binary_vs_ppo": med["dppo_binary_tv"] / med["ppo"],
        "topk_vs_ppo": med["dppo_topk_tv"] / med["ppo"],
        "median_seconds": med,
    }


def _memory_child(variant: str, tokens: int, device: str) -> None:
    """Run one divergence variant and print its extra peak memory in bytes (runs in a fresh process)."""
    import resource

    from dppo_oat.divergence import exact_tv

    dtype = torch.bfloat16
    mu_logits = torch.randn(tokens, VOCAB, dtype=dtype, device=device)
    logits = torch.randn(tokens, VOCAB, dtype=dtype, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if variant == "naive":
        tv = 0.5 * (mu_logits.float().softmax(-1) - logits.float().softmax(-1)).abs().sum(-1)
    else:
        tv = exact_tv(mu_logits, logits)  # default chunk: 16M elements
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert torch.isfinite(tv).all()
    print(max(peak - base, 1))


def peak_memory_ratio(tokens: int, device: str) -> dict:
    extra = {}
    for variant in ("naive", "chunked"):
        cmd = [sys.executable, __file__, "--memory-child", variant, "--tokens", str(tokens), "--device", device]
        result = subprocess.run(cmd, capture_output=True, text=True, check=True)
        extra[variant] = int(result.stdout.strip().splitlines()[-1])
    return {
        "chunked_peak_mem_ratio": extra["naive"] / extra["chunked"],
        "peak_extra_bytes": extra,
        "memory_tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls (the median is reported)")
    parser.add_argument("--batch", type=int, default=64, help="sequences")
    parser.add_argument("--length", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--k", type=int, default=20, help="K of the top-K divergence")
    parser.add_argument("--tokens", type=int, default=4096, help="N of the memory benchmark")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where it runs (default: cuda when available)")
    parser.add_argument("--memory-child", choices=("naive", "chunked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        _memory_child(args.memory_child, args.tokens, args.device)
        return
    report = {"device": args.device, "batch": args.batch, "length": args.length, "k": args.k}
    report.update(time_policy_loss(args.batch, args.length, args.k, args.repeats, args.device))
    report.update(peak_memory_ratio(args.tokens, args.device))
    report["targets"] = {"binary_vs_ppo": "<= 1.05", "topk_vs_ppo": "<= 1.3", "chunked_peak_mem_ratio": ">= 10"}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
