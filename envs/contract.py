"""Gem's env contract, as the rollout relies on it: what ``reset()`` and ``step()`` return, the action a cut
response sends, the observation text a policy sees, and :class:`BrokenEnvError`, the one-line failure of an env (or
its oracle) that breaks it. Below both the rollout (``dppo_oat.rollout.episodes``) and the oracles
(``envs.oracles``), which check every env they play through it; it imports nothing of ``dppo_oat``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

RESET_RETURNS = "(observation: str, info: dict)"
STEP_RETURNS = "(observation: str, reward: float, terminated: bool, truncated: bool, info: dict)"
"""What Gem's envs return from ``reset()`` and ``step()``, as contract errors say it."""

INVALID_ACTION = "<｜INVALID_ACTION｜>"
"""What the env receives for a response cut at the length limit (Gem's oat examples send the same string)."""


def observation_text(observation: str, info: dict[str, Any]) -> str:
    """The observation followed by ``info["suffix"]`` when present (Gem games put the current board there)."""
    suffix = info.get("suffix")
    if not suffix:
        return observation
    return observation.rstrip("\n") + "\n" + suffix


class BrokenEnvError(RuntimeError):
    """An env, or its oracle, broke what the trainer relies on: Gem's contract (what ``reset()`` and ``step()``
    return, an oracle's action text), or it raised where no episode can absorb the error (``reset()``, an oracle's
    episode). A bug in its code: it stops the run and is never counted as an env-error episode."""


def returned(value: Any) -> str:
    """What a method returned, as a contract error says it: ``None``, ``3 values``, or ``a str``."""
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return f"{len(value)} value{'' if len(value) == 1 else 's'}"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def is_number(value: Any) -> bool:
    """True for a value ``float()`` takes that is not text (a Python or numpy number, a one-element tensor)."""
    if isinstance(value, (str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def is_flag(value: Any) -> bool:
    """True for a bool, a numpy bool, or the integers 0 and 1."""
    return isinstance(value, (bool, np.bool_, int, np.integer)) and value in (0, 1)


def reset_problem(result: Any) -> str | None:
    """What is wrong with what ``reset()`` returned (:data:`RESET_RETURNS`), or None."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return f"returned {returned(result)}"
    observation, info = result
    if not isinstance(observation, str):
        return f"returned an observation of type {type(observation).__name__}"
    if not isinstance(info, dict):
        return f"returned an info of type {type(info).__name__}"
    return None


def step_problem(result: Any) -> str | None:
    """What is wrong with what ``step()`` returned (:data:`STEP_RETURNS`), or None. A reward is a real number, never
    a bool (``True`` would pass as 1.0 where the env meant a flag); an observation is text, the last one of an
    episode too (an env that returns something else there returns it elsewhere as well)."""
    if not isinstance(result, (tuple, list)) or len(result) != 5:
        return f"returned {returned(result)}"
    observation, reward, terminated, truncated, info = result
    if isinstance(reward, (bool, np.bool_)):
        return f"returned the reward {reward!r}, a bool: rewards are real numbers (1.0, not True)"
    if not is_number(reward):
        return f"returned the reward {reward!r}"
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not is_flag(flag):
            return f"returned {name}={flag!r}"
    if not isinstance(info, dict):
        return f"returned an info of type {type(info).__name__}"
    if not isinstance(observation, str):
        return f"returned an observation of type {type(observation).__name__}"
    return None


def contract_error(label: str, call: str, problem: str, returns: str) -> BrokenEnvError:
    """``env <id> (plugin ...): <call> <problem>; Gem envs return <returns>: fix its <method>``."""
    return BrokenEnvError(f"{label}: {call} {problem}; Gem envs return {returns}: fix its {call.split('(')[0]}()")


def checked_reset(env, seed: int | None, label: str) -> tuple:
    """``env.reset(seed=seed)``; a result that breaks the contract, or an exception, is a :class:`BrokenEnvError`
    naming ``label`` (no episode can start from either)."""
    try:
        result = env.reset(seed=seed)
    except Exception as error:
        raise BrokenEnvError(f"{label}: reset(seed={seed}) raised {type(error).__name__}: {error}: fix its "
                             "reset()") from error
    problem = reset_problem(result)
    if problem:
        raise contract_error(label, f"reset(seed={seed})", problem, RESET_RETURNS)
    return result


def check_step_result(result: Any, label: str) -> tuple:
    """``result``, what a ``step()`` returned; a :class:`BrokenEnvError` naming ``label`` if it breaks the contract."""
    problem = step_problem(result)
    if problem:
        raise contract_error(label, "step()", problem, STEP_RETURNS)
    return result


def checked_step(env, action: str, label: str) -> tuple:
    """``env.step(action)``, checked (:func:`check_step_result`). Exceptions pass through: the caller decides
    whether an episode absorbs them."""
    return check_step_result(env.step(action), label)
