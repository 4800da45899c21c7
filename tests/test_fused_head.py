"""The fused LM head against the logits path: the same log-probs, entropy and top-K log-probs, and the same gradients
(to the hidden states and the head weight) of DPPO's loss, over several chunks of tokens (forward) and of the
vocabulary (backward); and it never creates an ``[N, V]`` tensor, nor a ``[V, H]`` one wider than the weight."""

import copy
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dppo_oat.learner.forward as learner_forward_module
import dppo_oat.learner.fused_head as fused_head
from dppo_oat.aggregation import aggregate_loss
from dppo_oat.divergence.logprobs import logits_logprobs, topk_of_logprobs
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.learner.fused_head import (
    FusedHeadUnsupported,
    fused_head_logprobs,
    head_of,
    last_hidden_states,
)
from dppo_oat.learner.update import minibatch_step, recompute_logprobs
from dppo_oat.models.tiny import build_tiny_policy, toy_corpus
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.trust_region import TopK, TrustRegion, policy_loss
from dppo_oat.update_batch import UpdateBatch

B, T, H, V, K = 3, 11, 16, 97, 4


def head_batch(dtype=torch.float32, seed=0, k=K):
    """Hidden states ``[B, T, H]``, a head weight, sampled ids, μ near π and a top-K set, as an :class:`UpdateBatch`
    whose per-token fields are ``[B, T]`` (``input_ids`` carries the ids at positions 1..T)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen).to(dtype)
    weight = (0.5 * torch.randn(V, H, generator=gen)).to(dtype)
    logp_all = (hidden.double() @ weight.double().T).log_softmax(-1)
    ids = torch.multinomial(logp_all.exp().reshape(B * T, V), 1, generator=gen).reshape(B, T)
    mu = (logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1) + 0.3 * torch.randn(B, T, generator=gen)).clamp(max=0)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, :3] = False  # a prompt
    topk_ids, topk_mu = topk_of_logprobs(logp_all.float(), ids, k)
    batch = UpdateBatch(input_ids=torch.cat([torch.zeros(B, 1, dtype=torch.long), ids], 1),
                        attention_mask=torch.ones(B, T + 1, dtype=torch.long), response_mask=mask,
                        behavior_logp=mu.float(), advantages=torch.tensor([[1.0], [-1.0], [0.5]]),
                        topk_ids=topk_ids, topk_behavior_logp=topk_mu)
    return hidden, weight, batch


def dppo_loss(logp, topk_logp, batch, tr):
    topk = TopK(batch.topk_ids, batch.topk_behavior_logp, topk_logp, batch.topk_valid) if tr.uses_topk else None
    result = policy_loss(logp, batch.behavior_logp, batch.advantages, batch.response_mask, tr, topk=topk)
    return aggregate_loss(result.loss, batch.response_mask, "seq-mean-token-sum-norm", norm_constant=8.0)


def grads(path, hidden, weight, batch, tr, temperature, scale=1.0, chunk_size=7):
    """``(logp, entropy, topk_logp, ∂L/∂h, ∂L/∂W)`` of DPPO's loss by ``path``: logits or fused (``chunk_size`` token
    rows per forward chunk: 5 chunks of 7 rows, then 5 of 20 vocabulary rows of 97 for the 30 response tokens)."""
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ids, options = batch.input_ids[:, 1:], dict(temperature=temperature, topk_ids=batch.topk_ids)
    if path == "logits":
        out = logits_logprobs(hidden @ weight.T, ids, **options)
    else:
        out = fused_head_logprobs(hidden, weight, ids, chunk_size=chunk_size, **options)
    (scale * dppo_loss(out[0], out[2], batch, tr)).backward()
    return (*out, hidden.grad, weight.grad)


def assert_close_rel(actual, expected, rtol):
    torch.testing.assert_close(actual.float(), expected.float(), rtol=0, atol=rtol * expected.float().abs().max())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_values_equal_the_logits_path(temperature):
    hidden, weight, batch = head_batch()
    logits = logits_logprobs(hidden @ weight.T, batch.input_ids[:, 1:], temperature=temperature,
                             topk_ids=batch.topk_ids)
    fused = fused_head_logprobs(hidden, weight, batch.input_ids[:, 1:], temperature=temperature,
                                topk_ids=batch.topk_ids, chunk_size=5)
    for got, expected in zip(fused, logits, strict=True):
        assert got.dtype == torch.float32 and got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)  # -inf padding of the top-K set included


@pytest.mark.parametrize("preset", ["dppo_binary_tv", "dppo_topk_tv", "ppo", "cispo"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [1, 7, None], ids=["one-row-chunks", "several-chunks", "one-chunk"])
def test_gradients_equal_the_logits_path(preset, temperature, chunk_size):
    hidden, weight, batch = head_batch()
    tr = TrustRegion.preset(preset, k=K) if preset.startswith("dppo_topk") else TrustRegion.preset(preset)
    expected = grads("logits", hidden, weight, batch, tr, temperature)
    got = grads("fused", hidden, weight, batch, tr, temperature, chunk_size=chunk_size)
    assert expected[3].abs().max() > 0 and expected[4].abs().max() > 0
    assert_close_rel(got[3], expected[3], 1e-5)
    assert_close_rel(got[4], expected[4], 1e-5)


def test_the_backward_covers_the_vocabulary_in_chunks_and_each_sampled_token_in_its_own():
    """Chunk boundaries of the vocabulary cut between the sampled tokens: each token's ``e_{a_t}`` term lands in the
    chunk that holds ``a_t`` and in no other (a token whose id is a chunk's first or last row included)."""
    gen = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(6, 8, generator=gen, dtype=torch.float64), torch.randn(10, 8, generator=gen,
                                                                                     dtype=torch.float64)
    ids, g = torch.tensor([0, 2, 3, 5, 9, 9]), torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, -1.0], dtype=torch.float64)
    expected = gradients_of_weighted_logp("logits", hidden, weight, ids, g)
    assert fused_head.vocab_rows_per_chunk(5, 10, 8, chunk_size=1) == 2  # 5 rows with g ≠ 0: chunks of 2 ids
    got = gradients_of_weighted_logp("fused", hidden, weight, ids, g, chunk_size=1)
    for actual, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(actual, reference, rtol=1e-12, atol=1e-12)
    assert (got[0][3] == 0).all(), "a token with g = 0 gets no gradient"


