"""A :class:`~dppo_oat.rollout.generation.Generator` on Hugging Face ``generate``.

Hugging Face hands back the *processed* scores (after temperature, top-k and top-p), the very logits it samples
from, so ``log_softmax`` of them is μ exactly: this generator supports any temperature, top-k and top-p honestly
(tokens cut by top-k or top-p have μ = 0, log-prob ``-inf``). Log-probs and the top-K set are computed for the whole
batch in one vectorized pass after ``generate`` returns. Untruncated sampling at a temperature > 0 (every training
rollout) takes the generator's own sampling loop, :mod:`dppo_oat.rollout.decode`, instead, which gives the same μ
with less per-token overhead, on any model that :func:`~dppo_oat.rollout.direct_forward.runs_direct` accepts.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from dppo_oat.learner.autocast import autocast, torch_dtype, use_shape_agnostic_attention
from dppo_oat.rollout.cuda_graphs import GraphCache, Sampling, decode_step, run_decode
from dppo_oat.rollout.decode import Prefilled, prefill, prefill_after_past, shared_prefix_length
from dppo_oat.rollout.direct_forward import KVBuffer, runs_direct
from dppo_oat.rollout.generation import Completion
from dppo_oat.rollout.prefix_cache import (
    CachedRows,
    PrefixCache,
    WeightsVersion,
    concat_rows,
    gather_past,
    length_buckets,
    pack_rows,
    weights_version,
)
from dppo_oat.settings.spec import SamplingSettings
from dppo_oat.update_batch import TOPK_PAD_ID

NEUTRAL_PROCESSING = dict(
    typical_p=1.0,
    repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    epsilon_cutoff=0.0,
    eta_cutoff=0.0,
    min_length=0,
)
"""Generation fields pinned so that a checkpoint's own defaults never reshape the distribution (top-k, pinned too,
comes from the sampling settings)."""


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of shape ``[B, L]`` on ``device``, prompts right-aligned behind ``pad_id``
    (laid out on the host, then one copy each)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    input_ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = prompt
        attention_mask[row, width - len(prompt) :] = 1
    return torch.from_numpy(input_ids).to(device), torch.from_numpy(attention_mask).to(device)


def generate_kwargs(settings: SamplingSettings, eos_ids: Sequence[int], pad_id: int) -> dict:
    """Keyword arguments of ``model.generate`` for one sampling call that returns the processed scores."""
    sampling = settings.temperature > 0  # temperature 0: greedy (evaluation only)
    return dict(
        NEUTRAL_PROCESSING,
        do_sample=sampling,
        temperature=settings.temperature if sampling else None,
        top_p=settings.top_p,
        top_k=max(settings.top_k, 0),  # HF: 0 = no top-k cut
        max_new_tokens=settings.max_new_tokens,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
        return_dict_in_generate=True,
        output_scores=True,
        use_cache=True,
    )


def completion_lengths(new_ids: torch.Tensor, eos_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``new_ids [B, T]``: length up to and including the first EOS (else T), and whether EOS came."""
    is_eos = torch.isin(new_ids, eos_ids)
    stopped = is_eos.any(dim=1)
    first_eos = is_eos.int().argmax(dim=1)
    lengths = torch.where(stopped, first_eos + 1, torch.full_like(first_eos, new_ids.shape[1]))
    return lengths, stopped


def sampled_logprobs(logprobs: torch.Tensor, new_ids: torch.Tensor) -> torch.Tensor:
    """``log μ(a_t)`` for every position: ``logprobs [B, T, V]`` gathered at ``new_ids [B, T]``."""
    return logprobs.gather(-1, new_ids.unsqueeze(-1)).squeeze(-1)


