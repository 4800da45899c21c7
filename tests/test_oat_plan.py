"""The oat engine's plan (``--dry_run``): oat's topology and batch arithmetic from the arguments alone, and the plans
it refuses. Pure arithmetic on the arguments: no oat, GPU or model needed, so these run in the main suite."""

import json
import math
import re
from types import SimpleNamespace

import pytest

from dppo_oat.engines.oat.plan import check_plan, check_visible_gpus, plan_of, render_plan

OAT_DEFAULTS = dict(
    gpus=8, collocate=True, num_gpus_per_actor=1, num_groups=1, rollout_batch_size=128,
    rollout_batch_size_per_device=16, pi_buffer_maxlen_per_device=16, buffer_clear_every=math.inf,
    train_batch_size=128, train_batch_size_per_device=1, num_ppo_epochs=2, max_train=65000, eval_steps=20,
    save_steps=100, pretrain="no/such-model", bf16=True, fp16=False, prompt_max_length=8704,
    generate_max_length=4096, num_samples=1,
)


def args(**changes):
    return SimpleNamespace(**{**OAT_DEFAULTS, **changes})


def gem_recipe(gpus):
    """Gem's oat example for N GPUs: per-device rollout and buffer = 128 / N (GRADIENT_BATCH_SIZE / N_GPU)."""
    return args(gpus=gpus, rollout_batch_size_per_device=128 // gpus, pi_buffer_maxlen_per_device=128 // gpus)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_gem_recipe_is_one_round_per_actor_step_with_two_optimizer_steps(gpus):
    plan = plan_of(gem_recipe(gpus))
    check_plan(plan)
    assert (plan.actors, plan.learners, plan.actor_steps_per_round) == (gpus, gpus, 1)
    assert plan.samples_per_round == plan.buffer == plan.minibatch == 128 // gpus
    assert plan.grad_acc_step == 128 // gpus and plan.optimizer_steps_per_round == 2
    assert plan.rounds == 65000 // gpus // (128 // gpus)


def test_a_buffer_smaller_than_a_round_is_refused():
    """The first review's crash: 1 GPU, 16 per device and a buffer of 16 keep 16 of every 128 samples, and the
    learner's minibatch (128) never fills."""
    plan = plan_of(args(gpus=1))
    assert plan.actor_steps_per_round == 8 and plan.samples_per_round == 128
    with pytest.raises(ValueError, match="keeps only the last --pi_buffer_maxlen_per_device 16: set "
                                         "--pi_buffer_maxlen_per_device 128"):
        check_plan(plan)


def test_a_buffer_that_keeps_earlier_rounds_is_refused_unless_cleared():
    with pytest.raises(ValueError, match="earlier rounds"):
        check_plan(plan_of(args(pi_buffer_maxlen_per_device=64)))
    check_plan(plan_of(args(pi_buffer_maxlen_per_device=64, buffer_clear_every=1)))


@pytest.mark.parametrize("changes,message", [
    (dict(train_batch_size=256), "do not split into minibatches"),
    (dict(rollout_batch_size=100), "--rollout_batch_size 100 is not a multiple of 8 learner"),
    (dict(gpus=2, rollout_batch_size=129, pi_buffer_maxlen_per_device=64), "--rollout_batch_size 129"),
    (dict(gpus=6, num_gpus_per_actor=3), "1, 2, 4 or 8 GPUs"),
    (dict(train_batch_size=100), "not a multiple of 8 learner"),
    (dict(max_train=100), "fewer than one learning round"),
    (dict(gpus=3, num_gpus_per_actor=2), "pairs every learner"),
    (dict(gpus=4, collocate=False, num_gpus_per_actor=4), "no GPU for an actor"),
    (dict(rollout_batch_size_per_device=0), "must be >= 1"),
])
def test_inconsistent_plans_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        check_plan(plan_of(args(**changes)))


def test_separate_gpus_halve_the_learners():
    plan = plan_of(args(gpus=2, collocate=False, rollout_batch_size_per_device=128, pi_buffer_maxlen_per_device=128))
    check_plan(plan)
    assert (plan.actors, plan.learners, plan.collocate) == (1, 1, False)


def test_evaluation_and_saving_follow_oat_actor_step_counters():
    """oat evaluates after a learning round whose actor step count is a multiple of --eval_steps."""
    plan = plan_of(args(gpus=1, pi_buffer_maxlen_per_device=128, eval_steps=20, save_steps=-1))
    assert plan.actor_steps_per_round == 8 and plan.eval_every_rounds == 5 and plan.save_every_rounds is None
    text = render_plan(plan)
    assert "every 5 learning round(s)" in text and "never (--save_steps <= 0)" in text


QWEN3_CONFIG = {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
                "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144, "tie_word_embeddings": True}
"""Qwen3-1.7B's config.json, as far as the plan reads it."""


def test_logits_memory_is_read_from_the_model_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_CONFIG))
    plan = plan_of(args(pretrain=str(tmp_path)))
    assert plan.logits_gib == pytest.approx((12800 * 151936 * 6 + 3 * 1024 * 151936 * 4) / 2**30)
    assert "12800 tokens × V=151936" in render_plan(plan)
    measured_on_h100 = 11.78  # GiB: docs/bench/logits_memory_h100.jsonl, bf16, 12,800 tokens, chunks of 1,024
    assert 0.85 < measured_on_h100 / plan.logits_gib < 1.15


