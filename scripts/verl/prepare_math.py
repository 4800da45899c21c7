"""Math sets as verl's RL parquet files (``data.train_files`` / ``data.val_files`` of ``verl.trainer.main_ppo``).

Reads what the local-math envs read (``save_to_disk`` folders or JSON(L) files with ``problem``/``answer`` or
``input``/``gt_answer`` rows, see ``envs/math_local.py``) and writes one parquet file per output, each row in the
layout of verl's own MATH example (``examples/data_preprocess/math_dataset.py`` in the verl repository): a chat prompt,
``data_source`` ``lighteval/MATH`` (scored by ``verl.utils.reward_score.math_reward``: the last ``\\boxed{}`` against
the answer), and the answer as ``reward_model.ground_truth``.

    python scripts/verl/prepare_math.py --out data/verl-math \\
        --train /data/math/train/math_lvl3to5_8k --test /data/math/evaluation_suite:aime
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""Appended to every problem (verl's MATH example)."""
DATA_SOURCE = "lighteval/MATH"
"""The key ``verl.utils.reward_score.default_compute_score`` routes to its \\boxed{} MATH grader."""


def verl_row(problem: str, answer: str, split: str, index: int, source: str) -> dict:
    """One example in verl's RL layout (``verl/utils/dataset/rl_dataset.py`` reads ``prompt`` as chat messages)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "source": source},
    }


def rows_of(specs: Iterable[str], split: str) -> list[dict]:
    """Every problem of the sets named by ``specs``, in order, as verl rows."""
    from envs.math_local import load_math_dataset, parse_math_source

    rows = []
    for spec in specs:
        path, subset = parse_math_source(spec)  # PATH or PATH:SPLIT (a split of a saved DatasetDict)
        dataset = load_math_dataset(path, split=subset)
        source = f"{os.path.basename(os.path.normpath(path))}{':' + subset if subset else ''}"
        for example in dataset:
            rows.append(verl_row(example["problem"], example["answer"], split, len(rows), source))
    return rows


def write_parquet(rows: list[dict], path: str) -> str:
    """``rows`` as one parquet file (through ``datasets``, which verl's RLHFDataset also reads with)."""
    from datasets import Dataset

    if not rows:
        raise ValueError(f"no problems to write to {path}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    Dataset.from_list(rows).to_parquet(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", nargs="+", required=True, help="training sets: PATH or PATH:SPLIT")
    parser.add_argument("--test", nargs="+", required=True, help="validation sets: PATH or PATH:SPLIT")
    parser.add_argument("--out", required=True, help="folder for train.parquet and test.parquet")
    args = parser.parse_args(argv)
    try:
        for name, specs in (("train", args.train), ("test", args.test)):
            rows = rows_of(specs, name)
            print(f"{write_parquet(rows, os.path.join(args.out, f'{name}.parquet'))}: {len(rows)} problems")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