def topk_with_action(
    logprobs: torch.Tensor, new_ids: torch.Tensor, action_logprobs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's ``TopK(μ, K) ∪ {a_t}`` as ``[B, T, K+1]`` ids and log-probs (a_t last only if outside TopK)."""
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)
    inside = (top_ids == new_ids.unsqueeze(-1)).any(dim=-1)
    extra_ids = torch.where(inside, torch.full_like(new_ids, TOPK_PAD_ID), new_ids)
    extra_logprobs = torch.where(inside, torch.full_like(action_logprobs, float("-inf")), action_logprobs)
    ids = torch.cat([top_ids, extra_ids.unsqueeze(-1)], dim=-1)
    return ids, torch.cat([top_logprobs, extra_logprobs.unsqueeze(-1)], dim=-1)


def processed_logprobs(scores: Sequence[torch.Tensor]) -> torch.Tensor:
    """``log_softmax`` in fp32 of the per-step processed scores (``T`` tensors ``[B, V]``) as ``[B, T, V]``."""
    return torch.log_softmax(torch.stack(scores, dim=1).float(), dim=-1)


def build_completions(
    tokenizer, new_ids: np.ndarray, logprobs: np.ndarray, lengths: np.ndarray, stopped: np.ndarray,
    topk: tuple[np.ndarray, np.ndarray] | None,
) -> list[Completion]:
    """Cut every row at its length and wrap it as a :class:`Completion`.

    As in vLLM, the text leaves out the stop token and special tokens; ``token_ids`` keep the stop token.
    """
    token_lists = [new_ids[row, :n].tolist() for row, n in enumerate(lengths)]
    text_tokens = [tokens[:-1] if stopped[row] else tokens for row, tokens in enumerate(token_lists)]
    texts = tokenizer.batch_decode(text_tokens, skip_special_tokens=True)
    completions = []
    for row, (tokens, text) in enumerate(zip(token_lists, texts, strict=True)):
        n = len(tokens)
        completions.append(
            Completion(
                token_ids=tokens,
                logprobs=logprobs[row, :n].tolist(),
                text=text,
                finish_reason="stop" if stopped[row] else "length",
                topk_ids=None if topk is None else topk[0][row, :n],
                topk_logprobs=None if topk is None else topk[1][row, :n],
            )
        )
    return completions


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run the body with torch's RNG seeded by ``seed`` (no-op for None), leaving the global RNG state untouched."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def tied_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys that may be absent because they alias another parameter (tied embeddings): the LM head's
    weight when it is the embedding's own tensor. A rollout copy whose LM head holds a matrix of its own (the decode
    graphs' bf16 copy, :func:`~dppo_oat.rollout.rollout_copy.autocast_weights_copy`) needs it in every update, or its
    head would keep the old weights."""
    config = getattr(model, "config", None)
    tied = getattr(config, "tie_word_embeddings", False) if config is not None else False
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    shared = head is not None and embedding is not None and head.weight is embedding.weight
    return {"lm_head.weight"} if tied and shared else set()


def uses_sampling_loop(settings: SamplingSettings) -> bool:
    """Whether :func:`~dppo_oat.rollout.decode.sample_with_cache` samples these settings (untruncated sampling at a
    temperature > 0, i.e. every training rollout); greedy decoding and top-p / top-k go through ``generate``."""
    return settings.temperature > 0 and not settings.truncates


def own_draws(seed: int | None, device: torch.device) -> torch.Generator:
    """The sampling loop's own generator on ``device``, seeded by ``seed``, else by one number drawn from torch's CPU
    RNG (so an unseeded call still follows ``torch.manual_seed``). The device's default generator is left alone:
    a decode gives back the uniforms of the steps it did not run by rewinding its generator, which on the shared one
    would take back what another thread drew meanwhile, and a CUDA graph capture that fails can leave the default
    CUDA generator unusable."""
    if seed is None:
        seed = int(torch.randint(2**62, (1,)))
    return torch.Generator(device).manual_seed(seed)


class HFGenerator:
    """Samples in batches of ``batch_size`` prompts, left-padded, with the KV cache: its own sampling loop, that of
    :mod:`~dppo_oat.rollout.decode` for the settings of :func:`uses_sampling_loop` on a model that
    :func:`~dppo_oat.rollout.direct_forward.runs_direct`, else ``model.generate``.

    μ is the processed (temperature / top-p) distribution, so any :class:`SamplingSettings` is honest. ``max_topk``
    is the vocabulary size. The EOS token, when sampled, is part of ``token_ids`` with its log-prob. With
    ``reuse_prefixes``, the sampling loop keeps the keys and values of the last call's
    rows and prefills a prompt from the end of its longest cached prefix (:mod:`dppo_oat.rollout.prefix_cache`).
    ``compute_dtype`` (float32, bfloat16, float16) runs every forward pass under that autocast
    (:mod:`dppo_oat.learner.autocast`), as the learner's; μ is fp32 log-probs of those logits. ``cuda_graphs``:
    on a CUDA device, the sampling loop decodes with CUDA graphs of its decode step, captured once per batch and buffer
    bucket and kept across calls (``graphs``, a :class:`~dppo_oat.rollout.cuda_graphs.GraphCache`;
    ``graph_captures`` counts its captures); the graphs sample too (``graph_sampling``, the default: one replay a
    step) or run the forward alone. ``decode_steps`` counts the sampling loop's calls by the step that decoded them
    (``EagerStep``, ``GraphedStep``, ``SampledStep``), so that a capture that failed, and decoded eagerly, shows.
    """

    def __init__(self, model, tokenizer, *, batch_size: int = 64, eos_token_ids: Sequence[int] | None = None,
                 reuse_prefixes: bool = True, compute_dtype: str = "float32", cuda_graphs: bool = False,
                 graph_sampling: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        torch_dtype(compute_dtype)  # a known name
        self.compute_dtype = compute_dtype
        self.cuda_graphs = cuda_graphs
        self.graphs = GraphCache(sample_in_graph=graph_sampling) if cuda_graphs else None
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.max_topk = int(model.get_output_embeddings().weight.shape[0])
        use_shape_agnostic_attention(self.device)  # each decode step attends over a new length
        with self.autocast():  # as it samples: linear weights held in the compute dtype run only under autocast
            self.runs_direct = runs_direct(self.model)
        self.prefix_cache = PrefixCache() if reuse_prefixes and self.runs_direct else None
        self._version: WeightsVersion | None = None
        self._draws: torch.Generator | None = None
        self._cached_parts: list[CachedRows] = []
        self.decode_steps: collections.Counter[str] = collections.Counter()

    @property
    def graph_captures(self) -> int:
        """The decode graphs captured so far (0 without ``cuda_graphs``)."""
        return self.graphs.captures if self.graphs is not None else 0

    @property
    def device(self) -> torch.device:
        """Where the model (and so every input tensor) lives."""
        return next(self.model.parameters()).device

    def autocast(self):
        """The context every forward pass of this sampler runs in
        (:func:`~dppo_oat.learner.autocast.autocast`)."""
        return autocast(self.device, self.compute_dtype)

    def generate(self, prompts: Sequence[Sequence[int]], settings: SamplingSettings) -> list[Completion]:
        """One completion per prompt, in order; seeded by ``settings.seed`` when set (else the sampling loop's
        generator by one draw of torch's RNG: :func:`own_draws`)."""
        if settings.top_k_logprobs > self.max_topk:
            raise ValueError(f"top_k_logprobs={settings.top_k_logprobs} exceeds the vocabulary ({self.max_topk})")
        completions: list[Completion] = []
        self._cached_parts = []
        self._version = weights_version(self.model) if self.prefix_cache is not None else None
        loop = self.runs_direct and uses_sampling_loop(settings)
        self._draws = own_draws(settings.seed, self.device) if loop else None
        eos = torch.as_tensor(self.eos_token_ids, device=self.device)
        with contextlib.nullcontext() if loop else seeded(settings.seed, self.device), torch.inference_mode(), \
                self.autocast():
            sample = self._sample_loop if loop else self._sample_generate
            for start in range(0, len(prompts), self.batch_size):
                completions.extend(self._generate_batch(prompts[start : start + self.batch_size], settings, sample,
                                                        eos))
        if self.prefix_cache is not None and self._cached_parts:
            self.prefix_cache.store(concat_rows(self._cached_parts), self._version)
            self._cached_parts = []
        return completions

    def _generate_batch(self, prompts: Sequence[Sequence[int]], settings: SamplingSettings, sample,
                        eos: torch.Tensor) -> list[Completion]:
        """Sample one batch with ``sample`` (:meth:`_sample_loop` or :meth:`_sample_generate`) and turn its output
        into completions in one vectorized pass (``eos``: the stop ids, on the model's device)."""
        new_ids, action_logprobs, logprobs = sample(prompts, settings, eos)
        lengths, stopped = completion_lengths(new_ids, eos)
        topk = None
        if settings.top_k_logprobs > 0:
            ids, lps = topk_with_action(logprobs, new_ids, action_logprobs, settings.top_k_logprobs)
            topk = (ids.cpu().numpy(), lps.cpu().numpy())
        return build_completions(
            self.tokenizer, new_ids.cpu().numpy(), action_logprobs.cpu().numpy(),
            lengths.cpu().numpy(), stopped.cpu().numpy(), topk,
        )

    def _sample_loop(self, prompts, settings: SamplingSettings, eos: torch.Tensor):
        """``(new_ids, log μ(a_t), log μ or None)`` from the sampling loop, after the prefill of :meth:`_prefill`
        (whose rows may be in another order: every row draws its prompt's uniforms, and the results come back in
        prompt order); the batch's keys and values are then cached for the next call."""
        order, state = self._prefill(prompts, settings.max_new_tokens)
        draw_order = torch.as_tensor(order, device=self.device)
        sampling = Sampling(float(settings.temperature), tuple(self.eos_token_ids), self.pad_token_id)
        step = decode_step(self.model, state.cache, settings.max_new_tokens, self.graphs, sampling)
        self.decode_steps[type(step).__name__] += 1
        decoded = run_decode(self.model, state, step, sampling, max_new_tokens=settings.max_new_tokens, stop_ids=eos,
                             keep_logprobs=settings.top_k_logprobs > 0, draw_order=draw_order,
                             generator=self._draws)
        if self.prefix_cache is not None:
            self._cached_parts.append(self._rows_to_cache([prompts[i] for i in order], state, decoded, eos))
        prompt_order = torch.argsort(draw_order)
        logprobs = None if decoded.logprobs is None else decoded.logprobs[prompt_order]
        return decoded.new_ids[prompt_order], decoded.action_logprobs[prompt_order], logprobs

    def _prefill(self, prompts, room: int) -> tuple[list[int], Prefilled]:
        """``(order, state)``: the batch prefilled with its rows in ``order`` (prompt indices), ``room`` columns
        left for sampling. Prompts with a cached prefix start after it, in a few length buckets that fill
        consecutive rows of one buffer; otherwise the batch's shared prefix (a template's header) is prefilled once
        for every row."""
        found = self.prefix_cache.lookup_all(prompts, self._version) if self.prefix_cache is not None else []
        if not any(length for _, length in found):
            shared = shared_prefix_length(prompts)
            input_ids, attention_mask = left_pad([prompt[shared:] for prompt in prompts], self.pad_token_id,
                                                 self.device)
            prefix_ids = None
            if shared:
                prefix_ids = torch.as_tensor(list(prompts[0][:shared]), dtype=torch.long, device=self.device)
            return list(range(len(prompts))), prefill(self.model, input_ids, attention_mask, prefix_ids, room)
        return self._prefill_after_cached(prompts, found, room)

    def _prefill_after_cached(self, prompts, found: list[tuple[int, int]], room: int) -> tuple[list[int], Prefilled]:
        """Each bucket gathers its rows' cached pasts into its rows of the buffer, right-aligned with the others,
        and prefills the rest of its prompts there. The bookkeeping (which cached row, how many tokens) stays on the
        host, as the cache's own does; the keys and values never leave the device."""
        sources = torch.as_tensor([row for row, _ in found], device="cpu")
        reuse = torch.as_tensor([length for _, length in found], device="cpu")
        suffixes = [prompt[length:] for prompt, (_, length) in zip(prompts, found, strict=True)]
        buckets = length_buckets([len(suffix) for suffix in suffixes])
        spans = [int(reuse[bucket].max()) + max(len(suffixes[i]) for i in bucket) for bucket in buckets]
        width = max(spans)
        cached = self.prefix_cache.rows
        buffer = KVBuffer.allocate(len(prompts), width + room, cached.keys, cached.values)
        parts, start = [], 0
        for bucket, span in zip(buckets, spans, strict=True):
            index = torch.as_tensor(bucket, device="cpu")
            part = buffer.rows(start, start + len(bucket), width - span)
            part.fill(*gather_past(cached, sources[index], reuse[index]))
            input_ids, attention_mask = left_pad([suffixes[i] for i in bucket], self.pad_token_id, self.device)
            parts.append(prefill_after_past(self.model, part, input_ids, attention_mask, reuse[index].to(self.device)))
            start += len(bucket)
        buffer.width = width
        return [row for bucket in buckets for row in bucket], Prefilled(
            torch.cat([part.logits for part in parts]), buffer, buffer.valid[:, :width],
            torch.cat([part.next_position for part in parts]))

    @staticmethod
    def _rows_to_cache(prompts, state: Prefilled, decoded, eos: torch.Tensor) -> CachedRows:
        """Each row's prompt and fed response tokens, with their keys and values, packed for the prefix cache."""
        lengths, _ = completion_lengths(decoded.new_ids, eos)
        fed = torch.clamp(lengths, max=decoded.fed)
        steps = torch.arange(decoded.fed, device=lengths.device)
        valid = torch.cat([state.attention_mask.bool(), steps[None, :] < fed[:, None]], dim=1)
        new_ids, fed_counts = decoded.new_ids.tolist(), fed.tolist()  # one copy each, not one per row
        tokens = [tuple(prompt) + tuple(new_ids[row][: fed_counts[row]]) for row, prompt in enumerate(prompts)]
        return pack_rows(decoded.cache, valid, tokens)

    def _sample_generate(self, prompts, settings: SamplingSettings, eos: torch.Tensor):
        """``(new_ids, log μ(a_t), log μ)`` from ``model.generate`` and its processed scores."""
        input_ids, attention_mask = left_pad(prompts, self.pad_token_id, self.device)
        kwargs = generate_kwargs(settings, self.eos_token_ids, self.pad_token_id)
        output = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        new_ids = output.sequences[:, input_ids.shape[1] :]
        logprobs = processed_logprobs(output.scores)
        return new_ids, sampled_logprobs(logprobs, new_ids), logprobs

    def forget_prefixes(self) -> None:
        """Drop the cached rows: the next call prefills every prompt whole (the rollout collector calls this first,
        so that a rollout never depends on calls made before it, and a resumed run draws the same tokens)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def update_weights(self, state_dict: dict) -> None:
        """Copy new weights into the model in place (cast to its parameters' dtypes; the decode graphs, which read
        the weights where they are, stay valid); only tied aliases (e.g. ``lm_head.weight``) may be missing."""
        self.forget_prefixes()
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        really_missing = set(missing) - tied_keys(self.model)
        if really_missing or unexpected:
            raise KeyError(f"state_dict mismatch: missing {sorted(really_missing)}, unexpected {sorted(unexpected)}")