@pytest.mark.parametrize("requires", [(True, True), (True, False), (False, True)], ids=["both", "hidden", "head"])
def test_a_backward_with_no_gradient_to_pass_is_zeros(requires):
    """Every token blocked (or a prompt): ``g = 0`` everywhere, no logits recomputed, zero gradients of the inputs'
    shapes and dtypes."""
    hidden, weight, batch = head_batch(dtype=torch.bfloat16)
    h, w = hidden.clone().requires_grad_(requires[0]), weight.clone().requires_grad_(requires[1])
    logp = fused_head_logprobs(h, w, batch.input_ids[:, 1:], chunk_size=7)[0]
    (0.0 * logp).sum().backward()
    for leaf, wanted in zip((h, w), requires, strict=True):
        assert (leaf.grad is not None) == wanted
        if wanted:
            assert leaf.grad.dtype == torch.bfloat16 and leaf.grad.shape == leaf.shape and not leaf.grad.any()


def gradients_of_weighted_logp(path, hidden, weight, ids, g, chunk_size=None):
    """``(∂L/∂h, ∂L/∂W)`` of ``L = Σ_t g_t log π(a_t)`` by ``path`` (autograd through a log-softmax of the whole
    logits, in their dtype, or fused)."""
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    if path == "logits":
        logp = torch.log_softmax(hidden @ weight.T, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    else:
        logp = fused_head_logprobs(hidden, weight, ids, chunk_size=chunk_size, with_entropy=False)[0]
    (g * logp).sum().backward()
    return hidden.grad, weight.grad


@pytest.mark.parametrize("preset", ["dppo_binary_tv", "dppo_topk_tv"])
def test_bf16_within_tolerance_of_the_logits_path(preset):
    hidden, weight, batch = head_batch(dtype=torch.bfloat16)
    tr = TrustRegion.preset(preset, k=K) if preset.startswith("dppo_topk") else TrustRegion.preset(preset)
    expected = grads("logits", hidden, weight, batch, tr, 0.7)
    got = grads("fused", hidden, weight, batch, tr, 0.7)
    assert got[4].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0.05)
    assert_close_rel(got[3], expected[3], 0.03)
    assert_close_rel(got[4], expected[4], 0.03)


def test_gradcheck_in_fp64_over_several_chunks():
    hidden, weight, batch = head_batch(dtype=torch.float64)
    ids = batch.input_ids[:1, 1:]

    def logp(h, w):
        return fused_head_logprobs(h, w, ids, temperature=0.7, chunk_size=4)[0]

    assert torch.autograd.gradcheck(logp, (hidden[:1].requires_grad_(), weight.requires_grad_()))


