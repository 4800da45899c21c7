"""The packages a stock CUDA image lacks for the local engine, its tests and oat's learner, fetched into one folder,
one version each.

It starts from this package's requirements (``pyproject.toml``'s ``[project.dependencies]``) and the oat learner's
import-time roots (:data:`OAT_LEARNER_ROOTS`: oat-llm itself, whose own requirements are not followed, DeepSpeed and
what oat imports when its learner module loads; vLLM and launchpad have stand-ins there) and follows each
package's ``Requires-Dist`` (markers evaluated for CPython 3.12 on Linux x86_64, extras followed), skipping every
package the image holds (``requirements/cuda-image.txt``): what is left is what the image lacks, transitively. Each
is pinned to the GPU node's lock (``requirements/gpu-node-py310.txt``) unless ``requirements/device-wheels.txt``
pins it otherwise (with its reason); a pin that does not meet a requirement met on the way is refused.

A package is fetched as a wheel built for CPython 3.12 on manylinux x86_64, or a pure-Python one. Without such a
wheel, its sdist is built here: a pure-Python build is kept as a wheel; a compiled package travels as its sdist, and
``scripts/gpu/device_check.sh`` builds it on the device with the image's compiler. DeepSpeed is built here into a
pure-Python wheel with no prebuilt ops (:data:`BUILD_ENVIRONMENT`): its ops are JIT-compiled by the device's nvcc.
``--steps`` fetches only what the named steps of ``scripts/gpu/device_check.sh`` import (:func:`roots_for`): the
folder travels beside the checkout, and together they may weigh :data:`MAX_BYTES`. It prints the list and the total
size and refuses a folder that does not fit beside the checkout's files (:func:`checkout_bytes`).

    python scripts/gpu/device_wheels.py [--dest .whl] [--steps rollout tests]   # device_wheels.sh, make gpu-wheels
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

try:
    import tomllib  # novm (Python 3.10 takes pip's tomli below)
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
IMAGE_LIST = ROOT / "requirements" / "cuda-image.txt"
LOCK = ROOT / "requirements" / "gpu-node-py310.txt"
OVERRIDES = ROOT / "requirements" / "device-wheels.txt"
MAX_BYTES = 64 * 2**20
"""What the folder and the checkout's files may weigh together: they travel to the GPU machine at once."""

PYTHON_VERSION = "3.12"
"""The image's Python."""

OAT_LEARNER_ROOTS = ("oat-llm", "deepspeed", "dm-tree", "levenshtein", "msgspec", "openai")
"""What ``scripts/bench/oat_learner_step.py --device cuda`` imports beyond the local engine's packages: oat-llm, the
DeepSpeed it pins, and oat's import-time modules the image lacks (``tree``, ``Levenshtein``, ``msgspec``, ``openai``),
each at the GPU node lock's version. vLLM (imported by ``oat.actors``) and launchpad have import stand-ins on the
device."""

OAT_LEARNER_STEPS = ("oat-lora", "oat-learner")
"""The steps of ``scripts/gpu/device_check.sh`` that run oat's learner (``scripts/bench/oat_learner_step.py``)."""

DEVICE_STEPS = ("shaped-run", *OAT_LEARNER_STEPS, "tests", "rollout-ops", "rollout", "learner", "fused-head",
                "default-run")
"""Every step of ``scripts/gpu/device_check.sh``; all but the oat learner's run the local engine and need the
package's requirements."""

OAT_LEARNER_OWN_ROOTS = ("datasets", "tyro")
"""The package's own requirements that oat's learner step needs beyond the image: its benchmark makes no environment,
so Gem and the environments' packages stay behind (``tests/oat/test_oat_gpu_check.py`` runs it without them)."""

NO_DEPENDENCIES = {"oat-llm"}
"""Packages whose ``Requires-Dist`` is not followed, fetched whatever Python they require: oat-llm pins Python 3.10,
CUDA vLLM 0.8.4, flash-attn and dm-launchpad, none of which a learner step imports; its import-time needs are
:data:`OAT_LEARNER_ROOTS`."""

