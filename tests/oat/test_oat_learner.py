"""DPPOLearner: one real oat learning step through oat's DeepSpeed strategy equals the core's update on the same batch.

The learner is built by oat's own ``_init`` (DeepSpeed engine, scheduler, tokenizer) on the tiny policy, on the CPU.
The same samples also go through the local engine's path: the core's ``build_update_batch`` and ``update_policy`` with
``causal_lm_forward`` and a plain torch optimizer. Both must end on the same weights.
"""

import copy
import dataclasses
import pickle

import pytest
import torch

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder

from oat.utils.deepspeed import DeepspeedStrategy  # noqa: E402  (after pytest.importorskip)
from oat.utils.launcher import get_free_port  # noqa: E402  (after pytest.importorskip)
from torch.utils.data import DataLoader  # noqa: E402  (after pytest.importorskip)

from dppo_oat.advantages import group_advantages  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.args import run_spec, validate_args  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.data import DPPOTransitionDataset, transition_from_sample, update_batch_from_trajectory  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.launch import parse_args  # noqa: E402  (after pytest.importorskip)
from dppo_oat.engines.oat.learner import DPPOLearner  # noqa: E402  (after pytest.importorskip)
from dppo_oat.errors import CheckpointFailed, TrainingBlewUp  # noqa: E402  (after pytest.importorskip)
from dppo_oat.learner.forward import causal_lm_forward  # noqa: E402  (after pytest.importorskip)
from dppo_oat.learner.update import update_policy  # noqa: E402  (after pytest.importorskip)
from dppo_oat.models import load_policy, toy_corpus  # noqa: E402  (after pytest.importorskip)
from dppo_oat.rollout.hf_generator import HFGenerator  # noqa: E402  (after pytest.importorskip)
from dppo_oat.settings.spec import SamplingSettings  # noqa: E402  (after pytest.importorskip)
from dppo_oat.update_batch import TurnSample, build_update_batch  # noqa: E402  (after pytest.importorskip)

OPTIMIZERS = {
    "sgd": lambda params, lr, **_: torch.optim.SGD(params, lr=lr),
    "adamw": lambda params, lr, betas, weight_decay: torch.optim.AdamW(params, lr=lr, betas=betas,
                                                                       weight_decay=weight_decay),
}
"""oat builds FusedAdam (CUDA) or DeepSpeedCPUAdam (JIT-compiled); the tests hand DeepSpeed a torch optimizer."""

CASES = [
    # preset, extra flags, ZeRO stage, optimizer, learning rate, seed of the behavior samples
    # Binary-TV at δ = 0.2 masks only in the second epoch, and only a few tokens of some batches: with the node's
    # torch 2.6 (make test-oat), seed 7 has some.
    ("dppo_binary_tv", ["--tr_delta", "0.2"], 0, "sgd", 2.0, 7),
    ("dppo_topk_tv", ["--tr_k", "5", "--tr_delta", "0.02"], 2, "adamw", 1e-3, 0),
    ("minirl_tis", [], 0, "sgd", 2.0, 0),
    ("decoupled_ppo", [], 0, "sgd", 2.0, 0),  # a mismatch preset: π_θ' recomputed by the learner, masks on π_θ'/μ
    ("ppo", ["--critic_type", "grpo"], 0, "sgd", 2.0, 0),
    # masks that read other tokens than their own
    ("m2po", [], 0, "sgd", 2.0, 0),
    ("cppo", ["--tr_k", "5", "--tr_delta", "0.02", "--tr_delta_b", "0.002"], 2, "adamw", 1e-3, 0),
]


