"""The docs' tables that the code defines, generated from it: every trust-region preset (``PRESETS``: the README's
table of what each masks, and the docs' table of its settings and source), the
command-line flags of the local engine (``TrainConfig``, which holds ``DPPOFlags``) and of the oat engine
(``DPPOOatArgs``: the flags it declares, the oat defaults it changes and the oat flags it refuses), every preset in
verl's terms (``dppo_oat/engines/verl/mapping.py``: its loss mode, the numbers verl's config sets, its anchoring
mode, or why verl cannot run it), the faults a
user can reach, each with the test that proves it (the ``@pytest.mark.fault`` markers of ``tests/``), and the GPU
rows of ``docs/bench/`` that ``scripts/gpu/device_check.sh`` wrote ("not measured yet" until there are some).

The oat engine's module and the tests are read with ``ast``: neither oat nor a test module is imported; the verl
mapping is loaded from its file alone (it imports nothing of verl; its package registers the losses with verl).

Each table sits in a docs page between two markers, ``<!-- generated:NAME -->`` and ``<!-- end generated:NAME -->``.

    python scripts/docs_tables.py           # rewrite every generated table
    python scripts/docs_tables.py --check   # exit 1, naming the tables that differ from the code (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dppo_oat.engines.local.config import HELP_GROUPS, TrainConfig  # noqa: E402  (after the sys.path setup)
from dppo_oat.settings import spec as spec_module  # noqa: E402  (after the sys.path setup)
from dppo_oat.settings.docstrings import documented_fields  # noqa: E402  (after the sys.path setup)
from dppo_oat.settings.grouped_cli import flag_help  # noqa: E402  (after the sys.path setup)
from dppo_oat.settings.spec import DPPOFlags  # noqa: E402  (after the sys.path setup)
from dppo_oat.trust_region import CHOICE_FIELDS, FIELD_SYMBOLS, NUMBER_FIELDS, PRESETS, TrustRegion  # noqa: E402  (after the sys.path setup)

# --------------------------------------------------------------------------------- the trust-region presets

CATEGORICAL = tuple(field for field in CHOICE_FIELDS if field != "rule")
"""The TrustRegion fields besides ``rule`` that a preset may set, shown where they differ from the default."""


def number(value: float) -> str:
    """A field's value as the docs write it (∞ for math.inf)."""
    return "∞" if value == math.inf else f"{value:g}"


def preset_settings(name: str) -> str:
    """What preset ``name`` sets: its rule, the categorical fields it changes, and every number its rule reads."""
    tr, default = TrustRegion.preset(name), TrustRegion()
    parts = [f"rule `{tr.rule}`"]
    parts += [f"{field} `{getattr(tr, field)}`" for field in CATEGORICAL
              if getattr(tr, field) != getattr(default, field)]
    parts += [f"{field} {number(getattr(tr, field))}" for field in sorted(tr.fields_read)]
    return ", ".join(parts)


def presets_table() -> str:
    """Every preset: its name, its settings and its source (``PRESETS``)."""
    rows = [f"| `{name}` | {preset_settings(name)} | {preset.source} |" for name, preset in PRESETS.items()]
    return "\n".join(["| preset | settings (the numbers its rule reads) | source |", "|---|---|---|", *rows])


def preset_numbers(name: str) -> str:
    """The numbers preset ``name`` sets itself, as the docs write them (``δ 0.15, K 20``), or ``—``."""
    fields = PRESETS[name].fields
    return ", ".join(f"{FIELD_SYMBOLS[field]} {number(fields[field])}" for field in NUMBER_FIELDS
                     if field in fields) or "—"


PAPER_CITATION = re.compile(r"\b(?:eq|sec|app|fig):[A-Za-z_\-]*[A-Za-z_]")
"""A preset whose source cites one of the paper's labels is one of the paper's methods."""


