"""Every tensor a run's rollout and update create lives on --device, or on the host by name for the host's own
bookkeeping (batches laid out from Python lists, the prefix cache's row index, the token sample): none lands on
torch's default device by omission. On a GPU such a tensor is a CPU tensor that meets the model's CUDA tensors, a
silent copy and a synchronisation each time, or an error.

The check on a CPU: the default device is set to ``meta`` (tensors without data) for the RL step and the evaluation,
so any tensor created without a device breaks them; the step must then give exactly the numbers of an ordinary one.
"""

import pytest
import torch
import tyro
from rich.console import Console

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.trainer import LocalTrainer

SHORT = ["--steps", "1", "--groups-per-step", "4", "--group-size", "2", "--minibatch-size", "8",
         "--eval-episodes", "4", "--probe-every", "1"]


def one_step(tmp_path, name, flags, default_device=None):
    """The metrics of RL step 1 and the evaluation after it, with torch's default device ``default_device``."""
    config = tyro.cli(TrainConfig, args=[*SHORT, *flags, "--runs-dir", str(tmp_path), "--run-name", name])
    trainer = LocalTrainer(config, Console(quiet=True))
    try:
        with torch.device(default_device) if default_device else torch.device("cpu"):
            metrics = trainer.rl_step()
            evaluation = trainer.evaluate()
    finally:
        trainer.close(failed=True)
    timing = ("time/", "tokens_per_s/")
    return {key: value for key, value in metrics.items() if not key.startswith(timing)}, evaluation


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--trust-region", "dppo_topk_tv"],  # μ's top-K sets on the host, then the device
                                   ["--trust-region", "minirl", "--rollout-dtype", "int4"]])  # π_θ' recomputed
def test_no_tensor_of_a_step_takes_the_default_device(tmp_path, flags):
    expected = one_step(tmp_path, "plain", flags)
    assert one_step(tmp_path, "meta", flags, default_device="meta") == expected
