"""envs/README.md's "Your own game, start to finish", played as written on a copy of the working tree.

Step 1 is done as the page says (the template copied to ``my_envs.py`` and given the id ``mine:MyGame-v0``); every
command of the section's ``bash`` blocks then runs in the copy's root through a shell, with ``.venv`` the
environment this suite runs in. Only the training runs get flags appended, which shorten them (a small warm start,
two RL steps): the last occurrence of a flag wins, so the commands' own text is unchanged.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Your own game, start to finish"
SHORTER = ("--steps", "2", "--eval-every", "2", "--eval-episodes", "4", "--warm-start.demo-episodes", "150",
           "--warm-start.max-steps", "20", "--warm-start.check-every", "20", "--warm-start.check-episodes", "8",
           "--warm-start.vocab-size", "300")
"""What the test appends to each training command (the page's runs take minutes each on 2 cores)."""


def quickstart_commands(readme: str) -> list[str]:
    """The shell commands of the section's ``bash`` blocks, a continued line joined to its first."""
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        text = re.sub(r"\\\n\s*", " ", "\n".join(line.strip() for line in block.splitlines()))
        commands += [line for line in text.splitlines() if line and not line.startswith("#")]
    return commands


def copy_of_the_tree(destination: Path) -> Path:
    """The files git tracks or would (a fresh clone of the working tree, uncommitted files included), and a ``.venv``
    that is this suite's environment (so ``make notebooks`` installs nothing)."""
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    link_this_environment(destination / ".venv")
    return destination


def link_this_environment(venv: Path) -> None:
    """``venv`` as this suite's environment, seen through links, with its own marks of a set-up .venv."""
    venv.mkdir()
    for name in ("bin", "lib", "include", "pyvenv.cfg"):
        if (Path(sys.prefix) / name).exists():
            (venv / name).symlink_to(Path(sys.prefix) / name)
    for marker in (".runtime", ".installed"):  # newer than the copied pyproject.toml: make installs nothing
        (venv / marker).touch()


def my_game_plugin(folder: Path) -> Path:
    """Step 1, as the page says: the template copied to ``my_envs.py`` and given the id ``mine:MyGame-v0``."""
    plugin = folder / "my_envs.py"
    template = (ROOT / "envs" / "example_countdown.py").read_text()
    plugin.write_text(template.replace('ENV_ID = "example:Countdown-v0"', 'ENV_ID = "mine:MyGame-v0"'))
    return plugin


def test_the_quickstart_lists_the_steps_it_promises():
    commands = quickstart_commands((ROOT / "envs" / "README.md").read_text())
    assert [c.split(" -m ")[1].split()[0] for c in commands if " -m " in c] == [
        "dppo_oat.check_env", "dppo_oat.train", "dppo_oat.train", "dppo_oat.plot"]
    assert "make notebooks" in commands[-1]
    assert all(".venv/bin/python" in c for c in commands if " -m " in c)  # never a bare python


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
def test_the_envs_quickstart_runs_as_written(tmp_path):
    tree = copy_of_the_tree(tmp_path / "clone")
    my_game_plugin(tree)
    environment = {**os.environ, "DPPO_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(tree)}
    environment.pop("DPPO_ENV_MODULES", None)
    for command in quickstart_commands((tree / "envs" / "README.md").read_text()):
        if "dppo_oat.train" in command:
            command += " " + shlex.join([*SHORTER, "--cache-dir", str(tmp_path / "cache")])
        done = subprocess.run(command, shell=True, cwd=tree, env=environment, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if "check_env" in command:
            assert "from --env-module / --env-ids: mine:MyGame-v0" in done.stdout, done.stdout
    assert (tree / "mygame.png").stat().st_size > 0
    assert sorted(p.name for p in (tree / "runs").iterdir()) == ["mygame-dppo-s0", "mygame-grpo-s0"]
    executed = list((tree / "notebooks" / "out").glob("*.ipynb"))
    assert executed, "make notebooks wrote no executed notebook"


def without_test_tools(folder: Path) -> Path:
    """A folder whose ``pytest`` and ``hypothesis`` fail to import, as in an environment of the runtime alone (what
    ``make train`` installs); put it first on PYTHONPATH."""
    for name in ("pytest", "hypothesis"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\", "
                                                   f"name={name!r})\n")
    return folder


def test_the_contract_step_needs_only_what_make_train_installs(tmp_path):
    """Step 2 runs in the environment ``make train`` sets up, which has the package and not its ``dev`` extra:
    played here with pytest and hypothesis unimportable."""
    my_game_plugin(tmp_path)
    link_this_environment(tmp_path / ".venv")
    command = quickstart_commands((ROOT / "envs" / "README.md").read_text())[0]
    blocked = without_test_tools(tmp_path / "blocked")
    environment = {**os.environ, "PYTHONPATH": f"{blocked}{os.pathsep}{ROOT}"}
    environment.pop("DPPO_ENV_MODULES", None)
    done = subprocess.run(command, shell=True, cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.splitlines()[-1] == "env contract: of them from --env-module / --env-ids: mine:MyGame-v0"
