"""LoRA with DPPO's learner on oat (``--lora_rank``): the fused head computes π_θ of base + adapters, a learning step
trains the adapters alone, and the merge oat does for every weight broadcast leaves the base weights exact (in bf16
oat's own merge and unmerge would not). The whole program under LoRA, killed and resumed, with vLLM sampling from the
merged weights: ``test_oat_rehearsal.py``."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder
peft = pytest.importorskip("peft")

from test_oat_learner import behavior_samples, learner_args, oat_trajectory  # noqa: E402  (after pytest.importorskip)

from dppo_oat.engines.oat.data import transition_from_sample, update_batch_from_trajectory  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.lora import adapted_base_weights, base_weights_restored  # noqa: E402  (after pytest.importorskip)
from dppo_oat.learner.forward import causal_lm_forward  # noqa: E402  (after pytest.importorskip)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # oat's default


def lora_model(tiny_policy, dtype=torch.bfloat16):
    """The tiny policy in ``dtype`` with LoRA adapters on oat's default modules, trained a little (B ≠ 0)."""
    model = copy.deepcopy(tiny_policy[0]).to(dtype)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    return wrapped


def base_drift(model, before: dict) -> float:
    return max((tensor - before[name]).abs().max().item() for name, tensor in adapted_base_weights(model).items())


def test_broadcast_merges_leave_the_base_weights_exact(tiny_policy):
    """Twenty broadcasts' merge and unmerge in bf16: oat's alone move the base weights; within
    ``base_weights_restored`` (what ``DPPOLearner._broadcast_to_vllm`` wraps them in) not one bit moves."""
    model = lora_model(tiny_policy)
    before = {name: tensor.clone() for name, tensor in adapted_base_weights(model).items()}
    assert len(before) == 7 * len(model.base_model.model.model.layers)
    for _ in range(20):
        model.merge_adapter()
        model.unmerge_adapter()
    assert base_drift(model, before) > 0, "bf16 merges round: the base weights drift without the guard"

    model = lora_model(tiny_policy)
    for _ in range(20):
        with base_weights_restored(model):
            model.merge_adapter()
            model.unmerge_adapter()
    assert base_drift(model, before) == 0.0


def oat_grouped_learner(args, monkeypatch):
    """A DPPOLearner set up by oat's ``_init`` with oat's own two parameter groups (decay / no decay: under LoRA the
    second is empty, which DeepSpeed removes after oat's schedule was made), in torch's AdamW (the rehearsal's)."""
    from oat.utils.deepspeed import DeepspeedStrategy
    from oat.utils.launcher import get_free_port

    from dppo_oat.engines.oat.learner import DPPOLearner
    from dppo_oat.engines.oat.without_cuda import torch_adamw

    monkeypatch.setattr(DeepspeedStrategy, "create_optimizer", torch_adamw)
    learner = DPPOLearner(1, 0, 0, "127.0.0.1", get_free_port(), True, args, [], None)
    learner._init(args, [])
    return learner


def test_a_lora_learning_step_trains_the_adapters_through_the_fused_head(tiny_policy, tiny_policy_dir, tmp_path,
                                                                        oat_on_cpu, gpu_node, monkeypatch):
    """oat's ``LLM`` with LoRA under ZeRO-2: π_θ from the fused head equals the logits path's (base + adapters), and a
    learning step (with oat's schedule, matched to the groups DeepSpeed kept) moves the adapters and leaves every
    base weight as it was."""
    flags = ["--tr_delta", "0.2", "--lora_rank", "4", "--lora_alpha", "16"]
    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_binary_tv", flags, 2, 1e-2)
    learner = oat_grouped_learner(args, monkeypatch)
    model = learner.strategy._unwrap_model(learner.model)
    assert isinstance(model, peft.PeftModel)
    samples, advantages = behavior_samples(tiny_policy, seed=8)
    transitions = pickle.loads(pickle.dumps([transition_from_sample(s, a, "", {})
                                             for s, a in zip(samples, advantages, strict=True)]))
    trajectory = oat_trajectory(learner, transitions)
    batch = update_batch_from_trajectory(trajectory, learner.tokenizer.pad_token_id, with_topk=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # the fused head must not fall back to the logits path
        fused = causal_lm_forward(learner.model, lm_head="fused")(batch, False).logp
        logits = causal_lm_forward(learner.model, lm_head="logits")(batch, False).logp
    torch.testing.assert_close(fused, logits, atol=1e-5, rtol=1e-5)

    before = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    learner.model.train()
    infos = learner.learning_step(trajectory)
    after = model.state_dict()
    adapters = [name for name in before if "lora_" in name]
    assert adapters and all(torch.equal(after[name], before[name]) for name in before if name not in adapters)
    assert any(not torch.equal(after[name], before[name]) for name in adapters if "lora_B" in name)
    assert torch.isfinite(infos["pg_loss"]) and infos["policy_grad_norm"] > 0