BUILD_ENVIRONMENT = {"deepspeed": {"DS_BUILD_OPS": "0"}}
"""Sdists built here with these variables and without build isolation (DeepSpeed's ``setup.py`` imports torch, which
must be the building interpreter's): with ``DS_BUILD_OPS=0`` no op is compiled and the wheel is pure Python."""


def marker_env(python_version: str = PYTHON_VERSION) -> dict[str, str]:
    """CPython ``python_version`` on Linux x86_64, as environment markers read it."""
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "platform_release": "",
            "platform_version": "", "implementation_version": f"{python_version}.0"}


PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def canonical(name: str) -> str:
    return canonicalize_name(name)


def read_names(path: Path) -> set[str]:
    """The package names of a one-name-a-line file (comments and blank lines skipped), canonicalized."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {canonical(line) for line in lines if line}


def read_pins(path: Path) -> dict[str, str]:
    """``{name: version}`` of the ``name==version`` lines of a requirements file (a lock, or the overrides)."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if match:
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def project_requirements(pyproject: Path) -> list[Requirement]:
    """The package's own requirements (``[project.dependencies]``)."""
    return [Requirement(text) for text in tomllib.loads(pyproject.read_text())["project"]["dependencies"]]


def applies(requirement: Requirement, extras: Iterable[str], python_version: str = PYTHON_VERSION) -> bool:
    """Whether ``requirement`` (a ``Requires-Dist`` line) holds on the image when the package is installed with
    ``extras``."""
    if requirement.marker is None:
        return True
    env = marker_env(python_version)
    return any(requirement.marker.evaluate({**env, "extra": extra}) for extra in ("", *extras))


def requires_dist(metadata: str) -> list[Requirement]:
    """The ``Requires-Dist`` requirements of a wheel's ``METADATA`` text."""
    return [Requirement(line.split(":", 1)[1].strip()) for line in metadata.splitlines()
            if line.startswith("Requires-Dist:")]


def wheel_problem(filename: str, python_version: str = PYTHON_VERSION) -> str | None:
    """None when the wheel ``filename`` installs on CPython ``python_version`` on manylinux x86_64, else why not."""
    parts = filename[: -len(".whl")].split("-")
    pythons, abis, platforms = (set(tag.split(".")) for tag in parts[-3:])
    ours = "py" + python_version.replace(".", "")
    python_ok = bool(pythons & {"py3", ours, "cp" + ours[2:]}) or (
        "abi3" in abis and any(p.startswith("cp3") and int(p[3:]) <= int(ours[3:]) for p in pythons))
    if not python_ok:
        return f"built for {'/'.join(sorted(pythons))}, not Python {python_version}"
    if not platforms & {"any", *PLATFORMS} and not any(re.fullmatch(r"manylinux_2_\d+_x86_64", p) for p in platforms):
        return f"built for {'/'.join(sorted(platforms))}, not manylinux x86_64"
    return None


@dataclass
class Fetched:
    """One package in the folder: a wheel, or the sdist of a compiled package to build on the device."""

    name: str
    version: str
    path: Path
    metadata: str
    """Its ``METADATA`` (of a build here, for an sdist)."""

    @property
    def kind(self) -> str:
        return "wheel" if self.path.suffix == ".whl" else "sdist, built on the device"


@dataclass
class Resolution:
    """What the image lacks (``fetched``, in the order met) and what it was found to hold (``from_image``)."""

    fetched: dict[str, Fetched] = field(default_factory=dict)
    from_image: set[str] = field(default_factory=set)
    extras: dict[str, set[str]] = field(default_factory=dict)


def pinned_version(name: str, pins: dict[str, str], overrides: dict[str, str]) -> str:
    """The version of ``name``: the override, else the lock's; a ValueError names a package the lock lacks."""
    version = overrides.get(name, pins.get(name))
    if version is None:
        raise ValueError(f"{name} is needed on the image but pinned neither in {LOCK.name} nor in {OVERRIDES.name}")
    return version


