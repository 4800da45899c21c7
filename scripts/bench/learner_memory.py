"""The learner's LM head: today's logits path against the fused head, one DPPO micro-batch; prints one JSON object.

A stand-in model holds the last hidden states ``[B, L, H]`` as a parameter (their gradient is what the decoder would
receive) and a real bias-free ``nn.Linear`` head of Qwen3's vocabulary, so that both paths run the learner's own code:
``causal_lm_forward(lm_head=...)`` and ``minibatch_step`` (forward, DPPO's loss, backward). μ is π_θ with noise, so
the trust region blocks some tokens; each sequence starts with a prompt.

- ``peak_mem_ratio``: extra peak memory of the logits path ÷ the fused head, forward + backward, less the head
  weight's gradient (the optimizer's buffer, which both write). On the CPU the peak is the resident set's growth,
  sampled every millisecond in a process whose allocator returns every large block (``MALLOC_MMAP_THRESHOLD_``); on
  a GPU, ``torch.cuda.max_memory_allocated``.
- ``time_ratio``: seconds of the fused step ÷ the logits step (medians over interleaved rounds).
- ``topk_vs_binary``: the fused step under DPPO-TopK-TV (K = 20) ÷ under DPPO-Binary-TV.
- ``max_grad_rel_diff``: max |fused − logits| / max |logits| over the gradients of the hidden states and the head;
  ``max_grad_abs_diff``: max |fused − logits| over them.
- ``targets`` / ``meets_targets``: peak memory ratio ≥ 5, time ratio ≤ 1.1, largest absolute gradient difference
  ≤ 1e-3.

    python scripts/bench/learner_memory.py                        # 2,048 tokens, H 2,048, V 151,936
    python scripts/bench/learner_memory.py --tokens 512 --rounds 1 # a quick look
    python scripts/bench/learner_memory.py --device cuda --response-tokens 16384 --hidden 4096
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dppo_oat.divergence.logprobs import topk_of_logprobs
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.fused_head import fused_head_logprobs
from dppo_oat.learner.update import minibatch_step
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update_batch import UpdateBatch

TARGETS = {"peak_mem_ratio": (">=", 5.0), "time_ratio": ("<=", 1.1), "max_grad_abs_diff": ("<=", 1e-3)}
"""What the fused head should reach against the logits path."""
MMAP_THRESHOLD = "65536"
"""Blocks from 64 KiB up are mapped and unmapped on their own, so the resident set follows what is allocated."""


class HiddenStatesLM(torch.nn.Module):
    """A causal LM whose decoder output is a parameter: ``forward`` returns ``lm_head(hidden)`` as its logits."""

    def __init__(self, hidden: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.hidden = torch.nn.Parameter(hidden)
        self.lm_head = torch.nn.Linear(hidden.shape[-1], vocab, bias=False, dtype=hidden.dtype, device=hidden.device)
        with torch.no_grad():
            self.lm_head.weight.normal_(std=hidden.shape[-1] ** -0.5 * 2)
        self.config = None

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, head) -> None:
        self.lm_head = head

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.lm_head(self.hidden))


def micro_batch(model: HiddenStatesLM, prompt: int, k: int, seed: int = 0) -> UpdateBatch:
    """Sampled ids, μ = π_θ(a_t) + noise and μ's top-K set (π_θ's, with noise); a prompt at the start of each row."""
    gen = torch.Generator().manual_seed(seed)
    rows, length, _ = model.hidden.shape
    vocab = model.lm_head.weight.shape[0]
    ids = torch.randint(0, vocab, (rows, length), generator=gen).to(model.hidden.device)
    with torch.no_grad():
        logp, _, _ = fused_head_logprobs(model.hidden[:, :-1], model.lm_head.weight, ids[:, 1:], with_entropy=False)
        topk_ids, topk_mu = top_k_set(model, ids[:, 1:], k)

    def noise(shape):
        return 0.1 * torch.randn(shape, generator=gen).to(logp.device)

    response = torch.ones(rows, length - 1, dtype=torch.bool, device=ids.device)
    response[:, : prompt - 1] = False
    return UpdateBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response,
                       behavior_logp=(logp + noise(logp.shape)).clamp(max=0),
                       advantages=torch.tensor([[1.0], [-1.0]] * (rows // 2) + [[1.0]] * (rows % 2), device=ids.device),
                       topk_ids=topk_ids, topk_behavior_logp=(topk_mu + noise(topk_mu.shape)).clamp(max=0))


def top_k_set(model: HiddenStatesLM, ids: torch.Tensor, k: int, rows_per_chunk: int = 128):
    """``TopK(π_θ, K) ∪ {a_t}`` and its log-probs, chunk by chunk over the tokens."""
    hidden = model.hidden[:, :-1].reshape(-1, model.hidden.shape[-1])
    flat_ids, pieces = ids.reshape(-1), []
    for start in range(0, hidden.shape[0], rows_per_chunk):
        part = slice(start, start + rows_per_chunk)
        logp = model.lm_head(hidden[part]).float().log_softmax(-1)
        pieces.append(topk_of_logprobs(logp, flat_ids[part], k))
    top_ids, top_logp = (torch.cat(parts) for parts in zip(*pieces, strict=True))
    return top_ids.reshape(*ids.shape, k + 1), top_logp.reshape(*ids.shape, k + 1)


class PeakMemory:
    """Peak bytes above the level at entry: CUDA's allocator statistics, else the resident set sampled every ms."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peak = self.base = 0

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base = self.peak = resident_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, resident_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self.running = False
            self.thread.join()
            self.peak = max(self.peak, resident_bytes())

    @property
    def extra(self) -> int:
        return self.peak - self.base


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one_step(model, batch, tr: TrustRegion, lm_head: str, device: str) -> dict:
    """Seconds and extra peak bytes (less the head's gradient) of one micro-batch's forward + loss + backward; the
    gradients of the hidden states and the head, moved out of the model."""
    settings = UpdateSettings(minibatch_size=len(batch), micro_batch_size=len(batch),
                              norm_constant=float(batch.response_mask.shape[1]))
    model.zero_grad(set_to_none=True)
    forward = causal_lm_forward(model, lm_head=lm_head, settings=settings)
    with PeakMemory(device) as memory:
        start = time.perf_counter()
        minibatch_step(batch, torch.arange(len(batch)), tr, forward, lambda loss: loss.backward(), settings)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    head_grad = model.lm_head.weight.grad
    grads = (model.hidden.grad, head_grad)
    model.zero_grad(set_to_none=True)
    return {"seconds": seconds, "extra": memory.extra - head_grad.numel() * head_grad.element_size(), "grads": grads}


