"""The learner's step: what turns one rollout batch into optimizer steps, for the local and oat engines alike.

- :mod:`~dppo_oat.learner.update`: the one update loop (epochs × minibatches × micro-batches; forward, backward and
  step passed in) and ``learn_from_rollout``, each engine's call per rollout batch;
- :mod:`~dppo_oat.learner.forward`: the learner's forward pass, π_θ's log-probs at the sampling temperature;
- :mod:`~dppo_oat.learner.fused_head`: π_θ and the loss's gradients from the hidden states (never the ``[N, V]``
  logits);
- :mod:`~dppo_oat.learner.guard`: the blow-up guard (non-finite log-probs, losses, gradients);
- :mod:`~dppo_oat.learner.autocast`: ``--dtype``'s autocast over fp32 master weights.
"""
