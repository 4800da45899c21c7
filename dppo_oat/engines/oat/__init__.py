"""The oat engine: DPPO on oat's distributed actor/learner program (one GPU node, vLLM actors, DeepSpeed learners).

- :mod:`~dppo_oat.engines.oat.args`: :class:`DPPOOatArgs`, oat's ``PPOArgs`` plus DPPO's flags, mapped onto the
  core's :class:`~dppo_oat.settings.spec.RunSpec`;
- :mod:`~dppo_oat.engines.oat.plan`: what a run does on its node, worked out from the arguments (``--dry_run``);
- :mod:`~dppo_oat.engines.oat.price`: what it costs: time per learning round and for the run, and the learner's
  memory per GPU, from committed GPU measurements and stated models;
- :mod:`~dppo_oat.engines.oat.layout`: the run priced collocated and split, and which is faster;
- :mod:`~dppo_oat.engines.oat.preflight`: what the learner's optimizer needs of the node, checked before the launch;
- :mod:`~dppo_oat.engines.oat.data`: oat's transition data ⇄ the core's samples and
  :class:`~dppo_oat.update_batch.UpdateBatch`;
- :mod:`~dppo_oat.engines.oat.learner`: :class:`DPPOLearner`, oat's ``PPOLearner`` whose learning step is the core's
  update loop;
- :mod:`~dppo_oat.engines.oat.actor`: :class:`DPPOGemActor`, oat's ``PPOActor`` that plays Gem episodes through the
  core's rollout on the actor's vLLM engine;
- :mod:`~dppo_oat.engines.oat.run_dir`: the learner's run directory (the local engine's files, for the notebooks);
- :mod:`~dppo_oat.engines.oat.launch`: ``python -m dppo_oat.train --engine oat ...``.

Importing ``plan``, ``price``, ``layout`` or ``preflight`` imports nothing of oat; the other submodules import oat
(and with it vLLM, DeepSpeed and launchpad); this package itself imports nothing.
"""
