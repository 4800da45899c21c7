"""The GPU runbook's tools on the CPU: the wheels' resolution (scripts/gpu/device_wheels.py) on made-up metadata, the
rows' stamps and file names (scripts/gpu/device_rows.py), and scripts/gpu/device_check.sh --smoke end to end (slow):
every step's rows carry their fields, and a failing step is reported in one line while the next one runs."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROVENANCE = {"bench", "gpu", "torch", "cuda", "commit", "date", "smoke"}
STEPS = ("shaped-run", "oat-lora", "oat-learner", "tests", "rollout-ops", "rollout", "learner", "fused-head",
         "default-run")
"""device_check.sh's steps, in the order it runs them."""


def load(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


wheels = load("scripts/gpu/device_wheels.py")
rows = load("scripts/gpu/device_rows.py")


@pytest.mark.parametrize("name,slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA GeForce RTX 4090", "rtx-4090"),
                                       ("cpu (2 cores)", "cpu")])
def test_a_gpu_name_becomes_a_short_file_tag(name, slug):
    assert rows.gpu_slug(name) == slug


@pytest.mark.parametrize("filename,fits", [
    ("tyro-1.0.17-py3-none-any.whl", True),
    ("pytz-2026.6-py2.py3-none-any.whl", True),
    ("msgspec-0.19.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("multiprocess-0.70.16-py312-none-any.whl", True),
    ("multiprocess-0.70.15-py311-none-any.whl", False),
    ("msgspec-0.19.0-cp311-cp311-manylinux_2_17_x86_64.whl", False),
    ("x-1.0-cp38-abi3-manylinux_2_28_x86_64.whl", True),
    ("x-1.0-cp312-cp312-manylinux_2_17_aarch64.whl", False),
    ("x-1.0-cp312-cp312-macosx_11_0_arm64.whl", False),
])
def test_only_wheels_for_cpython_312_on_linux_x86_64_fit(filename, fits):
    assert (wheels.wheel_problem(filename) is None) == fits


def fake_index(packages: dict[str, tuple[str, list[str]]], fetched: list[str]):
    """A ``fetch`` over made-up packages: ``{name: (version, Requires-Dist lines)}``; the pinned version must be the
    index's."""
    def fetch(name, version):
        have, requires = packages[name]
        assert version == have, f"{name} fetched at {version}, pinned {have}"
        fetched.append(name)
        metadata = "Name: x\n" + "".join(f"Requires-Dist: {line}\n" for line in requires)
        return wheels.Fetched(name, version, Path(f"{name}-{version}-py3-none-any.whl"), metadata)
    return fetch


def test_the_closure_skips_the_images_packages_and_follows_extras_and_markers():
    Requirement = wheels.Requirement
    packages = {
        "gem-llm": ("0.1.0", ["math-verify[antlr]", "torch>=2", "nltk==3.9.1"]),
        "math-verify": ("0.9.0", ["latex2sympy2-extended==1.11.0", 'antlr4-python3-runtime==4.13.2; extra == "antlr"',
                                  'colorama; sys_platform == "win32"', 'docs-only; extra == "docs"']),
        "latex2sympy2-extended": ("1.11.0", ["sympy"]),
        "antlr4-python3-runtime": ("4.13.2", []),
        "nltk": ("3.9.1", ["regex", 'backports-x; python_version < "3.11"']),
    }
    fetched: list[str] = []
    pins = {"gem-llm": "0.1.0", "math-verify": "0.9.0", "latex2sympy2-extended": "1.11.0",
            "antlr4-python3-runtime": "4.13.2", "nltk": "3.8.0"}
    result = wheels.resolve([Requirement("gem-llm==0.1.0"), Requirement("math-verify")], {"torch", "sympy", "regex"},
                            pins, {"nltk": "3.9.1"}, fake_index(packages, fetched))
    assert sorted(result.fetched) == sorted(packages)
    assert sorted(fetched) == sorted(packages), "each package is fetched once"
    assert result.from_image == {"torch", "sympy", "regex"}


def test_a_pin_outside_a_requirement_or_missing_is_refused():
    Requirement = wheels.Requirement
    packages = {"a": ("1.0", ["b>=2"]), "b": ("1.5", [])}
    with pytest.raises(ValueError, match=r"a 1.0 requires b>=2, but b is pinned to 1.5"):
        wheels.resolve([Requirement("a")], set(), {"a": "1.0", "b": "1.5"}, {}, fake_index(packages, []))
    with pytest.raises(ValueError, match="b is needed on the image but pinned neither"):
        wheels.resolve([Requirement("a")], set(), {"a": "1.0"}, {}, fake_index(packages, []))


def test_every_package_the_project_needs_is_pinned_or_on_the_image():
    """The project's own requirements are each on the image's list or pinned (lock or override), so that a new
    requirement cannot leave the wheels silently short."""
    image, pins = wheels.read_names(wheels.IMAGE_LIST), wheels.read_pins(wheels.LOCK)
    overrides = wheels.read_pins(wheels.OVERRIDES)
    for requirement in wheels.project_requirements(ROOT / "pyproject.toml"):
        name = wheels.canonical(requirement.name)
        assert name in image or name in pins or name in overrides, name
    assert {"torch", "transformers", "pytest", "hypothesis"} <= image
    assert {"gem-llm", "tyro", "reasoning-gym", "math-verify"}.isdisjoint(image)


def test_the_wheels_are_those_of_the_steps_named():
    """``--steps``: the package's requirements for a step of the local engine, oat's roots (with the two of the
    package's own that its learner imports) for an oat step, both for both; the script knows the check's steps."""
    project = wheels.project_requirements(ROOT / "pyproject.toml")
    names = lambda steps: sorted(wheels.canonical(r.name) for r in wheels.roots_for(steps, project))  # noqa: E731
    own, oat = sorted(wheels.canonical(r.name) for r in project), list(wheels.OAT_LEARNER_ROOTS)
    assert wheels.DEVICE_STEPS == STEPS
    assert names(["rollout", "tests"]) == own
    assert names(["oat-learner"]) == names(["oat-lora", "oat-learner"]) == sorted(["datasets", "tyro", *oat])
    assert names(STEPS) == sorted(own + oat)
    with pytest.raises(ValueError, match="unknown step.*warp-drive"):
        wheels.roots_for(["rollout", "warp-drive"], project)


def test_wheels_that_would_not_travel_beside_the_checkout_are_refused_with_what_to_do(tmp_path):
    """The wheels and the checkout's files (tracked, and untracked but not ignored) travel together in 64 MiB; the
    hint splits a set of steps that mixes oat's learner steps with the others."""
    mib = 2**20
    assert wheels.travel_problem(18 * mib, 46 * mib, ["rollout", "tests"]) is None
    problem = wheels.travel_problem(23 * mib, 45.5 * mib, STEPS)
    assert problem.startswith("23.0 MiB of wheels beside the checkout's 45.5 MiB make 68.5 MiB, over the 64 MiB")
    assert problem.endswith("--steps with oat's learner steps alone, and with the others alone")
    for steps in (["rollout", "tests"], ["oat-lora", "oat-learner"]):
        assert wheels.travel_problem(23 * mib, 45.5 * mib, steps).endswith("the checkout must shrink")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tracked.txt").write_bytes(b"x" * 1000)
    (tmp_path / "untracked.txt").write_bytes(b"y" * 500)
    (tmp_path / ".gitignore").write_text("ignored.bin\n")
    (tmp_path / "ignored.bin").write_bytes(b"z" * 4000)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt"], check=True)
    assert wheels.checkout_bytes(tmp_path) == 1000 + 500 + len("ignored.bin\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    assert wheels.checkout_bytes(outside) == 0


def test_wheels_that_lack_what_the_steps_import_are_named_with_the_steps_to_fetch(tmp_path):
    """The install checks the imports of the steps named: oat's learner's for ``oat-learner``. Here the wheels' folder
    holds one wheel, pip installs nothing and DeepSpeed does not import (a stand-in interpreter for these two
    alone): one line says which ``--steps`` to fetch."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "tyro-1.0.17-py3-none-any.whl").write_bytes(b"")
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\ncase " $* " in\n    *" -m pip "*) exit 0 ;;\n'
                      f'    *"import "*deepspeed*) exit 1 ;;\nesac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done = device_check(tmp_path, "oat-learner", env={"PYTHON": str(python), "WHEELS": str(folder),
                                                      "FORCE_INSTALL": "1", "SITE": str(tmp_path / "site")})
    [install] = [line for line in done.stdout.splitlines() if line.startswith("device_check: install")]
    assert "FAILED" in install and "lack what these steps import: run scripts/gpu/device_wheels.sh --steps " \
        "oat-learner where" in install, install


def test_rows_are_stamped_and_appended_to_the_benchs_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DPPO_COMMIT", "abc123")
    monkeypatch.setenv("DPPO_SMOKE", "1")
    lines = ["a log line", json.dumps({"ratio": 1.5}), json.dumps({"ratio": 2.0})]
    path = rows.stamp(lines, "rollout", "cpu", tmp_path)
    rows.stamp([json.dumps({"ratio": 3.0})], "rollout", "cpu", tmp_path)
    assert path == tmp_path / "rollout_cpu.jsonl"
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["ratio"] for row in written] == [1.5, 2.0, 3.0]
    assert all(PROVENANCE <= row.keys() and row["commit"] == "abc123" and row["smoke"] for row in written)
    with pytest.raises(ValueError, match="no JSON row"):
        rows.stamp(["Traceback ..."], "rollout", "cpu", tmp_path)


def test_a_junit_report_becomes_counts_and_the_failing_tests(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text('<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
                      '<testcase classname="tests.test_gpu" name="test_a"/>'
                      '<testcase classname="tests.test_gpu" name="test_b"><failure message="x"/></testcase>'
                      '<testcase classname="tests.test_gpu" name="test_c"><skipped/></testcase>'
                      '<testcase classname="tests.test_gpu" name="test_d"/></testsuite></testsuites>')
    row = rows.junit_row(report, 3.0)
    assert (row["passed"], row["failed"], row["skipped"], row["failing"]) == (2, 1, 1, ["tests.test_gpu::test_b"])


def device_check(tmp_path, *args, env=None, from_its_folder=False):
    """The smoke check with ``args``; ``from_its_folder``: called as ``bash device_check.sh`` from scripts/gpu."""
    environment = {**os.environ, "PYTHON": sys.executable, "OUT_DIR": str(tmp_path / "out"),
                   "LOG_DIR": str(tmp_path / "logs"), **(env or {})}
    script, cwd = ("device_check.sh", ROOT / "scripts" / "gpu") if from_its_folder else (
        str(ROOT / "scripts/gpu/device_check.sh"), ROOT)
    return subprocess.run(["bash", script, "--smoke", *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=900)


EXPECTED = {  # each bench's file and the fields its rows must hold
    "gpu_tests": {"passed", "failed", "errors", "skipped", "failing", "seconds"},
    "default_run": {"command", "seed", "lr", "wall_seconds", "success_before", "success_after", "eval_episodes",
                    "steps"},
    "rollout_ops": {"sampled_tokens", "forwards", "kernel_ops", "kernel_ops_per_token", "dispatched_ops",
                    "scalar_reads", "top_self_ms", "top_python_s", "seconds"},
    "rollout": {"model", "parameters", "weights", "batch", "multi_turn", "roofline", "targets", "meets_targets"},
    "learner_mfu": {"shape", "parameters", "dtype", "tokens_per_s", "mfu", "peak_flops", "peak_method",
                    "model_flops_per_update", "flops_formula"},
    "learner_memory": {"vocab", "hidden", "response_tokens", "peak_mem_ratio", "time_ratio", "max_grad_abs_diff",
                       "targets", "meets_targets"},
}


@pytest.mark.slow
def test_the_smoke_run_writes_every_benchs_rows(tmp_path):
    done = device_check(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "every step ok" in done.stdout
    for bench, fields in EXPECTED.items():
        written = [json.loads(line) for line in (tmp_path / "out" / f"{bench}_cpu.jsonl").read_text().splitlines()]
        assert written, bench
        for row in written:
            missing = (PROVENANCE | fields) - row.keys()
            assert not missing, f"{bench} lacks {missing}"
            assert row["bench"] == bench and row["smoke"] is True and row["cuda"] is None
            assert row["gpu"].startswith("cpu") and row["commit"]
    rollout = json.loads((tmp_path / "out" / "rollout_cpu.jsonl").read_text())
    assert rollout["multi_turn"]["ratio"] > 0 and rollout["roofline"]["roofline_tokens_per_s"] > 0
    assert json.loads((tmp_path / "out" / "learner_mfu_cpu.jsonl").read_text())["mfu"] > 0  # on a loaded CPU the
    # peak and the update are timed apart, so the ratio may pass 1: no bound on it is a property of the code
    ops = json.loads((tmp_path / "out" / "rollout_ops_cpu.jsonl").read_text())
    assert ops["forwards"] > 0 and ops["kernel_ops"] > ops["forwards"] and ops["sampled_tokens"] > 0
    run = json.loads((tmp_path / "out" / "default_run_cpu.jsonl").read_text())
    assert 0 <= run["success_before"] <= 1 and 0 <= run["success_after"] <= 1 and run["steps"] == 2


@pytest.mark.slow
def test_a_failing_step_is_one_line_and_the_next_step_still_runs(tmp_path):
    (tmp_path / "logs" / "rollout.json").mkdir(parents=True)  # the rollout step cannot write its output
    done = device_check(tmp_path, "rollout", "learner")
    assert done.returncode == 1
    failures = [line for line in done.stdout.splitlines() if "FAILED" in line]
    assert len(failures) == 1 and failures[0].startswith("device_check: rollout FAILED")
    assert "device_check: learner ok" in done.stdout
    assert (tmp_path / "out" / "learner_mfu_cpu.jsonl").exists()
    assert done.stdout.splitlines()[-1] == "device_check: 1 step(s) failed: rollout"


def test_the_docs_table_shows_gpu_rows_and_says_not_measured_yet_without_them(tmp_path):
    tables = load("scripts/docs_tables.py")
    stamp = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0", "commit": "0123456789ab",
             "date": "2026-11-25T00:00:00+00:00", "smoke": False}
    learner = {"bench": "learner_mfu", **stamp, "tokens_per_s": 250_000.0, "mfu": 0.31, "peak_flops": 7.9e14}
    smoke = {**learner, "smoke": True, "mfu": 0.99}
    (tmp_path / "learner_mfu_h100.jsonl").write_text(json.dumps(smoke) + "\n" + json.dumps(learner) + "\n")
    (tmp_path / "learner_mfu_cpu.jsonl").write_text(json.dumps({**learner, "gpu": "cpu (2 cores)", "cuda": None}))
    table = tables.gpu_rows_table(tmp_path)
    line = next(row for row in table.splitlines() if row.startswith("| `learner_mfu`"))
    assert "NVIDIA H100 80GB HBM3: 250,000 tokens/s, MFU 0.310 (peak 790 TFLOP/s measured) (0123456)" in line
    assert "cpu" not in line and "0.99" not in line
    assert table.count("not measured yet") == len(tables.GPU_BENCHES) - 1


def test_the_docs_table_keeps_one_shaped_run_per_lr_and_seed(tmp_path):
    """The shaped step writes a row per run: the table shows each seed's, with its lr and seed, beside an older row
    of another lr, and a rerun of one seed replaces that seed's row."""
    tables = load("scripts/docs_tables.py")
    stamp = {"bench": "shaped_run", "gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "smoke": False,
             "date": "2026-11-28T00:00:00+00:00", "eval_episodes": 200.0, "steps": 20}
    old = {**stamp, "commit": "318a79e0", "command": "python -m dppo_oat.train --steps 50", "wall_seconds": 260.0,
           "success_before": 0.785, "success_after": 0.0}
    runs = [{**stamp, "commit": "abcdef01", "command": f"python -m dppo_oat.train --seed {seed}", "seed": seed,
             "lr": 8.333e-6, "wall_seconds": 90.0, "success_before": 0.78, "success_after": after}
            for seed, after in ((0, 0.1), (1, 0.81), (0, 0.82))]
    (tmp_path / "shaped_run_h200.jsonl").write_text("".join(json.dumps(row) + "\n" for row in (old, *runs)))
    line = next(row for row in tables.gpu_rows_table(tmp_path).splitlines() if row.startswith("| `shaped_run`"))
    assert "NVIDIA H200: 260 s, success 0.785 → 0.000" in line
    assert "NVIDIA H200: lr 8.3e-06, seed 0: 90 s, success 0.780 → 0.820" in line and "→ 0.100" not in line
    assert "NVIDIA H200: lr 8.3e-06, seed 1: 90 s, success 0.780 → 0.810" in line


def test_the_docs_table_keeps_the_newest_default_run_whatever_its_seed_and_lr(tmp_path):
    tables = load("scripts/docs_tables.py")
    stamp = {"bench": "default_run", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cuda": "13.0",
             "smoke": False, "date": "2026-11-28T00:00:00+00:00", "eval_episodes": 200.0, "steps": 100,
             "command": "python -m dppo_oat.train --device cuda", "success_before": 0.765}
    old = {**stamp, "commit": "9a93ada0", "wall_seconds": 112.0, "success_after": 0.87}
    new = {**stamp, "commit": "abcdef01", "wall_seconds": 99.0, "success_after": 0.9, "seed": 0, "lr": 3e-4}
    (tmp_path / "default_run_h100.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(new) + "\n")
    line = next(row for row in tables.gpu_rows_table(tmp_path).splitlines() if row.startswith("| `default_run`"))
    assert "99 s, success 0.765 → 0.900" in line and "112 s" not in line


def test_the_docs_table_keeps_a_rollout_row_per_model_and_decode_kind(tmp_path):
    """Eager, graphs of the forward (older rows have no ``graph_sampling``), graphs that sample, and the 1.7B shape's
    row: one each, the newest of a kind replacing the older."""
    tables = load("scripts/docs_tables.py")
    stamp = {"bench": "rollout", "gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "smoke": False,
             "date": "2026-11-29T00:00:00+00:00", "batch": 64, "model": "qwen3-100m", "commit": "abcdef01"}

    def row(rate, **kind):
        return {**stamp, **kind, "multi_turn": {"generator_tokens_per_s": rate, "ratio": rate / 4000,
                                                "graph_captures": 2 if kind.get("cuda_graphs") else 0},
                "roofline": {"generator_vs_roofline": rate / 500_000}}

    rows = [row(5000.0), row(13_000.0, cuda_graphs=True), row(14_000.0, cuda_graphs=True, graph_sampling=False),
            row(40_000.0, cuda_graphs=True, graph_sampling=True), row(50_000.0, cuda_graphs=True, graph_sampling=True),
            row(45_000.0, cuda_graphs=True, graph_sampling=True, model="qwen3-1.7b")]
    (tmp_path / "rollout_h200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = next(r for r in tables.gpu_rows_table(tmp_path).splitlines() if r.startswith("| `rollout`"))
    assert "5,000 tokens/s: 1.25× generate, 0.010 of the roofline (batch 64)" in line
    assert "14,000 tokens/s" in line and "13,000" not in line and "decode in CUDA graphs of the forward" in line
    assert "50,000 tokens/s: 12.50× generate, 0.100 of the roofline (batch 64, decode in CUDA graphs that sample, 2 " \
           "captured)" in line and "40,000" not in line
    assert "qwen3-1.7b: 45,000 tokens/s" in line


def test_the_oat_learner_row_says_its_resume_check_when_it_has_one():
    tables = load("scripts/docs_tables.py")
    [row] = [json.loads(line) for line in (ROOT / "docs/bench/oat_learner_step_h200.jsonl").read_text().splitlines()
             if line.strip()][-1:]
    without = tables.oat_learner_result({**row, "resume": None})
    assert "resumed" not in without
    resume = {"deviation": 0.0042, "checkpoint_gib": 19.6, "save_seconds": 31.2, "load_seconds": 12.7}
    assert tables.oat_learner_result({**row, "resume": resume}) == without + (
        "; resumed step off by 4.2e-03 of its size (19.6 GiB checkpoint saved in 31 s, loaded in 13 s)")


@pytest.mark.slow
def test_a_budget_stops_the_running_step_with_its_processes_and_skips_the_rest(tmp_path):
    """BUDGET: a step still running when the budget runs out is stopped with every process it started (here a
    training run that would sleep 600 s) and reported in one line; the steps after it are skipped, each said so; the
    rows of the steps that finished stay. Called by a relative path from another folder, as a user may. Whatever the
    machine's load: the step that finishes prints a made-up row at once, and the budget leaves the device and install
    checks and that step a minute."""
    pids = tmp_path / "pids"
    row = json.dumps({"shape": "smoke", "tokens_per_s": 1.0, "mfu": 0.5})
    slow_python = tmp_path / "python"
    slow_python.write_text(f'#!/usr/bin/env bash\ncase " $* " in\n'
                           f'    *" dppo_oat.train "*) echo $$ >>{pids}; exec sleep 600 ;;\n'
                           f"    *learner_mfu.py*) echo '{row}'; exit 0 ;;\n"
                           f'esac\nexec {sys.executable} "$@"\n')
    slow_python.chmod(0o755)
    done = device_check(tmp_path, "learner", "default-run", "fused-head",
                        env={"PYTHON": str(slow_python), "BUDGET": "60"}, from_its_folder=True)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert any(line.startswith("device_check: learner ok") for line in lines), done.stdout
    [stopped] = [line for line in lines if line.startswith("device_check: default-run")]
    assert "STOPPED at the budget of 60s" in stopped
    assert "device_check: fused-head skipped: the budget of 60s is spent" in lines
    assert lines[-1] == "device_check: 1 step(s) failed: default-run; skipped: fused-head"
    assert (tmp_path / "out" / "learner_mfu_cpu.jsonl").exists()
    [pid] = pids.read_text().split()
    assert process_ends(int(pid), within=15), "the stopped step's training process still runs"


def process_ends(pid: int, within: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie awaiting its reaper) within ``within`` seconds."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("budget", ["0", "600"])
def test_the_shaped_step_runs_every_seed_at_every_lr_and_a_failed_run_does_not_stop_the_next(tmp_path, budget):
    """SHAPED_SEEDS × SHAPED_LRS: one training run each, the lrs outermost, ``default`` giving no ``--lr`` (the rule by
    shape), each in a folder named by its lr and seed; under a BUDGET too (the step then runs in a child process,
    which must see the lists). Every run here fails (a stand-in interpreter for ``dppo_oat.train`` only): each is
    said so in the step's log, and the step is reported FAILED once."""
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\ncase " $* " in\n'
                      f'    *" dppo_oat.train "*) echo "$*" >>{calls}; exit 3 ;;\n'
                      f'esac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done = device_check(tmp_path, "shaped-run", env={"PYTHON": str(python), "SHAPED_SEEDS": "4 5",
                                                     "SHAPED_LRS": "default 1e-5", "BUDGET": budget})
    runs = [line.split() for line in calls.read_text().splitlines()]
    settings = [(run[run.index("--lr") + 1] if "--lr" in run else None, run[run.index("--seed") + 1]) for run in runs]
    assert settings == [(None, "4"), (None, "5"), ("1e-5", "4"), ("1e-5", "5")]
    assert all("qwen3-100m" in run for run in runs)
    names = [run[run.index("--run-name") + 1] for run in runs]
    assert [name.split("-2")[0] for name in names] == ["shaped_run-lrdefault-s4", "shaped_run-lrdefault-s5",
                                                       "shaped_run-lr1e-5-s4", "shaped_run-lr1e-5-s5"]
    failed = [line for line in done.stdout.splitlines() if line.startswith("device_check: shaped-run FAILED")]
    assert len(failed) == 1 and done.returncode == 1
    assert (tmp_path / "logs" / "shaped-run.log").read_text().count("shaped-run: the run at lr") == 4


@pytest.mark.parametrize("variable", ["SHAPED_SEEDS", "SHAPED_LRS"])
def test_an_empty_list_of_shaped_runs_is_refused_in_one_line(tmp_path, variable):
    done = device_check(tmp_path, "shaped-run", env={variable: " "})
    assert done.returncode == 2 and done.stderr.strip() == (
        f"device_check: {variable} names no value (unset it for the default)")


def test_an_unknown_step_is_refused_in_one_line(tmp_path):
    for args in (["warp-drive"], ["--only", "warp-drive"]):
        done = device_check(tmp_path, *args)
        assert done.returncode == 2 and done.stderr.strip() == "device_check: unknown step 'warp-drive'" + (
            f" ({' '.join(STEPS)})" if args[0] != "--only" else "")


def test_a_stopped_runs_row_says_where_it_stopped_and_its_seconds_per_step(tmp_path):
    evals = [{"step": 0, "eval/success": 0.785, "eval/episodes": 200.0},
             {"step": 25, "eval/success": 0.0, "eval/episodes": 200.0}]
    metrics = [{"step": s, "success": [0.75, 0.016, 0.0][s - 1], "time/rollout": 5.0 + s, "time/update": 0.5}
               for s in (1, 2, 3)]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (tmp_path / "config.json").write_text(json.dumps({"seed": 2, "lr": 8.3e-6, "steps": 50}))
    flags = ["--device", "cuda", "--steps", "50", "--eval-every", "25", "--cache-dir", "/somewhere/policy-cache",
             "--runs-dir", "/somewhere/runs"]
    finished = rows.default_run_row(tmp_path, 100.0, flags)
    assert finished["command"] == "python -m dppo_oat.train --device cuda --steps 50 --eval-every 25"
    assert (finished["success_after"], finished["steps"], finished["wall_seconds"]) == (0.0, 25, 100.0)
    assert (finished["seed"], finished["lr"]) == (2, 8.3e-6)  # the lr as the run resolved it
    row = rows.default_run_row(tmp_path, 259.0, flags, stopped="by the check's budget of 270 s")
    assert row["success_after"] is None and row["wall_seconds"] is None
    assert (row["steps"], row["steps_planned"]) == (3, 50)
    assert row["stopped"] == "after step 3 of 50, by the check's budget of 270 s"
    assert (row["median_rollout_seconds"], row["median_update_seconds"]) == (7.0, 0.5)
    assert row["rollout_success_by_step"] == {"1": 0.75, "2": 0.016, "3": 0.0}
    assert row["success_by_step"] == {"0": 0.785, "25": 0.0}


def test_the_oat_learner_rows_keep_one_per_lora_rank_and_dppo_micro_batch(tmp_path):
    """The oat-learner step's rows (micro-batch 1 both, DPPO at micro-batch 4, LoRA): one each in the table, the row
    of DPPO's own micro-batch and the LoRA row saying so."""
    tables = load("scripts/docs_tables.py")
    [row] = [json.loads(line) for line in (ROOT / "docs/bench/oat_learner_step_h200.jsonl").read_text().splitlines()
             if line.strip()][-1:]
    config = {**row["config"], "micro_batch": 1}
    rows = [{**row, "config": config}, {**row, "config": {**config, "dppo_micro_batch": 4}},
            {**row, "config": {**config, "lora_rank": 16}}]
    (tmp_path / "oat_learner_step_h200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bullets = tables.oat_learner_gpu_rows(tmp_path).splitlines()
    assert len(bullets) == 3
    assert sum("micro-batch 1 / 4 (PPO / DPPO)" in bullet for bullet in bullets) == 1
    assert sum("LoRA rank 16" in bullet for bullet in bullets) == 1
