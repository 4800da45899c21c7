"""The notebooks run top to bottom with nbclient, with ``DPPO_RUNS`` pointing at a folder of runs."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from test_analysis import write_synthetic_runs
from traitlets.config import Config

from dppo_oat.analysis import is_run_dir, load_run, notebook_runs
from dppo_oat.analysis.tokens import read_tokens

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def execute(which: str | Path, runs: Path, monkeypatch, tmp_path: Path) -> nbformat.NotebookNode:
    """Run ``notebooks/<which>`` (or the notebook at path ``which``) in its own folder with ``DPPO_RUNS=runs``; returns
    the executed notebook.

    The kernel talks over local IPC sockets under ``tmp_path`` (over TCP it warns about plain-text traffic).
    """
    path = which if isinstance(which, Path) else NOTEBOOKS / which
    monkeypatch.setenv("DPPO_RUNS", str(runs))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # the debugger's notice on frozen modules
    notebook = nbformat.read(path, as_version=4)
    ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(tmp_path / "kernel")}})
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", config=ipc,
                            resources={"metadata": {"path": str(path.parent)}})
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
    assert "final reward, highest first: " in printed(notebook)  # what these runs show, not the paper's claim


@pytest.mark.slow
def test_clipped_tokens_notebook_with_token_samples(runs, monkeypatch, tmp_path):
    """Runs clipped_tokens.ipynb on the synthetic runs of ``test_analysis.write_synthetic_runs`` (tokens.jsonl
    present): the shadow-mask part and every token-level figure and table."""
    notebook = execute("clipped_tokens.ipynb", runs, monkeypatch, tmp_path)
    assert_clean(notebook)
    assert "token samples from 3 run(s)" in printed(notebook)
    assert images(notebook) == 3
    assert "PPO's ratio clip would block most at μ < 0.1" in printed(notebook)


@pytest.mark.slow
def test_clipped_tokens_notebook_from_shadow_metrics_alone(tmp_path, monkeypatch):
    """Runs clipped_tokens.ipynb on the synthetic runs of ``test_analysis.write_synthetic_runs`` without any
    tokens.jsonl: it says so and shows the shadow-mask analysis only."""
    write_synthetic_runs(tmp_path / "runs", tokens=False, steps=20)
    notebook = execute("clipped_tokens.ipynb", tmp_path / "runs", monkeypatch, tmp_path)
    assert_clean(notebook)
    assert "No run here has a tokens.jsonl" in printed(notebook)
    assert "No run here has token exports" in printed(notebook)
    assert images(notebook) == 1


@pytest.mark.slow
def test_learning_curves_notebook_skips_damaged_runs_with_one_warning_each(runs, monkeypatch, tmp_path):
    """Beside the synthetic runs, one whose config.json is a JSON list and one whose metrics.jsonl is empty: the
    notebook warns once about each, naming it, and shows the others."""
    for name, config, metrics in (("listed", "[1, 2]", '{"step": 1, "reward": 1.0}\n'),
                                  ("fresh", '{"run_name": "fresh"}', "")):
        (runs / name).mkdir()
        (runs / name / "config.json").write_text(config)
        (runs / name / "metrics.jsonl").write_text(metrics)
    notebook = execute("learning_curves.ipynb", runs, monkeypatch, tmp_path)
    stderr = "".join(o.get("text", "") for o in outputs(notebook) if o.get("name") == "stderr")
    assert stderr.count("UserWarning") == 2, stderr
    assert f"{runs / 'listed'}: skipped, its config.json holds a list, not a JSON object" in stderr
    assert f"{runs / 'fresh'}: skipped, no step logged yet (its metrics.jsonl holds no row)" in stderr
    assert "6 runs on game:Sudoku-v0-easy" in printed(notebook) and images(notebook) == 9


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Real short runs of the local engine (the shipped warm-started policy, real Sudoku): DPPO-Binary-TV vs
    GRPO-ClipHigher vs CISPO, three RL steps each."""
    from test_train import SHIPPED

    from dppo_oat.train import main

    root = tmp_path_factory.mktemp("real-runs")
    cache = tmp_path_factory.mktemp("real-runs-cache")
    for algo in ("dppo_binary_tv", "grpo_clip_higher", "cispo"):
        export = ["--token-export", "all"] if algo == "dppo_binary_tv" else []
        main(["--trust-region", algo, "--steps", "3", "--runs-dir", str(root / "runs"), "--cache-dir", str(cache),
              *export, *SHIPPED])
    return root / "runs"


