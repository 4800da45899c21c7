"""The oat engine's install, walked: docs/engines/oat.md's install commands, as written, in a fresh clone.

The commands come from the docs themselves (the ``bash`` block of the section :data:`INSTALL_HEADING`), so the walk
and the docs cannot drift: every command of that block runs verbatim, in order, in one bash shell at the clone's
root (a ``source`` or an ``export`` carries over to the next command, as in a user's terminal), except those that
:data:`SKIPPED` names, which build CUDA code and need ``nvcc`` and a GPU (the walk prints a note for each; flash-attn's
wheel is built without its kernels in its place). The commands the section's prose gives in inline code run too
(``make lock-gpu-node``: the checkout must come back unchanged). Then it checks that the environment holds the real
packages of a launch (:data:`CHECKS`: dm-launchpad, oat, vLLM, DeepSpeed, and the engine's actor and learner
modules), runs the dry runs of the section :data:`FIRST_RUN_HEADING` as written and its inconsistent plan, and
prints what each step took, the size of the environment and of pip's downloads. Every cache the commands write
(pip's, unless ``--pip-cache`` names one; uv's, vLLM's, ...) goes under the walk's folder: the clone, the
environment and the caches are removed at the end unless ``--keep``.

    python3 scripts/gpu/install_walk.py [--python python3.10] [--repo .] [--rev HEAD]   # make install-walk
    python3 scripts/gpu/install_walk.py --print      # the walk's bash script, from this checkout's docs

It needs git, bash and a Python 3.10 (``--python``; default: ``python3.10`` on PATH, else pyenv's), which the docs'
commands find as ``python3.10``. It downloads several GB (torch and vLLM with their CUDA libraries, TensorFlow for
launchpad) and is not part of CI; the suite checks that the walk runs what the docs say (tests/test_install_walk.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = Path("docs/engines/oat.md")
INSTALL_HEADING = "## Install (Python 3.10, CUDA)"
FIRST_RUN_HEADING = "## The first run, step by step"
DRY_RUN_FLAG = "--dry-run"

SKIPPED = {
    "flash-attn": ("pip install --no-deps --no-build-isolation",
                   "flash-attn builds CUDA kernels against the installed torch (nvcc and a CUDA toolkit, or a prebuilt "
                   "wheel fetched from its GitHub releases): not walked without a GPU node's CUDA"),
}
"""Commands of the install block the walk does not run: a name, the start of the command and the word it must
contain (the name), and why. A test fails when a name matches no command of the docs or more than one."""


@dataclass(frozen=True)
class Step:
    """One command of the walk: ``kind`` is ``install`` (the docs' block), ``prose`` (a command the section's text
    gives), ``check``, ``dry-run`` (the docs' first run) or ``size``; ``skip`` is the reason a command is not run
    (None: it runs); ``expect_status`` its exit status."""

    kind: str
    command: str
    skip: str | None = None
    expect_status: int = 0
    expect_output: str | None = None
    """An extended regular expression (``grep -E``) a line of the command's output must match (None: any)."""


CHECKS = (
    Step("check", "python -c 'import sys; assert sys.version_info[:2] == (3, 10), sys.version; print(sys.version)'"),
    Step("check", "python -c 'import launchpad; print(launchpad.__file__); launchpad.launch; launchpad.stop'",
         expect_output=r"site-packages/launchpad/__init__\.py"),
    Step("check", "python -c 'import oat, oat.interface; from oat.interface import get_program; print(oat.__file__)'"),
    Step("check", "python -c 'import vllm; print(\"vllm\", vllm.__version__)'", expect_output=r"vllm 0\.8\.4"),
    Step("check", "python -c 'import deepspeed, torch; print(\"deepspeed\", deepspeed.__version__, \"torch\", "
                  "torch.__version__, \"cuda\", torch.version.cuda)'",
         expect_output=r"deepspeed 0\.16\.8 torch 2\.6\.0"),
    Step("check", "python -c 'from dppo_oat.engines.oat.actor import DPPOGemActor; "
                  "from dppo_oat.engines.oat.learner import DPPOLearner; "
                  "from dppo_oat.engines.oat.launch import build_program; print(\"the engine imports\")'"),
    Step("check", "pip check || true", expect_output=r"flash-attn|No broken requirements"),
)
"""What a launch imports, each in its own interpreter: the real dm-launchpad (not the dry run's stand-in), oat's
program builder, vLLM, DeepSpeed and torch at the lock's versions, and the engine's actor and learner modules; then
pip's own check of the requirements (listed, not enforced: flash-attn is not installed by the walk)."""

FLASH_ATTN_WITHOUT_CUDA = Step(
    "check", "FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip wheel --no-deps --no-build-isolation -w \"$WALK_DIR/wheels\" "
             "\"$(grep '^flash-attn==' requirements/gpu-node-py310.txt)\"",
    expect_output=r"Successfully built flash-attn")
"""In place of the skipped flash-attn install: its wheel built without its CUDA kernels, and not installed, which runs
its setup in the environment without build isolation (what it imports must be there)."""

TRACKED_FILES_UNCHANGED = Step("check", "git diff --exit-code --stat")
"""After the docs' commands: the checkout's tracked files are as cloned (``make lock-gpu-node`` reproduces the lock)."""

PROSE_COMMAND = re.compile(r"^(pip|make|python[\d.]*|bash|conda|uv|export|source|git) \S")
"""An inline code span of the install section's prose that is a command to run."""

NOT_WALKED_PROSE = {"make install-walk": "the walk itself"}
"""Commands of the prose the walk does not run, and why."""

REFUSED_PLAN = Step(
    "dry-run", "bash scripts/gpu/gem.sh sudoku --gpus 1 --dry-run --rollout_batch_size_per_device 16 "
               "--pi_buffer_maxlen_per_device 16", expect_status=2, expect_output=r"^error: ")
"""The docs' example of an inconsistent plan: one ``error:`` line and exit status 2."""


def section(markdown: str, heading: str) -> str:
    """The text under ``heading`` (a whole line), up to the next heading of the same or a higher level."""
    lines = markdown.splitlines()
    if heading not in lines:
        raise ValueError(f"{DOCS} has no heading {heading!r}")
    start = lines.index(heading) + 1
    level = len(heading) - len(heading.lstrip("#"))
    end = next((i for i in range(start, len(lines))
                if re.match(rf"#{{1,{level}}} ", lines[i]) and not in_fence(lines[:i])), len(lines))
    return "\n".join(lines[start:end])


def in_fence(lines: Sequence[str]) -> bool:
    """Whether the line after ``lines`` is inside a fenced code block."""
    return sum(line.startswith("```") for line in lines) % 2 == 1


def bash_blocks(text: str) -> list[str]:
    """The bodies of the ```` ```bash ```` blocks of a Markdown text."""
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[str]:
    """A bash block's commands: backslash-continued lines joined, blank lines and whole-line comments dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def install_commands(markdown: str) -> list[str]:
    """The commands of the install section's one bash block."""
    blocks = bash_blocks(section(markdown, INSTALL_HEADING))
    if len(blocks) != 1:
        raise ValueError(f"{DOCS}'s {INSTALL_HEADING!r} must have one bash block, not {len(blocks)}")
    return commands(blocks[0])


def dry_run_commands(markdown: str) -> list[str]:
    """The first run's commands that pass ``--dry-run``."""
    blocks = bash_blocks(section(markdown, FIRST_RUN_HEADING))
    found = [c for block in blocks for c in commands(block) if DRY_RUN_FLAG in shlex.split(c, comments=True)]
    if not found:
        raise ValueError(f"{DOCS}'s {FIRST_RUN_HEADING!r} gives no {DRY_RUN_FLAG} command")
    return found


def prose_commands(markdown: str) -> list[str]:
    """The commands the install section's prose gives in inline code (outside its code blocks), in order."""
    prose = re.sub(r"^```.*?^```", "", section(markdown, INSTALL_HEADING), flags=re.S | re.M)
    return [span for span in re.findall(r"`([^`\n]+)`", prose) if PROSE_COMMAND.match(span)]


def prose_steps(markdown: str) -> list[Step]:
    """The prose's commands that neither the install block nor the walk's checks already run (a part of one of their
    commands counts), each once, but :data:`NOT_WALKED_PROSE`."""
    walked = [*install_commands(markdown), *(step.command for step in (FLASH_ATTN_WITHOUT_CUDA, *CHECKS))]
    found = [c for c in prose_commands(markdown) if not any(c in command for command in walked)]
    return [Step("prose", c) for c in dict.fromkeys(found) if c not in NOT_WALKED_PROSE]


def skip_reason(command: str) -> str | None:
    """Why the walk does not run ``command`` (:data:`SKIPPED`), or None."""
    for name, (start, reason) in SKIPPED.items():
        if command.startswith(start) and name in command:
            return reason
    return None


def walk_steps(markdown: str) -> list[Step]:
    """Every step of the walk, in order: the docs' install commands, flash-attn built without CUDA, the commands of
    the install section's prose, the checkout unchanged, the imports, the docs' dry runs, the refused plan, and the
    environment's size."""
    install = [Step("install", c, skip=skip_reason(c)) for c in install_commands(markdown)]
    dry_runs = [Step("dry-run", c, expect_output=r"^optimizer: ") for c in dry_run_commands(markdown)]
    size = Step("size", 'du -sh "$VIRTUAL_ENV"')
    return [*install, FLASH_ATTN_WITHOUT_CUDA, *prose_steps(markdown), TRACKED_FILES_UNCHANGED, *CHECKS, *dry_runs,
            REFUSED_PLAN, size]


PROLOGUE = r"""# The oat engine's install, walked: generated by scripts/gpu/install_walk.py from docs/engines/oat.md.
# No `set -e` or pipefail, as in a terminal: each step's exit status is checked after it.
: "${WALK_RESULTS:?}" "${WALK_DIR:?}"
_walk_now() { echo "${EPOCHREALTIME/./}"; }
_walk_begin() {  # STEP KIND COMMAND
    printf '\n== walk step %s (%s): %s\n' "$1" "$2" "$3"
    _walk_start=$(_walk_now)
}
_walk_record() {  # STEP STATUS
    local took=$(( $(_walk_now) - _walk_start ))
    printf '%s\t%s\t%d.%06d\n' "$1" "$2" $((took / 1000000)) $((took % 1000000)) >> "$WALK_RESULTS"
    printf '== walk step %s: %s after %d.%d s\n' "$1" "$2" $((took / 1000000)) $((took % 1000000 / 100000))
}
_walk_check() {  # STEP STATUS EXPECTED_STATUS PATTERN: record the step; stop the walk on a failure
    if [[ $2 != "$3" ]]; then _walk_record "$1" "failed (exit $2, expected $3)"; exit 1; fi
    if [[ -n $4 ]] && ! grep -Eq -- "$4" "$WALK_DIR/step-$1.out"; then
        _walk_record "$1" "failed (no output matching $4)"; exit 1
    fi
    _walk_record "$1" ok
}
_walk_skip() {  # STEP REASON
    echo "== skipped: $2"
    printf '%s\tskipped\t0\n' "$1" >> "$WALK_RESULTS"
}
"""


def render_step(number: int, step: Step) -> str:
    """One step as bash: a banner, then the command as written. An install step runs in the walk's shell (a
    ``source`` or an ``export`` lasts, as in a terminal); a check or a dry run in a subshell whose output is kept to
    match :attr:`Step.expect_output`. Each step's exit status is then checked."""
    begin = f"_walk_begin {number} {step.kind} {shlex.quote(step.command)}\n"
    if step.skip:
        return begin + f"_walk_skip {number} {shlex.quote(step.skip)}\n"
    if step.kind in ("install", "size"):  # in this shell, its output copied by a tee beside it
        run = f'{{\n{step.command}\n}} > >(tee "$WALK_DIR/step-{number}.out") 2>&1\n_walk_status=$?\n'
    else:
        run = f'(\n{step.command}\n) 2>&1 | tee "$WALK_DIR/step-{number}.out"\n_walk_status=${{PIPESTATUS[0]}}\n'
    pattern = shlex.quote(step.expect_output or "")
    return begin + run + f'_walk_check {number} "$_walk_status" {step.expect_status} {pattern}\n'


def walk_script(steps: Sequence[Step]) -> str:
    """The walk as one bash script, run at the clone's root."""
    return PROLOGUE + "\n".join(render_step(n, s) for n, s in enumerate(steps, 1))


def python310(candidate: str) -> str | None:
    """The interpreter ``candidate`` runs, if it is a Python 3.10 (a pyenv shim without a 3.10 selected is not)."""
    try:
        done = subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 10); "
                               "print(sys.executable)"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python310() -> str | None:
    """``python3.10`` on PATH, else pyenv's newest 3.10: the first that runs."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which("python3.10"), *map(str, sorted(pyenv.glob("3.10*/bin/python3.10"), reverse=True))]
    return next((found for c in candidates if c and (found := python310(c))), None)


def du(path: Path) -> int:
    """Bytes under ``path`` (0 when it does not exist)."""
    if not path.exists():
        return 0
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def gigabytes(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


PIP_FILE = re.compile(r"^\s*(Downloading|Using cached) \S+ \(([\d.]+) (kB|MB|GB|bytes)\)", re.M)
PIP_LOCAL_FILE = re.compile(r"^Processing (/\S+)", re.M)
UNITS = {"bytes": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def downloads(pip_output: str) -> tuple[int, int]:
    """Bytes of the files pip fetched (``Downloading``, and ``Processing`` of a local file) and bytes it took from
    its cache (``Using cached``), from pip's output."""
    fetched = cached = 0
    for kind, size, unit in PIP_FILE.findall(pip_output):
        if kind == "Downloading":
            fetched += int(float(size) * UNITS[unit])
        else:
            cached += int(float(size) * UNITS[unit])
    for path in PIP_LOCAL_FILE.findall(pip_output):
        fetched += Path(path).stat().st_size if Path(path).is_file() else 0
    return fetched, cached