def readme_presets_table() -> str:
    """The README's table: each of the paper's presets (its source cites the paper) with its name, what its mask
    blocks and the numbers it sets; then one row naming the others (other frameworks, later papers, the CPU study's
    ablations), whose masks and sources docs/trust-region.md gives (``PRESETS``)."""
    papers = {name: preset for name, preset in PRESETS.items() if PAPER_CITATION.search(preset.source)}
    rows = [f"| `{name}` | {cell(preset.label)} | {cell(preset.blocks)} | {preset_numbers(name)} |"
            for name, preset in papers.items()]
    others = [name for name in PRESETS if name not in papers]
    if others:
        names = ", ".join(f"`{name}`" for name in others)
        rows.append(f"| {names} | {len(others)} presets of other frameworks, later papers and the CPU study | "
                    "docs/trust-region.md gives each one's mask, numbers and source | |")
    return "\n".join(["| preset | name | mask blocks … | defaults |", "|---|---|---|---|", *rows])


# --------------------------------------------------------------------------------- flags, from their dataclasses


def cell(text: str) -> str:
    """``text`` inside a Markdown table cell (its ``|`` escaped)."""
    return text.replace("|", "\\|")


def flag_row(flag: str, default: str, help_text: str) -> str:
    """One row of a flags table: the flag, its default (as Python writes it) and its help."""
    return f"| `--{flag}` | `{default}` | {cell(help_text)} |"


def flag_rows(cls: type, prefix: str = "", names: tuple[str, ...] | None = None) -> Iterator[str]:
    """One row per flag of ``cls`` (nested dataclasses as ``--outer.inner``), or of its fields ``names`` in that
    order: the flag, its default and its help."""
    docs, fields = flag_help(cls), {field.name: field for field in dataclasses.fields(cls)}
    for name in fields if names is None else names:
        field, flag = fields[name], prefix + name.replace("_", "-")
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if dataclasses.is_dataclass(default):
            yield from flag_rows(type(default), prefix=f"{flag}.")
            continue
        yield flag_row(flag, repr(default), docs.get(name, ""))


FLAGS_HEADER = ["| flag | default | what |", "|---|---|---|"]


def section_row(title: str, about: str) -> str:
    """The row that opens a section of a flags table: its title (``--help``'s heading) and what it says."""
    return f"| **{title}** | | {cell(about)} |" if about else f"| **{title}** | | |"


def check_sections(names, sections: list[tuple[str, ...]], what: str) -> None:
    """Every flag of ``names`` is in one of the sections (else its table would leave it out)."""
    left_out = sorted(set(names) - {name for section in sections for name in section})
    if left_out:
        raise ValueError(f"{what}: no help section holds {left_out}: add them to HELP_GROUPS")


def local_flags_table() -> str:
    """Every flag of ``python -m dppo_oat.train`` (the local engine), in the sections of its ``--help``
    (``HELP_GROUPS``)."""
    check_sections([field.name for field in dataclasses.fields(TrainConfig)], [g.fields for g in HELP_GROUPS],
                   "TrainConfig")
    rows = [row for group in HELP_GROUPS
            for row in [section_row(group.title, group.about), *flag_rows(TrainConfig, names=group.fields)]]
    return "\n".join([*FLAGS_HEADER, *rows])


# --------------------------------------------------------------------------------- the oat engine (read, not run)

OAT_ARGS = ROOT / "dppo_oat" / "engines" / "oat" / "args.py"
"""The oat engine's arguments: ``DPPOOatArgs(PPOArgs, DPPOFlags)``; importing it imports oat, so it is parsed."""


def oat_args_module() -> ast.Module:
    return ast.parse(OAT_ARGS.read_text(encoding="utf-8"))


def class_node(module: ast.Module, name: str) -> ast.ClassDef:
    return next(node for node in module.body if isinstance(node, ast.ClassDef) and node.name == name)


def constant_node(module: ast.Module, name: str) -> ast.expr:
    """The expression assigned to ``name`` at the top of ``module``."""
    assignment = next(node for node in module.body if isinstance(node, ast.Assign)
                      and any(isinstance(target, ast.Name) and target.id == name for target in node.targets))
    return assignment.value


def constant(module: ast.Module, name: str):
    """The literal value assigned to ``name`` at the top of ``module``."""
    return ast.literal_eval(constant_node(module, name))


def declared_defaults(klass: ast.ClassDef) -> dict[str, str]:
    """Each field a class body declares with a default, and that default as Python writes it."""
    defaults = {}
    for statement in klass.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value:
            try:
                defaults[statement.target.id] = repr(ast.literal_eval(statement.value))
            except ValueError:
                defaults[statement.target.id] = ast.unparse(statement.value)
    return defaults


