"""Rollout throughput, printed as ONE JSON object on stdout.

``--model tiny`` (default) measures the tiny policy's shape: new tokens per second of :class:`HFGenerator` against
a raw ``model.generate`` (same model, same 64 prompts, same length; medians over repeats, the two run in back-to-back
pairs), the same for :class:`VLLMGenerator` when ``vllm`` is importable (else null), and Gem Sudoku environment steps
per second when ``gem`` is importable (else null).

Every model also gets the multi-turn measurement (``multi_turn``): ``--turns`` turns of ``--batch`` episodes, each
turn's prompts being the last turn's prompts, completions and a 16-token observation, sampled by the generator the
local engine uses (:class:`HFGenerator`: the direct-forward sampling loop, the prefix cache across turns) and by
``model.generate`` from the same first prompts, in pairs; and its decode roofline (``roofline``): the rate at which the
machine's memory bandwidth lets each decode step read the weights and the keys and values of every row's context,

    roofline tokens/s = batch ÷ ((weight bytes + KV bytes of the context) ÷ bandwidth),  averaged over the steps,

with the bandwidth measured here by a large copy (a device-to-device copy on a GPU, RAM on the CPU). The rollout's
rate counts its prefills too. ``--model qwen3-100m`` is a ~100M-parameter Qwen3 with a 32,768-token vocabulary and
random weights (throughput only: with random weights every row runs to ``--new-tokens``); ``--model smoke`` the
same architecture at a tiny size; ``--model qwen3-1.7b`` Qwen3-1.7B's architecture with random weights, where a decode
step is mostly the reading of its weights. Targets (in the row): the generator ≥ 5× ``generate`` and ≥ 0.2 of the
roofline at batch 64 (qwen3-1.7b: ≥ 0.5 of the roofline). ``--cuda-graphs`` times the generator's decode in CUDA
graphs kept across its calls (the local engine's ``--cuda-graphs``): graphs that sample too, one replay a step, or
with ``--graph-forward-only`` graphs of the forward alone, the host sampling between replays (``graph_sampling`` in
the row); ``multi_turn.graph_captures`` counts the graphs it captured over the warm-up and every timed run (one per
batch and buffer bucket: a turn's calls replay the graph the warm-up captured). Everything else (engine logs,
progress bars) goes to stderr.

    python scripts/bench/rollout.py [--batch 64] [--new-tokens 16] [--repeats 7] [--env-seconds 2]
    python scripts/bench/rollout.py --model qwen3-100m --device cuda --dtype bfloat16 --new-tokens 128
    python scripts/bench/rollout.py --model qwen3-100m --device cuda --dtype bfloat16 --new-tokens 128 --cuda-graphs
    python scripts/bench/rollout.py --model qwen3-1.7b --device cuda --dtype bfloat16 --new-tokens 128 --cuda-graphs
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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from machine import copy_bandwidth
from qwen3_shapes import SHAPES
from qwen3_shapes import random_qwen3 as random_qwen3_model

from dppo_oat.models import build_tiny_policy, save_policy, toy_corpus
from dppo_oat.rollout.cuda_graphs import MIN_GRAPH_STEPS
from dppo_oat.rollout.hf_generator import HFGenerator, completion_lengths, left_pad
from dppo_oat.settings.spec import SamplingSettings

TARGET_RATIO = 0.9
"""The single-turn target of the tiny policy (``hf.meets_target``)."""
TARGETS = {"multi_turn_vs_generate": 5.0, "vs_roofline_at_batch_64": 0.2}
"""The multi-turn targets: the generator's rate ÷ ``generate``'s, and ÷ the decode roofline at batch 64."""
MODEL_TARGETS = {"qwen3-1.7b": {"vs_roofline_at_batch_64": 0.5}}
"""Models with targets of their own: at Qwen3-1.7B's shape reading the weights dominates a step, so the decode is
held to half its roofline (and not to a ratio over ``generate``, which reads the same weights)."""
OBSERVATION_TOKENS = 16
"""Tokens an env adds between two turns (the next turn's prompt: the last one, its completion, then these)."""


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
    ratio = statistics.median(ours / raw for ours, raw in zip(our_rates, raw_rates, strict=True))
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
        import vllm
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


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer of ``vocab_size`` tokens ``w0 w1 …`` (``w0`` the EOS, ``w1`` the pad): a real
    ``batch_decode`` for a model with random weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w2"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="w0", pad_token="w1", padding_side="left")


def random_qwen3(shape: str, seed: int, device: str = "cpu"):
    """A Qwen3 of ``SHAPES[shape]`` with random weights (built on ``device``), and its word-level tokenizer."""
    tokenizer = word_tokenizer(SHAPES[shape]["vocab_size"])
    model = random_qwen3_model(shape, seed, device, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id)
    return model.eval(), tokenizer


def random_tokens(count: int, vocab: int, generator: torch.Generator) -> list[int]:
    """``count`` token ids drawn uniformly above the special ones (0, 1, 2)."""
    return torch.randint(3, vocab, (count,), generator=generator).tolist()


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` down to ``length − 15`` random tokens (left padding is exercised)."""
    generator = torch.Generator().manual_seed(seed)
    return [random_tokens(length - i % 16, vocab, generator) for i in range(batch)]


def next_turn(prompts, completions, vocab: int, generator: torch.Generator) -> list[list[int]]:
    """Each episode's next prompt: its prompt, its completion's tokens and an observation of random tokens."""
    return [list(p) + list(c) + random_tokens(OBSERVATION_TOKENS, vocab, generator)
            for p, c in zip(prompts, completions, strict=True)]


def multi_turn_runner(sample, prompts, turns: int, vocab: int, seed: int):
    """A closure: ``turns`` turns of ``sample(prompts) → completions`` (token lists) from ``prompts``, each turn's
    prompts built by :func:`next_turn`; returns the new-token count and records each turn's prompts."""
    turn_prompts: list[list[list[int]]] = []

    def run() -> int:
        generator, current, produced = torch.Generator().manual_seed(seed), prompts, 0
        turn_prompts.clear()
        for _ in range(turns):
            turn_prompts.append(current)
            completions = sample(current)
            produced += sum(len(c) for c in completions)
            current = next_turn(current, completions, vocab, generator)
        return produced

    run.turn_prompts = turn_prompts
    return run


def generate_sampler(model, tokenizer, new_tokens: int):
    """``model.generate`` on left-padded prompts (sampling at temperature 1, no scores): each row's new tokens up to
    and including its EOS."""
    eos = torch.as_tensor([tokenizer.eos_token_id])

    def sample(prompts):
        input_ids, attention_mask = left_pad(prompts, tokenizer.pad_token_id, model.device)
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=0,
                                 max_new_tokens=new_tokens, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        new = out[:, input_ids.shape[1]:].cpu()
        lengths, _ = completion_lengths(new, eos)
        return [row[:n].tolist() for row, n in zip(new, lengths.tolist(), strict=True)]

    return sample


def bench_multi_turn(model, tokenizer, prompts, args) -> dict:
    """The generator and ``generate`` on the same multi-turn rollout, back to back in pairs: medians of their rates
    and of the pairs' ratios, and the prompts' mean lengths per turn (for the roofline)."""
    generator = HFGenerator(model, tokenizer, batch_size=len(prompts), cuda_graphs=args.cuda_graphs,
                            graph_sampling=not args.graph_forward_only)
    settings = SamplingSettings(max_new_tokens=args.new_tokens)
    vocab = model.config.vocab_size

    def ours(current):
        if current is prompts:
            generator.forget_prefixes()  # a rollout starts cold, as the collector's does
        return [c.token_ids for c in generator.generate(current, settings)]

    ours_run = multi_turn_runner(ours, prompts, args.turns, vocab, args.seed)
    raw_run = multi_turn_runner(generate_sampler(model, tokenizer, args.new_tokens), prompts, args.turns, vocab,
                                args.seed)
    ours_run(), raw_run()  # warm-up
    refuse_eager_calls(generator, args.cuda_graphs)
    our_rates, raw_rates = [], []
    for _ in range(args.repeats):
        raw_rates += tokens_per_second(raw_run, 1)
        our_rates += tokens_per_second(ours_run, 1)
    ratio = statistics.median(o / r for o, r in zip(our_rates, raw_rates, strict=True))
    refuse_eager_calls(generator, args.cuda_graphs)
    return {
        "generator_tokens_per_s": round(statistics.median(our_rates), 1),
        "generate_tokens_per_s": round(statistics.median(raw_rates), 1),
        "ratio": round(ratio, 3),
        "runs_direct": generator.runs_direct,
        "decode_steps": dict(generator.decode_steps),
        "graph_captures": generator.graph_captures,
        "prompt_tokens_by_turn": [round(statistics.mean(len(p) for p in turn), 1) for turn in ours_run.turn_prompts],
    }


def refuse_eager_calls(generator: HFGenerator, cuda_graphs: bool) -> None:
    """Under ``--cuda-graphs``, exit when a generator call decoded eagerly (a capture failed): the row would time
    the eager decode under the graphs' name."""
    eager = generator.decode_steps["EagerStep"]
    if cuda_graphs and eager:
        raise SystemExit(f"--cuda-graphs: {eager} of {sum(generator.decode_steps.values())} generator calls decoded "
                         "eagerly (a capture failed: its warning is above); this row would time the eager decode")


def weight_bytes(model) -> int:
    """Bytes a decode step reads of the weights: every parameter once (a tied embedding is the LM head's matrix,
    read whole; the lookup reads a few rows of it)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes_per_token(model) -> int:
    """Bytes of the keys and values of one context token, over all layers."""
    config, element = model.config, next(model.parameters()).element_size()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element


def decode_roofline(model, batch: int, prompt_tokens_by_turn: list[float], new_tokens: int,
                    bandwidth: float) -> float:
    """Tokens/s of a multi-turn decode bound by memory traffic alone: each step reads the weights and every row's
    context (its prompt and the tokens sampled so far) at ``bandwidth`` bytes/s; one token per row per step."""
    weights, kv = weight_bytes(model), kv_bytes_per_token(model)
    seconds = sum((weights + kv * batch * (prompt + step)) / bandwidth
                  for prompt in prompt_tokens_by_turn for step in range(new_tokens))
    return batch * new_tokens * len(prompt_tokens_by_turn) / seconds


def roofline_report(model, multi: dict, args, bandwidth: float) -> dict:
    """The roofline, the generator's share of it and what it was computed from."""
    roofline = decode_roofline(model, args.batch, multi["prompt_tokens_by_turn"], args.new_tokens, bandwidth)
    return {
        "bandwidth_bytes_per_s": round(bandwidth),
        "bandwidth_method": f"median of 10 copies of {args.copy_mib} MiB on {args.device}, bytes read + written",
        "weight_bytes": weight_bytes(model),
        "kv_bytes_per_context_token": kv_bytes_per_token(model),
        "roofline_tokens_per_s": round(roofline, 1),
        "generator_vs_roofline": round(multi["generator_tokens_per_s"] / roofline, 4),
        "generate_vs_roofline": round(multi["generate_tokens_per_s"] / roofline, 4),
    }


def random_move() -> str:
    """A well-formed Sudoku action ``\\boxed{row col digit}`` with random 1-based values."""
    row, col, digit = (random.randint(1, 4) for _ in range(3))
    return f"\\boxed{{{row} {col} {digit}}}"


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", *SHAPES],
                        help="tiny: the tiny policy's shape and BPE tokenizer; else a Qwen3 with random weights")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the model's weights (and so its KV cache)")
    parser.add_argument("--batch", type=int, default=64, help="episodes sampled together")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens sampled per turn and episode")
    parser.add_argument("--prompt-tokens", type=int, default=256,
                        help="the first turn's prompt length (random-weight models; the tiny one: 20-30 tokens)")
    parser.add_argument("--turns", type=int, default=2, help="turns of the multi-turn measurement")
    parser.add_argument("--repeats", type=int, default=11, help="timed pairs (generator, generate) per measurement")
    parser.add_argument("--copy-mib", type=int, default=None,
                        help="MiB of each buffer of the bandwidth copy (default: 2048 on a GPU, 256 on the CPU)")
    parser.add_argument("--env-seconds", type=float, default=2.0, help="seconds of Gem env steps (tiny model only)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and observations")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="the generator decodes with CUDA graphs of its decode step, captured once per batch and "
                             "buffer bucket and replayed across calls (on a CUDA device; the local engine's "
                             "--cuda-graphs); the row's multi_turn.graph_captures counts the captures")
    parser.add_argument("--graph-forward-only", action="store_true",
                        help="with --cuda-graphs: the graphs run the forward alone, the host sampling between "
                             "replays and reading the stop flags every few steps (default: the graphs sample too)")
    args = parser.parse_args(argv)
    if args.graph_forward_only and not args.cuda_graphs:
        parser.error("--graph-forward-only is a kind of --cuda-graphs: give both")
    if args.cuda_graphs and not args.device.startswith("cuda"):
        parser.error("--cuda-graphs needs --device cuda")
    if args.cuda_graphs and args.new_tokens < MIN_GRAPH_STEPS:
        parser.error(f"--cuda-graphs: a call samples --new-tokens {args.new_tokens}, fewer than the "
                     f"{MIN_GRAPH_STEPS} it takes to decode with a graph; give --new-tokens {MIN_GRAPH_STEPS} or more")
    if args.copy_mib is None:
        args.copy_mib = 2048 if args.device.startswith("cuda") else 256
    return args


def build_model(args):
    """The model, its tokenizer, the first turn's prompts and what the weights are."""
    if args.model == "tiny":
        model, tokenizer = build_tiny_policy(bench_corpus(), seed=args.seed)
        prompts, weights = bench_prompts(tokenizer, args.batch), "tiny policy's shape, random initialisation"
    else:
        model, tokenizer = random_qwen3(args.model, args.seed, args.device)
        prompts = random_prompts(args.batch, args.prompt_tokens, model.config.vocab_size, args.seed)
        weights = "random (throughput only: rows run to --new-tokens)"
    model.to(device=args.device, dtype=getattr(torch, args.dtype))
    return model, tokenizer, prompts, weights


def model_targets(model: str) -> dict[str, float]:
    """The targets ``model``'s row is held to: :data:`MODEL_TARGETS`' own, else :data:`TARGETS`."""
    return MODEL_TARGETS.get(model, TARGETS)


def targets_met(targets: dict[str, float], multi: dict, roofline: dict, batch: int) -> dict:
    """Each of ``targets`` met or not (the roofline's only at batch 64, else null)."""
    measured = {"multi_turn_vs_generate": multi["ratio"],
                "vs_roofline_at_batch_64": roofline["generator_vs_roofline"] if batch == 64 else None}
    return {name: None if measured[name] is None else measured[name] >= target for name, target in targets.items()}


def main() -> None:
    """Run every measurement; only the final JSON reaches stdout."""
    args = parse_args()
    json_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # engine logs written to stdout land on stderr
    torch.manual_seed(args.seed)
    model, tokenizer, prompts, weights = build_model(args)
    result = {
        "model": args.model, "parameters": sum(p.numel() for p in model.parameters()), "weights": weights,
        "device": args.device, "dtype": args.dtype, "batch": args.batch, "max_new_tokens": args.new_tokens,
        "precision": "weights cast to dtype, as an inference engine holds them (the local engine's --dtype samples "
                     "from fp32 weights under torch.autocast instead)",
        "turns": args.turns, "repeats": args.repeats, "vocab_size": model.config.vocab_size,
        "torch_threads": torch.get_num_threads(), "cuda_graphs": args.cuda_graphs,
        "graph_sampling": (not args.graph_forward_only) if args.cuda_graphs else None,
    }
    if args.model == "tiny":
        result["hf"] = bench_hf(model, tokenizer, prompts, args.new_tokens, args.repeats)
    multi = bench_multi_turn(model, tokenizer, prompts, args)
    roofline = roofline_report(model, multi, args, copy_bandwidth(args.device, args.copy_mib))
    targets = model_targets(args.model)
    result.update(multi_turn=multi, roofline=roofline,
                  targets={name: f">= {value}" for name, value in targets.items()},
                  meets_targets=targets_met(targets, multi, roofline, args.batch))
    if args.model == "tiny":
        result["env_steps_per_s"] = env_steps_per_second(args.env_seconds)
        result["vllm"] = bench_vllm(model, tokenizer, prompts, args.new_tokens, args.repeats)
    json_out.write(json.dumps(result) + "\n")
    json_out.flush()


if __name__ == "__main__":
    main()
