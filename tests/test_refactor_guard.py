"""The default run and every preset's loss, bit for bit.

A 3-step ``python -m dppo_oat.train`` (the shipped tiny policy, one thread, seed 0, evaluation on 8 puzzles) writes
the metrics.jsonl, eval.jsonl and tokens.jsonl stored under tests/data/default_run, every number equal as JSON text,
only the wall-clock fields (:data:`WALL_CLOCK_FIELDS`) left out; and :func:`~dppo_oat.trust_region.policy_loss` of
every preset on one fixed batch gives the loss, gradient, mask, divergence and metrics stored beside them.

A change that moves any number of the default run (a rule, the loss, its metrics, the rollout, the update) or of a
preset's loss fails here; a change meant to move them regenerates the reference with
``python tests/test_refactor_guard.py`` and says why in its commit. Floating-point kernels differ between CPUs and torch
builds, so the comparison runs on the platform that made the reference (:data:`PLATFORM_FILE`) and is skipped, with that
platform named, elsewhere."""

import json
import math
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "default_run"
PLATFORM_FILE = REFERENCE / "platform.json"
PRESET_LOSSES = REFERENCE / "preset_losses.json"
TOPK_K = 3
"""K of the fixed batch's top-K set (the top-K presets' K is overridden to it)."""
FILES = ("metrics.jsonl", "eval.jsonl", "tokens.jsonl")
WALL_CLOCK_FIELDS = frozenset({"time/rollout", "time/update", "tokens_per_s/rollout", "tokens_per_s/update"})
"""The fields of these files that measure wall-clock time (metrics.jsonl's only; eval.jsonl and tokens.jsonl have
none)."""
RUN_FLAGS = ("--steps", "3", "--threads", "1", "--seed", "0", "--eval-episodes", "8", "--run-name", "default")


def current_platform() -> dict:
    """What floating-point results depend on beyond the code: torch's version, the CPU kernels it picked, the
    machine."""
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