def behavior_samples(policy, n=8, group_size=4, top_k=0, seed=0):
    """Samples of a perturbed copy of the policy (so μ ≠ π and the trust region has work), rewards 0/1 in groups."""
    model, tokenizer = policy
    behavior = copy.deepcopy(model)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for parameter in behavior.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter) * parameter.std())
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"][: 10 + i]
               for i, t in enumerate(toy_corpus(n, seed=5))]
    settings = SamplingSettings(8, top_k_logprobs=top_k, seed=seed)
    completions = HFGenerator(behavior, tokenizer).generate(prompts, settings)
    samples = [
        TurnSample(prompt_ids=p, response_ids=c.token_ids, behavior_logprobs=c.logprobs, reward=float(i % 3 == 0),
                   done=True, truncated=False, turn=0, env_id="toy", episode_id=i, group_id=str(i // group_size),
                   finish_reason=c.finish_reason, response_text=c.text, topk_ids=c.topk_ids,
                   topk_logprobs=c.topk_logprobs)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    return samples, group_advantages([s.reward for s in samples], [s.group_id for s in samples])


def learner_args(gpu_node, model_dir, save_path, preset, flags, zero_stage, lr):
    argv = [
        "--pretrain", model_dir, "--no-flash_attn", "--no-bf16", "--gpus", "2", "--zero_stage", str(zero_stage),
        "--trust_region", preset, *flags, "--learning_rate", str(lr), "--lr_scheduler", "constant",
        "--lr_warmup_ratio", "0", "--num_ppo_epochs", "2", "--train_batch_size", "4",
        "--train_batch_size_per_device", "2", "--rollout_batch_size", "8", "--rollout_batch_size_per_device", "8",
        "--pi_buffer_maxlen_per_device", "8", "--num_samples", "4", "--generate_max_length", "8",
        "--max_train", "64", "--save_path", save_path, "--seed", "7",
    ]
    with gpu_node():
        return validate_args(parse_args(argv))


def oat_learner(args, optimizer, monkeypatch):
    """A DPPOLearner set up by oat's own ``_init``: one learner process, no actors."""
    monkeypatch.setattr(
        DeepspeedStrategy, "create_optimizer",
        lambda self, model, **kwargs: OPTIMIZERS[optimizer](model.model.parameters(), **kwargs),
    )
    learner = DPPOLearner(1, 0, 0, "127.0.0.1", get_free_port(), True, args, [], None)
    learner._init(args, [])
    return learner


def oat_trajectory(learner, transitions):
    """The batch oat's ``PPOLearner.learn`` hands to ``learning_step``: the whole buffer, collated."""
    dataset = learner.dataset_builder(transitions, learner.tokenizer, learner.strategy)
    return next(iter(DataLoader(dataset, batch_size=len(dataset), shuffle=False, collate_fn=dataset.collate_fn)))


def local_update(model_dir, args, samples, advantages, tr, optimizer, pad_token_id):
    """The local engine's update: the core's loop with a plain torch model and optimizer, same hyper-parameters."""
    model, _ = load_policy(model_dir)
    model.train()
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=args.learning_rate,
                                betas=(args.adam_beta_1, args.adam_beta_2), weight_decay=args.l2)

    def step():
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        opt.step()
        opt.zero_grad()
        return {"policy_grad_norm": float(norm)}

    batch = build_update_batch(samples, advantages, pad_token_id, with_topk=tr.uses_topk)
    settings = run_spec(args, grad_acc_step=2).update
    settings = dataclasses.replace(settings, scale_micro_batches=True)  # a plain optimizer does not average
    history = update_policy(batch, tr, causal_lm_forward(model, chunk_size=args.logprob_chunk_size),
                            lambda loss: loss.backward(), step, settings,
                            generator=torch.Generator().manual_seed(args.seed))
    return model, history


@pytest.mark.parametrize("preset,flags,zero_stage,optimizer,lr,seed", CASES)
def test_learning_step_matches_the_core_update(preset, flags, zero_stage, optimizer, lr, seed, tiny_policy,
                                               tiny_policy_dir, tmp_path, oat_on_cpu, gpu_node, monkeypatch):
    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), preset, flags, zero_stage, lr)
    learner = oat_learner(args, optimizer, monkeypatch)
    tr = learner.trust_region
    samples, advantages = behavior_samples(tiny_policy, top_k=tr.k if tr.uses_topk else 0, seed=seed)
    transitions = pickle.loads(pickle.dumps(  # oat pickles transitions from actor to learner
        [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]))
    start = {k: v.detach().clone() for k, v in learner.model.model.module.state_dict().items()}

    learner.model.train()
    infos = learner.learning_step(oat_trajectory(learner, transitions))

    model, history = local_update(tiny_policy_dir, args, samples, advantages, tr, optimizer,
                                  learner.tokenizer.pad_token_id)
    trained = learner.model.model.module.state_dict()
    moved = max((trained[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-3, "the learning step did not change the weights"
    # Adam divides by √v: where a weight's gradient is near 0, float-level differences between ZeRO's flat fp32
    # buffers and the plain optimizer's move it by a few percent of one lr-sized step (2.1e-5 at lr 1e-3 seen).
    atol = 5e-5 if optimizer == "adamw" else 2e-5
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trained[name], value, atol=atol, rtol=1e-4, msg=f"{name} differs from the core's")
    assert len(history) == 4  # 2 epochs × 2 minibatches of 4 samples
    local_fraction = sum(h["mask/fraction"] for h in history) / len(history)
    assert infos["dppo/mask/fraction"].item() == pytest.approx(local_fraction, abs=1e-6)
    assert infos["pg_loss"].item() == pytest.approx(sum(h["loss"] for h in history) / len(history), abs=1e-5)
    for key in ("entropy", "policy_grad_norm", "adv_mean", "dppo/mismatch/abs_diff_mean",
                "dppo/shadow/ppo/mask_fraction"):
        assert key in infos and torch.isfinite(infos[key]), key
    if preset != "minirl_tis":
        assert 0 < local_fraction < 1, "the test batch should have both masked and kept tokens"


def test_trajectory_batch_is_the_core_batch(tiny_policy, tiny_policy_dir, tmp_path, oat_on_cpu, gpu_node, monkeypatch):
    """oat's collation and back: the learner's batch is the one the local engine builds from the same samples."""
    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_topk_kl", ["--tr_k", "4"], 0, 0.1)
    learner = oat_learner(args, "sgd", monkeypatch)
    samples, advantages = behavior_samples(tiny_policy, top_k=4, seed=3)
    transitions = [transition_from_sample(s, a, "", {"actor/x": 1.0}) for s, a in zip(samples, advantages, strict=True)]
    transitions[2].loss_mask = False
    assert isinstance(learner.dataset_builder(transitions, learner.tokenizer, learner.strategy), DPPOTransitionDataset)
    got = update_batch_from_trajectory(oat_trajectory(learner, transitions), learner.tokenizer.pad_token_id,
                                       with_topk=True)
    want = build_update_batch(samples, advantages, learner.tokenizer.pad_token_id, with_topk=True)
    want.response_mask[2] = False
    for field in ("input_ids", "attention_mask", "response_mask", "behavior_logp", "advantages", "topk_ids",
                  "topk_behavior_logp"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), msg=field)


def test_partial_minibatches_are_refused(tiny_policy, tiny_policy_dir, tmp_path, oat_on_cpu, gpu_node, monkeypatch):
    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_binary_tv", [], 0, 0.1)
    learner = oat_learner(args, "sgd", monkeypatch)
    samples, advantages = behavior_samples(tiny_policy, n=6, group_size=3)
    transitions = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    with pytest.raises(ValueError, match="minibatches of 4"):
        learner.learning_step(oat_trajectory(learner, transitions))


def test_rebn_normalises_over_every_learners_batch():
    """Gem's norm_return: the mean and std of all learners' returns, not of one learner's (all_reduce of sums)."""
    from dppo_oat.advantages import batch_normalize
    from dppo_oat.engines.oat.learner import global_batch_normalize

    mine, theirs = torch.tensor([[1.0], [0.0], [0.5]]), torch.tensor([[0.9], [0.9], [0.2]])
    their_sums = iter([float(theirs.numel()), float(theirs.sum()), float((theirs**2).sum())])  # in the order asked

    got = global_batch_normalize(mine, lambda value: value + next(their_sums))
    expected = torch.as_tensor(batch_normalize(torch.cat([mine, theirs]).numpy()))[:3]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, torch.as_tensor(batch_normalize(mine.numpy())), atol=1e-3)