def resolve(roots: Iterable[Requirement], image: set[str], pins: dict[str, str], overrides: dict[str, str],
            fetch: Callable[[str, str], Fetched], python_version: str = PYTHON_VERSION) -> Resolution:
    """Every package that ``roots`` need on CPython ``python_version``, transitively, and the image lacks, each
    fetched once by ``fetch(name, version)`` at its pinned version; a ValueError when a pin misses a requirement's
    range."""
    result = Resolution()
    queue = [(requirement, "pyproject.toml") for requirement in roots if applies(requirement, (), python_version)]
    while queue:
        requirement, needed_by = queue.pop(0)
        name = canonical(requirement.name)
        if name in image:
            result.from_image.add(name)
            continue
        if name not in result.fetched:
            result.fetched[name] = fetch(name, pinned_version(name, pins, overrides))
        package = result.fetched[name]
        if requirement.specifier and not requirement.specifier.contains(package.version, prereleases=True):
            raise ValueError(f"{needed_by} requires {requirement}, but {name} is pinned to {package.version}")
        done = result.extras.get(name)
        wanted = set(requirement.extras) | (done or set())
        if done is not None and wanted == done:
            continue
        result.extras[name] = wanted
        if name in NO_DEPENDENCIES:
            continue
        queue += [(dependency, f"{name} {package.version}") for dependency in requires_dist(package.metadata)
                  if applies(dependency, wanted, python_version)]
    return result


def roots_for(steps: Iterable[str], project: list[Requirement]) -> list[Requirement]:
    """What the device check's ``steps`` import, as requirements: the package's own (``project``) for a step of the
    local engine, the oat learner's roots for an oat step (with the two of the package's own it imports)."""
    steps = set(steps)
    if not steps <= set(DEVICE_STEPS):
        raise ValueError(f"unknown step(s) {', '.join(sorted(steps - set(DEVICE_STEPS)))}: {' '.join(DEVICE_STEPS)}")
    oat = bool(steps & set(OAT_LEARNER_STEPS))
    local = bool(steps - set(OAT_LEARNER_STEPS))
    own = project if local else [r for r in project if canonical(r.name) in OAT_LEARNER_OWN_ROOTS]
    return [*own, *(map(Requirement, OAT_LEARNER_ROOTS) if oat else ())]


def checkout_bytes(root: Path) -> int:
    """What the checkout's files weigh, tracked and untracked but not ignored (0 outside a git checkout): they
    travel with the folder."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True)
    if listed.returncode != 0:
        return 0
    files = (root / name for name in listed.stdout.decode().split("\0") if name)
    return sum(path.stat().st_size for path in files if path.is_file())


def travel_problem(wheels: int, checkout: int, steps: Iterable[str]) -> str | None:
    """None when ``wheels`` bytes fit beside a ``checkout`` of that many bytes in :data:`MAX_BYTES`, else what to do."""
    if wheels + checkout <= MAX_BYTES:
        return None
    steps = set(steps)
    mixed = bool(steps & set(OAT_LEARNER_STEPS)) and bool(steps - set(OAT_LEARNER_STEPS))
    hint = ("fetch the wheels of fewer steps, one set per GPU session: --steps with oat's learner steps alone, and "
            "with the others alone" if mixed else "these steps' wheels alone do not fit: the checkout must shrink")
    return (f"{wheels / 2**20:.1f} MiB of wheels beside the checkout's {checkout / 2**20:.1f} MiB make "
            f"{(wheels + checkout) / 2**20:.1f} MiB, over the {MAX_BYTES / 2**20:.0f} MiB that travel to the GPU "
            f"machine: {hint}")


def pip(*args: str, quiet: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m pip ARGS`` (this interpreter's pip), its output captured; ``env`` added to the environment."""
    command = [sys.executable, "-m", "pip", *args, *(["--quiet"] if quiet else [])]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def fetch_with_pip(name: str, version: str, dest: Path, python_version: str = PYTHON_VERSION) -> Fetched:
    """``name==version`` into ``dest``: a wheel for CPython ``python_version`` if the index has one, else built from
    the sdist here (pure Python), else the sdist itself; a RuntimeError says why none would do."""
    spec = f"{name}=={version}"
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        any_python = ["--ignore-requires-python"] if canonical(name) in NO_DEPENDENCIES else []
        got = pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                  "--implementation", "cp", *platforms, *any_python, "-d", str(scratch / "wheel"), spec)
        wheels = list((scratch / "wheel").glob("*.whl")) if got.returncode == 0 else []
        if wheels:
            problem = wheel_problem(wheels[0].name, python_version)
            if problem:
                raise RuntimeError(f"{spec}: the only wheel is {wheels[0].name}, {problem}")
            return keep(name, version, wheels[0], wheel_metadata(wheels[0]), dest)
        got = pip("download", "--no-deps", "--no-binary=:all:", "-d", str(scratch / "sdist"), spec)
        sdists = list((scratch / "sdist").glob("*")) if got.returncode == 0 else []
        if not sdists:
            raise RuntimeError(f"{spec}: no wheel for Python {python_version} on manylinux x86_64 and no sdist "
                               f"({(got.stderr.strip().splitlines() or ['?'])[-1]})")
        environment = BUILD_ENVIRONMENT.get(canonical(name))
        isolation = [] if environment is None else ["--no-build-isolation"]
        if environment is not None and importlib.util.find_spec("torch") is None:
            raise RuntimeError(f"{spec}: its sdist imports torch to build, and {sys.executable} has none: run with "
                               "PYTHON= an interpreter that has torch (make gpu-wheels uses the project's .venv)")
        built = pip("wheel", "--no-deps", *isolation, "-w", str(scratch / "built"), str(sdists[0]), env=environment)
        wheels = list((scratch / "built").glob("*.whl")) if built.returncode == 0 else []
        if not wheels:
            last_line = (built.stderr.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"{spec}: its sdist does not build here ({last_line})")
        metadata = wheel_metadata(wheels[0])
        if wheels[0].name.endswith("-none-any.whl") and wheel_problem(wheels[0].name, python_version) is None:
            return keep(name, version, wheels[0], metadata, dest)  # pure Python: the wheel built here installs there
        return keep(name, version, sdists[0], metadata, dest)