class CreatedTensors(TorchDispatchMode):
    """Records the largest number of elements, and of bytes, of a tensor an operator returns."""

    def __init__(self):
        super().__init__()
        self.largest = self.largest_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.numel())
                self.largest_bytes = max(self.largest_bytes, value.numel() * value.element_size())
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_tensor_of_n_by_v_nor_a_wider_head_gradient_is_ever_created(dtype):
    """Memory, without a clock: the largest tensor of the fused forward + backward is one chunk of fp32 logits or
    the head's gradient in the weight's own dtype, never ``[N, V]`` (the logits path's), nor a ``[V, H]`` fp32
    accumulator beside a bf16 weight."""
    hidden, weight, batch = head_batch(dtype=dtype)
    tr = TrustRegion.preset("dppo_topk_tv", k=K)
    with CreatedTensors() as created:
        grads("fused", hidden, weight, batch, tr, 1.0)
    assert created.largest <= max(7 * V, V * H) < B * T * V
    assert created.largest_bytes <= max(7 * V * 4, V * H * weight.element_size())
    with CreatedTensors() as created:
        grads("logits", hidden, weight, batch, tr, 1.0)
    assert created.largest >= B * T * V


# --------------------------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def policy(request):
    model, tokenizer = build_tiny_policy(toy_corpus(100), seed=0, vocab_size=300,
                                         tie_word_embeddings=request.param)
    return model.train(), tokenizer


def model_batch(policy, k=0):
    model, tokenizer = policy
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, len(tokenizer), (4, 14), generator=gen)
    mask = torch.zeros(4, 13, dtype=torch.bool)
    mask[:, 5:] = True
    with torch.no_grad():
        logp_all = (model(input_ids=ids).logits[:, :-1] / 0.8).log_softmax(-1)
    mu = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) + 0.2 * torch.randn(4, 13, generator=gen)
    batch = UpdateBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=mask,
                        behavior_logp=mu.clamp(max=0), advantages=torch.tensor([[1.0], [-1.0], [2.0], [-0.5]]))
    if k:
        batch.topk_ids, batch.topk_behavior_logp = topk_of_logprobs(logp_all, ids[:, 1:], k)
    return batch


def test_last_hidden_states_are_the_decoders_and_the_head_is_put_back(policy):
    model, _ = policy
    batch = model_batch(policy)
    head = model.get_output_embeddings()
    hidden = last_hidden_states(model, batch.input_ids, batch.attention_mask)
    expected = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    torch.testing.assert_close(hidden, expected)
    assert model.get_output_embeddings() is head
    assert head_of(model).weight is head.weight


@pytest.mark.parametrize("preset", ["dppo_binary_tv", "dppo_topk_kl", "dppo_binary_tv_recompute", "decoupled_ppo",
                                    "seq_geo_mask", "dppo_binary_tv_kl"])
