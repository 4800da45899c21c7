"""``python -m dppo_oat.train --engine oat``: oat's arguments, validation, and the program handed to oat's builder.

The GPU-node scripts (``scripts/gpu``) are run with ``PYTHON=echo`` and the commands they would launch are parsed
and validated as written, so the paper's settings cannot drift from the code. oat's ``get_program`` runs for real;
launchpad is the recorder in ``launchpad_stub`` (see conftest).
"""

import os
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.oat
pytest.importorskip("oat.algorithms.ppo")  # not just "oat": that name also finds the tests/oat folder

import launchpad  # noqa: E402
from oat.algorithms.ppo import PPOArgs  # noqa: E402
from oat.types import RLAlgo  # noqa: E402
from oat.utils.ipc import PlasmaShmServer  # noqa: E402

from dppo_oat.engines.oat import launch  # noqa: E402
from dppo_oat.engines.oat.actor import DPPOGemActor  # noqa: E402
from dppo_oat.engines.oat import args as oat_args  # noqa: E402
from dppo_oat.engines.oat.args import (  # noqa: E402
    REPLACED_OAT_FLAGS,
    DPPOOatArgs,
    sampling_settings,
    trust_region_from_args,
    update_settings,
    validate_args,
)
from dppo_oat.engines.oat.learner import DPPOLearner  # noqa: E402
from dppo_oat.trust_region import PRESETS  # noqa: E402
from shared_data import MATH_DATA  # noqa: E402  (only its name reaches the scripts: validation opens no data)

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "gpu"
PREFIX = "-m dppo_oat.train --engine oat"
recorder_only = pytest.mark.skipif(
    not hasattr(launchpad, "LAUNCHES"), reason="inspects the launchpad recorder (the real launchpad would launch)"
)
SMALL = ["--pretrain", "some/model", "--gpus", "2", "--rollout_batch_size", "16", "--rollout_batch_size_per_device", "8",
         "--pi_buffer_maxlen_per_device", "8", "--train_batch_size", "8", "--num_samples", "4"]
PAPER_RUNS = {"sudoku": ["gem.sh", "sudoku"], "arc1d": ["gem.sh", "arc1d"], "acre": ["gem.sh", "acre"],
              "math": ["math.sh"]}
SANITY_METHODS = ["pg_is", "cispo", "grpo_clip_higher", "minirl", "minirl_tis", "dppo_binary_tv", "dppo_binary_kl"]


def script_commands(*script_args: str) -> list[list[str]]:
    """The ``dppo_oat.train`` arguments a GPU-node script runs, read by running it with ``PYTHON=echo``."""
    env = {**os.environ, "PYTHON": "echo", "DPPO_MATH_DATA": str(MATH_DATA)}
    out = subprocess.run(["bash", str(SCRIPTS / script_args[0]), *script_args[1:]], env=env, check=True,
                         capture_output=True, text=True).stdout
    return [shlex.split(line)[len(PREFIX.split()):] for line in out.splitlines() if line.startswith(PREFIX)]


