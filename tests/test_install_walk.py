"""The oat engine's install walk (scripts/gpu/install_walk.py, `make install-walk`) runs what docs/engines/oat.md says:
every command of the docs' install block, verbatim and in order, except the CUDA builds it names, and the first run's
dry runs. The walk itself downloads several GB and is not run here; these checks read the docs and the walk's
generated script, so a docs change the walk would not follow, or a walk step the docs do not give, fails here."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "engines" / "oat.md"


def load(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


walk = load("scripts/gpu/install_walk.py")


@pytest.fixture(scope="module")
def docs() -> str:
    return DOCS.read_text()


@pytest.fixture(scope="module")
def script() -> str:
    """The walk's bash script as ``--print`` writes it."""
    done = subprocess.run([sys.executable, "scripts/gpu/install_walk.py", "--print"], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return done.stdout


def executed_lines(script: str) -> list[str]:
    """The script's lines that are commands of the walk (not its own bookkeeping)."""
    assert script.startswith(walk.PROLOGUE)
    ours = ("_walk_", "{", "}", "(", ")")
    return [line for line in script[len(walk.PROLOGUE):].splitlines() if line and not line.startswith(ours)]


def test_the_walk_runs_every_install_command_of_the_docs_verbatim_in_order_but_the_cuda_builds(docs, script):
    install = walk.install_commands(docs)
    run = [c for c in install if walk.skip_reason(c) is None]
    lines = executed_lines(script)
    assert lines[:len(run)] == run
    for command in install:
        if walk.skip_reason(command):
            assert command not in lines
            assert f"_walk_begin {install.index(command) + 1} install {walk.shlex.quote(command)}" in script
            assert "_walk_skip" in script


def test_the_install_block_makes_a_python_3_10_venv_installs_the_lock_and_the_package(docs):
    install = walk.install_commands(docs)
    assert install[0].startswith("python3.10 -m venv ") and "source " in install[0]
    assert any("-r" in c and "requirements/gpu-node-py310.txt" in c for c in install)
    assert "pip install --no-deps -e ." in install
    assert any(c.startswith("export LD_LIBRARY_PATH=") for c in install)


@pytest.mark.parametrize("name", sorted(walk.SKIPPED))
def test_each_skipped_cuda_build_is_one_command_of_the_docs(docs, name):
    matches = [c for c in walk.install_commands(docs) if walk.skip_reason(c) == walk.SKIPPED[name][1]]
    assert len(matches) == 1, f"SKIPPED[{name!r}] matches {len(matches)} commands of the docs' install block"


def test_the_walk_runs_the_first_runs_dry_runs_as_written(docs, script):
    dry_runs = walk.dry_run_commands(docs)
    assert dry_runs == ["bash scripts/gpu/gem.sh sudoku --gpus 1 --dry-run   # 1. the plan: checks everything that "
                        "needs no GPU, launches nothing"]
    lines = executed_lines(script)
    assert all(c in lines for c in dry_runs)


def test_the_docs_name_the_walk_and_what_it_skips(docs):
    install = walk.section(docs, walk.INSTALL_HEADING)
    assert "make install-walk" in install
    assert "flash-attn" in install.split("make install-walk", 1)[1]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^install-walk:.*\n\t.*scripts/gpu/install_walk\.py", makefile, re.M)


def test_the_walks_script_is_valid_bash(script, tmp_path):
    path = tmp_path / "walk.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).stderr == ""


def test_a_command_added_to_the_docs_block_is_walked_and_one_removed_is_not():
    text = DOCS.read_text()
    block = walk.bash_blocks(walk.section(text, walk.INSTALL_HEADING))[0]
    added = text.replace(block, block + "pip install --no-deps tiny-extra==1.0\n")
    assert "pip install --no-deps tiny-extra==1.0" in executed_lines(walk.walk_script(walk.walk_steps(added)))
    removed = text.replace("pip install --no-deps -e .\n", "")
    assert "pip install --no-deps -e ." not in executed_lines(walk.walk_script(walk.walk_steps(removed)))


def test_commands_join_continued_lines_and_drop_comments():
    block = "# a comment\npython3.10 -m venv v \\\n    && source v/bin/activate\n\n  # indented comment\nls  # kept\n"
    assert walk.commands(block) == ["python3.10 -m venv v && source v/bin/activate", "ls  # kept"]


def test_a_section_ends_at_the_next_heading_of_its_level_not_at_a_comment_in_a_code_block():
    text = "## A\n```bash\n# not a heading\nls\n```\n### sub\nx\n## B\ny\n"
    assert walk.section(text, "## A") == "```bash\n# not a heading\nls\n```\n### sub\nx"
    with pytest.raises(ValueError, match="no heading"):
        walk.section(text, "## C")


def test_pips_download_lines_are_summed():
    output = ("  Downloading torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl (766.7 MB)\n"
              "Downloading six-1.17.0-py2.py3-none-any.whl (11 kB)\n"
              "  Using cached vllm-0.8.4-cp38-abi3-manylinux1_x86_64.whl (294.1 MB)\n")
    assert walk.downloads(output) == (766_700_000 + 11_000, 294_100_000)


def test_every_command_the_install_section_gives_is_walked(docs):
    steps = [step for step in walk.walk_steps(docs) if not step.skip]
    prose = walk.prose_commands(docs)
    assert "make lock-gpu-node" in prose
    for command in prose:
        assert command in walk.NOT_WALKED_PROSE or any(command in step.command for step in steps), command
    assert [s.command for s in steps if s.kind == "prose"] == ["make lock-gpu-node"]
