"""``python -m dppo_oat.check_env``: Gem's env contract, as the trainer relies on it, checked on env ids.

    python -m dppo_oat.check_env --env-module my_envs.py     # every env id the file registers
    python -m dppo_oat.check_env --env-ids mine:MyGame-v0    # ids registered some other way (an installed plugin)
    python -m dppo_oat.check_env                             # every id of the project and the paper's tasks

It needs the package alone (no test tools). Each id must: have an oracle; make through ``gem.make`` and
``gem.make_vec`` (which passes ``seed=`` to the constructor); give the same episode for the same reset seed, whatever
the env played before, and in two slots of a vector env (a GRPO group); have an oracle that wins at least
``--min-win-rate`` (default 1) of its episodes; end the episode on an unreadable reply (the trainer also sends one
for a reply cut at the length limit) with Gem's -0.1 in a multi-turn env, and at most 0 in a single-turn one (whose
oracle always answers in one turn). Each check that fails is one line (``env <id>: <check>: <why>``); the last two
lines name every env id checked and the ones ``--env-module`` / ``--env-ids`` added. Exit 0 when every check passes,
1 when one fails, 2 on bad input (a plugin that fails to import, an unknown id), before any env is played.

The check functions (``check_*``) raise :class:`ContractViolation`, an ``AssertionError``, so that tests of one's own
can call them.
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated

import gem
import tyro
from gem.envs.registration import ENV_REGISTRY

import envs
from dppo_oat.settings.spec import FORMAT_ERROR_PENALTY, RolloutSettings
from envs.contract import INVALID_ACTION
from envs.oracles import oracle_action, oracle_for_env_id, play_oracle_episode

ORACLE_EPISODES = 8
"""Oracle episodes per env id (seeds ``0 .. ORACLE_EPISODES - 1``)."""
SUCCESS_THRESHOLD = RolloutSettings().success_threshold
"""An episode is won when its return reaches the trainer's success threshold."""
UNREADABLE_REPLIES = ("I am not sure.", INVALID_ACTION)
ENV_SEED = RolloutSettings().env_seed
"""Constructor seed of every slot of the trainer's vector env."""


class ContractViolation(AssertionError):
    """An env id breaks the contract; the message says how."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`ContractViolation` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ContractViolation(message)


# --- the checks, one function each ---------------------------------------------------------------------------------


def check_has_an_oracle(env_id: str) -> None:
    """An oracle is registered for the id or its class (it warm-starts the tiny policy and plays the checks)."""
    require(oracle_for_env_id(env_id) is not None,
            f"no oracle for {env_id}: register one with envs.register_oracle({env_id!r}, oracle)")


def check_makes_resets_and_steps(env_id: str) -> None:
    """``gem.make`` builds it; ``reset`` gives ``(text, dict)``; ``step`` gives a finite reward and two flags."""
    env = envs.make_env(env_id)
    observation, info = env.reset(seed=0)
    require(isinstance(observation, str) and bool(observation), "reset must return a non-empty observation text")
    require(isinstance(info, dict), "reset must return (observation, info dict)")
    result = env.step(oracle_action(env, random.Random(0)))
    require(len(result) == 5, "step must return (observation, reward, terminated, truncated, info)")
    observation, reward, terminated, truncated, info = result
    require(isinstance(observation, str) and isinstance(info, dict), "step must return a text observation and a dict")
    require(math.isfinite(float(reward)), f"reward {reward!r} is not a finite number")
    require(terminated in (True, False) and truncated in (True, False), "terminated and truncated must be booleans")


def check_group_slots_play_the_same_episode(env_id: str) -> None:
    """Two slots of a vector env built as the trainer builds them (``gem.make_vec``, one constructor seed) and reset
    with one seed play the same episode: a GRPO group compares answers to the same puzzle."""
    with contextlib.redirect_stdout(io.StringIO()):  # make_vec prints a banner
        vec = gem.make_vec([env_id, env_id], vec_kwargs=[{"seed": ENV_SEED}, {"seed": ENV_SEED}])
    observations, _ = vec.reset(seed=[7, 7])
    require(observations[0] == observations[1], "two envs reset with the same seed must show the same observation")
    first, second = (play_oracle_episode(env, 7, random.Random(0)) for env in vec.envs)
    require(first == second, "two envs reset with the same seed must play the same episode")


def check_reset_seed_fixes_the_episode(env_id: str) -> None:
    """The oracle's episode from ``reset(seed)`` is the same on a fresh env and after other episodes on another
    (the trainer keeps its envs for the whole run)."""
    fresh = play_oracle_episode(envs.make_env(env_id, seed=ENV_SEED), 5, random.Random(0))
    env = envs.make_env(env_id, seed=ENV_SEED)
    play_oracle_episode(env, 6, random.Random(1))
    again = play_oracle_episode(env, 5, random.Random(0))
    require(again == fresh, "reset(seed) must make the episode reproducible, whatever the env played before")


def oracle_episodes(env_id: str, episodes: int = ORACLE_EPISODES) -> list:
    """``(turns, return)`` of the oracle's episodes from seeds ``0 .. episodes - 1``."""
    env = envs.make_env(env_id)
    return [play_oracle_episode(env, seed, random.Random(seed)) for seed in range(episodes)]