VARIANTS = {  # name: (trust region, lm_head)
    "logits": ("dppo_binary_tv", "logits"),
    "fused": ("dppo_binary_tv", "fused"),
    "fused_topk": ("dppo_topk_tv", "fused"),
}


def rel_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max())


def abs_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).abs().max())


def meets(value: float, target: tuple[str, float]) -> bool:
    comparison, bound = target
    return value >= bound if comparison == ">=" else value <= bound


def measure(args) -> dict:
    torch.manual_seed(0)
    dtype, rows = getattr(torch, args.dtype), args.sequences
    length = args.tokens // rows + 1
    model = HiddenStatesLM(torch.randn(rows, length, args.hidden, dtype=dtype, device=args.device), args.vocab)
    batch = micro_batch(model, args.prompt, k=20)
    trust_regions = {name: TrustRegion.preset(name) for name in ("dppo_binary_tv", "dppo_topk_tv")}
    seconds = {name: [] for name in VARIANTS}
    extra = {name: 0 for name in VARIANTS}
    diffs, abs_diffs = {}, {}
    for _ in range(args.rounds):
        reference = None
        for name, (tr_name, lm_head) in VARIANTS.items():
            out = one_step(model, batch, trust_regions[tr_name], lm_head, args.device)
            seconds[name].append(out["seconds"])
            extra[name] = max(extra[name], out["extra"])
            if name == "logits":
                reference = out["grads"]
            elif tr_name == "dppo_binary_tv":
                diffs[name] = [rel_diff(g, r) for g, r in zip(out["grads"], reference, strict=True)]
                abs_diffs[name] = [abs_diff(g, r) for g, r in zip(out["grads"], reference, strict=True)]
            del out
    row = summary(args, seconds, extra, diffs, model.lm_head.weight)
    row["response_tokens"] = int(batch.response_mask.sum())
    row["max_grad_abs_diff"] = max(max(values) for values in abs_diffs.values())
    row["targets"] = {name: f"{comparison} {bound:g}" for name, (comparison, bound) in TARGETS.items()}
    row["meets_targets"] = {name: meets(row[name], target) for name, target in TARGETS.items()}
    return row


def summary(args, seconds, extra, diffs, weight) -> dict:
    median = {name: statistics.median(values) for name, values in seconds.items()}
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    return {
        "device": device, "dtype": args.dtype, "tokens": args.tokens, "sequences": args.sequences,
        "prompt_tokens_per_sequence": args.prompt, "hidden": args.hidden, "vocab": args.vocab, "rounds": args.rounds,
        "peak_mem_ratio": extra["logits"] / extra["fused"],
        "time_ratio": median["fused"] / median["logits"],
        "topk_vs_binary": median["fused_topk"] / median["fused"],
        "max_grad_rel_diff": max(max(values) for values in diffs.values()),
        "grad_rel_diff": {name: dict(zip(("hidden", "head"), values, strict=True)) for name, values in diffs.items()},
        "extra_peak_gib": {name: value / 2**30 for name, value in extra.items()},
        "head_grad_gib": weight.numel() * weight.element_size() / 2**30,
        "step_seconds": median,
        "memory": "cuda max_memory_allocated" if args.device.startswith("cuda") else "resident set, sampled every ms",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the micro-batch")
    parser.add_argument("--response-tokens", type=int, default=None,
                        help="response tokens of the micro-batch (sets --tokens: these plus each sequence's prompt)")
    parser.add_argument("--sequences", type=int, default=2, help="sequences the tokens are split into")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens at the start of each sequence")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary (Qwen3: 151,936)")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size (Qwen3-1.7B: 2,048)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every variant")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where it runs (default: cuda when available)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                        help="weights and hidden states (default: bfloat16 on a GPU, float32 on the CPU)")
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.response_tokens is not None:  # a row's length − 1 positions, its first prompt − 1 of them the prompt's
        args.tokens = args.response_tokens + args.sequences * (args.prompt - 1)
    if args.device == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    print(json.dumps(measure(args)))


if __name__ == "__main__":
    main()
