"""The vLLM generator for the local engine: vLLM serves the policy's weights, synced after every update."""

from __future__ import annotations

import tempfile

from dppo_oat.models.tiny import save_policy
from dppo_oat.rollout.vllm_generator import VLLMGenerator


def make_vllm_generator(model, tokenizer, config) -> VLLMGenerator:
    """Save the current policy to a temporary directory and start vLLM on it (in this process).

    :meth:`VLLMGenerator.update_weights` later reloads all weights in one call after each learner step.
    """
    directory = tempfile.mkdtemp(prefix="dppo-vllm-policy-")
    save_policy(model, tokenizer, directory)
    return VLLMGenerator(directory, eos_token_ids=[tokenizer.eos_token_id], seed=config.seed)