def run_default(runs_dir: Path) -> Path:
    """The 3-step default run under ``runs_dir``; its run directory."""
    done = subprocess.run([sys.executable, "-m", "dppo_oat.train", *RUN_FLAGS, "--runs-dir", str(runs_dir),
                           "--cache-dir", str(runs_dir / "cache")], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return runs_dir / "default"


def canonical_lines(path: Path) -> list[str]:
    """Each record of a jsonl file as JSON text, its keys in their order, the wall-clock fields dropped (Python's
    float repr round-trips, so equal text is equal bits)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [json.dumps({k: v for k, v in record.items() if k not in WALL_CLOCK_FIELDS}) for record in records]


def skip_on_another_platform() -> None:
    reference_platform = json.loads(PLATFORM_FILE.read_text())
    if current_platform() != reference_platform:
        pytest.skip(f"the reference was made on {reference_platform}, this is {current_platform()}: regenerate it "
                    "(python tests/test_refactor_guard.py) on the old code to compare here")


def fixed_batch():
    """One ``[4, 12]`` fp32 batch with per-token advantages (a few 0), a ragged response mask, π_θ and π_θ' from near
    μ (the first row) to a few nats from it (the last), and a consistent top-K set (:data:`TOPK_K`) over an 11-token
    vocabulary."""
    gen = torch.Generator().manual_seed(20240611)
    b, t, vocab = 4, 12, 11
    spread = torch.tensor([[0.02], [0.1], [0.4], [1.0]])
    mu = torch.empty(b, t).uniform_(-4.0, 0, generator=gen)
    logp = (mu + torch.randn(b, t, generator=gen) * spread).clamp(max=-1e-4)
    recomputed = (mu + torch.randn(b, t, generator=gen) * spread / 2).clamp(max=-1e-4)
    advantages = torch.randn(b, t, generator=gen)
    advantages[0, :3] = 0.0
    mask = torch.rand(b, t, generator=gen) > 0.2
    mask[1, 8:] = False
    sampled = torch.randint(vocab, (b, t), generator=gen)
    logits = torch.randn(b, t, vocab, generator=gen)
    shifted = logits + torch.randn(b, t, vocab, generator=gen) * spread.unsqueeze(-1)
    full_mu = with_entry(logits.log_softmax(-1), sampled, mu)
    full_pi = with_entry(shifted.log_softmax(-1), sampled, logp)
    return logp, mu, recomputed, advantages, mask, topk_set(full_mu, full_pi, sampled)


def with_entry(full_logp, ids, entry_logp):
    """``full_logp`` with log p(ids) set to ``entry_logp``, the other entries rescaled to sum to 1 with it."""
    p = full_logp.exp()
    p.scatter_(-1, ids.unsqueeze(-1), 0.0)
    p = p / p.sum(-1, keepdim=True) * (1 - entry_logp.exp()).unsqueeze(-1)
    p.scatter_(-1, ids.unsqueeze(-1), entry_logp.exp().unsqueeze(-1))
    return p.log()


def topk_set(full_mu, full_pi, sampled):
    from dppo_oat.divergence.logprobs import topk_of_logprobs
    from dppo_oat.trust_region import TopK

    ids, mu_k = topk_of_logprobs(full_mu, sampled, TOPK_K)
    pi_k = torch.where(ids >= 0, full_pi.gather(-1, ids.clamp(min=0)), -math.inf)
    return TopK(ids=ids, behavior_logp=mu_k, logp=pi_k, valid=ids >= 0)


def preset_loss(name: str) -> dict:
    """``policy_loss`` of preset ``name`` on :func:`fixed_batch`: per-token loss, gradient of its sum, M_t, D_t
    (as lists) and the metrics."""
    from dppo_oat.trust_region import TrustRegion, policy_loss

    logp, mu, recomputed, advantages, mask, topk = fixed_batch()
    tr = TrustRegion.preset(name)
    if tr.uses_topk:
        tr = TrustRegion.preset(name, k=TOPK_K)
    logp = logp.clone().requires_grad_()
    out = policy_loss(logp, mu, advantages, mask, tr, recomputed_logp=recomputed, topk=topk)
    out.loss.sum().backward()
    return {"loss": out.loss.tolist(), "grad": logp.grad.tolist(), "keep": out.keep.tolist(),
            "divergence": out.divergence.tolist(), "metrics": out.metrics}


def all_preset_losses() -> dict:
    from dppo_oat.trust_region import PRESETS

    return {name: preset_loss(name) for name in PRESETS}


def test_every_preset_gives_the_reference_loss_gradient_mask_and_metrics():
    skip_on_another_platform()
    reference = json.loads(PRESET_LOSSES.read_text())
    for name, want in reference.items():
        got = json.loads(json.dumps(preset_loss(name)))
        for part in ("loss", "grad", "keep", "divergence"):
            assert json.dumps(got[part]) == json.dumps(want[part]), f"preset {name}: its {part} differs"
        metrics, expected = json.dumps(got["metrics"]), json.dumps(want["metrics"])
        assert metrics == expected, f"preset {name}: its metrics differ:\n{first_difference(metrics, expected)}"


def test_the_default_run_writes_the_reference_numbers(tmp_path):
    skip_on_another_platform()
    run = run_default(tmp_path)
    for name in FILES:
        got, want = canonical_lines(run / name), canonical_lines(REFERENCE / name)
        assert len(got) == len(want), f"{name}: {len(got)} records, the reference has {len(want)}"
        for index, (line, expected) in enumerate(zip(got, want, strict=True)):
            assert line == expected, f"{name} record {index} differs:\n{first_difference(line, expected)}"


def first_difference(line: str, expected: str) -> str:
    """The fields of two records that differ (or appear in one only), as ``key: got != expected`` lines."""
    got, want = json.loads(line), json.loads(expected)
    keys = list(dict.fromkeys([*want, *got]))
    return "\n".join(f"{key}: {got.get(key, '<absent>')!r} != {want.get(key, '<absent>')!r}" for key in keys
                     if json.dumps(got.get(key)) != json.dumps(want.get(key))) or "(the key order differs)"


def regenerate() -> None:
    """Rewrite the reference from this checkout's default run (and record the platform it ran on)."""
    import tempfile

    REFERENCE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        run = run_default(Path(scratch))
        for name in FILES:
            (REFERENCE / name).write_text((run / name).read_text())
    PRESET_LOSSES.write_text(json.dumps(all_preset_losses(), indent=1) + "\n")
    PLATFORM_FILE.write_text(json.dumps(current_platform(), indent=2) + "\n")
    print(f"wrote {', '.join(FILES)}, {PRESET_LOSSES.name} and {PLATFORM_FILE.name} "
          f"under {REFERENCE.relative_to(ROOT)}")


if __name__ == "__main__":
    regenerate()
