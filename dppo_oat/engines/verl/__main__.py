"""``python -m dppo_oat.engines.verl``: what a verl launch of the core's trust regions needs.

- ``list``: every preset, registered or refused (with the reason);
- ``overrides PRESET [FIELD=VALUE ...]``: the ``verl.trainer.main_ppo`` overrides of a preset, one per line, with
  optional TrustRegion field overrides (``delta=0.2 is_cap=5``);
- ``check OVERRIDE ...``: compose verl's config with a launch's overrides (CPU, no Ray) and check it (exit 2 with one
  line on what to change).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from dppo_oat.engines.verl import INSTALL_HINT, VERL_INSTALLED
from dppo_oat.engines.verl.mapping import hydra_overrides, loss_name, supported_presets


def parse_fields(pairs: Sequence[str]) -> dict:
    """``["delta=0.2", "is_cap=inf"]`` as TrustRegion field overrides: each a FIELD=VALUE whose value is a number
    (``inf`` allowed, NaN not), each field once; ``ValueError`` with one line naming the pair otherwise."""
    fields = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"a trust-region field is FIELD=VALUE (e.g. delta=0.2), got {pair!r}")
        if name in fields:
            raise ValueError(f"{name} is given twice ({name}={fields[name]:g} and {pair}): give each field once")
        fields[name] = _number(pair, value)
    return fields


def _number(pair: str, text: str) -> int | float:
    """The number ``text`` of ``pair`` (an int where it is one: K), never NaN."""
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        if kind is float and math.isnan(number):
            break
        return number
    raise ValueError(f"{pair}: a trust-region field takes a number (e.g. delta=0.2, is_cap=inf), got {text!r}")


def preset_lines() -> list[str]:
    """``list``: every preset, registered (verl can run it) or refused with the reason; no verl needed."""
    presets = supported_presets()
    return ([f"{loss_name(name)}: registered" for name, reason in presets.items() if reason is None]
            + [reason for reason in presets.values() if reason is not None])


def check_lines(overrides: Sequence[str]) -> list[str]:
    """``check``: compose verl's config with ``overrides`` and check it (needs verl)."""
    if not VERL_INSTALLED:
        raise ValueError(f"check composes verl's own config: it needs verl ({INSTALL_HINT})")
    from dppo_oat.engines.verl.preflight import check, compose

    verl_said: list[str] = []
    line = check(compose(overrides), verl_said)  # verl's own lines, only once every check passed
    return [*verl_said, line]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m dppo_oat.engines.verl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="presets registered and refused")
    over = sub.add_parser("overrides", help="the Hydra overrides of a preset")
    over.add_argument("preset", help="a preset name (python -m dppo_oat.engines.verl list)")
    over.add_argument("fields", nargs="*", help="TrustRegion field overrides, FIELD=VALUE")
    chk = sub.add_parser("check", help="compose verl's config with these overrides and check it")
    chk.add_argument("overrides", nargs="*", help="Hydra overrides, KEY=VALUE (as `overrides` prints them)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            lines = preset_lines()
        elif args.command == "overrides":
            lines = hydra_overrides(args.preset, **parse_fields(args.fields))
        else:
            lines = check_lines(args.overrides)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
