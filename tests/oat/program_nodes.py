"""The nodes of a launchpad program, read alike from dm-launchpad's and from the stand-in's (tests only)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class NodeView:
    """One node of a launchpad program, read alike from dm-launchpad's and from the stand-in's."""

    label: str
    constructor: object
    args: tuple
    kwargs: dict
    node: object


def program_nodes(program) -> list[NodeView]:
    """The nodes of ``program`` (oat's ``get_program``): dm-launchpad keeps them by label in ``program.groups``, each
    with its ``_constructor``, ``_args`` and ``_kwargs``; the stand-in lists them in ``program.nodes``."""
    if hasattr(program, "groups"):
        return [NodeView(label, node._constructor, node._args, node._kwargs, node)
                for label, nodes in program.groups.items() for node in nodes]
    return [NodeView(node.label, node.constructor, node.args, node.kwargs, node) for node in program.nodes]
