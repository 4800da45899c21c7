"""Where the tests find the project's shared math data sets (``DPPO_MATH_DATA``, else ``../shared/data/math``)."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MATH_DATA = Path(os.environ.get("DPPO_MATH_DATA", REPO_ROOT.parent / "shared" / "data" / "math"))
needs_math_data = pytest.mark.skipif(
    not MATH_DATA.is_dir(),
    reason=f"no math data sets at {MATH_DATA}: set DPPO_MATH_DATA to a folder of datasets save_to_disk folders (oat's "
           "train/math_lvl3to5_8k, evaluation_suite; envs/README.md, 'Local math'), which the repository does not ship")