@pytest.mark.slow
def test_notebooks_on_real_local_engine_runs(real_runs, monkeypatch, tmp_path):
    """Both notebooks on runs the local engine just wrote, tokens.jsonl included (and one run's token exports):
    every token-level table."""
    curves = execute("learning_curves.ipynb", real_runs, monkeypatch, tmp_path)
    assert_clean(curves)
    assert "3 runs" in printed(curves) and images(curves) >= 3
    tokens = execute("clipped_tokens.ipynb", real_runs, monkeypatch, tmp_path)
    assert_clean(tokens)
    assert "token samples from 3 run(s)" in printed(tokens) and images(tokens) == 3
    assert all(heading in html_tables(tokens) for heading in ("clip_only %", "positive samples", "blocked high %"))
    assert "exported tokens from 1 run(s)" in printed(tokens)


EXAMPLE_RUNS = NOTEBOOKS / "example_runs"
EXECUTED = ("learning_curves.ipynb", "clipped_tokens.ipynb")


def html_tables(notebook: nbformat.NotebookNode) -> str:
    """Every HTML table the cells displayed, as one string."""
    return "".join(o.get("data", {}).get("text/html", "") for o in outputs(notebook))


@pytest.mark.parametrize("name", EXECUTED)
def test_committed_notebooks_show_their_figures(name):
    """The notebooks are committed executed, top to bottom, with figures and (clipped tokens) real token tables:
    on GitHub or in a fresh clone there is something to read (``make notebooks`` re-executes them)."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    counts = [cell.get("execution_count") for cell in notebook.cells if cell.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), "execute it top to bottom (make notebooks-refresh)"
    assert_clean(notebook)
    assert images(notebook) >= 3
    assert "Reading the example runs" in printed(notebook)
    if name == "clipped_tokens.ipynb":
        assert "token samples from 6 run(s)" in printed(notebook) and "clip_only %" in html_tables(notebook)


@pytest.mark.slow
@pytest.mark.parametrize("name", EXECUTED)
def test_notebooks_execute_in_a_fresh_clone(name, monkeypatch, tmp_path):
    """Without DPPO_RUNS the notebooks read runs/ or, as in a fresh clone, the shipped example runs, and say so."""
    monkeypatch.delenv("DPPO_RUNS", raising=False)
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(tmp_path / "kernel")}})
    NotebookClient(notebook, timeout=300, kernel_name="python3", config=ipc,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    assert_clean(notebook)
    own_runs = NOTEBOOKS.parent / "runs"
    if not (own_runs.is_dir() and any(is_run_dir(path) for path in own_runs.iterdir())):
        assert "Reading the example runs" in printed(notebook)
    assert images(notebook) >= 3


def test_example_runs_are_real_local_engine_runs():
    """DPPO-Binary-TV, GRPO-ClipHigher and CISPO on Sudoku, two seeds each, each with a tokens.jsonl; small."""
    runs = [load_run(path) for path in sorted(EXAMPLE_RUNS.iterdir()) if is_run_dir(path)]
    assert sorted((run.algo, run.seed) for run in runs) == [
        (algo, seed) for algo in ("cispo", "dppo_binary_tv", "grpo_clip_higher") for seed in (0, 1)]
    for run in runs:
        assert run.config["engine"] == "local" and run.env.startswith("game:Sudoku-v0-easy")
        assert read_tokens(run.path) is not None and not (run.path / "checkpoint.pt").exists()
    size = sum(path.stat().st_size for path in EXAMPLE_RUNS.rglob("*") if path.is_file())
    assert size < 8e6, f"the example runs take {size / 1e6:.1f} MB"


def test_notebook_runs_order(tmp_path):
    """DPPO_RUNS, else ../runs when it holds runs, else example_runs."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    assert notebook_runs(notebooks, {"DPPO_RUNS": "x/*"}) == ("x/*", "Reading DPPO_RUNS=x/*.")
    # make notebooks passes the folder it ran from: relative patterns start there, not in notebooks/
    spec, note = notebook_runs(notebooks, {"DPPO_RUNS": "runs/a-* /abs/b", "DPPO_RUNS_BASE": str(tmp_path)})
    assert spec == f"{tmp_path / 'runs' / 'a-*'} /abs/b"
    assert note == f"Reading DPPO_RUNS=runs/a-* /abs/b (relative to {tmp_path})."
    spec, note = notebook_runs(notebooks, {})
    assert spec == str(notebooks / "example_runs") and note.startswith("Reading the example runs")
    (tmp_path / "runs").mkdir()
    assert notebook_runs(notebooks, {})[0].endswith("example_runs")  # an empty runs/ is not enough
    write_synthetic_runs(tmp_path / "runs", tokens=False, steps=3)
    spec, note = notebook_runs(notebooks, {})
    assert spec == str(notebooks / ".." / "runs") and note.startswith("Reading your runs")


def load_run_notebooks_script():
    """``scripts/run_notebooks.py`` as a module (scripts/ is not a package)."""
    import importlib.util

    path = NOTEBOOKS.parent / "scripts" / "run_notebooks.py"
    spec = importlib.util.spec_from_file_location("run_notebooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_notebooks_writes_copies_into_out_and_passes_the_callers_folder(tmp_path, monkeypatch):
    """make notebooks: the executed copy goes to --out, the notebook itself is left as it was, and the kernel
    (running in the notebook's folder) gets DPPO_RUNS_BASE = the folder the script was called from."""
    script = load_run_notebooks_script()
    folder, caller = tmp_path / "notebooks", tmp_path / "caller"
    folder.mkdir()
    caller.mkdir()
    cell = nbformat.v4.new_code_cell("import os; print(os.environ['DPPO_RUNS_BASE'], os.getcwd())")
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "tiny.ipynb")
    before = (folder / "tiny.ipynb").read_text()
    monkeypatch.setenv("DPPO_RUNS_BASE", "")  # unset: the script sets it (restored after the test)
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    monkeypatch.chdir(caller)
    assert script.main([str(folder / "tiny.ipynb"), "--out", "out"]) == 0
    assert (folder / "tiny.ipynb").read_text() == before
    executed = nbformat.read(caller / "out" / "tiny.ipynb", as_version=4)
    assert printed(executed).split() == [str(caller), str(folder)]


def committed_notebooks() -> list[str]:
    """The notebooks in the repository, from its root: the general ones in notebooks/, each study's in its folder."""
    found = [*NOTEBOOKS.glob("*.ipynb"), *ROOT.glob("studies/*/*.ipynb")]
    return sorted(path.relative_to(ROOT).as_posix() for path in found)


