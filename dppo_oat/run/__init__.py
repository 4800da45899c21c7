"""A run's files: the directory both engines write and the analysis reads.

- :mod:`~dppo_oat.run.directory`: :class:`~dppo_oat.run.directory.RunDir`, every path of a run and the rules its files
  keep, and the one writer's lock;
- :mod:`~dppo_oat.run.log`: writing ``config.json`` and the logs, the run's provenance, the wandb/TensorBoard mirrors;
- :mod:`~dppo_oat.run.safe_io`: atomic, kill-safe writes and the JSON(L) reads;
- :mod:`~dppo_oat.run.token_samples`: each step's sample of tokens (``tokens.jsonl``);
- :mod:`~dppo_oat.run.token_export`: every trained token (``--token-export all``, ``token_exports/``).
"""