def oracle_win_rate(env_id: str) -> float:
    """The share of the oracle's episodes whose return reaches the trainer's success threshold."""
    return sum(ret >= SUCCESS_THRESHOLD for _, ret in oracle_episodes(env_id)) / ORACLE_EPISODES


def check_oracle_wins(env_id: str, min_win_rate: float = 1.0) -> None:
    """The oracle wins at least ``min_win_rate`` of its :data:`ORACLE_EPISODES` episodes."""
    rate = oracle_win_rate(env_id)
    require(rate >= min_win_rate, f"the oracle of {env_id} won {rate:.0%} of {ORACLE_EPISODES} episodes "
                                  f"(at least {min_win_rate:.0%} wanted)")


def is_single_turn(env_id: str) -> bool:
    """True when every oracle episode is one turn: a question and its answer."""
    return all(len(turns) == 1 for turns, _ in oracle_episodes(env_id))


def unreadable_reply_rule(env_id: str) -> str:
    """The rule :func:`check_unreadable_reply_ends_the_episode` applies to ``env_id``, in words: which kind of env
    its oracle's episodes make it, and what an unreadable reply must then score."""
    if is_single_turn(env_id):
        return (f"{env_id} is single-turn (every oracle episode is one turn): an unreadable reply ends the episode "
                "(terminated=True) and scores at most 0, as a wrong answer does")
    return (f"{env_id} is multi-turn (an oracle episode takes more than one turn): an unreadable reply ends the "
            f"episode (terminated=True) with Gem's format-error reward {FORMAT_ERROR_PENALTY}, so that it costs more "
            "than a legal move")


def check_unreadable_reply_ends_the_episode(env_id: str) -> None:
    """A reply with no readable answer ends the episode: Gem's -0.1 in a multi-turn env (so that format errors cost
    more than a legal move), at most 0 in a single-turn one (Gem's ``rg:*`` give 0). A failure states the rule it
    applied (:func:`unreadable_reply_rule`)."""
    single_turn = is_single_turn(env_id)
    env = envs.make_env(env_id)
    for reply in UNREADABLE_REPLIES:
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step(reply)
        scored = float(reward) <= 0 if single_turn else math.isclose(float(reward), FORMAT_ERROR_PENALTY,
                                                                     rel_tol=1e-6)
        require(bool(terminated) and scored, f"{unreadable_reply_rule(env_id)}; the reply {reply!r} gave "
                                             f"terminated={terminated}, reward {reward}")


CHECKS = (check_makes_resets_and_steps, check_group_slots_play_the_same_episode, check_reset_seed_fixes_the_episode,
          check_unreadable_reply_ends_the_episode)