def oat_engine_flags() -> dict[str, tuple[str, str]]:
    """The flags the oat engine declares, ``name -> (default, help)``: ``DPPOFlags``' (with the defaults and help
    ``DPPOOatArgs`` gives them again), then the fields ``DPPOOatArgs`` documents itself; a field it declares
    without a docstring only changes the default of oat's own flag (:func:`oat_default_changes`)."""
    docs = flag_help(DPPOFlags)
    flags = {field.name: (repr(field.default), docs[field.name]) for field in dataclasses.fields(DPPOFlags)}
    klass = class_node(oat_args_module(), "DPPOOatArgs")
    own_docs = documented_fields(klass)
    for name, default in declared_defaults(klass).items():
        if name in flags or name in own_docs:
            flags[name] = (default, own_docs.get(name) or flags[name][1])
    return flags


def oat_default_changes() -> dict[str, str]:
    """oat's own flags whose default ``DPPOOatArgs`` changes (declared there without a docstring), apart from those
    it refuses (``REPLACED_OAT_FLAGS``, whose one accepted value is that default)."""
    module = oat_args_module()
    klass, refused = class_node(module, "DPPOOatArgs"), constant(module, "REPLACED_OAT_FLAGS")
    documented = set(documented_fields(klass)) | {field.name for field in dataclasses.fields(DPPOFlags)}
    return {name: default for name, default in declared_defaults(klass).items()
            if name not in documented and name not in refused}


def spec_value(node: ast.expr):
    """A literal, or a name :mod:`dppo_oat.settings.spec` defines (``OVERRIDES_ABOUT``), as the oat engine's module
    uses it."""
    return getattr(spec_module, node.id) if isinstance(node, ast.Name) else ast.literal_eval(node)


def oat_help_groups() -> list[tuple[str, str, tuple[str, ...]]]:
    """The oat engine's ``HELP_GROUPS``, read from its source: ``(title, about, fields)`` per ``FlagGroup(...)``,
    a ``*NAME`` among the fields being a tuple of :mod:`dppo_oat.settings.spec`."""
    groups = []
    for call in constant_node(oat_args_module(), "HELP_GROUPS").elts:
        title, about, fields = call.args
        names = [name for elt in fields.elts
                 for name in (spec_value(elt.value) if isinstance(elt, ast.Starred) else (spec_value(elt),))]
        groups.append((spec_value(title), spec_value(about), tuple(names)))
    return groups


def oat_flags_table() -> str:
    """Every flag the oat engine adds to oat's (``DPPOOatArgs`` and the ``DPPOFlags`` it holds), in the sections of
    its ``--help`` (``HELP_GROUPS``)."""
    flags, groups = oat_engine_flags(), oat_help_groups()
    check_sections(flags, [names for _, _, names in groups], "DPPOOatArgs")
    rows = [row for title, about, names in groups
            for row in [section_row(title, about), *(flag_row(name, *flags[name]) for name in names)]]
    return "\n".join([*FLAGS_HEADER, *rows])


def oat_refused_table() -> str:
    """oat's flags whose job DPPO does differently, refused at any value but one (``REPLACED_OAT_FLAGS``)."""
    refused = constant(oat_args_module(), "REPLACED_OAT_FLAGS")
    rows = [f"| `--{name}` | `{accepted!r}` | {cell(hint)} |" for name, (accepted, hint) in refused.items()]
    return "\n".join(["| oat flag | the one value accepted | instead |", "|---|---|---|", *rows])


