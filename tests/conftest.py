"""Shared test settings. In CI (CI=true) hypothesis runs derandomized so that a red run can be replayed."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