@pytest.mark.parametrize("name", sorted(PAPER_RUNS))
@pytest.mark.parametrize("baseline", [False, True])
def test_paper_scripts_are_valid(name, baseline, gpu_node):
    """Each GPU-node script runs the paper's setting: DPPO-Binary-TV with δ = 0.2, or the PPO-ratio baseline."""
    [argv] = script_commands(*PAPER_RUNS[name], *(["ppo"] if baseline else []))
    with gpu_node(8):
        args = validate_args(launch.parse_args(argv))
    assert isinstance(args, PPOArgs) and args.algo == RLAlgo.PPO
    tr = trust_region_from_args(args)
    assert (tr.name, tr.rule) == (("ppo", "ratio") if baseline else ("dppo_binary_tv", "binary_tv"))
    assert tr.anchor == "behavior"
    assert (tr.eps_low, tr.eps_high) == (0.2, 0.2) if baseline else tr.delta == 0.2
    assert (args.temperature, args.top_p, args.top_k, args.beta) == (1.0, 1.0, -1, 0.0)
    assert args.wb_run_name == f"{name}-{'ppo' if baseline else 'dppo-binary-tv'}"
    settings = update_settings(args, grad_acc_step=args.train_batch_size // args.gpus)
    assert settings.aggregation == "seq-mean-token-sum-norm" and settings.norm_constant == args.generate_max_length
    assert args.rollout_batch_size_per_device % settings.minibatch_size == 0


def test_script_flags_can_be_overridden(gpu_node):
    [argv] = script_commands("gem.sh", "sudoku", "--gpus", "4", "--rollout_batch_size_per_device", "32",
                             "--pi_buffer_maxlen_per_device", "32")
    with gpu_node(4):
        args = validate_args(launch.parse_args(argv))
    assert (args.gpus, args.rollout_batch_size_per_device) == (4, 32)


def test_sanity_test_script_runs_every_method_of_the_figure(gpu_node):
    """64 prompts × 8 samples per rollout, 4 gradient steps per rollout, each method with the paper's defaults."""
    commands = script_commands("sanity_test.sh")
    assert len(commands) == len(SANITY_METHODS)
    for method, argv in zip(SANITY_METHODS, commands):
        with gpu_node(8):
            args = validate_args(launch.parse_args(argv))
        assert trust_region_from_args(args) == type(trust_region_from_args(args)).preset(method)
        groups = oat_args.groups_per_step(args) * args.gpus
        assert (groups, args.num_samples) == (64, 8)
        assert args.rollout_batch_size // args.train_batch_size * args.num_ppo_epochs == 4
        assert args.learning_rate == 1e-6 and args.generate_max_length == 8000
    assert len(script_commands("sanity_test.sh", "pg_is", "dppo_binary_kl")) == 2


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_is_available(preset, gpu_node):
    with gpu_node(2):
        args = validate_args(launch.parse_args(SMALL + ["--trust_region", preset]))
    tr = trust_region_from_args(args)
    assert tr == type(tr).preset(preset)
    assert sampling_settings(args, tr).top_k_logprobs == (tr.k if tr.uses_topk else 0)


def test_overrides_reach_the_trust_region(gpu_node):
    flags = ["--trust_region", "dppo_topk_kl", "--tr_delta", "0.1", "--tr_k", "8", "--tr_is_cap", "5"]
    with gpu_node(2):
        args = validate_args(launch.parse_args(SMALL + flags))
    tr = trust_region_from_args(args)
    assert (tr.rule, tr.delta, tr.k, tr.is_cap) == ("topk_kl", 0.1, 8, 5.0)
    assert sampling_settings(args, tr).top_k_logprobs == 8


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--temperature", "0.7"], "raw log-probs"),
        (["--top_p", "0.9"], "raw log-probs"),
        (["--critic_type", "ppo"], "learned critic"),
        (["--trust_region", "dppo"], "unknown --trust_region"),
        (["--trust_region", "dppo_binary_tv", "--tr_delta", "0"], "delta"),
        (["--rollout_batch_size", "12"], "multiple of train_batch_size"),
        (["--num_samples", "1"], "needs groups"),
        (["--prompt_template", "llama"], "prompt_template"),
    ],
)
def test_invalid_arguments_are_refused(flags, message, gpu_node):
    with gpu_node(2), pytest.raises(ValueError, match=message):
        validate_args(launch.parse_args(SMALL + flags))


OTHER_VALUES = {"cliprange": "0.3", "tis_c": "2.0", "beta": "0.1", "kl_penalty_coef": "0.1", "reward_scale": "2",
                "non_stop_penalty": "-1", "non_stop_fixed_reward": "0"}


@pytest.mark.parametrize("name", sorted(REPLACED_OAT_FLAGS))
def test_oat_loss_flags_are_refused_not_ignored(name, gpu_node):
    flag = [f"--{name}", OTHER_VALUES[name]] if name in OTHER_VALUES else [f"--{name}"]
    with gpu_node(2), pytest.raises(ValueError, match=f"--{name}=.*not used by DPPO"):
        validate_args(launch.parse_args(SMALL + flag))
    assert f"`--{name}`" in (REPO / "README.md").read_text(), "the README lists every refused oat flag"


def test_oat_still_counts_gpus(gpu_node):
    with gpu_node(1), pytest.raises(AssertionError, match="GPUs available"):
        validate_args(launch.parse_args(SMALL))


@recorder_only
def test_program_runs_dppo_learners_and_actors(gpu_node):
    """oat's builder gets DPPOLearner and DPPOGemActor: 8 collocated actors and learners for the Sudoku command."""
    with gpu_node(8):
        args = validate_args(launch.parse_args(script_commands("gem.sh", "sudoku")[0]))
        program, resources = launch.build_program(args)
    by_class = {}
    for node in program.nodes:
        by_class.setdefault(node.constructor, []).append(node)
    assert set(by_class) == {PlasmaShmServer, DPPOGemActor, DPPOLearner}
    actors, learners = by_class[DPPOGemActor], by_class[DPPOLearner]
    assert len(actors) == len(learners) == 8
    assert all(isinstance(node, launchpad.CourierNode) for node in actors)
    assert all(isinstance(node, launchpad.PyClassNode) for node in learners)
    ipc, vllm_args, actor_args = actors[0].args
    assert actor_args is args and isinstance(args, DPPOOatArgs)
    assert vllm_args["model"] == "Qwen/Qwen3-1.7B-Base" and vllm_args["max_model_len"] == 12800
    world_size, rank, *_, learner_args, learner_actors, learner_ipc = learners[3].args
    assert (world_size, rank, learner_args, learner_ipc) == (8, 3, args, ipc)
    assert learner_actors == actors
    assert resources[learners[3].label].env == {"CUDA_VISIBLE_DEVICES": "3"}


@recorder_only
def test_main_launches_the_program(gpu_node, monkeypatch):
    launched = []
    monkeypatch.setattr(launchpad, "LAUNCHES", launched)
    with gpu_node(2):
        launch.main(SMALL + ["--trust_region", "dppo_topk_tv"])
    (program, kwargs), = launched
    assert kwargs["launch_type"] == "local_mp" and kwargs["terminal"] == "current_terminal"
    assert any(node.constructor is DPPOLearner for node in program.nodes)
    assert any(node.constructor is DPPOGemActor for node in program.nodes)
