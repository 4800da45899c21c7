"""Rollout throughput on the tiny policy, printed as ONE JSON object on stdout.

Measures new tokens per second of :class:`HFGenerator` against a raw ``model.generate`` (same model, same 64
prompts, same length; medians over repeats, the two run in back-to-back pairs), the same for
:class:`VLLMGenerator` when ``vllm`` is importable (else null), and Gem Sudoku environment steps per second when
``gem`` is importable (else null).
Everything else (engine logs, progress bars) goes to stderr.

    python scripts/bench/rollout.py [--batch 64] [--new-tokens 16] [--repeats 7] [--env-seconds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

import torch

from dppo_oat.models import build_tiny_policy, save_policy, toy_corpus
from dppo_oat.spec import SamplingSettings
from dppo_oat.rollout.hf_generator import HFGenerator, left_pad

TARGET_RATIO = 0.9


def bench_corpus() -> list[str]:
    """Board texts plus numeric chatter: enough pairs for a 512-entry BPE vocabulary, as in the reference policy."""
    chatter = [f"turn {i}: cells {' '.join(str((i * j) % 97) for j in range(16))}" for i in range(400)]
    return toy_corpus(600) + chatter


def bench_prompts(tokenizer, batch: int) -> list[list[int]]:
    """``batch`` Sudoku-like prompts of 20-30 tokens."""
    texts = toy_corpus(batch, seed=123)
    return [tokenizer.encode(text)[: 20 + i % 11] for i, text in enumerate(texts)]


def tokens_per_second(run, repeats: int) -> list[float]:
    """Rates of ``repeats`` calls of ``run`` (which returns the number of new tokens it produced)."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        produced = run()
        rates.append(produced / (time.perf_counter() - start))
    return rates


def raw_generate_runner(model, tokenizer, prompts, new_tokens: int):
    """A closure: one plain ``model.generate`` sampling call (no scores), returning the new-token count."""
    input_ids, attention_mask = left_pad(prompts, tokenizer.pad_token_id, model.device)
    eos = tokenizer.eos_token_id

    def run() -> int:
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=0,
                max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, input_ids.shape[1] :]
        is_eos = new == eos
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, torch.full_like(new[:, 0], new.shape[1]))
        return int(lengths.sum())

    return run


def generator_runner(generator, prompts, new_tokens: int, top_k: int = 0):
    """A closure: one ``generator.generate`` call, returning the number of tokens in its completions."""
    settings = SamplingSettings(max_new_tokens=new_tokens, top_k_logprobs=top_k)
    return lambda: sum(len(c.token_ids) for c in generator.generate(prompts, settings))


def bench_hf(model, tokenizer, prompts, new_tokens: int, repeats: int) -> dict:
    """HFGenerator vs raw generate, run back to back in pairs; the ratio is the median of the pairs' ratios, which
    cancels most of the drift of a shared machine (the ratio of the best runs is the least disturbed estimate)."""
    raw = raw_generate_runner(model, tokenizer, prompts, new_tokens)
    ours = generator_runner(HFGenerator(model, tokenizer, batch_size=len(prompts)), prompts, new_tokens)
    raw(), ours()  # warm-up
    raw_rates, our_rates = [], []
    for _ in range(repeats):
        raw_rates += tokens_per_second(raw, 1)
        our_rates += tokens_per_second(ours, 1)
    ratio = statistics.median(ours / raw for ours, raw in zip(our_rates, raw_rates))
    return {
        "raw_generate_tokens_per_s": round(statistics.median(raw_rates), 1),
        "hf_generator_tokens_per_s": round(statistics.median(our_rates), 1),
        "ratio": round(ratio, 3),
        "ratio_of_best_runs": round(max(our_rates) / max(raw_rates), 3),
        "meets_target": ratio >= TARGET_RATIO,
    }


def bench_vllm(model, tokenizer, prompts, new_tokens: int, repeats: int) -> dict | None:
    """VLLMGenerator tokens/s (with and without the top-20 set), or None without vllm. Run it last: a CPU engine
    lowers torch's thread count for the whole process."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None
    from dppo_oat.rollout.vllm_generator import VLLMGenerator

    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        generator = VLLMGenerator(str(save_policy(model, tokenizer, directory)), max_logprobs=20)
        startup = time.perf_counter() - start
        plain = generator_runner(generator, prompts, new_tokens)
        with_topk = generator_runner(generator, prompts, new_tokens, top_k=20)
        plain(), with_topk()  # warm-up
        return {
            "vllm_generator_tokens_per_s": round(statistics.median(tokens_per_second(plain, repeats)), 1),
            "vllm_generator_top20_tokens_per_s": round(statistics.median(tokens_per_second(with_topk, repeats)), 1),
            "vllm_startup_s": round(startup, 2),
            "vllm_version": vllm.__version__,
        }


def random_move() -> str:
    """A well-formed Sudoku action ``\\boxed{row col digit}`` with random 1-based values."""
    return "\\boxed{%d %d %d}" % (random.randint(1, 4), random.randint(1, 4), random.randint(1, 4))


def env_steps_per_second(seconds: float = 2.0, env_id: str = "game:Sudoku-v0-easy") -> float | None:
    """Steps/s of a Gem env driven by random well-formed moves (resets included), or None without gem."""
    try:
        import gem
    except ImportError:
        return None
    env = gem.make(env_id)
    env.reset(seed=0)
    steps, episodes, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(random_move())
        steps += 1
        if terminated or truncated:
            episodes += 1
            env.reset(seed=episodes)
    return round(steps / (time.perf_counter() - start), 1)


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--env-seconds", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    """Run every measurement; only the final JSON reaches stdout."""
    args = parse_args()
    json_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # engine logs written to stdout land on stderr
    torch.manual_seed(args.seed)
    model, tokenizer = build_tiny_policy(bench_corpus(), seed=args.seed)
    prompts = bench_prompts(tokenizer, args.batch)
    result = {
        "batch": args.batch,
        "max_new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "vocab_size": len(tokenizer),
        "torch_threads": torch.get_num_threads(),
        "hf": bench_hf(model, tokenizer, prompts, args.new_tokens, args.repeats),
        "env_steps_per_s": env_steps_per_second(args.env_seconds),
        "vllm": bench_vllm(model, tokenizer, prompts, args.new_tokens, args.repeats),
    }
    json_out.write(json.dumps(result) + "\n")
    json_out.flush()


if __name__ == "__main__":
    main()