def documented_notebooks() -> list[str]:
    """The notebooks docs/notebooks.md lists (its section's bullets, each a path from the repository's root)."""
    page = (ROOT / "docs" / "notebooks.md").read_text()
    section = page.split("## Notebooks", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `([\w/]+\.ipynb)`", section, re.M)


def test_make_notebooks_executes_the_notebooks_the_docs_list():
    """docs/notebooks.md's list, the notebooks committed and what ``make notebooks`` executes are one list, and the
    page's count of them agrees."""
    listed = documented_notebooks()
    assert listed == list(load_run_notebooks_script().NOTEBOOKS)
    assert sorted(listed) == committed_notebooks()
    counts = {1: "One", 2: "Two", 3: "Three", 4: "Four"}
    assert f"{counts[len(listed)]} notebooks" in (ROOT / "docs" / "notebooks.md").read_text()


@pytest.mark.parametrize("name", list(load_run_notebooks_script().NOTEBOOKS))
def test_committed_notebooks_record_the_hash_of_the_inputs_they_were_executed_on(name):
    """A committed notebook keeps its outputs only as long as its inputs (code cells, the committed files it reads)
    are those it was executed on: its metadata's hash is theirs, its cells ran top to bottom, without timestamps."""
    script = load_run_notebooks_script()
    notebook = nbformat.read(ROOT / name, as_version=4)
    assert script.recorded_digest(notebook) == script.inputs_digest(notebook, script.NOTEBOOKS[name]), (
        f"{name}: its inputs changed since it was executed: make notebooks-refresh NOTEBOOKS={Path(name).name}")
    assert notebook.metadata[script.METADATA_KEY]["inputs"] == list(script.NOTEBOOKS[name])
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.get("execution_count") for cell in code] == list(range(1, len(code) + 1))
    assert not any("execution" in cell.metadata for cell in notebook.cells)