@pytest.mark.fault("oat engine: a non-finite minibatch",
                   "not applied, through DeepSpeed's own skipped-step path; counted in `train/dppo/guard/skipped`")
@pytest.mark.parametrize("zero_stage", [1, 2])
def test_a_poisoned_minibatch_is_skipped_through_deepspeed(zero_stage, tiny_policy, tiny_policy_dir, tmp_path,
                                                           oat_on_cpu, gpu_node, monkeypatch):
    """Non-finite μ in every sample: DeepSpeed (which checks overflow for fp16 only) applies nothing, counts the
    skipped steps, and the next healthy batch trains as usual."""
    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_binary_tv", [], zero_stage, 1e-3)
    learner = oat_learner(args, "adamw", monkeypatch)
    samples, advantages = behavior_samples(tiny_policy)
    healthy = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    for sample in samples:
        sample.behavior_logprobs = [float("nan")] + list(sample.behavior_logprobs[1:])
    poisoned = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    start = {k: v.detach().clone() for k, v in learner.model.model.module.state_dict().items()}

    learner.model.train()
    infos = learner.learning_step(oat_trajectory(learner, poisoned))
    assert infos["dppo/guard/skipped"].item() == 1.0 and infos["dppo/guard/nonfinite_mu"].item() == 1.0
    assert learner.model.model.skipped_steps == 4  # 2 epochs × 2 minibatches, none applied
    for name, value in learner.model.model.module.state_dict().items():
        torch.testing.assert_close(value, start[name], atol=0, rtol=0, msg=name)

    infos = learner.learning_step(oat_trajectory(learner, healthy))
    assert infos["dppo/guard/skipped"].item() == 0.0 and learner.model.model.skipped_steps == 4
    moved = max((v - start[k]).abs().max().item() for k, v in learner.model.model.module.state_dict().items())
    assert moved > 1e-4


