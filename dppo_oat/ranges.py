"""Numbers a run computes with in float32: the one range check every engine applies to its numeric flags before any
model loads (the local engine's validation, the oat engine's, and verl's mapping of its config).

The loss, the sampler and the optimizer turn a flag's value into a float32 tensor (or multiply float32 tensors by
it). A finite value past float32's range (``--tr-tau-pos 1e300``) overflows to ∞ there, after the model has loaded
and a rollout has run (``RuntimeError: value cannot be converted to type float without overflow``); a nonzero value
below its smallest normal number (``1e-300``) underflows to 0 or loses its precision, and its reciprocal (SAPO's
4/τ) overflows. ∞ itself is left to each field's own rule (an IS cap C of ∞ means no truncation).

Imports nothing heavy: verl's workers import it with the mapping.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32."""
FLOAT32_TINY = 1.1754943508222875e-38
"""The smallest positive normal float32."""


def float32_problem(value: Any) -> str | None:
    """Why ``value`` does not fit float32 (None when it does, or when it is not a real number, or is ±∞ or NaN:
    those are each field's own rule)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value == 0:
        return None
    if abs(value) > FLOAT32_MAX:
        return f"overflows float32 (its largest number is {FLOAT32_MAX:.3g})"
    if abs(value) < FLOAT32_TINY:
        return f"underflows float32 (its smallest normal number is {FLOAT32_TINY:.3g}; 1/x would overflow)"
    return None


def check_float32(flag: str, value: Any) -> None:
    """Refuse ``flag``'s ``value`` in one ``ValueError`` when it does not fit float32 (:func:`float32_problem`)."""
    problem = float32_problem(value)
    if problem:
        raise ValueError(f"{flag} {value:g} {problem}, in which the run computes with it: give a value within "
                         "float32's range")


def check_float32_fields(settings: Any, flag_of: Callable[[str], str], skip: Iterable[str] = ()) -> None:
    """:func:`check_float32` on every numeric field of the dataclass ``settings`` (nested dataclasses too, their
    fields dotted: ``warm_start.lr``), each named by ``flag_of(dotted name)``; ``skip``: fields left out."""
    left_out = set(skip)
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name, None)
        if field.name in left_out:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_float32_fields(value, lambda name, outer=field.name: flag_of(f"{outer}.{name}"))
        else:
            check_float32(flag_of(field.name), value)
