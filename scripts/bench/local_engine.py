"""Local-engine benchmark; prints one JSON object.

- ``seconds_per_rl_step``: median wall time of one RL step (rollout + update) of the default configuration.
- ``rollout_vs_raw_generate``: rollout tokens/s (whole multi-turn Gem rollout, env steps included) ÷ tokens/s of a
  raw ``model.generate`` (no scores) on the rollout's own first-turn prompts. Target ≥ 0.9.
- ``rollout_vs_raw_sampling_loop``: the same rollout ÷ the rollout's own sampling loop on one full batch of those
  prompts (the generator's ceiling: what env steps, tokenisation and shrinking turn batches cost).
- ``update_vs_raw_fwd_bwd``: update tokens/s (the core's update loop: policy_loss, metrics, aggregation, AdamW)
  ÷ tokens/s of a raw forward + log-softmax gather + backward + AdamW step on the same minibatches. Target ≥ 0.9.
- Every RL step is followed by its raw counterparts (``generate`` and the sampling loop: the median of
  :data:`RAW_REPEATS` calls, as one call lasts a tenth of a rollout and one slow call would decide the pair; one raw
  update), and each ratio is the median over steps of that step's own ratio, so that a machine's drift (other work,
  frequency) cancels in pairs.
- ``default_run_seconds`` (with ``--default-run``): wall time of ``python -m dppo_oat.train`` with no arguments
  in a fresh run directory (the tiny policy is built unless it is already cached in ``--cache-dir``).

Usage: ``python scripts/bench/local_engine.py [--steps 10] [--cache-dir DIR] [--default-run]``
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.progress import line_console
from dppo_oat.engines.local.seeds import train_group_seeds
from dppo_oat.engines.local.trainer import LocalTrainer
from dppo_oat.learner.update import minibatch_indices
from dppo_oat.rollout.decode import sample_with_cache
from dppo_oat.rollout.hf_generator import completion_lengths, left_pad

RAW_REPEATS = 3
"""Raw ``generate`` and sampling-loop calls per RL step (their median is the step's raw rate)."""


def first_turn_batch(trainer: LocalTrainer):
    """``(input_ids, attention_mask)`` of the first-turn prompts of a full rollout batch (left-padded)."""
    c = trainer.config
    seeds = train_group_seeds(c.seed, 10_000, c.groups_per_step)
    observations, infos = trainer.collector.vec_env.reset(seed=[s for s in seeds for _ in range(c.group_size)])
    prompts = [trainer.collector._tokenize(trainer.collector.render(trainer.collector.observation_fn(o, i)))
               for o, i in zip(observations, infos, strict=True)]
    return left_pad(prompts, trainer.tokenizer.pad_token_id, trainer.generator.model.device)


def raw_generate_tokens_per_s(trainer: LocalTrainer, input_ids, attention_mask) -> float:
    """Plain ``model.generate`` on the first-turn prompts of a rollout batch (same model, same lengths)."""
    model, tok, c = trainer.generator.model, trainer.tokenizer, trainer.config
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=0,
                             max_new_tokens=c.max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
    new = out[:, input_ids.shape[1]:]
    produced = int(((new != tok.pad_token_id) | (new == tok.eos_token_id)).sum())
    return produced / (time.perf_counter() - start)


def raw_sampling_loop_tokens_per_s(trainer: LocalTrainer, input_ids, attention_mask) -> float:
    """The rollout's own sampling loop (:mod:`dppo_oat.rollout.decode`) on one full batch of first-turn prompts:
    what the rollout would reach if every call were a full first turn (no env, no tokenisation, no shrinking)."""
    model, tok, c = trainer.generator.model, trainer.tokenizer, trainer.config
    stop_ids = torch.as_tensor([tok.eos_token_id])
    start = time.perf_counter()
    decoded = sample_with_cache(model, input_ids, attention_mask, max_new_tokens=c.max_new_tokens,
                                temperature=trainer.spec.sampling.temperature, stop_ids=stop_ids,
                                pad_id=tok.pad_token_id, keep_logprobs=False)
    lengths, _ = completion_lengths(decoded.new_ids, stop_ids)
    return int(lengths.sum()) / (time.perf_counter() - start)


def raw_update_tokens_per_s(trainer: LocalTrainer, batch) -> float:
    """Forward + gather + backward + AdamW on the same minibatches, without the core's loss and metrics (on a copy
    of the model and optimizer: the run itself goes on from where it was)."""
    model, optimizer = copy.deepcopy((trainer.model, trainer.optimizer))  # one copy: the optimizer steps the model's
    model.train()
    start = time.perf_counter()
    tokens = 0
    for index in minibatch_indices(len(batch), trainer.config.minibatch_size, torch.Generator().manual_seed(0)):
        mb = batch.select(index)
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
        logp = logits.float().log_softmax(-1).gather(-1, mb.input_ids[:, 1:, None])[..., 0]
        (-(logp * mb.response_mask * mb.advantages).sum() / trainer.config.max_new_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(mb.attention_mask.sum())
    return tokens / (time.perf_counter() - start)


def last_update_batch(trainer: LocalTrainer):
    """The update batch of a fresh rollout of the current policy (for the raw-update comparison)."""
    from dppo_oat.advantages import sample_advantages
    from dppo_oat.update_batch import build_update_batch

    seeds = train_group_seeds(trainer.config.seed, 20_000 + trainer.step, trainer.config.groups_per_step)
    samples = trainer.collector.collect(trainer.generator, trainer._sampling(1), seeds).samples
    advantages = sample_advantages(samples, trainer.spec.advantages)
    return build_update_batch(samples, advantages, trainer.tokenizer.pad_token_id)


def measure_steps(trainer: LocalTrainer, steps: int) -> list[dict]:
    """``steps`` RL steps, each followed by its raw counterparts: one row of rates per step."""
    rows = []
    for _ in range(steps):
        row = trainer.rl_step()
        input_ids, attention_mask = first_turn_batch(trainer)
        rows.append({"seconds": row["time/rollout"] + row["time/update"],
                     "rollout": row["tokens_per_s/rollout"], "update": row["tokens_per_s/update"],
                     "raw_generate": statistics.median(raw_generate_tokens_per_s(trainer, input_ids, attention_mask)
                                                       for _ in range(RAW_REPEATS)),
                     "raw_loop": statistics.median(raw_sampling_loop_tokens_per_s(trainer, input_ids, attention_mask)
                                                   for _ in range(RAW_REPEATS)),
                     "raw_update": raw_update_tokens_per_s(trainer, last_update_batch(trainer))})
    return rows


def default_run_seconds(cache_dir: str | None) -> float:
    with tempfile.TemporaryDirectory() as runs_dir:
        cmd = [sys.executable, "-m", "dppo_oat.train", "--runs-dir", runs_dir]
        if cache_dir:
            cmd += ["--cache-dir", cache_dir]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10,
                        help="RL steps measured, each paired with its raw counterparts")
    parser.add_argument("--cache-dir", default=None,
                        help="the tiny policy's cache (default: $DPPO_CACHE or ~/.cache/dppo_oat)")
    parser.add_argument("--default-run", action="store_true",
                        help="also time `python -m dppo_oat.train` with no arguments")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs_dir:
        config = TrainConfig(runs_dir=runs_dir, cache_dir=args.cache_dir, steps=args.steps)
        trainer = LocalTrainer(config, line_console(stderr=True))
        rows = measure_steps(trainer, args.steps)

        def median(key: str) -> float:
            return statistics.median(row[key] for row in rows)

        def paired(numerator: str, denominator: str) -> float:
            return statistics.median(row[numerator] / row[denominator] for row in rows)

        report = {
            "seconds_per_rl_step": median("seconds"),
            "rollout_tokens_per_s": median("rollout"),
            "raw_generate_tokens_per_s": median("raw_generate"),
            "rollout_vs_raw_generate": paired("rollout", "raw_generate"),
            "raw_sampling_loop_tokens_per_s": median("raw_loop"),
            "rollout_vs_raw_sampling_loop": paired("rollout", "raw_loop"),
            "update_tokens_per_s": median("update"),
            "raw_fwd_bwd_tokens_per_s": median("raw_update"),
            "update_vs_raw_fwd_bwd": paired("update", "raw_update"),
            "steps": args.steps,
            "threads": torch.get_num_threads(),
            "targets": {"rollout_vs_raw_generate": ">= 0.9", "update_vs_raw_fwd_bwd": ">= 0.9",
                        "default_run_seconds": "<= 360"},
        }
    if args.default_run:
        report["default_run_seconds"] = default_run_seconds(args.cache_dir)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
