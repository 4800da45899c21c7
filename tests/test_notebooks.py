"""The notebooks run top to bottom with nbclient, with ``DPPO_RUNS`` pointing at a folder of runs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from traitlets.config import Config

from test_analysis import write_synthetic_runs

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(name: str, runs: Path, monkeypatch, tmp_path: Path) -> nbformat.NotebookNode:
    """Run ``notebooks/<name>`` in its own folder with ``DPPO_RUNS=runs``; returns the executed notebook.

    The kernel talks over local IPC sockets under ``tmp_path`` (over TCP it warns about plain-text traffic).
    """
    monkeypatch.setenv("DPPO_RUNS", str(runs))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # the debugger's notice on frozen modules
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(tmp_path / "kernel")}})
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", config=ipc,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> list[dict]:
    """Every output of every code cell."""
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]


def printed(notebook: nbformat.NotebookNode) -> str:
    """Everything the cells printed to stdout."""
    return "".join(o.get("text", "") for o in outputs(notebook) if o.get("name") == "stdout")


def images(notebook: nbformat.NotebookNode) -> int:
    """How many images the cells displayed."""
    return sum("image/png" in o.get("data", {}) for o in outputs(notebook))


def assert_clean(notebook: nbformat.NotebookNode) -> None:
    """No cell wrote to stderr (warnings included)."""
    stderr = [o.get("text", "") for o in outputs(notebook) if o.get("name") == "stderr"]
    assert not stderr, stderr


@pytest.fixture
def runs(tmp_path):
    """Synthetic runs: DPPO-Binary-TV, GRPO-ClipHigher and CISPO on one env, two seeds each, 40 steps, with a
    tokens.jsonl for seed 0."""
    write_synthetic_runs(tmp_path / "runs", steps=40)
    return tmp_path / "runs"


@pytest.mark.slow
def test_learning_curves_notebook(runs, monkeypatch, tmp_path):
    """Runs learning_curves.ipynb on the synthetic runs of ``test_analysis.write_synthetic_runs``."""
    notebook = execute("learning_curves.ipynb", runs, monkeypatch, tmp_path)
    assert_clean(notebook)
    assert "6 runs on game:Sudoku-v0-easy" in printed(notebook)
    assert images(notebook) == 9


@pytest.mark.slow
def test_clipped_tokens_notebook_with_token_samples(runs, monkeypatch, tmp_path):
    """Runs clipped_tokens.ipynb on the synthetic runs of ``test_analysis.write_synthetic_runs`` (tokens.jsonl
    present): the shadow-mask part and every token-level figure and table."""
    notebook = execute("clipped_tokens.ipynb", runs, monkeypatch, tmp_path)
    assert_clean(notebook)
    assert "token samples from 3 run(s)" in printed(notebook)
    assert images(notebook) == 3


@pytest.mark.slow
def test_clipped_tokens_notebook_from_shadow_metrics_alone(tmp_path, monkeypatch):
    """Runs clipped_tokens.ipynb on the synthetic runs of ``test_analysis.write_synthetic_runs`` without any
    tokens.jsonl: it says so and shows the shadow-mask analysis only."""
    write_synthetic_runs(tmp_path / "runs", tokens=False, steps=20)
    notebook = execute("clipped_tokens.ipynb", tmp_path / "runs", monkeypatch, tmp_path)
    assert_clean(notebook)
    assert "No run here has a tokens.jsonl" in printed(notebook)
    assert images(notebook) == 1


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Real short runs of the local engine (tiny warm-started policy, real Sudoku): DPPO-Binary-TV vs
    GRPO-ClipHigher vs CISPO, three RL steps each."""
    from test_train import SHORT

    from dppo_oat.train import main

    root = tmp_path_factory.mktemp("real-runs")
    cache = tmp_path_factory.mktemp("real-runs-cache")
    for algo in ("dppo_binary_tv", "grpo_clip_higher", "cispo"):
        main(["--trust-region", algo, "--steps", "3", "--run-dir", str(root / "runs"), "--cache-dir", str(cache), *SHORT])
    return root / "runs"


@pytest.mark.slow
def test_notebooks_on_real_local_engine_runs(real_runs, monkeypatch, tmp_path):
    """Both notebooks on runs the local engine just wrote (no tokens.jsonl: the shadow-mask analysis only)."""
    curves = execute("learning_curves.ipynb", real_runs, monkeypatch, tmp_path)
    assert_clean(curves)
    assert "3 runs" in printed(curves) and images(curves) >= 3
    tokens = execute("clipped_tokens.ipynb", real_runs, monkeypatch, tmp_path)
    assert_clean(tokens)
    assert "No run here has a tokens.jsonl" in printed(tokens) and images(tokens) == 1
