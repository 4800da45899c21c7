"""The dry run's optimizer line and the launch's refusal (:mod:`dppo_oat.engines.oat.preflight`): DeepSpeed 0.16.8
from source compiles FusedAdam at learner start, which needs nvcc of torch's CUDA version and ninja. Pure functions
of the machine's answers, so these run in the main suite; the probe itself runs on this machine at the end."""

import dataclasses
import os
import stat

import pytest

from dppo_oat.engines.oat.preflight import (
    OptimizerToolkit,
    cuda_versions_compatible,
    nvcc_release,
    optimizer_toolkit,
    toolkit_line,
    toolkit_problem,
)

NODE = OptimizerToolkit(op="fused_adam", prebuilt=False, torch_cuda="12.4", cuda_home="/usr/local/cuda-12.4",
                        nvcc_release="12.4", ninja=True)
"""A node of the lock (torch 2.6.0 cu124) with a matching CUDA toolkit."""


def node(**changes) -> OptimizerToolkit:
    return dataclasses.replace(NODE, **changes)


def test_a_node_with_the_toolkit_compiles_at_learner_start():
    assert toolkit_problem(NODE) is None
    assert "FusedAdam, compiled at learner start" in toolkit_line(NODE) and "nvcc 12.4" in toolkit_line(NODE)


def test_a_prebuilt_op_needs_nothing():
    prebuilt = node(prebuilt=True, cuda_home=None, nvcc_release=None, ninja=False)
    assert toolkit_problem(prebuilt) is None and toolkit_line(prebuilt) == "optimizer: DeepSpeed FusedAdam, prebuilt"


@pytest.mark.parametrize("changes,message", [
    (dict(cuda_home=None, nvcc_release=None), "needs the CUDA 12.4 toolkit (nvcc): install it and set CUDA_HOME"),
    (dict(nvcc_release=None), "needs the CUDA 12.4 toolkit (nvcc)"),
    (dict(ninja=False), "needs ninja, importable and on PATH: pip install ninja"),
    (dict(nvcc_release="13.0"), "nvcc 13.0 (/usr/local/cuda-12.4) does not match torch's CUDA 12.4"),
    (dict(nvcc_release="11.8"), "does not match torch's CUDA 12.4"),
])
def test_a_node_that_cannot_compile_is_one_line_that_says_what_to_do(changes, message):
    problem = toolkit_problem(node(**changes))
    assert problem is not None and message in problem and "\n" not in problem
    assert problem.startswith("DeepSpeed's FusedAdam is not prebuilt and is compiled at learner start")
    assert "a launch here refuses" in toolkit_line(node(**changes))


def test_offloaded_adam_names_its_op_and_deepspeeds_escape_hatch_is_honoured():
    assert "DeepSpeedCPUAdam (--adam_offload)" in toolkit_problem(node(op="cpu_adam", ninja=False))
    assert "DS_BUILD_CPU_ADAM=1" in toolkit_problem(node(op="cpu_adam", nvcc_release=None))
    assert "DS_BUILD_FUSED_ADAM=1" in toolkit_problem(node(nvcc_release=None))
    assert toolkit_problem(node(nvcc_release="13.0", skip_cuda_check=True)) is None


def test_deepspeeds_accepted_minor_mismatches():
    assert cuda_versions_compatible("12.6", "12.4") and cuda_versions_compatible("11.8", "11.7")
    assert not cuda_versions_compatible("12.9", "12.4") and not cuda_versions_compatible("13.0", "12.4")


def test_a_cpu_torch_is_left_to_the_node():
    cpu = node(torch_cuda=None, cuda_home=None, nvcc_release=None)
    assert toolkit_problem(cpu) is None and "the launch on the node checks it" in toolkit_line(cpu)


def test_nvcc_release_is_read_as_deepspeed_reads_it(tmp_path):
    """A real executable that prints nvcc's version banner, under a CUDA_HOME of its own."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    assert nvcc_release(str(tmp_path)) == "12.4"
    assert nvcc_release(str(tmp_path / "elsewhere")) is None and nvcc_release(None) is None


def test_this_machine_gets_an_answer():
    """The probe on the machine running the tests (no DeepSpeed import, no GPU needed)."""
    toolkit = optimizer_toolkit(adam_offload=False)
    assert toolkit.op == "fused_adam" and toolkit_line(toolkit).startswith("optimizer: ")
    assert os.environ.get("DS_SKIP_CUDA_CHECK", "0") == "1" or not toolkit.skip_cuda_check
