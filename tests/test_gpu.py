"""What only a GPU can show (skipped without CUDA; ``pytest -m gpu``, run by scripts/gpu/device_check.sh): the
rollout's sampling loop, the fused head's gradients and one RL step of the local engine, on CUDA, in bf16 where the
GPU runs use it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.update import minibatch_step
from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
from dppo_oat.rollout.direct_forward import runs_direct
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.settings.spec import SamplingSettings, UpdateSettings
from dppo_oat.trust_region import TrustRegion
from dppo_oat.update_batch import UpdateBatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ROOT = Path(__file__).resolve().parents[1]


def tiny_policy(dtype: torch.dtype):
    model, tokenizer = build_tiny_policy(toy_corpus(200), seed=0)
    return model.to(device="cuda", dtype=dtype), tokenizer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_sampling_loop_runs_the_models_own_forward_on_the_gpu(dtype):
    model, tokenizer = tiny_policy(dtype)
    assert runs_direct(model), "the direct forward differs from the model's own on CUDA"
    generator = HFGenerator(model, tokenizer, batch_size=8)
    prompts = [tokenizer.encode(text)[:12 + i] for i, text in enumerate(toy_corpus(8, seed=3))]
    first = generator.generate(prompts, SamplingSettings(max_new_tokens=8, seed=0))
    again = generator.generate(prompts, SamplingSettings(max_new_tokens=8, seed=0))  # from the prefix cache
    for completion in first + again:
        assert 1 <= len(completion.token_ids) <= 8
        assert all(-1e4 < lp <= 0 for lp in completion.logprobs)
    if dtype == torch.float32:  # in bf16 a cached prefix's logits may differ from a fresh prefill's in the last bit
        assert [c.token_ids for c in first] == [c.token_ids for c in again]


def update_batch(vocab: int, rows: int = 4, length: int = 33) -> UpdateBatch:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, length), generator=generator)
    response = torch.ones(rows, length - 1, dtype=torch.bool)
    response[:, :7] = False
    behavior = (-6.0 + 0.3 * torch.randn(rows, length - 1, generator=generator)).clamp(max=0)
    return UpdateBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response,
                       behavior_logp=behavior, advantages=torch.tensor([[1.0], [-1.0], [0.5], [-0.5]])).to("cuda")


def gradients(model, batch: UpdateBatch, lm_head: str) -> dict[str, torch.Tensor]:
    tr = TrustRegion.preset("dppo_binary_tv")
    settings = UpdateSettings(minibatch_size=len(batch), norm_constant=32.0)
    forward = causal_lm_forward(model, settings=settings, lm_head=lm_head)
    model.zero_grad(set_to_none=True)
    minibatch_step(batch, torch.arange(len(batch)), tr, forward, lambda loss: loss.backward(), settings)
    return {name: p.grad.float().clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)], ids=["fp32", "bf16"])
def test_the_fused_head_gives_the_logits_paths_gradients_on_the_gpu(dtype, tolerance):
    model, tokenizer = tiny_policy(dtype)
    model.train()
    batch = update_batch(len(tokenizer))
    fused, logits = gradients(model, batch, "fused"), gradients(model, batch, "logits")
    assert fused.keys() == logits.keys() and fused
    for name, expected in logits.items():
        scale = float(expected.abs().max()) or 1.0
        assert float((fused[name] - expected).abs().max()) <= tolerance * scale, name


def test_one_rl_step_of_the_local_engine_on_the_gpu(tmp_path):
    command = [sys.executable, "-m", "dppo_oat.train", "--device", "cuda", "--steps", "1", "--groups-per-step", "2",
               "--group-size", "2", "--eval-episodes", "4", "--runs-dir", str(tmp_path), "--run-name", "gpu"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    assert all(isinstance(v, (int, float)) and v == v for v in rows[0].values() if not isinstance(v, (str, dict)))