def keep(name: str, version: str, path: Path, metadata: str, dest: Path) -> Fetched:
    dest.mkdir(parents=True, exist_ok=True)
    return Fetched(name, version, Path(shutil.copy2(path, dest / path.name)), metadata)


def report(resolution: Resolution, room: int = MAX_BYTES) -> list[str]:
    """The folder's contents, one line a package, and the total size against the ``room`` left beside the
    checkout."""
    packages = sorted(resolution.fetched.values(), key=lambda f: f.name)
    lines = [f"  {p.name}=={p.version}  {p.path.name}  {p.path.stat().st_size / 2**20:.2f} MiB  ({p.kind})"
             for p in packages]
    total = sum(p.path.stat().st_size for p in packages)
    lines.append(f"{len(packages)} packages, {total / 2**20:.1f} MiB in all (at most {room / 2**20:.1f} MiB); "
                 f"taken from the image: {', '.join(sorted(resolution.from_image))}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=str(ROOT / ".whl"), help="the folder (its wheels and sdists are replaced)")
    parser.add_argument("--python-version", default=PYTHON_VERSION,
                        help="the image's Python (X.Y); another one only to rehearse the install elsewhere")
    parser.add_argument("--steps", nargs="+", default=list(DEVICE_STEPS), metavar="STEP",
                        help="only what these steps of device_check.sh import (default: every step: "
                             f"{' '.join(DEVICE_STEPS)})")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    staging = Path(tempfile.mkdtemp(prefix="device-wheels-"))
    try:
        roots = roots_for(args.steps, project_requirements(ROOT / "pyproject.toml"))
        resolution = resolve(roots, read_names(IMAGE_LIST), read_pins(LOCK),
                             read_pins(OVERRIDES), lambda name, version: fetch_with_pip(name, version, staging,
                                                                                        args.python_version),
                             args.python_version)
    except (ValueError, RuntimeError) as error:
        print(f"device_wheels: {error}", file=sys.stderr)
        return 1
    checkout = checkout_bytes(ROOT)
    print("\n".join(report(resolution, MAX_BYTES - checkout)))
    total = sum(f.path.stat().st_size for f in resolution.fetched.values())
    problem = travel_problem(total, checkout, args.steps)
    if problem:
        print(f"device_wheels: {problem}", file=sys.stderr)
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob("*.whl"), *dest.glob("*.tar.gz"), *dest.glob("*.zip")]:
        old.unlink()
    for fetched in resolution.fetched.values():
        shutil.move(str(fetched.path), dest / fetched.path.name)
    shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
