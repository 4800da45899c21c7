"""The learner's update: tokens per second and model FLOP utilisation (MFU); prints one JSON object.

One update is the local engine's: the core's :func:`~dppo_oat.learner.update.learn_from_rollout` (DPPO-Binary-TV, the
fused head, AdamW with gradient clipping) over the minibatches of a rollout batch, on a Qwen3 of
``qwen3_shapes.SHAPES`` with random weights (throughput only) and random token ids; weights and AdamW states in fp32
and the forward passes under ``torch.autocast(--dtype)``, as the local engine's ``--dtype`` runs them. Sequences are
``--prompt-tokens`` of prompt then ``--response-tokens`` of response, as a rollout's.

- ``tokens_per_s``: tokens (prompt and response) of the rollout batch ÷ the median seconds of one update.
- ``mfu``: the update's model FLOPs per second ÷ ``peak_flops``, the rate of one large matrix product in ``--dtype``
  measured on the same device (``--peak-size``³). Model FLOPs (no recomputation counted):

      6 · N_decoder · tokens  +  6 · V · H · response tokens  +  6 · L · (heads · head_dim) · Σ_sequences s²

  (the decoder's matrices on every token; the LM head on the response tokens only, which is all the fused head
  computes; causal attention, half of the 12 · L · H · Q · s per token of a full attention matrix).

    python scripts/bench/learner_mfu.py --device cuda                     # qwen3-100m, bf16, 32 × 1,024 tokens
    python scripts/bench/learner_mfu.py --shape smoke --dtype float32 --updates 1 --peak-size 256
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from machine import matmul_flops, synchronize
from qwen3_shapes import SHAPES, random_qwen3

from dppo_oat.learner.autocast import autocast_forward
from dppo_oat.learner.guard import BlowUpGuard
from dppo_oat.learner.update import EngineSteps, clip_and_step, learn_from_rollout
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update_batch import UpdateBatch


def rollout_batch(sequences: int, prompt: int, response: int, vocab: int, device: str) -> UpdateBatch:
    """Random token ids, μ near uniform (log μ = −log V + noise), advantages ±1, the response after the prompt."""
    generator = torch.Generator().manual_seed(1)
    length = prompt + response
    ids = torch.randint(0, vocab, (sequences, length), generator=generator)
    response_mask = torch.zeros(sequences, length - 1, dtype=torch.bool)
    response_mask[:, prompt - 1:] = True
    behavior = -float(torch.log(torch.tensor(float(vocab)))) + 0.05 * torch.randn(sequences, length - 1,
                                                                                   generator=generator)
    advantages = torch.where(torch.arange(sequences) % 2 == 0, 1.0, -1.0)[:, None]
    return UpdateBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response_mask,
                       behavior_logp=behavior.clamp(max=0), advantages=advantages).to(device)


def model_flops(model, batch: UpdateBatch) -> float:
    """The update's model FLOPs for one pass over ``batch`` (the formula of the module's docstring)."""
    config = model.config
    head = config.vocab_size * config.hidden_size
    decoder = sum(p.numel() for p in model.parameters()) - head * (1 if config.tie_word_embeddings else 2)
    tokens = int(batch.attention_mask.sum())
    response = int(batch.response_mask.sum())
    lengths = batch.attention_mask.sum(1).double()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 6 * config.num_hidden_layers * config.num_attention_heads * head_dim * float((lengths**2).sum())
    return 6 * decoder * tokens + 6 * head * response + attention


def time_updates(model, batch: UpdateBatch, args) -> list[float]:
    """Seconds of ``args.updates`` updates after one warm-up."""
    tr = TrustRegion.preset("dppo_binary_tv")
    settings = UpdateSettings(minibatch_size=args.minibatch, micro_batch_size=args.micro_batch,
                              norm_constant=float(args.response_tokens))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    steps = EngineSteps(lambda loss: loss.backward(), lambda: clip_and_step(list(model.parameters()), optimizer, 1.0),
                        lambda: optimizer.zero_grad(set_to_none=True))

    def update() -> None:
        learn_from_rollout(model, batch, tr, settings, steps, shuffle=torch.Generator().manual_seed(0),
                           guard=BlowUpGuard(), token_sampler=None,
                           precision=lambda forward: autocast_forward(forward, args.device, args.dtype))

    seconds = []
    for round_ in range(args.updates + 1):
        synchronize(args.device)
        start = time.perf_counter()
        update()
        synchronize(args.device)
        if round_:  # the first is the warm-up
            seconds.append(time.perf_counter() - start)
    return seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-100m", choices=list(SHAPES), help="the model (random weights)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="weights, activations and AdamW states (and the peak matmul's)")
    parser.add_argument("--sequences", type=int, default=32, help="sequences of the rollout batch")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt tokens per sequence")
    parser.add_argument("--response-tokens", type=int, default=768, help="response tokens per sequence")
    parser.add_argument("--minibatch", type=int, default=16, help="sequences per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=None, help="sequences per forward/backward (default: all)")
    parser.add_argument("--updates", type=int, default=3, help="timed updates (after one warm-up)")
    parser.add_argument("--peak-size", type=int, default=None,
                        help="side of the peak matmul (default: 8192 on a GPU, 1024 on the CPU)")
    args = parser.parse_args(argv)
    args.peak_size = args.peak_size or (8192 if args.device.startswith("cuda") else 1024)
    return args


def main() -> None:
    args = parse_args()
    dtype = getattr(torch, args.dtype)
    model = random_qwen3(args.shape, seed=0).to(device=args.device).train()  # fp32 master weights
    batch = rollout_batch(args.sequences, args.prompt_tokens, args.response_tokens, model.config.vocab_size,
                          args.device)
    seconds = statistics.median(time_updates(model, batch, args))
    flops = model_flops(model, batch)
    peak = matmul_flops(args.device, dtype, args.peak_size)
    print(json.dumps({
        "shape": args.shape, "parameters": sum(p.numel() for p in model.parameters()),
        "weights": "random (throughput only)", "device": args.device, "dtype": args.dtype,
        "precision": "fp32 weights and AdamW states, forward passes under torch.autocast(dtype) (the local engine's "
                     "--dtype)",
        "sequences": args.sequences, "prompt_tokens": args.prompt_tokens, "response_tokens": args.response_tokens,
        "minibatch": args.minibatch, "micro_batch": args.micro_batch or args.minibatch, "updates": args.updates,
        "update_seconds": seconds, "tokens_per_s": int(batch.attention_mask.sum()) / seconds,
        "response_tokens_per_s": int(batch.response_mask.sum()) / seconds,
        "model_flops_per_update": flops, "achieved_flops": flops / seconds, "peak_flops": peak,
        "peak_method": f"median of 10 {args.peak_size}^3 {args.dtype} matmuls on random data, same device",
        "mfu": flops / seconds / peak,
        "flops_formula": "6*N_decoder*tokens + 6*V*H*response_tokens + 6*L*heads*head_dim*sum(s^2) (causal)",
    }))


if __name__ == "__main__":
    main()