def environment_size(work: Path, steps: Sequence[Step]) -> str:
    """What the walk's ``size`` step printed (``du -sh`` of the environment)."""
    number = next(n for n, s in enumerate(steps, 1) if s.kind == "size")
    output = work / f"step-{number}.out"
    return output.read_text().strip() if output.exists() else "not measured"


def clone(repo: str, rev: str | None, into: Path) -> None:
    """A fresh ``git clone`` of the repository (its checked-out branch, or ``rev``)."""
    subprocess.run(["git", "clone", "--quiet", repo, str(into)], check=True)
    if rev:
        subprocess.run(["git", "-C", str(into), "checkout", "--quiet", rev], check=True)


def summary(steps: Sequence[Step], results: dict[int, tuple[str, float]]) -> list[str]:
    """One line per step: its number, kind, status, seconds and command."""
    lines = []
    for number, step in enumerate(steps, 1):
        status, seconds = results.get(number, ("not reached", 0.0))
        lines.append(f"{number:>3} {step.kind:<8} {status:<28} {seconds:>8.1f} s  {step.command[:100]}")
    return lines


def read_results(path: Path) -> dict[int, tuple[str, float]]:
    results = {}
    if path.exists():
        for line in path.read_text().splitlines():
            number, status, seconds = line.split("\t")
            results[int(number)] = (status, float(seconds))
    return results


