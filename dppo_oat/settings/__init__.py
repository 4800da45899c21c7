"""A run's settings: what the command lines of the local and oat engines become, and how they are checked.

- :mod:`~dppo_oat.settings.spec`: ``RunSpec`` (trust region, rollout, sampling, advantages, update) and
  ``DPPOFlags``, the flags the local and oat engines share;
- :mod:`~dppo_oat.settings.docstrings`: the docstring under each field, for help texts and generated tables;
- :mod:`~dppo_oat.settings.grouped_cli`: ``--help`` in sections over the engines' flat argument classes;
- :mod:`~dppo_oat.settings.usage`: a usage error of a command line in one ``error:`` line.

The float32 range check of every numeric flag is :mod:`dppo_oat.ranges` (the trust region applies it too).
"""