def test_diverged_weights_stop_the_learning_step_through_deepspeed(tiny_policy, tiny_policy_dir, tmp_path, oat_on_cpu,
                                                                   gpu_node, monkeypatch):
    """π_θ non-finite (a NaN weight): the minibatch is discarded through DeepSpeed's skip and the learning step
    raises, through the core's agreement (one learner here: its own state)."""
    from dppo_oat.errors import TrainingBlewUp

    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_binary_tv", [], 1, 1e-3)
    learner = oat_learner(args, "adamw", monkeypatch)
    samples, advantages = behavior_samples(tiny_policy)
    transitions = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    with torch.no_grad():
        learner.model.model.module.model.norm.weight[0] = float("nan")
    learner.model.train()
    with pytest.raises(TrainingBlewUp, match="weights diverged"):
        learner.learning_step(oat_trajectory(learner, transitions))
    assert learner.model.model.skipped_steps == 1


@pytest.mark.fault("oat engine: a weight broken by a learning round",
                   "the run stops: every learner checks its shard of the weights after every learning round, before "
                   "oat saves them or sends them to vLLM")
def test_a_broken_weight_after_learning_stops_before_oat_saves_it(tiny_policy, tiny_policy_dir, tmp_path, oat_on_cpu,
                                                                  gpu_node, monkeypatch):
    """A non-finite weight that the update's π_θ check does not see (it reads the first rows of the batch only; here
    it is switched off, and the last optimizer step breaks a weight) is found by the scan of every learner's weight
    shards at the end of the learning step, before oat's save or its weight sync to vLLM."""
    import dppo_oat.learner.update
    from dppo_oat.errors import TrainingBlewUp

    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_binary_tv", [], 2, 1e-3)
    learner = oat_learner(args, "adamw", monkeypatch)
    samples, advantages = behavior_samples(tiny_policy)
    transitions = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    step = learner._optimizer_step
    target = dict(learner.model.model.module.named_parameters())["model.layers.1.mlp.down_proj.weight"]

    steps = []

    def step_then_break_a_weight():  # the last of 2 epochs × 2 minibatches
        out = step()
        steps.append(1)
        if len(steps) == 4:
            with torch.no_grad():
                target[0, 0] = float("inf")
        return out

    monkeypatch.setattr(dppo_oat.learner.update, "check_policy_finite", lambda *args, **kwargs: None)
    monkeypatch.setattr(learner, "_optimizer_step", step_then_break_a_weight)
    learner.model.train()
    with pytest.raises(TrainingBlewUp, match="weights are non-finite .*down_proj"):
        learner.learning_step(oat_trajectory(learner, transitions))