def run_walk(args: argparse.Namespace, work: Path) -> int:
    """Clone, generate the walk from the clone's docs, run it, print the summary and sizes; the walk's status."""
    source = work / "dppo_oat"
    started = time.monotonic()
    clone(args.repo, args.rev, source)
    cloned = time.monotonic() - started
    steps = walk_steps((source / DOCS).read_text())
    script = work / "walk.sh"
    script.write_text(walk_script(steps))
    shims = work / "bin"
    shims.mkdir()
    (shims / "python3.10").symlink_to(args.python)
    caches = work / "cache"  # uv's (make lock-gpu-node), vLLM's, torch's, ...: removed with the rest
    pip_cache = Path(args.pip_cache) if args.pip_cache else caches / "pip"
    environment = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(caches),
                   "PIP_CACHE_DIR": str(pip_cache), "WALK_RESULTS": str(work / "results.tsv"), "WALK_DIR": str(work)}
    for variable in ("UV_CACHE_DIR", "VIRTUAL_ENV"):
        environment.pop(variable, None)
    print(f"== walk: git clone {args.repo} ({cloned:.1f} s), {len(steps)} steps, python3.10 = {args.python}",
          flush=True)
    status = subprocess.run(["bash", str(script)], cwd=source, env=environment).returncode
    total = time.monotonic() - started
    print("\n== walk summary (step, kind, status, seconds, command)")
    print("\n".join(summary(steps, read_results(work / "results.tsv"))))
    outputs = [path.read_text(errors="replace") for path in sorted(work.glob("step-*.out"))]
    fetched, cached = downloads("\n".join(outputs))
    print(f"== environment: {environment_size(work, steps)}")
    print(f"== downloads as pip reported them: {gigabytes(fetched)}"
          + (f", and {gigabytes(cached)} from pip's cache" if cached else "")
          + f"; caches afterwards: {gigabytes(du(caches) + (du(pip_cache) if args.pip_cache else 0))}")
    print(f"== clone with its environment: {gigabytes(du(source))}; total {total / 60:.1f} min; "
          f"{'passed' if status == 0 else 'FAILED'}", flush=True)
    return status


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=None, help="the Python 3.10 the docs' commands find as python3.10")
    parser.add_argument("--repo", default=str(ROOT), help="what to git clone (default: this checkout)")
    parser.add_argument("--rev", default=None, help="the revision to check out (default: the clone's branch)")
    parser.add_argument("--workdir", default=None, help="where the clone, environment and cache go (default: a "
                                                        "temporary folder)")
    parser.add_argument("--pip-cache", default=None, help="a pip cache to use and keep (default: a fresh one)")
    parser.add_argument("--keep", action="store_true", help="keep the clone, environment and cache")
    parser.add_argument("--print", action="store_true", help="print the walk's bash script and exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.print:
        print(walk_script(walk_steps((ROOT / DOCS).read_text())), end="")
        return 0
    args.python = python310(args.python) if args.python else find_python310()
    if not args.python:
        print("error: no Python 3.10 found: pass --python path/to/python3.10 (make install-walk "
              "PYTHON310=path/to/python3.10)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="dppo-install-walk-", dir=args.workdir))
    try:
        return run_walk(args, work)
    finally:
        if args.keep:
            print(f"== kept {work}")
        else:
            print(f"== removing {work}", flush=True)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