NOTEBOOK_MAX_BYTES = 2_000_000
"""A committed notebook stays under 2 MB, readable on GitHub (the CPU study's report links its figures instead)."""


@pytest.mark.parametrize("name", list(load_run_notebooks_script().NOTEBOOKS))
def test_committed_notebooks_stay_small(name):
    size = (ROOT / name).stat().st_size
    assert size <= NOTEBOOK_MAX_BYTES, f"{name} is {size / 1e6:.1f} MB (at most {NOTEBOOK_MAX_BYTES / 1e6:.0f} MB)"


def test_a_refreshed_notebook_keeps_its_figures_as_palette_pngs():
    """``palette_images``: a figure becomes a palette PNG on white, smaller; an image its palette would not make
    smaller is kept as it is."""
    import base64
    import io

    from matplotlib.figure import Figure
    from PIL import Image

    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    for shift in range(8):
        ax.plot(range(50), [(i * shift) % 17 for i in range(50)], alpha=0.6)
        ax.fill_between(range(50), 0, [shift + i % 5 for i in range(50)], alpha=0.2)
    drawn, dot = io.BytesIO(), io.BytesIO()
    fig.savefig(drawn, format="png", transparent=True)
    Image.new("RGB", (1, 1), "red").save(dot, format="PNG")
    outputs = [nbformat.v4.new_output("display_data", {"image/png": base64.b64encode(png.getvalue()).decode()})
               for png in (drawn, dot)]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=outputs)])
    load_run_notebooks_script().palette_images(notebook)
    figure, kept = (base64.b64decode(output["data"]["image/png"]) for output in notebook.cells[0].outputs)
    image = Image.open(io.BytesIO(figure))
    assert image.mode == "P" and len(figure) < len(drawn.getvalue()) and image.size == (400, 300)
    assert image.convert("RGB").getpixel((0, 0)) == (255, 255, 255)  # a transparent corner, on white
    assert kept == dot.getvalue()


def tiny_repository(tmp_path: Path, monkeypatch):
    """A repository of one committed notebook, ``nb/tiny.ipynb``, that prints its one input ``nb/data.txt``: the
    script's :data:`NOTEBOOKS` and root pointed at it."""
    script = load_run_notebooks_script()
    (tmp_path / "nb").mkdir()
    (tmp_path / "nb" / "data.txt").write_text("first")
    cells = [nbformat.v4.new_markdown_cell("# tiny"), nbformat.v4.new_code_cell("print(open('data.txt').read())")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / "nb" / "tiny.ipynb")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "NOTEBOOKS", {"nb/tiny.ipynb": ("nb/data.txt",)})
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    for name in ("DPPO_RUNS", "DPPO_STUDY"):
        monkeypatch.delenv(name, raising=False)
    return script, tmp_path / "nb" / "tiny.ipynb"


