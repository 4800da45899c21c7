"""Peak memory of one learner micro-batch's logits path, measured, against the estimate the oat engine's dry run
prints (``dppo_oat.engines.oat.plan.logits_memory``: N tokens × V × (logit bytes + 4)).

One micro-batch of ``--tokens`` tokens goes through the core's forward (``causal_lm_forward``: fp32 log-probs from a
chunked log-softmax), loss and backward (``minibatch_step`` with DPPO-Binary-TV), on a Qwen3-shaped model with the
real vocabulary and with a 1,024-token one; the difference of the two peaks, less the LM head's extra gradient, is
what the vocabulary costs. Prints one JSON object. Meant for a GPU (``--device cuda``, peak from
``torch.cuda.max_memory_allocated``); on the CPU it reports time only.

    python scripts/bench/logits_memory.py --device cuda                       # Qwen3-1.7B's vocabulary, 12,800 tokens
    python scripts/bench/logits_memory.py --device cuda --tokens 4096 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.update import minibatch_step
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update_batch import UpdateBatch

SMALL_VOCAB = 1024


def qwen3(vocab: int, hidden: int, layers: int, dtype: torch.dtype, device: str):
    """A randomly initialised Qwen3 of the given shape (tied embeddings, as Qwen3-1.7B)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                         max_position_embeddings=1 << 16)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(device=device, dtype=dtype)


def micro_batch(tokens: int, vocab: int, device: str) -> UpdateBatch:
    """One sequence: a 256-token prompt and ``tokens − 256`` response tokens, μ close to uniform."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (1, tokens + 1), generator=generator)
    response = torch.zeros(1, tokens, dtype=torch.bool)
    response[:, 255:] = True
    return UpdateBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response,
        behavior_logp=torch.full((1, tokens), -float(torch.log(torch.tensor(float(vocab))))),
        advantages=torch.ones(1, 1),
    ).to(device)


def one_step(model, batch: UpdateBatch, chunk: int, device: str) -> tuple[float, float]:
    """Extra peak bytes and seconds of forward + loss + backward of ``batch`` (gradients freed afterwards)."""
    settings = UpdateSettings(micro_batch_size=1, minibatch_size=1, norm_constant=float(batch.response_mask.sum()))
    forward = causal_lm_forward(model, chunk_size=chunk)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    start = time.perf_counter()
    minibatch_step(batch, torch.arange(1), TrustRegion.preset("dppo_binary_tv"), forward, lambda loss: loss.backward(),
                   settings)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() - base) if cuda else float("nan")
    model.zero_grad(set_to_none=True)
    return float(peak), seconds


def measure(args, vocab: int) -> tuple[float, float]:
    model = qwen3(vocab, args.hidden, args.layers, getattr(torch, args.dtype), args.device)
    model.gradient_checkpointing_enable()
    model.train()
    batch = micro_batch(args.tokens, vocab, args.device)
    one_step(model, batch, args.chunk, args.device)  # warm-up: kernels, allocator
    peak, seconds = one_step(model, batch, args.chunk, args.device)
    del model, batch
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12800, help="tokens of the micro-batch (Gem: 1 × 12,800)")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary (Qwen3: 151,936)")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size (Qwen3-1.7B: 2,048)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (few: the head is what is measured)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="logits dtype")
    parser.add_argument("--chunk", type=int, default=1024, help="rows per chunk of the fp32 log-softmax")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where it runs (default: cuda when available)")
    args = parser.parse_args()
    big_peak, big_seconds = measure(args, args.vocab)
    small_peak, small_seconds = measure(args, SMALL_VOCAB)
    dtype_bytes = torch.finfo(getattr(torch, args.dtype)).bits // 8
    extra_vocab = args.vocab - SMALL_VOCAB
    head_gradient = extra_vocab * args.hidden * dtype_bytes
    measured = big_peak - small_peak - head_gradient
    estimate = args.tokens * extra_vocab * (dtype_bytes + 4)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(json.dumps({
        "device": name, "dtype": args.dtype, "tokens": args.tokens, "vocab": args.vocab, "hidden": args.hidden,
        "chunk": args.chunk, "measured_logits_gib": measured / 2**30, "estimate_gib": estimate / 2**30,
        "measured_vs_estimate": measured / estimate, "peak_gib": big_peak / 2**30,
        "step_seconds": big_seconds, "step_seconds_small_vocab": small_seconds,
    }))


if __name__ == "__main__":
    main()