def verl_mapping():
    """``dppo_oat/engines/verl/mapping.py`` as a module of its own, without its package (whose ``__init__`` imports
    verl to register the losses)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("verl_mapping", ROOT / "dppo_oat" / "engines" / "verl" / "mapping.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verl_presets_table() -> str:
    """Every preset on the verl engine: its ``loss_mode``, the numbers verl's actor config sets (the rest are the
    preset's), and the mode that anchors it (bypass: μ only; decoupled: μ and π_θ'), or why verl cannot run it."""
    mapping, names = verl_mapping(), FIELD_SYMBOLS
    rows = []
    for name, reason in mapping.supported_presets().items():
        if reason:
            rows.append(f"| `{name}` | refused | | {cell(reason.split(' is refused: ', 1)[-1])} |")
            continue
        tr = mapping.TrustRegion.preset(name)
        settable = ", ".join(names[field] for field in mapping.verl_settable_fields(tr))
        mode = "decoupled (μ and π_θ')" if tr.needs_recompute else "bypass (μ)"
        rows.append(f"| `{name}` | `{mapping.loss_name(name)}` | {settable} | {mode} |")
    return "\n".join(["| preset | verl `policy_loss.loss_mode` | set by verl's config | anchoring mode |",
                      "|---|---|---|---|", *rows])


def oat_defaults_table() -> str:
    """oat's flags whose default the oat engine changes."""
    rows = [f"| `--{name}` | `{default}` |" for name, default in oat_default_changes().items()]
    return "\n".join(["| oat flag | default here |", "|---|---|", *rows])


# --------------------------------------------------------------------------------- the faults, from their tests

TESTS = ROOT / "tests"
"""Where the fault markers are: ``@pytest.mark.fault("situation", "what the user sees")`` on a test function."""


class Fault(NamedTuple):
    """One row of docs/faults.md: a fault a user can reach, what they see, and the test that proves it."""

    situation: str
    outcome: str
    test: str
    """``tests/file.py::test_name``, as pytest names it."""


def functions_of(module: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """The functions of a module, top-level or in a class, each with its pytest name (``Class::name``)."""
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for method in node.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}::{method.name}", method


def is_fault_marker(decorator: ast.expr) -> bool:
    """True for ``@pytest.mark.fault(...)``."""
    return isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pytest.mark.fault"


