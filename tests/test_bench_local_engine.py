"""The local-engine benchmark runs end to end and reports every ratio it promises (values: docs, not asserts)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_local_engine_benchmark_prints_its_ratios(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts/bench/local_engine.py"), "--steps", "1",
                             "--cache-dir", str(tmp_path)], capture_output=True, text=True, check=True, cwd=ROOT)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("rollout_vs_raw_generate", "rollout_vs_raw_sampling_loop", "update_vs_raw_fwd_bwd"):
        assert 0 < report[key] < 10, key
    assert report["rollout_tokens_per_s"] > 0 and report["raw_sampling_loop_tokens_per_s"] > 0
