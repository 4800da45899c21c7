"""The docs' tables that the code defines, generated from it: every trust-region preset (``PRESETS``), the
command-line flags of the local engine (``TrainConfig``, which holds ``DPPOFlags``) with their defaults and help, and
the GPU rows of ``docs/bench/`` that ``scripts/gpu/device_check.sh`` wrote ("not measured yet" until there are some).

Each table sits in a docs page between two markers, ``<!-- generated:NAME -->`` and ``<!-- end generated:NAME -->``.

    python scripts/docs_tables.py           # rewrite every generated table
    python scripts/docs_tables.py --check   # exit 1, naming the tables that differ from the code (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import math
import re
import sys
import textwrap
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dppo_oat.engines.local.config import TrainConfig  # noqa: E402
from dppo_oat.trust_region import PRESETS, TrustRegion  # noqa: E402

CATEGORICAL = ("anchor", "relax", "is_weight", "mismatch_mask")
"""The TrustRegion fields besides ``rule`` that a preset may set, shown where they differ from the default."""


def number(value: float) -> str:
    """A field's value as the docs write it (∞ for math.inf)."""
    return "∞" if value == math.inf else f"{value:g}"


def preset_settings(name: str) -> str:
    """What preset ``name`` sets: its rule, the categorical fields it changes, and every number its rule reads."""
    tr, default = TrustRegion.preset(name), TrustRegion()
    parts = [f"rule `{tr.rule}`"]
    parts += [f"{field} `{getattr(tr, field)}`" for field in CATEGORICAL if getattr(tr, field) != getattr(default, field)]
    parts += [f"{field} {number(getattr(tr, field))}" for field in sorted(tr.fields_read)]
    return ", ".join(parts)


def presets_table() -> str:
    """Every preset: its name, its settings and its source (``PRESETS``)."""
    rows = [f"| `{name}` | {preset_settings(name)} | {preset.source} |" for name, preset in PRESETS.items()]
    return "\n".join(["| preset | settings (the numbers its rule reads) | source |", "|---|---|---|", *rows])


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and of its bases (the string literal after the field, as tyro
    reads it), joined into one line."""
    docs: dict[str, str] = {}
    for klass in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for statement, following in zip(body, body[1:]):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def flag_rows(cls: type, prefix: str = "") -> Iterator[str]:
    """One row per flag of ``cls`` (nested dataclasses as ``--outer.inner``): the flag, its default and its help."""
    docs = field_docstrings(cls)
    for field in dataclasses.fields(cls):
        flag = prefix + field.name.replace("_", "-")
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if dataclasses.is_dataclass(default):
            yield from flag_rows(type(default), prefix=f"{flag}.")
            continue
        help_text = docs.get(field.name, "").replace("|", "\\|")
        yield f"| `--{flag}` | `{default!r}` | {help_text} |"


def local_flags_table() -> str:
    """Every flag of ``python -m dppo_oat.train`` (the local engine)."""
    return "\n".join(["| flag | default | what |", "|---|---|---|", *flag_rows(TrainConfig)])


GPU_BENCHES = {  # bench: (what scripts/gpu/device_check.sh measures, its target)
    "gpu_tests": ("`pytest -m gpu`", "all pass"),
    "default_run": ("the default run: wall time, held-out success before → after", "—"),
    "rollout": ("multi-turn rollout (~100M Qwen3, V 32,768, batch 64): tokens/s ÷ `model.generate`, ÷ the decode "
                "roofline", "≥ 1.0×; ≥ 0.5"),
    "learner_mfu": ("the update in bf16 (same model): tokens/s, MFU against a measured bf16 matmul", "—"),
    "learner_memory": ("fused head ÷ logits path (V 151,936): peak memory, time, max abs gradient difference",
                       "≥ 5×, ≤ 1.1×, ≤ 1e-3"),
}
"""The device check's benchmarks, in the order of its steps."""