def fault_of(marker: ast.Call, test: str) -> Fault:
    """The row a marker states; ValueError unless it holds exactly two non-empty string literals."""
    texts = [arg.value for arg in marker.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    if len(texts) != 2 or len(marker.args) != 2 or marker.keywords or not all(t.strip() for t in texts):
        raise ValueError(f"{test}: a fault marker takes two strings, the situation and what the user sees "
                         f"(got {ast.unparse(marker)})")
    situation, outcome = (" ".join(text.split()) for text in texts)
    return Fault(situation, outcome, test)


def faults_in(path: Path, root: Path) -> Iterator[Fault]:
    """The faults that the tests of one file mark, in the file's order; ValueError for a marker on a function pytest
    does not run (its name does not start with ``test``)."""
    where = path.relative_to(root.parent).as_posix()
    for name, function in functions_of(ast.parse(path.read_text(encoding="utf-8"))):
        for decorator in filter(is_fault_marker, function.decorator_list):
            if not function.name.startswith("test"):
                raise ValueError(f"{where}::{name}: a fault marker on a function that is not a test")
            yield fault_of(decorator, f"{where}::{name}")


FAULT_SUITE = "test_faults.py"
"""The fault suite (the command line, runs, checkpoints, signals, files): its rows come first."""


def in_table_order(path: Path, root: Path) -> tuple:
    """The fault suite first, then the other files of the top folder, then those of its subfolders, by name."""
    return len(path.relative_to(root).parts), path.name != FAULT_SUITE, path.as_posix()


def faults(root: Path) -> list[Fault]:
    """Every fault marked by the tests under ``root``, each file in its order (:func:`in_table_order`); ValueError
    when two markers name the same situation."""
    files = sorted(root.rglob("test_*.py"), key=lambda path: in_table_order(path, root))
    found = [fault for path in files for fault in faults_in(path, root)]
    seen: dict[str, str] = {}
    for fault in found:
        key = fault.situation.casefold()
        if key in seen:
            raise ValueError(f"the fault {fault.situation!r} is marked twice: {seen[key]} and {fault.test}")
        seen[key] = fault.test
    return found


def faults_table() -> str:
    """Every fault a user can reach: the situation, what the user sees, and the test that proves it."""
    rows = [f"| {cell(f.situation)} | {cell(f.outcome)} | `{f.test}` |" for f in faults(TESTS)]
    return "\n".join(["| fault | what the user sees | test |", "|---|---|---|", *rows])


# --------------------------------------------------------------------------------- the pages

GPU_BENCHES = {  # bench: (what scripts/gpu/device_check.sh measures, its target)
    "shaped_run": ("the local engine with the ~100M policy (`--warm-start.shape qwen3-100m`), warm-started on the GPU, "
                   "then RL at a learning rate and seed: wall time, held-out success before → after",
                   "after > before in every seed at the default `--lr`"),
    "oat_learner_step": ("oat's own learners under DeepSpeed ZeRO-2, bf16, at Qwen3-1.7B's shape: DPPO's step time ÷ "
                         "PPO's (same batch), each one's peak memory and MFU; DPPO's learner resumed from its "
                         "checkpoint: the resumed step's distance from the uninterrupted one ÷ the step's size",
                         "≤ 0.85; ≤ 0.01"),
    "gpu_tests": ("`pytest -m gpu`", "all pass"),
    "default_run": ("the default run: wall time, held-out success before → after", "—"),
    "rollout_ops": ("one default-run rollout: operations dispatched (about one kernel launch each on a GPU) per "
                    "sampled token, and its wall time", "—"),
    "rollout": ("multi-turn rollout (~100M Qwen3, V 32,768, batch 64): tokens/s ÷ `model.generate`, ÷ the decode "
                "roofline; at Qwen3-1.7B's shape (random weights), ÷ the roofline", "≥ 5×; ≥ 0.2; 1.7B: ≥ 0.5"),
    "learner_mfu": ("the update in bf16 (same model): tokens/s, MFU against a measured bf16 matmul", "—"),
    "learner_memory": ("fused head ÷ logits path (V 151,936): peak memory, time, max abs gradient difference",
                       "≥ 5×, ≤ 1.1×, ≤ 1e-3"),
}
"""The device check's benchmarks, in the order of its steps."""


PER_RUN_BENCHES = ("shaped_run",)
"""Benchmarks whose rows are runs of a study (a row per learning rate and seed, all kept); the default run's row is
one run, replaced by the next."""


def gpu_rows(bench: str, folder: Path) -> list[dict]:
    """The rows of ``bench`` measured on a GPU (not smoke runs), the newest per GPU, model, size, decode (eager, in a
    CUDA graph of the forward, in one that samples too) and, for the shaped runs (:data:`PER_RUN_BENCHES`), learning
    rate and seed; oldest first."""
    rows = [json.loads(line) for path in sorted(folder.glob(f"{bench}_*.jsonl")) if not path.stem.endswith("_cpu")
            for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("bench") == bench and row.get("cuda") and not row.get("smoke")]
    per_run = bench in PER_RUN_BENCHES
    newest = {(row["gpu"], row.get("model"), row.get("hidden"), row.get("response_tokens"), decode_kind(row),
               learner_setup(row), row.get("lr") if per_run else None, row.get("seed") if per_run else None): row
              for row in rows}
    return sorted(newest.values(), key=lambda row: (row["gpu"], row.get("model") or "", row.get("hidden") or 0,
                                                    row.get("response_tokens") or 0, decode_kind(row),
                                                    learner_setup(row), row.get("lr") or 0, row.get("seed") or 0))


def learner_setup(row: dict) -> tuple[int, int]:
    """An oat learner row's LoRA rank and DPPO's micro-batch (rows from before ``--dppo-micro-batch``: the common
    one); (0, 0) for other rows."""
    config = row.get("config") or {}
    return config.get("lora_rank") or 0, config.get("dppo_micro_batch") or config.get("micro_batch") or 0


def decode_kind(row: dict) -> int:
    """How a rollout row decoded: 0 eagerly, 1 in CUDA graphs of the forward (rows from before the graphs sampled
    have no ``graph_sampling``), 2 in CUDA graphs that sample too."""
    if not row.get("cuda_graphs"):
        return 0
    return 2 if row.get("graph_sampling") else 1


def run_settings(row: dict) -> str:
    """A run row's learning rate and seed as a prefix ("lr 8.3e-06, seed 1: "), nothing for rows without them."""
    settings = [f"{name} {row[name]:.2g}" if name == "lr" else f"{name} {row[name]}" for name in ("lr", "seed")
                if row.get(name) is not None]
    return ", ".join(settings) + ": " if settings else ""


def graphs_note(row: dict) -> str:
    """How a rollout row decoded: nothing for the eager decode; in a CUDA graph, with the captures when the row
    counts them (rows of the graphs kept across calls)."""
    if not row.get("cuda_graphs"):
        return ""
    captures = row["multi_turn"].get("graph_captures")
    if captures is None:
        return ", decode in a CUDA graph"
    kind = "that sample" if row.get("graph_sampling") else "of the forward"
    return f", decode in CUDA graphs {kind}, {captures} captured"


def gpu_result(row: dict) -> str:
    """One GPU row in a few words, with its GPU and commit."""
    bench = row["bench"]
    if bench == "gpu_tests":
        text = f"{row['passed']} passed, {row['failed'] + row['errors']} failed, {row['skipped']} skipped"
        if row.get("interrupted"):
            text += f", {len(row['interrupted'])} interrupted ({row['note']})"
    elif bench in ("default_run", "shaped_run") and row.get("stopped"):
        later = [f"{success:.3f} at step {step}" for step, success in row["success_by_step"].items() if step != "0"]
        text = (f"{run_settings(row)}stopped {row['stopped']}; success before {row['success_before']:.3f}"
                f"{', then ' + ', '.join(later) if later else ''}; median "
                f"{row['median_rollout_seconds']:.2f} s of rollout and {row['median_update_seconds']:.2f} s of "
                f"update per step (`{row['command'].removeprefix('python -m dppo_oat.train ')}`)")
    elif bench in ("default_run", "shaped_run"):
        text = (f"{run_settings(row)}{row['wall_seconds']:.0f} s, success {row['success_before']:.3f} → "
                f"{row['success_after']:.3f} "
                f"(`{row['command'].removeprefix('python -m dppo_oat.train ')}`)")
    elif bench == "rollout_ops":
        text = (f"{row['kernel_ops']:,} operations for {row['sampled_tokens']:,} tokens "
                f"({row['kernel_ops_per_token']:.1f} per token, {row['forwards']} forwards), {row['seconds']:.2f} s")
        if row.get("device_busy_ms") is not None:
            text += (f" (the GPU busy {row['device_busy_ms']:.0f} ms of it; "
                     f"{row['op_microseconds']:.0f} µs per small op)")
    elif bench == "rollout":
        shape = "" if row.get("model") in (None, "qwen3-100m") else f"{row['model']}: "
        multi = row["multi_turn"]
        text = (f"{shape}{multi['generator_tokens_per_s']:,.0f} tokens/s: {multi['ratio']:.2f}× generate, "
                f"{row['roofline']['generator_vs_roofline']:.3f} of the roofline (batch {row['batch']}"
                f"{graphs_note(row)})")
    elif bench == "oat_learner_step":
        text = oat_learner_result(row)
    elif bench == "learner_mfu":
        text = (f"{row['tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.3f} "
                f"(peak {row['peak_flops'] / 1e12:.0f} TFLOP/s measured)")
    else:
        text = (f"H {row['hidden']}, {row['response_tokens']:,} tokens: {row['peak_mem_ratio']:.1f}×, "
                f"{row['time_ratio']:.2f}×, {row['max_grad_abs_diff']:.1e}")
    return f"{row['gpu']}: {text} ({row['commit'][:7]})"


def oat_learner_result(row: dict) -> str:
    """An ``oat_learner_step`` row in a few words: the ratio, the shape, each learner's peak and MFU, the optimizer."""
    config, learners = row["config"], row["learners"]
    optimizer = ("FusedAdam compiled" if row["fused_adam"]["compiled"]
                 else f"FusedAdam did not compile: torch's fused AdamW ({row['fused_adam']['error']})")
    return (f"DPPO ÷ PPO step time {row['dppo_vs_ppo_step_time']:.2f} "
            f"(H {config['hidden']}, {config['layers']} layers, "
            f"{config['sequences']} × {config['prompt_tokens']} + {config['response_tokens']} tokens"
            f"{learner_setup_note(config)}); peak "
            f"{row['peak_mem_total_gib']['ppo']:.1f} / {row['peak_mem_total_gib']['dppo']:.1f} GiB, MFU "
            f"{learners['ppo']['mfu']:.3f} / {learners['dppo']['mfu']:.3f} (PPO / DPPO); {optimizer}, DeepSpeed "
            f"{row['deepspeed']}, {row['attention']} attention{resume_result(row.get('resume'))}")


def learner_setup_note(config: dict) -> str:
    """", micro-batch 1 / 4" where DPPO's micro-batch is not PPO's, ", LoRA rank 16" under LoRA; else nothing."""
    note, shared = "", config.get("micro_batch")
    if config.get("dppo_micro_batch", shared) != shared:
        note += f", micro-batch {shared} / {config['dppo_micro_batch']} (PPO / DPPO)"
    if config.get("lora_rank"):
        note += f", LoRA rank {config['lora_rank']}"
    return note


def resume_result(resume: dict | None) -> str:
    """The resume check of an ``oat_learner_step`` row in a few words (nothing for a row without one)."""
    if not resume:
        return ""
    return (f"; resumed step off by {resume['deviation']:.1e} of its size ({resume['checkpoint_gib']:.1f} GiB "
            f"checkpoint saved in {resume['save_seconds']:.0f} s, loaded in {resume['load_seconds']:.0f} s)")


def gpu_rows_table(folder: Path = ROOT / "docs" / "bench") -> str:
    """One line per benchmark of the device check: what it measures, its target and its GPU rows."""
    lines = ["| step (`docs/bench/`) | measures | target | measured on a GPU |", "|---|---|---|---|"]
    for bench, (measures, target) in GPU_BENCHES.items():
        results = [gpu_result(row) for row in gpu_rows(bench, folder)] or ["not measured yet"]
        measured = "<br>".join(results).replace("|", "\\|")
        lines.append(f"| `{bench}` | {measures} | {target} | {measured} |")
    return "\n".join(lines)


def oat_learner_gpu_rows(folder: Path = ROOT / "docs" / "bench") -> str:
    """The GPU rows of ``oat_learner_step``, one bullet each (docs/performance.md), or a bullet saying there is none."""
    rows = gpu_rows("oat_learner_step", folder)
    return "\n".join(f"- {gpu_result(row)}" for row in rows) or "- none recorded yet"


# --------------------------------------------------------------------------------- the oat engine's CPU rehearsal

NODE_CPU_DIFFERENCES = ROOT / "requirements" / "oat-node-cpu.txt"


def node_cpu_differences(path: Path = NODE_CPU_DIFFERENCES) -> list[tuple[str, str, str, str]]:
    """The packages in which the CPU rehearsal's environment differs from the GPU node's lock:
    ``(name, on the node, in the rehearsal, why)``, one per line ``name | node | rehearsal | why`` of ``path``."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            cells = [cell.strip() for cell in line.split(" | ")]
            if len(cells) != 4:
                raise ValueError(f"{path.name}: not 'name | node | rehearsal | why': {line}")
            rows.append(tuple(cells))
    return rows


def node_cpu_table() -> str:
    """requirements/oat-node-cpu.txt as the docs' table of what the CPU rehearsal runs differently."""
    lines = ["| package | on the GPU node | in the CPU rehearsal | why |", "|---|---|---|---|"]
    lines += [f"| {name} | {node} | {rehearsal} | {why} |" for name, node, rehearsal, why in node_cpu_differences()]
    return "\n".join(lines)


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "readme-presets": ("README.md", readme_presets_table),
    "presets": ("docs/trust-region.md", presets_table),
    "local-flags": ("docs/engines/local.md", local_flags_table),
    "oat-flags": ("docs/engines/oat.md", oat_flags_table),
    "oat-refused": ("docs/engines/oat.md", oat_refused_table),
    "oat-defaults": ("docs/engines/oat.md", oat_defaults_table),
    "oat-node-cpu": ("docs/engines/oat.md", node_cpu_table),
    "verl-presets": ("docs/engines/verl.md", verl_presets_table),
    "faults": ("docs/faults.md", faults_table),
    "gpu-rows": ("docs/gpu.md", gpu_rows_table),
    "oat-learner-gpu-rows": ("docs/performance.md", oat_learner_gpu_rows),
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