def test_a_minibatch_step_trains_the_same_gradients_on_both_heads(policy, preset):
    model, _ = policy
    tr = TrustRegion.preset(preset, k=3) if preset.startswith("dppo_topk") else TrustRegion.preset(preset)
    batch = model_batch(policy, k=3 if tr.uses_topk else 0)
    settings = UpdateSettings(minibatch_size=4, micro_batch_size=2, aggregation="token-mean", temperature=0.8)
    found = {}
    for lm_head in ("logits", "fused"):
        copy_ = copy.deepcopy(model)
        forward = causal_lm_forward(copy_, settings=settings, lm_head=lm_head)
        step = batch
        if tr.needs_recompute:
            step = UpdateBatch(**{**batch.__dict__, "recomputed_logp": recompute_logprobs(batch, forward, 2)})
        metrics = minibatch_step(step, torch.arange(4), tr, forward, lambda loss: loss.backward(), settings)
        found[lm_head] = (metrics, {n: p.grad for n, p in copy_.named_parameters()})
    for name, grad in found["logits"][1].items():
        torch.testing.assert_close(found["fused"][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert math.isclose(found["fused"][0]["loss"], found["logits"][0]["loss"], rel_tol=1e-5)
    assert math.isclose(found["fused"][0]["entropy"], found["logits"][0]["entropy"], rel_tol=1e-5)


@pytest.mark.parametrize("preset", ["drpo", "cppo", "cppo_binary_tv", "m2po"])
def test_later_presets_train_the_same_gradients_on_both_heads(policy, preset):
    """DRPO adds a regulariser to the loss, and the masks of CPPO and M2PO read other tokens than their own: the
    head's gradient still reaches the logits only through log π_θ(a_t) of each token."""
    model, _ = policy
    small = {"m2po": {"tau_m2": 0.01}, "drpo": {"delta": 0.05}}.get(preset, {"delta": 5e-4, "delta_b": 1e-4, "k": 3})
    tr = TrustRegion.preset(preset)  # thresholds for this tiny model's probabilities (about 1/300)
    tr = tr.replace(**{name: value for name, value in small.items() if name in tr.fields_read})
    batch = model_batch(policy, k=3 if tr.uses_topk else 0)
    settings = UpdateSettings(minibatch_size=4, micro_batch_size=2, aggregation="token-mean", temperature=0.8)
    found = {}
    for lm_head in ("logits", "fused"):
        copy_ = copy.deepcopy(model)
        forward = causal_lm_forward(copy_, settings=settings, lm_head=lm_head)
        metrics = minibatch_step(batch, torch.arange(4), tr, forward, lambda loss: loss.backward(), settings)
        found[lm_head] = (metrics, {n: p.grad for n, p in copy_.named_parameters()})
    for name, grad in found["logits"][1].items():
        torch.testing.assert_close(found["fused"][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert math.isclose(found["fused"][0]["loss"], found["logits"][0]["loss"], rel_tol=1e-5)
    if tr.couples_tokens and not tr.uses_topk:  # (the batch's top-K μ is the model's own: its top-K TV is 0)
        assert found["fused"][0]["mask/fraction"] > 0, "the case exercises the mask"


def test_a_head_the_fused_path_cannot_reproduce_takes_the_logits_path(policy):
    model = copy.deepcopy(policy[0])
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(FusedHeadUnsupported, match="final_logit_softcapping"):
        head_of(model)
    with pytest.warns(UserWarning, match="logits path"):
        forward = causal_lm_forward(model)
    batch = model_batch(policy)
    expected = causal_lm_forward(model, lm_head="logits")(batch, False).logp
    torch.testing.assert_close(forward(batch, False).logp, expected)


def test_zero3_partitioned_head_is_refused(policy, monkeypatch):
    model = copy.deepcopy(policy[0])
    model.get_output_embeddings().weight.ds_id = 0  # what DeepSpeed ZeRO-3 sets on the parameters it partitions
    with pytest.raises(FusedHeadUnsupported, match="ZeRO-3"):
        head_of(model)


def test_unknown_lm_head_is_refused(policy):
    with pytest.raises(ValueError, match="lm_head"):
        causal_lm_forward(policy[0], lm_head="dense")


def test_default_chunk_holds_about_128_mib_of_logits():
    assert fused_head.rows_per_chunk(151_936) == 220
    assert fused_head.vocab_rows_per_chunk(16_384, 151_936, 4096) == 2040  # 220 rows' worth of logits
    assert fused_head.vocab_rows_per_chunk(10, 151_936, 4096) == 8192  # 128 Mi weights, not the whole head
    assert fused_head.rows_per_chunk(512) == 65_536
    with pytest.raises(ValueError):
        fused_head.rows_per_chunk(512, 0)


@pytest.mark.parametrize("lm_head", ["fused", "logits"])
def test_the_head_runs_on_response_tokens_only_and_prompts_read_as_mu(policy, lm_head, monkeypatch):
    """The softmax runs on the response rows alone (here 4 × 8 of 4 × 13); elsewhere π reads μ's values (ratio 1)
    and entropy 0; on the response tokens the values equal a full-sequence log-softmax."""
    model, _ = policy
    batch = model_batch(policy, k=3)
    seen = []
    for name in ("fused_head_logprobs", "logits_logprobs"):
        original = getattr(learner_forward_module, name)
        monkeypatch.setattr(learner_forward_module, name,
                            lambda rows, *a, _f=original, **k: seen.append(rows.shape[0]) or _f(rows, *a, **k))
    settings = UpdateSettings(aggregation="token-mean", temperature=0.8)
    out = causal_lm_forward(model, settings=settings, lm_head=lm_head)(batch, True)
    assert seen == [int(batch.response_mask.sum())] == [32]
    prompt = ~batch.response_mask
    torch.testing.assert_close(out.logp[prompt], batch.behavior_logp[prompt])
    torch.testing.assert_close(out.topk_logp[prompt], batch.topk_behavior_logp[prompt])
    assert (out.entropy[prompt] == 0).all()
    with torch.no_grad():
        full = (model(input_ids=batch.input_ids).logits[:, :-1] / 0.8).log_softmax(-1)
    expected = full.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out.logp[batch.response_mask].detach(), expected[batch.response_mask], rtol=1e-5,
                               atol=1e-5)