"""Every check that takes only an env id besides the oracle's (:func:`check_has_an_oracle`) and its win rate
(:func:`check_oracle_wins`)."""


# --- the command ----------------------------------------------------------------------------------------------------


def contract_checks(min_win_rate: float) -> list[tuple[str, Callable[[str], None]]]:
    """``(name, check)`` of every check, in the order they run (the oracle first: the others play it)."""
    return [("has an oracle", check_has_an_oracle), ("makes, resets and steps", check_makes_resets_and_steps),
            ("group slots play the same episode", check_group_slots_play_the_same_episode),
            ("reset(seed) fixes the episode", check_reset_seed_fixes_the_episode),
            ("the oracle wins", lambda env_id: check_oracle_wins(env_id, min_win_rate)),
            ("an unreadable reply ends the episode", check_unreadable_reply_ends_the_episode)]


def failures(env_id: str, min_win_rate: float = 1.0) -> list[str]:
    """One line per check ``env_id`` fails (``<check>: <why>``); after a missing oracle nothing else is played. An
    error the env's or oracle's own code raised counts as a failure of the check that met it."""
    found = []
    for name, check in contract_checks(min_win_rate):
        try:
            check(env_id)
        except ContractViolation as violation:
            found.append(f"{name}: {violation}")
            if check is check_has_an_oracle:
                break
        except Exception as error:  # the env's own code raised: one line, where it did
            found.append(f"{name}: raised {' '.join(f'{type(error).__name__}: {error}'.split())}")
    return found


@dataclass(frozen=True)
class CheckEnvArgs:
    """Check env ids against Gem's env contract as the trainer relies on it (see the module's docstring)."""

    env_module: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """A module (my_lab.envs) or file (path/to/my_envs.py) to import, as the trainer's --env-module: every env id it
    registers is checked; repeat the flag for several."""
    env_ids: tuple[str, ...] = ()
    """Env ids registered some other way, checked too. With neither flag: every id of the project and the paper's
    tasks."""
    min_win_rate: float = 1.0
    """The share of its episodes the oracle must win."""


def ids_to_check(args: CheckEnvArgs) -> tuple[list[str], list[str]]:
    """``(every id to check, the ids the flags named)``, after importing ``--env-module``; a plugin that fails to
    import or an unknown id raises one ``ValueError`` line."""
    if not 0 <= args.min_win_rate <= 1:
        raise ValueError(f"--min-win-rate must be in [0, 1], got {args.min_win_rate}")
    before = set(ENV_REGISTRY)
    envs.import_env_modules(args.env_module)
    named = [env_id for env_id in ENV_REGISTRY if env_id not in before] + list(args.env_ids)
    for env_id in args.env_ids:
        envs.ensure_registered(env_id)
    if args.env_module and not named:
        raise ValueError(f"--env-module {' '.join(args.env_module)} registered no env id: register one with "
                         "gem.envs.registration.register (envs/README.md)")
    every = named or [*envs.PROJECT_ENV_IDS, *envs.PAPER_TASKS]
    return list(dict.fromkeys(every)), list(dict.fromkeys(named))


def main(argv: Sequence[str] | None = None) -> int:
    args = tyro.cli(CheckEnvArgs, args=argv, prog="python -m dppo_oat.check_env",
                    description=__doc__.split("\n\n")[0].replace("``", "`"))
    try:
        checked, named = ids_to_check(args)
        failed = 0
        for env_id in checked:
            lines = failures(env_id, args.min_win_rate)
            failed += bool(lines)
            for line in lines:
                print(f"env {env_id}: {line}", flush=True)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted: nothing was written; run the same command again", file=sys.stderr)
        return 130
    print(f"env contract checked {len(checked)} env id{'' if len(checked) == 1 else 's'}: {', '.join(checked)}; "
          f"{len(checked) - failed} passed, {failed} failed")
    print(f"env contract: of them from --env-module / --env-ids: {', '.join(named) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
