"""The oat engine's preflight: what the learner's optimizer needs of a GPU node, checked before anything launches (as
the verl engine's :mod:`~dppo_oat.engines.verl.preflight` checks verl's config before its launch).

oat's learner builds DeepSpeed's ``FusedAdam`` (``DeepSpeedCPUAdam`` with ``--adam_offload``) when it starts. The
lock's DeepSpeed 0.16.8 has no wheel: installed from source without ``DS_BUILD_FUSED_ADAM=1`` it compiles the op
just in time, at learner start, which needs the CUDA toolkit: ``nvcc`` under torch's ``CUDA_HOME``, of the CUDA
version torch was built with (DeepSpeed accepts another minor version of CUDA 11 or 12), and ninja (importable
and on PATH). Without them every learner fails after the models have loaded. :func:`optimizer_toolkit` reads the
node, :func:`toolkit_problem` says what is missing, :func:`toolkit_line` is the dry run's line.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEEPSPEED_MINOR_MISMATCH_OK = {
    11: ("11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8"),
    12: ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8"),
}
"""DeepSpeed 0.16.8's ``cuda_minor_mismatch_ok``: toolkit and torch CUDA versions it accepts together."""


@dataclass(frozen=True)
class OptimizerToolkit:
    """How the learner's Adam op can be had on this machine."""

    op: str
    """DeepSpeed's op name: ``fused_adam``, or ``cpu_adam`` with ``--adam_offload``."""
    prebuilt: bool
    """Compiled when DeepSpeed was installed (``DS_BUILD_FUSED_ADAM=1``): nothing is compiled at start-up."""
    torch_cuda: str | None
    """``torch.version.cuda`` (None: a CPU build of torch)."""
    cuda_home: str | None
    """torch's ``CUDA_HOME`` (``$CUDA_HOME``, else the folder of ``nvcc`` on PATH, else /usr/local/cuda)."""
    nvcc_release: str | None
    """``major.minor`` of ``$CUDA_HOME/bin/nvcc -V`` (None: no nvcc there)."""
    ninja: bool
    skip_cuda_check: bool = False
    """``DS_SKIP_CUDA_CHECK=1``: DeepSpeed compiles whatever the versions."""

    @property
    def name(self) -> str:
        return "DeepSpeedCPUAdam (--adam_offload)" if self.op == "cpu_adam" else "FusedAdam"

    @property
    def build_variable(self) -> str:
        """DeepSpeed's install-time switch that prebuilds this op."""
        return f"DS_BUILD_{self.op.upper()}=1"


def toolkit_problem(toolkit: OptimizerToolkit) -> str | None:
    """Why DeepSpeed could not build the op at learner start, as one line that says what to do; None if it can, or
    if this torch has no CUDA (not a GPU node: oat's own check refuses a launch there)."""
    if toolkit.prebuilt or toolkit.torch_cuda is None:
        return None
    where = f"DeepSpeed's {toolkit.name} is not prebuilt and is compiled at learner start"
    if toolkit.cuda_home is None or toolkit.nvcc_release is None:
        return (f"{where}, which needs the CUDA {toolkit.torch_cuda} toolkit (nvcc): install it and set CUDA_HOME, "
                f"or reinstall DeepSpeed with {toolkit.build_variable} where one is")
    if not toolkit.ninja:
        return (f"{where}, which needs ninja, importable and on PATH: pip install ninja, and put that "
                "environment's bin folder on PATH")
    torch_release = ".".join(toolkit.torch_cuda.split(".")[:2])
    if not (toolkit.skip_cuda_check or cuda_versions_compatible(toolkit.nvcc_release, torch_release)):
        return (f"{where}, and nvcc {toolkit.nvcc_release} ({toolkit.cuda_home}) does not match torch's CUDA "
                f"{torch_release}: point CUDA_HOME at a CUDA {torch_release} toolkit (or set DS_SKIP_CUDA_CHECK=1)")
    return None


def cuda_versions_compatible(nvcc_release: str, torch_release: str) -> bool:
    """DeepSpeed's ``assert_no_cuda_mismatch``: equal ``major.minor``, or both in its list for that major."""
    if nvcc_release == torch_release:
        return True
    accepted = DEEPSPEED_MINOR_MISMATCH_OK.get(int(nvcc_release.split(".")[0]), ())
    return nvcc_release in accepted and torch_release in accepted


def toolkit_line(toolkit: OptimizerToolkit) -> str:
    """The dry run's line: prebuilt, compiled at start with which nvcc, or what is missing on this machine."""
    if toolkit.prebuilt:
        return f"optimizer: DeepSpeed {toolkit.name}, prebuilt"
    if toolkit.torch_cuda is None:
        return (f"optimizer: DeepSpeed {toolkit.name}, not prebuilt: compiled at learner start, which needs the CUDA "
                "toolkit (nvcc) on the node; this torch has no CUDA, so the launch on the node checks it")
    problem = toolkit_problem(toolkit)
    if problem is None:
        return (f"optimizer: DeepSpeed {toolkit.name}, compiled at learner start (a minute or two, then cached) with "
                f"nvcc {toolkit.nvcc_release} ({toolkit.cuda_home})")
    return f"optimizer: cannot be compiled on this machine, and a launch here refuses: {problem}"


def optimizer_toolkit(adam_offload: bool) -> OptimizerToolkit:
    """This machine's answer for the learner's Adam op (reads files and runs ``nvcc -V``; imports no DeepSpeed)."""
    import torch
    import torch.utils.cpp_extension

    op = "cpu_adam" if adam_offload else "fused_adam"
    cuda_home = torch.utils.cpp_extension.CUDA_HOME
    return OptimizerToolkit(
        op=op, prebuilt=deepspeed_prebuilt_ops().get(op, False), torch_cuda=torch.version.cuda, cuda_home=cuda_home,
        nvcc_release=nvcc_release(cuda_home), ninja=ninja_available(),
        skip_cuda_check=os.environ.get("DS_SKIP_CUDA_CHECK", "0") == "1",
    )


def ninja_available() -> bool:
    """DeepSpeed imports the ``ninja`` module, and torch's extension builder runs ``ninja`` from PATH."""
    return importlib.util.find_spec("ninja") is not None and shutil.which("ninja") is not None


def deepspeed_prebuilt_ops() -> dict:
    """DeepSpeed's ``installed_ops`` (which ops were compiled at install), read from its installed
    ``git_version_info_installed.py`` without importing DeepSpeed; empty if DeepSpeed is not installed."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "git_version_info_installed.py"
    if not path.is_file():
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "installed_ops" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def nvcc_release(cuda_home: str | None) -> str | None:
    """``major.minor`` that ``<cuda_home>/bin/nvcc -V`` reports, as DeepSpeed reads it; None without one."""
    nvcc = Path(cuda_home or "") / "bin" / "nvcc"
    if cuda_home is None or not (nvcc.is_file() or shutil.which(str(nvcc))):
        return None
    try:
        output = subprocess.run([str(nvcc), "-V"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", output)
    return f"{found.group(1)}.{found.group(2)}" if found else None