def test_logits_memory_of_a_model_known_by_name_or_by_flag():
    """A hub id whose config.json is not readable offline is priced from the shape table; any other model needs
    --price_model, and the plan says so instead of printing a size."""
    for named in (args(pretrain="Qwen/Qwen3-1.7B-Base"), args(price_model="Qwen3-1.7B")):
        assert plan_of(named).logits_gib == pytest.approx((12800 * 151936 * 6 + 3 * 1024 * 151936 * 4) / 2**30)
    text = render_plan(plan_of(args()))
    assert plan_of(args()).logits_gib is None and "unknown" not in text
    assert "not priced without the model's shape" in text and "give --price_model" in text


def test_the_dry_run_says_which_head_holds_what(tmp_path):
    """The fused head (the default) never holds [N, V]: the dry run says so and gives the logits path's bound;
    ZeRO-3, where the learner falls back to the logits path, and --lm_head logits print that path's estimate."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_CONFIG))
    fused = render_plan(plan_of(args(pretrain=str(tmp_path), lm_head="fused", zero_stage=2)))
    assert "LM head: fused" in fused and "never [N, V]" in fused and "at most" in fused
    for changes in (dict(lm_head="fused", zero_stage=3), dict(lm_head="logits", zero_stage=2)):
        text = render_plan(plan_of(args(pretrain=str(tmp_path), **changes)))
        assert "logits per micro-batch: at most" in text and "LM head: fused" not in text


@pytest.mark.parametrize("visible,gpus", [(None, 8), ("0", 1), ("4,5", 2), (" 0, 1 ", 2)])
def test_visible_gpus_that_match_gpus_pass(visible, gpus):
    check_visible_gpus(gpus, visible)


@pytest.mark.parametrize("visible,gpus,message", [
    ("0,1,2,3,4,5,6,7", 1, "lists 8 GPU(s) but --gpus is 1: oat starts an actor and a learner on every visible GPU; "
                           "pass --gpus 8, or export CUDA_VISIBLE_DEVICES=0"),
    ("2,3", 4, "lists 2 GPU(s) but --gpus is 4: oat starts an actor and a learner on every visible GPU; pass --gpus 2"),
    ("GPU-8e6b2c4f,GPU-1a2b3c4d", 2, "GPU indices"),
    ("", 1, "GPU indices"),
])
def test_visible_gpus_that_oat_would_misplace_are_refused(visible, gpus, message):
    """oat 0.2.4 puts an actor and a learner on each GPU CUDA_VISIBLE_DEVICES lists (``int()`` of each entry)."""
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        check_visible_gpus(gpus, visible)
    assert "\n" not in str(refused.value)


@pytest.mark.fault("oat engine: `--num_samples 0` or a negative one (with `--dry_run` too)",
                   "one line before the plan is printed: `--num_samples must be an integer >= 1` (exit 2); the dry "
                   "run stops at its first failed check")
@pytest.mark.parametrize("value", [0, -3, True])
def test_a_group_size_below_one_is_refused(value):
    from dppo_oat.engines.oat.plan import check_group_size

    with pytest.raises(ValueError, match="--num_samples must be an integer >= 1"):
        check_group_size(value)
    check_group_size(8)


@pytest.mark.parametrize("changes,line", [
    ({}, "trust region: --trust_region dppo_binary_tv (DPPO-Binary-TV, rule binary_tv): band δ 0.15; also reads C inf, "
         "τ 0"),
    (dict(trust_region="dppo_binary_tv", tr_delta=0.2),
     "trust region: --trust_region dppo_binary_tv (DPPO-Binary-TV, rule binary_tv): band δ 0.2 (--tr_delta; the "
     "preset's 0.15); also reads C inf, τ 0"),
    (dict(trust_region="ppo"), "trust region: --trust_region ppo (PPO, rule ratio): band ε_low 0.2, ε_high 0.2; also "
                               "reads C inf, τ 0"),
    (dict(trust_region="ppo", tr_eps_low=0.3, tr_is_cap=2.0),
     "trust region: --trust_region ppo (PPO, rule ratio): band ε_low 0.3 (--tr_eps_low; the preset's 0.2), ε_high "
     "0.2; also reads C 2 (--tr_is_cap; the preset's inf), τ 0"),
    (dict(trust_region="cispo"), "trust region: --trust_region cispo (CISPO (PG-TIS), rule none): no band (its mask "
                                 "thresholds nothing); also reads C 3, τ 0"),
])
def test_the_plan_names_the_trust_region_and_its_band(changes, line):
    """`gem.sh sudoku ppo` and DPPO differ in the plan: the preset, its rule and the numbers it reads, an override
    beside the preset's own value."""
    text = render_plan(plan_of(args(**changes)))
    assert [row for row in text.splitlines() if row.startswith("trust region:")] == [line]


def test_an_override_the_preset_does_not_read_is_refused_by_the_plan_as_by_the_learner():
    with pytest.raises(ValueError, match="--tr-delta: not read by the trust region ppo"):
        plan_of(args(trust_region="ppo", tr_delta=0.2))
