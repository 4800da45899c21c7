"""The oat engine: DPPO on oat's distributed actor/learner program (one GPU node, vLLM actors, DeepSpeed learners).

- :mod:`~dppo_oat.engines.oat.args`: :class:`DPPOOatArgs`, oat's ``PPOArgs`` plus the trust region and the Gem tasks;
- :mod:`~dppo_oat.engines.oat.data`: oat's transition data ⇄ the core's samples and :class:`~dppo_oat.update.UpdateBatch`;
- :mod:`~dppo_oat.engines.oat.learner`: :class:`DPPOLearner`, oat's ``PPOLearner`` whose learning step is the core's
  update loop;
- :mod:`~dppo_oat.engines.oat.actor`: :class:`DPPOGemActor`, oat's ``PPOActor`` that plays Gem episodes through the
  core's rollout on the actor's vLLM engine;
- :mod:`~dppo_oat.engines.oat.launch`: ``python -m dppo_oat.train --engine oat ...``.

Importing a submodule imports oat (and with it vLLM, DeepSpeed and launchpad); this package itself imports nothing.
"""
