"""The oat rehearsal's test-only probes and faults (``test_oat_rehearsal.py``), installed in every process of a
program launched by ``python -m dppo_oat.train --engine oat --on_cpu``, by ``node_prelude/sitecustomize.py`` right
after ``dppo_oat.engines.oat.on_cpu`` is imported. What replaces oat's CUDA calls on a CPU is the product's own
``--on_cpu`` (``dppo_oat/engines/oat/on_cpu.py``); nothing here changes what the program computes.

Probes (observability, no behaviour change), as JSON lines under ``probe_dir``:

- ``learner.jsonl``: every learning round (``learn``'s train info and the actor step's statistics), weight sync and
  evaluation of the learner;
- ``actor.jsonl``: the actor's vLLM log-probs of the fixed token sequence ``probe_ids`` right after the engine is
  built and after every complete weight load (the broadcast's last parameter, ``empty_cache=True``), the vLLM
  ``generate`` calls of every actor step, and the first sample of each step (``sampled``: its tokens, μ and weight
  version).

Faults and test-only settings:

- ``kill_in_checkpoint`` r: the learner kills itself with SIGKILL halfway through writing round r's checkpoint
  (DeepSpeed's files written, the learner's own state not), for the resume tests;
- ``fp16_on_cpu`` (the ``--fp16`` rehearsal): DeepSpeed's ``is_fp16_supported`` → True. DeepSpeed refuses fp16 on a
  CPU whose oneDNN has no fp16 kernels, while torch computes in float16 on any CPU, so its real ZeRO fp16 optimizer
  and loss scaler run.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path


def install(on_cpu, *, probe_dir: str, probe_ids: Sequence[int], fp16_on_cpu: bool = False,
            kill_in_checkpoint: int | None = None) -> None:
    """Probe ``on_cpu``'s learner and actor classes in this process, and add the requested faults."""
    probe_learner(on_cpu.CPULearner, Path(probe_dir) / "learner.jsonl")
    probe_actor(on_cpu.CPUActor, Path(probe_dir) / "actor.jsonl", list(probe_ids))
    if kill_in_checkpoint is not None:
        kill_halfway_through_checkpoint(kill_in_checkpoint)
    if fp16_on_cpu:
        from deepspeed.accelerator import get_accelerator

        type(get_accelerator()).is_fp16_supported = lambda self: True


# ---------------------------------------------------------------------------------------------------------- learner


def probe_learner(learner_cls: type, path: Path) -> None:
    """Record each ``learn`` (a learning round), ``sync_params_to_actors`` and ``evaluate`` of ``learner_cls``."""

    def after_learn(self, result, learning_round):
        append_record(path, {"event": "learn", "round": learning_round, "info": finite_floats(result),
                             "actor_info": finite_floats(self.actor_info), "policy_sgd_step": self.policy_sgd_step,
                             "steps": self.steps})

    def after_sync(self, result):
        append_record(path, {"event": "sync", "pi_beta_version": self.pi_beta_version, "steps": self.steps})

    def after_evaluate(self, result, dataloader, steps):
        append_record(path, {"event": "evaluate", "steps": steps, "info": finite_floats(result),
                             "save_path": self.save_path})

    wrap_method(learner_cls, "learn", after_learn)
    wrap_method(learner_cls, "sync_params_to_actors", after_sync)
    wrap_method(learner_cls, "evaluate", after_evaluate)


def kill_halfway_through_checkpoint(learning_round: int) -> None:
    """SIGKILL this learner once DeepSpeed has written round ``learning_round``'s checkpoint files and before the
    learner's own state is (a kill mid-save: the run must resume from the previous checkpoint)."""
    import signal

    import dppo_oat.engines.oat.learner as learner_module

    write = learner_module.write_learner_state

    def write_then_die(folder, rank, state):
        if state.learning_rounds == learning_round:
            os.kill(os.getpid(), signal.SIGKILL)
        write(folder, rank, state)

    learner_module.write_learner_state = write_then_die


def finite_floats(info: dict) -> dict:
    return {key: float(value) for key, value in info.items()
            if isinstance(value, (int, float)) and math.isfinite(float(value))}


# ------------------------------------------------------------------------------------------------------------ actor


def probe_actor(actor_cls: type, path: Path, probe_ids: list[int]) -> None:
    """Record vLLM's log-probs of ``probe_ids`` after ``init`` and after each complete weight load, and the first
    sample each actor step collects."""

    def after_init(self, result, *args, **kwargs):
        append_record(path, {"event": "init", "logprobs": vllm_prompt_logprobs(self.llm, probe_ids)})

    def after_update_weight(self, result, name, dtype, *args, empty_cache=False, **kwargs):
        if empty_cache:
            append_record(path, {"event": "loaded", "last": name, "dtype": str(dtype),
                                 "logprobs": vllm_prompt_logprobs(self.llm, probe_ids)})

    def after_collect(self, transitions, wanted, weight_version=0, *args, **kwargs):
        first = transitions[0]
        append_record(path, {"event": "sampled", "weight_version": int(weight_version),
                             "prompt_ids": list(first.prompt_ids), "response_ids": list(first.response_ids),
                             "logprobs": [float(x) for x in first.response_logprobs]})

    wrap_method(actor_cls, "init", after_init)
    wrap_method(actor_cls, "update_weight", after_update_weight)
    wrap_method(actor_cls, "collect_transitions", after_collect)
    count_generate_calls(actor_cls, path)


def count_generate_calls(actor_cls: type, path: Path) -> None:
    """Record how many times each actor step called vLLM's ``generate`` (a turn of the episodes still running), and
    the weight version it played with (``play_step``: oat's ``step`` goes through it too)."""
    original = actor_cls.play_step

    @functools.wraps(original)
    def play_step(self, *args, **kwargs):
        calls, generate = [0], self.llm.generate

        def counted(*call_args, **call_kwargs):
            calls[0] += 1
            return generate(*call_args, **call_kwargs)

        self.llm.generate = counted
        try:
            return original(self, *args, **kwargs)
        finally:
            del self.llm.generate  # the engine's own method again
            append_record(path, {"event": "step", "generate_calls": calls[0], "weight_version": self.weight_version})

    actor_cls.play_step = play_step


def vllm_prompt_logprobs(llm, token_ids: list[int]) -> list[float]:
    """log μ(x_t | x_<t) for t >= 1 of a fixed sequence, from vLLM's prompt log-probs (teacher forcing)."""
    import vllm

    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    output = llm.generate([{"prompt_token_ids": token_ids}], params, use_tqdm=False)[0]
    return [entry[token].logprob for entry, token in zip(output.prompt_logprobs[1:], token_ids[1:], strict=True)]


# ----------------------------------------------------------------------------------------------------------- shared


def wrap_method(cls: type, name: str, after: Callable) -> None:
    """``cls.name`` (wherever it is defined in the MRO) followed by ``after(self, result, *args, **kwargs)``."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        after(self, result, *args, **kwargs)
        return result

    setattr(cls, name, wrapped)


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps({"pid": os.getpid(), **record}) + "\n")


def read_records(path: Path, event: str) -> list[dict]:
    """The records of one kind a probe wrote (for the test process)."""
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [record for record in records if record["event"] == event]