@pytest.mark.fault("oat engine: a run that keeps diverging",
                   "every learner stops together, launchpad stops the program, and the launcher prints `error: "
                   "training diverged: …` (exit 1)")
@pytest.mark.fault("oat engine: a checkpoint that cannot be written (a full disk)",
                   "every learner stops together and the launcher prints `error: writing the checkpoint … failed "
                   "(…); the newest whole checkpoint is round_NNNNNN: … --resume_dir <run>` (exit 1)")
@pytest.mark.parametrize("error,line", [
    (TrainingBlewUp("weights are non-finite: lower --lr"), "training diverged: weights are non-finite: lower --lr"),
    (CheckpointFailed("writing the checkpoint r/checkpoints/round_000003 failed (OSError: [Errno 28] No space left "
                      "on device); the newest whole checkpoint is round_000002: make room or fix the folder, then go "
                      "on with the same command plus --resume_dir r"), None),
])
def test_a_run_stopped_by_every_learner_ends_in_one_line_and_status_1(error, line, capsys, monkeypatch, tmp_path):
    """DPPOLearner.run: a TrainingBlewUp or CheckpointFailed (raised on every learner together) makes rank 0 close
    its logs and hand the reason to the launcher, and asks launchpad to stop the program (the test stand-in for
    launchpad records it); the launcher then prints one line and exits 1."""
    import launchpad as lp

    from dppo_oat.engines.oat import launch
    from dppo_oat.engines.oat.status import STATUS_DIR_ENV

    stops, finished = [], []
    monkeypatch.setattr(lp, "stop", lambda: stops.append(True))

    def stop_with_error(self):
        raise error

    def learner_process(*args, **kwargs):  # what the learner's process does inside the launched program
        monkeypatch.setattr(DPPOLearner, "_init", lambda self, args, actors: None)
        monkeypatch.setattr(DPPOLearner, "train", stop_with_error)
        learner = DPPOLearner.__new__(DPPOLearner)
        learner.args, learner.actors = None, []
        learner.strategy = type("Rank0", (), {"is_rank_0": staticmethod(lambda: True)})()
        learner._wandb = type("Logs", (), {"finish": staticmethod(lambda: finished.append(True))})()
        learner.run()

    monkeypatch.delenv(STATUS_DIR_ENV, raising=False)
    fake_args = type("Args", (), {"dry_run": False, "adam_offload": False, "launch_type": "local_mp",
                                  "checkpoint_every": 0, "resume_dir": "", "on_cpu": True})()
    monkeypatch.setattr(launch, "checked_plan", lambda argv: (fake_args, None))
    monkeypatch.setattr("dppo_oat.engines.oat.layout.render_with_layouts", lambda args, plan: "plan")
    monkeypatch.setattr(launch, "build_program", lambda args: (None, {}))
    monkeypatch.setattr(lp, "launch", learner_process)
    with pytest.raises(SystemExit) as stopped:
        launch.main([])
    assert stopped.value.code == 1 and stops == [True] and finished == [True]
    assert capsys.readouterr().err == f"\nerror: {line or error}\n"  # on a line of its own after the workers'


def test_a_zero3_shard_is_checked_without_its_padding(monkeypatch):
    """ZeRO-3 pads each partition up to a multiple of the world size with uninitialised memory: only the valid
    elements of this learner's partition are checked (here rank 1 of 2 holds 2 of 5 elements, then padding)."""
    from dppo_oat.engines.oat.learner import local_shard

    parameter = torch.nn.Parameter(torch.empty(0))
    parameter.ds_numel = 5
    parameter.ds_tensor = torch.tensor([1.0, 2.0, float("nan")])  # elements 3 and 4, then one padding slot
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    assert local_shard(parameter).tolist() == [1.0, 2.0]
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    assert local_shard(parameter).numel() == 3  # rank 0: a full partition, no padding
    plain = torch.nn.Parameter(torch.ones(2, 2))
    assert local_shard(plain) is plain


