"""The local engine's starting policy: a cached tiny policy warm-started on oracle demonstrations, or any HF model.

The tiny policy is a byte-level BPE tokenizer trained on the env's own text and a small Qwen3,
trained by supervised learning on oracle moves until it solves *some but not all* held-out puzzles — the paper's
sanity-test regime (sec:stability), where a stable RL method should climb. It is built once and cached on disk; the
default run's comes with the package (``dppo_oat/policies``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from rich.progress import Progress

from dppo_oat.engines.local.config import run_spec
from dppo_oat.engines.local.seeds import DEMO_SEED, EVAL_SAMPLING_SEED, VALIDATION_SEED
from dppo_oat.learner.forward import causal_lm_forward
from dppo_oat.models.tiny import build_shaped_policy, load_policy, save_policy, weights_dtype
from dppo_oat.rollout.episodes import EpisodeCollector, adds_bos, prompt_token_ids
from dppo_oat.rollout.hf_generator import HFGenerator
from dppo_oat.rollout.templates import render_prompt
from dppo_oat.run.safe_io import honour_umask
from dppo_oat.settings.spec import RunSpec
from dppo_oat.update_batch import TurnSample, build_update_batch

CACHE_FORMAT = 3
"""Bumped whenever the warm start changes, so that a stale cached policy is never reused."""
SHIPPED_POLICIES = Path(__file__).resolve().parents[2] / "policies"
"""Warm-started policies that come with the package (the default run's: no warm start on a fresh machine), under
the same names as the cache's; see its README for how they are built."""


@dataclass
class WarmStartReport:
    steps: int
    seconds: float
    success: float
    checks: list
    target: float = 0.0
    """The validation success the warm start aimed at (``--warm-start.target-success``)."""

    @property
    def reached_target(self) -> bool:
        return self.success >= self.target


def policy_cache_key(env_id: str, template: str, warm_start, seed: int) -> str:
    """A stable, flat folder name for one warm-started policy: its shape, the env id's flat form and a hash of
    everything that changes the policy, the env's data and user code included (:func:`envs.fingerprint.env_content`).
    The tiny shape leaves its name out of the hash, which keeps its keys the names of the shipped policies; every
    other shape hashes it (and prefixes it), so no two shapes share a key."""
    from envs.fingerprint import env_content, flat_name

    settings = {name: value for name, value in asdict(warm_start).items() if name != "seed"}  # resolved: ``seed``
    if settings.get("shape") == "tiny":
        del settings["shape"]
    payload = {**settings, "env": env_id, "template": template, "seed": seed, "format": CACHE_FORMAT}
    content = env_content(env_id)
    if content:  # the package's own envs have none: their keys are the shipped policies' names
        payload["content"] = content
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
    return f"{warm_start.shape}-{flat_name(env_id)}-{digest}"


def demonstration_samples(demos, tokenizer, template: str) -> list[TurnSample]:
    """Oracle (observation, action) turns as learner samples: prompt = rendered observation, response = action+EOS."""
    samples, with_bos = [], adds_bos(tokenizer)
    for episode_id, episode in enumerate(demos):
        for turn, (observation, action) in enumerate(episode):
            prompt = prompt_token_ids(tokenizer, render_prompt(template, observation, tokenizer), with_bos=with_bos)
            response = tokenizer(action, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            samples.append(TurnSample(prompt, response, [0.0] * len(response), 0.0, False, False, turn, "demo",
                                      episode_id, str(episode_id), "stop"))
    return samples


def supervised_step(model, optimizer, samples, pad_token_id: int) -> float:
    """One step of maximum likelihood on the response tokens of ``samples`` (on the model's device, in fp32)."""
    batch = build_update_batch(samples, [0.0] * len(samples), pad_token_id).to(next(model.parameters()).device)
    forward = causal_lm_forward(model, with_entropy=False, lm_head="logits")  # as the shipped policies were built
    logp = forward(batch, False).logp
    loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.item())


def warm_start(model, tokenizer, samples, settings, evaluate: Callable[[object], float], seed: int,
               console=None) -> WarmStartReport:
    """Supervised training until the first check whose validation success (puzzles apart from the held-out ones)
    is ≥ ``settings.target_success``."""
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    start, checks, success, step = time.perf_counter(), [], 0.0, 0
    with Progress(transient=True) as progress:
        task = progress.add_task("warm start (supervised, oracle moves)", total=settings.max_steps)
        for step in range(1, settings.max_steps + 1):
            index = rng.choice(len(samples), size=min(settings.batch_size, len(samples)), replace=False)
            model.train()
            loss = supervised_step(model, optimizer, [samples[i] for i in index], tokenizer.pad_token_id)
            progress.update(task, advance=1, description=f"warm start: loss {loss:.3f}, success {success:.2f}")
            if step % settings.check_every == 0:
                success = evaluate(model)
                checks.append({"step": step, "loss": loss, "success": success})
                if console is not None:
                    console.print(f"  warm start step {step}: loss {loss:.3f}, validation success {success:.2f}")
                if success >= settings.target_success:
                    break
    return WarmStartReport(step, time.perf_counter() - start, success, checks, settings.target_success)


def validation_success(config, model, tokenizer, spec: RunSpec | None = None) -> float:
    """Success of ``model`` on the warm start's validation puzzles of ``config.env_ids[0]`` (sampling as in RL, as
    the run's ``spec`` evaluates: built from ``config`` when not given)."""
    spec = spec or run_spec(config)
    episodes = config.warm_start.check_episodes
    collector = EpisodeCollector(config.env_ids[:1], episodes, 1, tokenizer, spec.eval_rollout)
    generator = HFGenerator(model.eval(), tokenizer, batch_size=64)
    sampling = replace(spec.eval_sampling, seed=EVAL_SAMPLING_SEED, top_k_logprobs=0)
    rollout = collector.collect(generator, sampling, [VALIDATION_SEED + i for i in range(episodes)])
    collector.close()
    return rollout.stats()["success"]


def find_tiny_policy(config) -> tuple[Path, str] | None:
    """The folder of ``config``'s warm-started tiny policy and where it was found ("cached", or "shipped with the
    package"), or None when it has not been built."""
    key = policy_cache_key(config.env_ids[0], config.template, config.warm_start, config.warm_start_seed)
    for path, where in ((config.resolved_cache_dir() / "policies" / key, "cached"),
                        (SHIPPED_POLICIES / key, "shipped with the package")):
        if (path / "warm_start.json").exists():
            return path, where
    return None


def load_or_build_tiny_policy(config, console, spec: RunSpec | None = None) -> tuple:
    """The cached warm-started tiny policy for ``config.env_ids[0]``, building it on first use (its validation
    plays as the run's ``spec`` evaluates). A warm start that ended below its target is cached as such and said so,
    on every use."""
    ws = config.warm_start
    key = policy_cache_key(config.env_ids[0], config.template, ws, config.warm_start_seed)
    found = find_tiny_policy(config)
    if found is not None:
        path, where = found
        console.print(f"{ws.shape} policy: {where} at {path}")
        _say_if_below_target(read_report(path, ws.target_success), ws.shape, console)
        return load_policy(path)
    model, tokenizer, report = build_tiny_policy_for(config, key, console, spec)
    _save_atomically(model.eval(), tokenizer, report, config.resolved_cache_dir() / "policies" / key)
    _say_if_below_target(report, ws.shape, console)
    return model, tokenizer


def build_tiny_policy_for(config, key: str, console, spec: RunSpec | None = None) -> tuple:
    """Tokenizer, model of ``--warm-start.shape`` and supervised warm start on oracle moves of ``config.env_ids[0]``,
    on ``config.device``."""
    from envs.oracles import demonstrations

    env_id, template, seed, ws = config.env_ids[0], config.template, config.warm_start_seed, config.warm_start
    console.print(f"{ws.shape} policy: building {key} (tokenizer, model, supervised warm start on oracle moves) "
                  "...")
    demos = demonstrations(env_id, ws.demo_episodes, seed=DEMO_SEED + seed, mistake_rate=ws.mistake_rate)
    texts = [render_prompt(template, obs) + " " + action for episode in demos for obs, action in episode]
    model, tokenizer = build_shaped_policy(texts, seed, ws.shape, vocab_size=ws.vocab_size,
                                           hidden_size=ws.hidden_size, num_layers=ws.num_layers)
    model.to(config.device)  # the warm start runs where the run will, in fp32 (a model of any shape)
    samples = demonstration_samples(demos, tokenizer, template)
    spec = spec or run_spec(config)
    report = warm_start(model, tokenizer, samples, ws, lambda m: validation_success(config, m, tokenizer, spec), seed,
                        console)
    console.print(f"{ws.shape} policy: warm start stopped after {report.steps} steps, {report.seconds:.0f} s, "
                  f"validation success {report.success:.2f}")
    return model, tokenizer, report


def read_report(directory: Path, target: float) -> WarmStartReport:
    """The warm start's record of a cached or shipped policy, whose key holds its ``target``."""
    record = json.loads((directory / "warm_start.json").read_text())
    return WarmStartReport(record["steps"], record["seconds"], record["success"], record["checks"], target)


def _say_if_below_target(report: WarmStartReport, shape: str, console) -> None:
    """One warning when the warm start of the ``shape`` policy stopped at --warm-start.max-steps short of its
    target."""
    if report.reached_target:
        return
    console.print(f"warning: the {shape} policy's warm start ended below its target (validation success "
                  f"{report.success:.2f} < --warm-start.target-success {report.target:.2f} after {report.steps} "
                  "steps): RL starts from a weaker policy than intended; raise --warm-start.max-steps (a new "
                  "policy is built), or train a model of your own with --pretrain", soft_wrap=True)


def _save_atomically(model, tokenizer, report: WarmStartReport, path: Path) -> None:
    """Write the policy into a temporary sibling directory and rename it: a kill never leaves half a cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    honour_umask(tmp, directory=True)  # a cache shared with colleagues stays readable to them
    save_policy(model, tokenizer, tmp)
    record = {**asdict(report), "reached_target": report.reached_target}
    (tmp / "warm_start.json").write_text(json.dumps(record, indent=2))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def load_pretrained(name_or_path: str):
    """Any Hugging Face causal LM and its tokenizer, in fp32; a hub id already in the local cache loads from it
    without asking the hub (no retries on a machine without network)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dppo_oat.engines.local.hub import cached_on_disk

    directory = Path(name_or_path).expanduser().exists()
    local_only = not directory and cached_on_disk(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, local_files_only=local_only,
                                                     **weights_dtype(torch.float32))
    except Exception as error:
        if directory:  # a damaged or partial model directory: nothing the hub could fix
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ValueError(f"--pretrain {name_or_path!r} does not load ({first_line})") from None
        if not local_only or not isinstance(error, OSError):
            raise
        return load_from_hub(name_or_path)  # only part of it is cached: the hub has the rest
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_from_hub(name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(name, **weights_dtype(torch.float32)), tokenizer