def gpu_rows(bench: str, folder: Path) -> list[dict]:
    """The rows of ``bench`` measured on a GPU (not smoke runs), the newest per GPU and size, oldest first."""
    rows = [json.loads(line) for path in sorted(folder.glob(f"{bench}_*.jsonl")) if not path.stem.endswith("_cpu")
            for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("bench") == bench and row.get("cuda") and not row.get("smoke")]
    newest = {(row["gpu"], row.get("hidden"), row.get("response_tokens")): row for row in rows}
    return sorted(newest.values(), key=lambda row: (row["gpu"], row.get("hidden") or 0, row.get("response_tokens") or 0))


def gpu_result(row: dict) -> str:
    """One GPU row in a few words, with its GPU and commit."""
    bench = row["bench"]
    if bench == "gpu_tests":
        text = f"{row['passed']} passed, {row['failed'] + row['errors']} failed, {row['skipped']} skipped"
    elif bench == "default_run":
        text = (f"{row['wall_seconds']:.0f} s, success {row['success_before']:.3f} → {row['success_after']:.3f} "
                f"(`{row['command'].removeprefix('python -m dppo_oat.train ')}`)")
    elif bench == "rollout":
        text = (f"{row['multi_turn']['generator_tokens_per_s']:,.0f} tokens/s: {row['multi_turn']['ratio']:.2f}× "
                f"generate, {row['roofline']['generator_vs_roofline']:.2f} of the roofline (batch {row['batch']})")
    elif bench == "learner_mfu":
        text = (f"{row['tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.2f} "
                f"(peak {row['peak_flops'] / 1e12:.0f} TFLOP/s measured)")
    else:
        text = (f"H {row['hidden']}, {row['response_tokens']:,} tokens: {row['peak_mem_ratio']:.1f}×, "
                f"{row['time_ratio']:.2f}×, {row['max_grad_abs_diff']:.1e}")
    return f"{row['gpu']}: {text} ({row['commit'][:7]})"


def gpu_rows_table(folder: Path = ROOT / "docs" / "bench") -> str:
    """One line per benchmark of the device check: what it measures, its target and its GPU rows."""
    lines = ["| step (`docs/bench/`) | measures | target | measured on a GPU |", "|---|---|---|---|"]
    for bench, (measures, target) in GPU_BENCHES.items():
        results = [gpu_result(row) for row in gpu_rows(bench, folder)] or ["not measured yet"]
        measured = "<br>".join(results).replace("|", "\\|")
        lines.append(f"| `{bench}` | {measures} | {target} | {measured} |")
    return "\n".join(lines)


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "presets": ("docs/trust-region.md", presets_table),
    "local-flags": ("docs/engines/local.md", local_flags_table),
    "gpu-rows": ("docs/gpu.md", gpu_rows_table),
}
"""Each generated table: the page it is in and the function that makes it."""


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated:{name} -->\n)(.*?)(<!-- end generated:{name} -->)", re.S)


def with_table(text: str, name: str, table: str) -> str:
    """``text`` with the block of table ``name`` replaced by ``table``; ValueError when the page has no block."""
    pattern = block(name)
    if not pattern.search(text):
        raise ValueError(f"no '<!-- generated:{name} -->' block")
    return pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(3), text, count=1)


def drifted() -> list[str]:
    """The tables whose page differs from what the code makes now (``page (table)``)."""
    stale = []
    for name, (page, make) in TABLES.items():
        text = (ROOT / page).read_text(encoding="utf-8")
        if with_table(text, name, make()) != text:
            stale.append(f"{page} ({name})")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report the tables that differ from the code")
    args = parser.parse_args(argv)
    if args.check:
        stale = drifted()
        for entry in stale:
            print(f"stale generated table: {entry}: run python scripts/docs_tables.py")
        return 1 if stale else 0
    for name, (page, make) in TABLES.items():
        path = ROOT / page
        path.write_text(with_table(path.read_text(encoding="utf-8"), name, make()), encoding="utf-8")
        print(f"wrote {page} ({name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