@pytest.fixture
def fp16_on_cpu(monkeypatch):
    """DeepSpeed refuses fp16 on a CPU whose oneDNN has no fp16 kernels (``is_fp16_supported``); torch computes in
    float16 on any CPU, so the check is lifted and DeepSpeed's real ZeRO fp16 optimizer and loss scaler run."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


def fp16_learner(gpu_node, tiny_policy_dir, tmp_path, monkeypatch, zero_stage=2):
    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_binary_tv", ["--fp16"], zero_stage, 1e-3)
    learner = oat_learner(args, "adamw", monkeypatch)
    assert learner.model.model.fp16_enabled() and next(learner.model.model.module.parameters()).dtype == torch.float16
    return learner


def weights_of(learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.model.module.state_dict().items()}


def max_change(learner, start: dict[str, torch.Tensor]) -> float:
    return max((v.float() - start[k].float()).abs().max().item()
               for k, v in learner.model.model.module.state_dict().items())


@pytest.mark.fault("oat engine: an fp16 run (`--fp16 --no-bf16`) whose scaled gradients overflow",
                   "DeepSpeed's loss scaler skips the step and lowers its scale, counted in "
                   "`train/dppo/guard/loss_scale_skips`: never a reason to stop; at DeepSpeed's minimum scale a "
                   "non-finite gradient is the guard's skip (`train/dppo/guard/skipped`)")
@pytest.mark.parametrize("zero_stage", [1, 2])
def test_fp16_loss_scale_overflows_are_deepspeeds_skips_not_divergence(zero_stage, tiny_policy, tiny_policy_dir,
                                                                       tmp_path, oat_on_cpu, gpu_node, fp16_on_cpu,
                                                                       monkeypatch):
    """DeepSpeed's dynamic scale starts at 2^32 (oat sets no fp16 options): every scaled gradient overflows, and
    DeepSpeed skips the step and halves the scale, four times in a learning step of 2 epochs × 2 minibatches. The
    guard counts none of them; the weights stay. At a workable scale the next learning step trains."""
    learner = fp16_learner(gpu_node, tiny_policy_dir, tmp_path, monkeypatch, zero_stage)
    engine, optimizer = learner.model.model, learner.model.model.optimizer
    samples, advantages = behavior_samples(tiny_policy)
    transitions = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    start = weights_of(learner)
    assert optimizer.loss_scale == 2.0**32

    learner.model.train()
    infos = learner.learning_step(oat_trajectory(learner, transitions))
    assert infos["dppo/guard/loss_scale_skips"].item() == 4.0 and infos["dppo/guard/skipped"].item() == 0.0
    assert learner.guard.loss_scale_skips == 4 and learner.guard.skipped_in_a_row == 0
    assert engine.skipped_steps == 4 and optimizer.loss_scale == 2.0**28
    assert max_change(learner, start) == 0.0

    optimizer.loss_scale = 2.0**8
    infos = learner.learning_step(oat_trajectory(learner, transitions))
    assert infos["dppo/guard/loss_scale_skips"].item() == 0.0 and engine.skipped_steps == 4
    assert infos["dppo/loss_scale"].item() == 2.0**8
    assert 0 < infos["policy_grad_norm"].item() < 1e3  # unscaled: the scaled norm would be 2^8 times larger
    assert max_change(learner, start) > 1e-4


def test_fp16_overflow_at_the_minimum_scale_is_the_guards_skip(tiny_policy, tiny_policy_dir, tmp_path, oat_on_cpu,
                                                               gpu_node, fp16_on_cpu, monkeypatch):
    """An overflow at DeepSpeed's minimum scale (here raised to the starting 2^32) cannot be cured by a lower scale:
    DeepSpeed still skips the step (it would raise a bare exception at the minimum), the guard counts it as a
    non-finite gradient, and ``patience`` of them in a row stop the run."""
    from dppo_oat.errors import TrainingBlewUp

    learner = fp16_learner(gpu_node, tiny_policy_dir, tmp_path, monkeypatch)
    learner.model.model.optimizer.loss_scaler.min_scale = 2.0**32
    learner.guard.patience = 6
    samples, advantages = behavior_samples(tiny_policy)
    transitions = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]

    learner.model.train()
    infos = learner.learning_step(oat_trajectory(learner, transitions))
    assert infos["dppo/guard/skipped"].item() == 1.0 and infos["dppo/guard/nonfinite_grad"].item() == 1.0
    assert infos["dppo/guard/loss_scale_skips"].item() == 0.0 and learner.guard.skipped_in_a_row == 4
    assert learner.model.model.optimizer.loss_scale == 2.0**32
    with pytest.raises(TrainingBlewUp, match="the gradient norm non-finite in 6 optimizer steps in a row"):
        learner.learning_step(oat_trajectory(learner, transitions))


def test_fp16_discarded_minibatch_leaves_weights_and_loss_scale(tiny_policy, tiny_policy_dir, tmp_path, oat_on_cpu,
                                                                gpu_node, fp16_on_cpu, monkeypatch):
    """A minibatch the guard discards (non-finite μ) in fp16: its zero-surrogate gradients are finite, so
    DeepSpeed's own overflow check would apply them (Adam's momentum would move the weights); it is held off, and
    so is the scale's update: nothing changes but DeepSpeed's count of skipped steps."""
    learner = fp16_learner(gpu_node, tiny_policy_dir, tmp_path, monkeypatch)
    optimizer = learner.model.model.optimizer
    optimizer.loss_scale = 2.0**8
    samples, advantages = behavior_samples(tiny_policy)
    transitions = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    learner.model.train()
    learner.learning_step(oat_trajectory(learner, transitions))  # Adam now has momentum to move weights with
    for sample in samples:
        sample.behavior_logprobs = [float("nan")] + list(sample.behavior_logprobs[1:])
    poisoned = [transition_from_sample(s, a, "", {}) for s, a in zip(samples, advantages, strict=True)]
    start, skipped, scale = weights_of(learner), learner.model.model.skipped_steps, optimizer.loss_scale

    infos = learner.learning_step(oat_trajectory(learner, poisoned))
    assert infos["dppo/guard/skipped"].item() == 1.0 and infos["dppo/guard/nonfinite_mu"].item() == 1.0
    assert learner.model.model.skipped_steps == skipped + 4 and optimizer.loss_scale == scale
    assert max_change(learner, start) == 0.0
    assert not optimizer.overflow and "check_overflow" not in vars(optimizer)


def test_staleness_counts_learning_rounds_between_the_sampling_and_the_trained_weights():
    """Sync runs learn on-policy (the samples of round r come from the broadcast of round r − 1's weights); one
    actor step of prefetch (oat's ``--asynchronous``) lags one round; ``--sync_params_every 2`` every other round
    one; actors at different versions average."""
    from dppo_oat.engines.oat.learner import sample_staleness

    def ages(versions, rounds_trained, broadcast_rounds):
        out = sample_staleness(versions, rounds_trained, broadcast_rounds)
        return out["staleness/mean"].item(), out["staleness/max"].item()

    assert ages([0, 0], 0, []) == (0.0, 0.0)  # round 1 of any run: --pretrain's weights
    assert ages([2, 2], 2, [1, 2]) == (0.0, 0.0)  # sync, round 3
    assert ages([1, 1], 2, [1, 2]) == (1.0, 1.0)  # asynchronous, round 3: sampled while round 2 trained
    assert ages([1, 1], 2, [2]) == (0.0, 0.0)  # --sync_params_every 2, round 3
    assert ages([1, 1], 3, [2]) == (1.0, 1.0)  # --sync_params_every 2, round 4
    assert ages([0, 1, 1], 3, [2]) == (pytest.approx(5 / 3), 3.0)  # one actor still on --pretrain's weights


def test_learning_step_logs_the_staleness_of_its_samples(tiny_policy, tiny_policy_dir, tmp_path, oat_on_cpu, gpu_node,
                                                         monkeypatch):
    """The weight version each sample carries from its actor becomes ``staleness/mean`` and ``staleness/max``."""
    args = learner_args(gpu_node, tiny_policy_dir, str(tmp_path), "dppo_binary_tv", [], 0, 0.1)
    learner = oat_learner(args, "sgd", monkeypatch)
    samples, advantages = behavior_samples(tiny_policy)
    transitions = [transition_from_sample(s, a, "", {}, weight_version=i % 2) for i, (s, a) in
                   enumerate(zip(samples, advantages, strict=True))]
    learner.learning_rounds, learner.broadcast_rounds = 1, [1]  # round 2; broadcast 1 holds round 1's weights
    learner.model.train()
    infos = learner.learning_step(oat_trajectory(learner, transitions))
    assert infos["staleness/mean"].item() == 0.5 and infos["staleness/max"].item() == 1.0


def test_the_actor_takes_its_weight_version_from_the_learner_and_refuses_a_load_while_generating():
    """The learner states the version after each broadcast (an evaluation's loads are none); a weight sent while an
    actor step or an evaluation generates would be sampled half-loaded, so it is refused."""
    from dppo_oat.engines.oat.actor import DPPOGemActor

    actor = DPPOGemActor.__new__(DPPOGemActor)
    calls = []
    actor.llm = type("LLM", (), {"collective_rpc": staticmethod(lambda name, args: calls.append(args[-1]))})()
    actor.actor_id, actor.weight_version, actor.eval_mode, actor.generate_mode = 0, 0, False, False
    for last in (False, False, True):
        actor.update_weight("w", "float32", (1,), empty_cache=last)
    assert actor.weight_version == 0 and calls == [False, False, True]  # loads alone do not make a version
    actor.set_weight_version(1)
    assert actor.weight_version == 1
    with actor.generating(), pytest.raises(RuntimeError, match="weight 'w' sent while generating"):
        actor.update_weight("w", "float32", (1,), empty_cache=True)
    assert not actor.generate_mode and calls == [False, False, True]


def test_an_actor_step_of_the_asynchronous_loop_plays_only_on_the_version_it_names():
    """``play_step(v, ...)``: the samples carry version v, which must be the one the actor holds."""
    from dppo_oat.engines.oat.actor import DPPOGemActor

    actor = DPPOGemActor.__new__(DPPOGemActor)
    actor.actor_id, actor.weight_version, actor.generate_mode, actor.steps_played = 0, 2, False, 0
    actor.args = type("Args", (), {"seed": 7, "rollout_batch_size_per_device": 2})()
    actor.ipc_client = type("IPC", (), {"serialize_ipc": staticmethod(lambda data: data)})()
    actor.collect_transitions = lambda wanted, version, rng: [("sample", version)] * wanted
    with pytest.raises(RuntimeError, match="asked for a step with weight version 1, holds version 2"):
        actor.play_step(1, ["a", "b"])
    assert actor.play_step(2, ["a", "b"]) == [("sample", 2)] * 2 and actor.steps_played == 1
    assert actor.step(["a"]) == [("sample", 2)] and actor.steps_played == 2


OAT_RUN_LOOP_SHA256 = "287b4b97cc958ccf"
"""The first 16 hex digits of the SHA-256 of oat 0.2.4's ``LearnerBase.run`` source, which ``DPPOLearner.train``
mirrors (with resume added)."""


def test_the_learners_loop_mirrors_oats_own():
    """``DPPOLearner.run`` replaces oat's ``LearnerBase.run`` to resume mid-run; when oat's loop changes (another oat
    version), this fails: read oat's new loop and bring ``DPPOLearner.train`` (and ``train_in_lockstep``, the
    synchronous loop) in line before updating the hash."""
    import hashlib
    import inspect

    from oat.learners.base import LearnerBase

    source = inspect.getsource(LearnerBase.run)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == OAT_RUN_LOOP_SHA256
    assert DPPOLearner.run is not LearnerBase.run