def test_refresh_rewrites_a_committed_notebook_only_when_its_inputs_changed(tmp_path, monkeypatch, capsys):
    """make notebooks-refresh: a notebook whose inputs changed is re-executed in place with their hash; one whose
    inputs did not is kept byte for byte (a markdown edit is not an input); FORCE re-executes it anyway."""
    script, path = tiny_repository(tmp_path, monkeypatch)
    assert script.main(["--refresh"]) == 0
    first = path.read_text()
    notebook = nbformat.read(path, as_version=4)
    assert printed(notebook).strip() == "first" and not any("execution" in c.metadata for c in notebook.cells)
    assert script.recorded_digest(notebook) == script.inputs_digest(notebook, ("nb/data.txt",))

    notebook.cells[0].source = "# tiny, retitled"
    nbformat.write(notebook, path)
    edited = path.read_text()
    assert script.main(["--refresh", "tiny.ipynb"]) == 0
    assert path.read_text() == edited and "kept as it is" in capsys.readouterr().out

    (tmp_path / "nb" / "data.txt").write_text("second")
    assert script.main(["--refresh"]) == 0
    assert printed(nbformat.read(path, as_version=4)).strip() == "second" and path.read_text() != first
    assert script.main(["--refresh", "--force"]) == 0
    assert "re-executed" in capsys.readouterr().out


@pytest.mark.fault("`make notebooks-refresh` with `DPPO_RUNS` or `DPPO_STUDY` set, or `make notebooks OUT=` a "
                   "folder of committed notebooks", "one line: unset them (or write copies with `OUT`) / use "
                   "`make notebooks-refresh`; no notebook runs")
def test_what_would_write_other_outputs_over_committed_notebooks_is_refused(tmp_path, monkeypatch, capsys):
    script, path = tiny_repository(tmp_path, monkeypatch)
    before = path.read_text()
    monkeypatch.setenv("DPPO_STUDY", "runs/mine")
    assert script.main(["--refresh"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --refresh executes the committed notebooks on their committed "
                                               "inputs: unset DPPO_STUDY (or write copies with --out)")
    monkeypatch.delenv("DPPO_STUDY")
    assert script.main(["--out", str(tmp_path / "nb")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --out {tmp_path / 'nb'} would write copies over committed "
                                               "notebooks: re-execute those with --refresh (make notebooks-refresh)")
    assert path.read_text() == before


@pytest.mark.fault("`make notebooks NOTEBOOKS=` a name that is no notebook", "one line naming the notebooks; none "
                   "runs")
def test_an_unknown_notebook_is_one_line_naming_the_notebooks(tmp_path, monkeypatch, capsys):
    script, _ = tiny_repository(tmp_path, monkeypatch)
    assert script.main(["nope.ipynb", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == ("error: no notebook 'nope.ipynb': name one of tiny.ipynb, or give a "
                                               "notebook's path")
    assert not (tmp_path / "out").exists()


def test_a_relative_study_folder_starts_from_the_callers_folder(tmp_path, monkeypatch):
    """make notebooks runs the kernel in the notebook's folder: DPPO_STUDY=relative/folder is taken from where it
    was called."""
    script = load_run_notebooks_script()
    folder, caller = tmp_path / "studies", tmp_path / "caller"
    folder.mkdir()
    caller.mkdir()
    cell = nbformat.v4.new_code_cell("import os; print(os.environ['DPPO_STUDY'])")
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "study.ipynb")
    monkeypatch.setenv("DPPO_RUNS_BASE", "")
    monkeypatch.setenv("DPPO_STUDY", "runs/my_study")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    monkeypatch.chdir(caller)
    assert script.main([str(folder / "study.ipynb"), "--out", "out"]) == 0
    assert printed(nbformat.read(caller / "out" / "study.ipynb", as_version=4)).split() == [
        str(caller / "runs" / "my_study")]


def test_a_runs_lock_file_is_not_an_input_of_a_notebook(tmp_path):
    """A run leaves ``.lock`` in its folder (git ignores it): a checkout whose example runs were run again must
    not read as a notebook whose inputs changed."""
    script = load_run_notebooks_script()
    runs = tmp_path / "example_runs" / "a-s0"
    runs.mkdir(parents=True)
    (runs / "metrics.jsonl").write_text('{"step": 1}\n')
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    before = script.inputs_digest(notebook, ("example_runs",), root=tmp_path)
    (runs / ".lock").write_text("4242\n")
    assert script.inputs_digest(notebook, ("example_runs",), root=tmp_path) == before
    (runs / "metrics.jsonl").write_text('{"step": 2}\n')
    assert script.inputs_digest(notebook, ("example_runs",), root=tmp_path) != before
