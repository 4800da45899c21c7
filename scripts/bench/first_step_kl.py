"""How far one AdamW step of the RL update moves the policy, by the policy's width: the mean per-token KL between
the policy before and after one policy-gradient step at a learning rate, on one fixed batch.

Adam moves every weight by about the learning rate on its first step, whatever the gradient's scale, and a logit is
a dot product over ``hidden`` such moves: at a fixed ``--lr`` the step's KL grows with the width. This measures it on
Qwen3s of the built-in architecture at several widths (random weights, the tiny policy's 2 layers and a 512-token
vocabulary, so that only the width changes; and at the default width, deeper), on ``qwen3-100m`` itself (12 layers,
32,768 tokens), and on the default run's warm-started tiny policy; each at the lrs given and at the lr
:func:`~dppo_oat.engines.local.config.default_lr` gives its shape. One JSON row per (model, lr) on stdout.

    python scripts/bench/first_step_kl.py                                # every width, lr 3e-4 and each shape's default
    python scripts/bench/first_step_kl.py --widths 128 768 --lrs 3e-4 5e-5 --no-100m
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dppo_oat.engines.local.config import default_lr
from dppo_oat.models.shapes import FIXED_SHAPES, PADDED_VOCAB_SIZE
from dppo_oat.models.tiny import build_tiny_model, count_parameters, tiny_qwen3_config

SMALL_VOCAB = 512


def width_model(hidden: int, layers: int, seed: int):
    """The tiny architecture (the tiny defaults) at ``hidden`` and ``layers`` over a 512-token vocabulary, random
    weights; heads of 32 dimensions so that every width divides into them."""
    config = tiny_qwen3_config(SMALL_VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=max(1, hidden // 32),
                               num_key_value_heads=max(1, hidden // 64), head_dim=32, intermediate_size=3 * hidden,
                               pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return build_tiny_model(config, seed)


def qwen3_100m(seed: int):
    """The ``qwen3-100m`` shape over its padded vocabulary, random weights."""
    config = tiny_qwen3_config(PADDED_VOCAB_SIZE["qwen3-100m"], **FIXED_SHAPES["qwen3-100m"], pad_token_id=0,
                               eos_token_id=1, bos_token_id=1)
    return build_tiny_model(config, seed)


def default_run_policy():
    """The default run's warm-started tiny policy (cached, or shipped with the package), or None when neither."""
    from dppo_oat.engines.local.config import TrainConfig
    from dppo_oat.engines.local.policy import find_tiny_policy
    from dppo_oat.models.tiny import load_policy

    found = find_tiny_policy(TrainConfig())
    return load_policy(found[0])[0] if found is not None else None


def fixed_batch(vocab: int, sequences: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids drawn uniformly from the first ``min(vocab, 512)`` ids (the text part of a padded vocabulary) and
    one advantage of ±1 per sequence, as a GRPO batch's."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(vocab, SMALL_VOCAB), (sequences, length), generator=generator)
    advantages = torch.randint(0, 2, (sequences, 1), generator=generator).float() * 2 - 1
    return ids, advantages


def token_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """log π of every next token at every position: (sequences, length − 1, vocab)."""
    return torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)


def first_step_kl(model, ids: torch.Tensor, advantages: torch.Tensor, lr: float) -> dict:
    """One AdamW step (the local engine's: weight decay 0, the gradient clipped to norm 1) on the policy gradient
    −Â · log π(token) of a copy of ``model``; the mean per-token KL(π_before ‖ π_after) and the mean |Δ log π| of the
    batch's own tokens."""
    policy = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    with torch.no_grad():
        before = token_logprobs(policy, ids)
    taken = ids[:, 1:, None]
    loss = -(advantages * token_logprobs(policy, ids).gather(-1, taken).squeeze(-1)).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    with torch.no_grad():
        after = token_logprobs(policy, ids)
    kl = (before.exp() * (before - after)).sum(-1).mean()
    moved = (after.gather(-1, taken) - before.gather(-1, taken)).abs().mean()
    return {"kl_per_token": float(kl), "abs_dlogp_taken": float(moved)}


def commit() -> str:
    """The checkout's commit, or "unknown" outside a git checkout."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def rows(models: dict, lrs: list[float], args: argparse.Namespace):
    """One row per (model, lr): the model's shape, its rule's default lr, and :func:`first_step_kl`."""
    where = {"device": f"cpu ({torch.get_num_threads()} threads)", "commit": commit()}
    for name, (model, shape) in models.items():
        vocab, hidden, layers = model.config.vocab_size, model.config.hidden_size, model.config.num_hidden_layers
        ids, advantages = fixed_batch(vocab, args.sequences, args.length, args.seed)
        rule = default_lr(shape=shape, hidden_size=hidden, num_layers=layers, pretrain=None)
        for lr in sorted({*lrs, rule}, reverse=True):
            start = time.perf_counter()
            result = first_step_kl(model, ids, advantages, lr)
            yield {"bench": "first_step_kl", "model": name, "hidden": hidden, "layers": layers, "vocab": vocab,
                   "parameters": count_parameters(model), "lr": lr, "default_lr": rule, "is_default": lr == rule,
                   **result, "seconds": round(time.perf_counter() - start, 2), "tokens": int(ids.numel()), **where}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512, 768],
                        help="hidden sizes of the 2-layer models")
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 8, 12], help="layers of the hidden-128 models")
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-4],
                        help="learning rates to step each model at, beside its shape's default")
    parser.add_argument("--sequences", type=int, default=8, help="sequences in the fixed batch")
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the batch and its advantages")
    parser.add_argument("--no-100m", dest="with_100m", action="store_false", help="leave out qwen3-100m (slow)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    models = {f"tiny-h{width}-l2": (width_model(width, 2, args.seed), "tiny") for width in args.widths}
    models |= {f"tiny-h128-l{depth}": (width_model(128, depth, args.seed), "tiny") for depth in args.depths}
    if args.with_100m:
        models["qwen3-100m"] = (qwen3_100m(args.seed), "qwen3-100m")
    warm = default_run_policy()
    if warm is not None:
        models["tiny-default-run"] = (warm, "tiny")
    for row in rows(models, args.lrs, args):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
