"""The flags of an in-process run that change nothing it trains: where it writes (its run directory,
:class:`~dppo_oat.run.directory.RunDir`, inside ``--runs-dir``, the folder of runs), where it runs, and what it mirrors
or probes besides its metrics. Each declares itself (:mod:`dppo_oat.settings.kinds`): a resume may change all but
``run_name``, and runs averaged as seeds need not agree on any."""

from __future__ import annotations

from dataclasses import dataclass

from dppo_oat.settings.kinds import flag


@dataclass
class RunFlags:
    """Where a run writes and runs, and what it logs besides its metrics."""

    runs_dir: str = flag("runs", resumable=True, setting=False, formerly="run_dir")
    """The folder that holds the runs, each in <runs-dir>/<run-name>."""
    run_name: str | None = flag(None, setting=False)
    """Name of this run's folder inside --runs-dir. None: <trust-region>-<first env id>-s<seed>."""
    resume: bool = flag(False, resumable=True, setting=False)
    """Continue <runs-dir>/<run-name> from its checkpoint."""
    overwrite: bool = flag(False, resumable=True, setting=False)
    """Start a new run where one of this name is, its files moved aside into <run>/overwritten-<UTC time>/."""
    allow_metrics_gap: bool = flag(False, resumable=True, setting=False)
    """With --resume: continue a run whose metrics.jsonl lost steps its checkpoint has (they stay missing)."""
    cache_dir: str | None = flag(None, resumable=True, setting=False)
    """Where the tiny policy is cached. None: $DPPO_CACHE, else ~/.cache/dppo_oat."""
    device: str = flag("cpu", resumable=True, setting=False)
    """Torch device of the whole run: cpu, cuda, cuda:1, ..."""
    cuda_graphs: bool = flag(False, resumable=True, setting=False)
    """On CUDA, decode by replaying CUDA graphs of the decode step, sampling included (one launch per token): the
    eager decode's distribution, up to float rounding."""
    threads: int | None = flag(None, resumable=True, setting=False)
    """CPU threads torch may use (at most 4 per usable CPU). None: the usable CPUs less those busy now, at least 1.
    Each count sums floats in its own order, so draws other tokens."""
    wandb: bool = flag(False, resumable=True, setting=False)
    """Also log metrics to Weights & Biases (needs wandb installed and logged in)."""
    tensorboard: bool = flag(False, resumable=True, setting=False)
    """Also write TensorBoard event files into the run directory."""
    probe_every: int = flag(0, resumable=True, setting=False)
    """Every N steps, also log binary, top-K and exact D_TV/D_KL between μ and the updated π on the step's batch
    (probe/* metrics; HF generator only). 0: never."""
