"""oat's program on a CPU (``--on_cpu``): one actor and one learner, for a laptop run or a rehearsal of the node.

The launcher counts one GPU, and launches oat's program with :class:`CPULearner` and :class:`CPUActor`, which
replace oat's CUDA-only calls in their own process before oat's constructors run
(:mod:`~dppo_oat.engines.oat.without_cuda` lists each, by file and line of oat 0.2.4, and why). Everything else is
oat's and DPPO's own code: oat's ``get_program``, ``LearnerBase.run`` (learn, evaluate, broadcast, save,
``launchpad.stop()``), DeepSpeed's ZeRO strategy on gloo, the weight broadcast (the same parameters in the same
order over the gloo group oat uses for collocated actors) and vLLM's ``load_weights``.
"""

from __future__ import annotations

from dppo_oat.engines.oat.actor import DPPOGemActor
from dppo_oat.engines.oat.learner import DPPOLearner
from dppo_oat.engines.oat.without_cuda import actor_without_cuda, learner_without_cuda


class CPULearner(DPPOLearner):
    """:class:`DPPOLearner` in a process whose CUDA calls are replaced first (:func:`learner_without_cuda`)."""

    def __init__(self, *args, **kwargs) -> None:
        learner_without_cuda()
        super().__init__(*args, **kwargs)


class CPUActor(DPPOGemActor):
    """:class:`DPPOGemActor` in a process whose weight-sync receive is on the CPU (:func:`actor_without_cuda`)."""

    def __init__(self, *args, **kwargs) -> None:
        actor_without_cuda()
        super().__init__(*args, **kwargs)
