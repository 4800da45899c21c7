"""The oat engine's price before launch (``--dry_run``): time per learning round and for the run, and the learner's
memory per GPU, each with its source. Arithmetic on the arguments and the committed GPU rows: no oat, GPU or model
needed, so these run in the main suite. The GPU scripts' own flags are read by running them with ``PYTHON=echo``."""

import dataclasses
import functools
import itertools
import json
import math
import os
import re
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dppo_oat.engines.oat.plan import (
    actor_step_calls,
    check_plan,
    checkpoint_size,
    plan_of,
    priced_plan,
    render_plan,
)
from dppo_oat.engines.oat.price import (
    GPUS,
    MEASURED_LEARNER,
    MEASURED_SETTING,
    MEASURED_TURNS,
    OAT_TARGET_MODULES,
    SHAPES,
    EpisodeTurns,
    ModelShape,
    StepCalls,
    check_price_flags,
    decode_seconds,
    env_turn_limit,
    episode_turns,
    learner_flops,
    learner_seconds,
    resolve_gpu,
    step_calls,
)

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30
PLAN_DEFAULTS = dict(
    num_gpus_per_actor=1, num_groups=1, buffer_clear_every=math.inf, bf16=True, fp16=False, logprob_chunk_size=1024,
    lm_head="fused", zero_stage=2, gradient_checkpointing=False, adam_offload=False, groups_per_step=None,
    vllm_gpu_ratio=0.25, vllm_sleep=False, collocate=False, price_gpu="h200", price_model=None,
    price_decode_efficiency=0.5,
)
"""oat's defaults of what the plan and the price read, where a script does not set them; the price is asked for on an
H200, so that no test reads the machine's nvidia-smi."""


def flags_of(argv: list) -> dict:
    """``--name value`` as ``{name: value}`` (a bare ``--name``: True; several values: a tuple)."""
    flags, name = {}, None
    for token in argv:
        if token.startswith("--"):
            name = token[2:]
            flags[name] = True
            continue
        value = number(token)
        flags[name] = value if flags[name] is True else (*(flags[name] if isinstance(flags[name], tuple)
                                                           else (flags[name],)), value)
    return flags


def number(token: str):
    for kind in (int, float):
        try:
            return kind(token)
        except ValueError:
            pass
    return token


def script_args(*script_args: str, **changes) -> SimpleNamespace:
    """The arguments a GPU-node script gives ``dppo_oat.train`` (it is run with ``PYTHON=echo``), over
    :data:`PLAN_DEFAULTS`, then ``changes``."""
    env = {**{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}, "PYTHON": "echo",
           "DPPO_MATH_DATA": str(REPO)}
    out = subprocess.run(["bash", str(REPO / "scripts" / "gpu" / script_args[0]), *script_args[1:]], env=env,
                         check=True, capture_output=True, text=True, timeout=60).stdout
    argv = shlex.split(out.splitlines()[0])
    assert argv[:4] == ["-m", "dppo_oat.train", "--engine", "oat"], argv
    return SimpleNamespace(**{**PLAN_DEFAULTS, **flags_of(argv[4:]), **changes})


def sudoku(gpus: int, **changes) -> SimpleNamespace:
    return script_args("gem.sh", "sudoku", "--gpus", str(gpus), **changes)


@pytest.mark.parametrize("gpus", [1, 8])
def test_the_sudoku_plans_print_time_and_memory_with_their_sources(gpus):
    args = sudoku(gpus)
    assert (args.pretrain, args.prompt_max_length, args.generate_max_length) == ("Qwen/Qwen3-1.7B-Base", 8704, 4096)
    plan = priced_plan(args)
    check_plan(plan)
    text = render_plan(plan)
    assert "unknown" not in text
    assert "model: the shape table's Qwen3-1.7B-Base (--pretrain, its config.json not readable here)" in text
    assert "logits path (--lm_head logits) per micro-batch: at most 12.6 GiB" in text
    assert re.search(r"\n  actors per round: at most [\d.]+ (s|min), about [\d.]+ (s|min) at the measured mean turns: "
                     r"1 actor step\(s\) of at most \d+ generate calls decoding \d+ episode turns", text)
    assert ("\nepisodes: 2 played at once, one vLLM generate call per turn; game:Sudoku-v0-easy at most 15 turns (its "
            "own limit, Gem's registration), 11.49 on average (measured: 52,962 turns in 4,608 episodes") in text
    assert ("\ntrust region: --trust_region dppo_binary_tv (DPPO-Binary-TV, rule binary_tv): band δ 0.2 (--tr_delta; "
            "the preset's 0.15); also reads C inf, τ 0\n") in text
    assert "an assumed vLLM efficiency (not measured: vLLM has not run on a GPU here" in text
    assert re.search(r"\n  learner per round: at most [\d.]+ (s|min): [\d.]+ PFLOP", text)
    assert "NVIDIA H200, commit 318a79e, docs/bench/oat_learner_step_h200.jsonl" in text
    assert re.search(r"\n  run: at most [\d.]+ h.*: 507 learning round\(s\) × [\d.]+ min; about [\d.]+ h.* at the "
                     r"measured mean turns", text)
    assert re.search(r"\n  learner memory per GPU: about [\d.]+ GiB of 140 GiB = ZeRO-2's states", text)
    assert "the backward's 2.2 GiB (not measured: activations of 12,800 tokens" in text
    assert ("ZeRO-2's traffic between 8 learners not measured" in text) == (gpus == 8)


QWEN3_DECODER = 28 * (2 * 2048 * 2048 + 2 * 2048 * 1024 + 3 * 2048 * 6144)
"""Qwen3-1.7B's decoder matrices: q and o of 16 × 128, k and v of 8 × 128, the MLP's three of 2,048 × 6,144."""
QWEN3_HEAD = 151_936 * 2048
MEASURED_RATE = 720_987_855_257_600 / 8.900584624000004
"""FLOP/s of DPPO's oat learner on the H200 (docs/bench/oat_learner_step_h200.jsonl)."""


def test_the_learner_time_is_the_measured_step_scaled_by_model_flops_by_hand():
    """Sudoku on 1 GPU: 2 epochs × 128 samples of 8,704 + 4,096 tokens with gradient, 4 without (the check after the
    update); the fused head on the 4,096 response rows."""
    assert QWEN3_DECODER == 1_409_286_144 and SHAPES["qwen3-1.7b-base"].decoder_parameters == QWEN3_DECODER
    per_token = QWEN3_DECODER + 28 * 2048 * 12_800  # attention over a 12,800-token sequence
    flops = (6 * 256 + 2 * 4) * (per_token * 12_800 + QWEN3_HEAD * 4096)
    price = priced_plan(sudoku(1)).price
    assert price.learner_seconds == pytest.approx(flops / MEASURED_RATE, rel=1e-12)
    assert price.learner_seconds == pytest.approx(547.2, abs=0.1)
    on_a100 = priced_plan(sudoku(1, price_gpu="a100")).price
    assert on_a100.learner_seconds == pytest.approx(price.learner_seconds * 989 / 312, rel=1e-12)
    assert "× NVIDIA A100-SXM4-80GB's bf16 peak ÷ the NVIDIA H200's" in on_a100.learner_note
    eight = priced_plan(sudoku(8)).price
    assert eight.learner_seconds == pytest.approx((6 * 32 + 2 * 4) * (per_token * 12_800 + QWEN3_HEAD * 4096)
                                                  / MEASURED_RATE, rel=1e-12)


def test_at_the_measured_shape_and_length_the_rule_gives_the_measured_step_scaled_by_tokens():
    shape = SHAPES["qwen3-1.7b"]
    measured = learner_seconds(learner_flops(shape, 32, 4, 2048, 1536), GPUS["h200"])
    assert measured == pytest.approx(8.9006, rel=1e-3)
    doubled = learner_seconds(learner_flops(shape, 64, 8, 2048, 1536), GPUS["h200"])
    assert doubled == pytest.approx(2 * measured, rel=1e-12)


WEIGHTS = 2 * (QWEN3_DECODER + QWEN3_HEAD)
"""Bytes of bf16 weights each decode step reads (the tied head once)."""
KV_PER_TOKEN = 2 * 28 * 8 * 128 * 2
CONTEXT = 4096 * 8704 + 4096 * 4095 // 2
"""Tokens of context summed over the 4,096 decode steps of one sequence of an 8,704-token prompt."""
SUDOKU_MEAN = 52_962 / 4_608
"""The measured mean turns per Sudoku-v0-easy episode (notebooks/example_runs)."""


def call_seconds(sequences: int) -> float:
    """One generate call of ``sequences`` at the H200's decode roofline (memory-bound at these sizes)."""
    return (4096 * WEIGHTS + sequences * CONTEXT * KV_PER_TOKEN) / 4.8e12


def test_the_actor_time_is_the_decode_roofline_over_the_assumed_efficiency_by_hand():
    """Sudoku: 2 episodes at a time, one call per turn over the running ones, until 128 (1 GPU) or 16 (8 GPUs)
    turn samples, each call at the decode roofline ÷ 0.5. Bound (turn limit 15): the worst rounds are one 15-turn
    episode beside a 1-turn one (15 calls, 16 samples) while fewer than the wanted samples are in hand, then two
    15-turn episodes: 7 such rounds + one of 14 calls + 15 = 134 calls and 127 + 30 = 157 sequences on 1 GPU,
    14 + 15 = 29 calls and 15 + 30 = 45 sequences on 8; priced on the chord f(1) + (k − 1)·(f(2) − f(1)). Expected:
    rounds of 2 × 11.49 samples, ceil(128 / 22.99) = 6 of them on 1 GPU, 1 on 8, each of 11.49 calls of 2."""
    one, two = call_seconds(1), call_seconds(2)
    price = priced_plan(sudoku(1)).price
    assert price.actor_seconds == pytest.approx((134 * one + (157 - 134) * (two - one)) / 0.5, rel=1e-12)
    assert price.actor_expected_seconds == pytest.approx(6 * SUDOKU_MEAN * two / 0.5, rel=1e-12)
    assert "at most 134 generate calls decoding 157 episode turns" in price.actor_note
    assert "about 69.0 calls of 2 at the measured mean turns" in price.actor_note
    slower = priced_plan(sudoku(1, price_decode_efficiency=0.25)).price
    assert slower.actor_seconds == pytest.approx(2 * price.actor_seconds, rel=1e-12)
    eight = priced_plan(sudoku(8)).price
    assert eight.actor_seconds == pytest.approx((29 * one + (45 - 29) * (two - one)) / 0.5, rel=1e-12)
    assert eight.actor_expected_seconds == pytest.approx(SUDOKU_MEAN * two / 0.5, rel=1e-12)


def test_multi_turn_episodes_cost_their_turns_over_single_turn_ones():
    """Sudoku on 8 GPUs, its episodes cut to 1 turn (--max_turns 1), is the single-turn price: 16 samples are 8 calls
    of 2. Played to its 15-turn limit it costs the turn factor more: about 11.49 / 8 of it at the measured mean, and
    at most (29·f(1) + 16·(f(2) − f(1))) / (8·f(2)) of it."""
    single = priced_plan(sudoku(8, max_turns=1)).price
    assert single.actor_seconds == single.actor_expected_seconds
    assert single.actor_seconds == pytest.approx(8 * call_seconds(2) / 0.5, rel=1e-12)
    assert "8 generate call(s) of 2 sequence(s)" in single.actor_note
    multi = priced_plan(sudoku(8)).price
    assert multi.actor_expected_seconds / single.actor_seconds == pytest.approx(SUDOKU_MEAN / 8, rel=1e-12)
    one, two = call_seconds(1), call_seconds(2)
    factor = (29 * one + 16 * (two - one)) / (8 * two)
    assert multi.actor_seconds / single.actor_seconds == pytest.approx(factor, rel=1e-12)
    assert factor > SUDOKU_MEAN / 8 > 1
    assert multi.round_seconds > multi.expected_round_seconds > single.round_seconds


def test_single_turn_tasks_price_one_call_per_actor_step_and_say_so():
    """rg:arc_1d is single-turn: every episode of an actor step in one call (16 sequences on 8 GPUs), bound and
    expected the same."""
    args = script_args("gem.sh", "arc1d", "--gpus", "8")
    plan = priced_plan(args)
    assert plan.decode_batch == 16
    assert "rg:arc_1d 1 turn (single-turn: Gem's reasoning-gym env ends every episode" in render_plan(plan)
    assert plan.price.actor_seconds == plan.price.actor_expected_seconds
    assert plan.price.actor_seconds == pytest.approx(call_seconds(16) / 0.5, rel=1e-12)
    assert "1 generate call(s) of 16 sequence(s)" in plan.price.actor_note
    assert "at the measured mean turns" not in render_plan(plan)


def test_the_learner_memory_is_zero2_states_and_the_larger_of_step_and_backward_by_hand():
    psi = QWEN3_DECODER + QWEN3_HEAD  # tied: the embedding is the head
    step_per_parameter = 12.820955276489258 * GiB / 1_720_574_976  # measured: 8.0 bytes per parameter
    backward = 12_800 * 2048 * (2 * 28 + 34)
    one, eight = priced_plan(sudoku(1)).price.memory, priced_plan(sudoku(8)).price.memory
    assert one.peak == pytest.approx(16 * psi + max(step_per_parameter * psi, backward), rel=1e-12)
    assert one.peak / GiB == pytest.approx(38.5, abs=0.05) and one.step > one.backward
    assert eight.peak == pytest.approx(2 * psi + 14 * psi / 8 + backward, rel=1e-12) and eight.backward > eight.step
    assert one.available_gib == 140.4  # --vllm_sleep: vLLM lets the learner have the GPU while it learns


def test_the_price_reads_the_committed_learner_row():
    row = json.loads((REPO / MEASURED_LEARNER.source).read_text().splitlines()[-1])
    assert (row["gpu"], row["commit"][:7]) == (MEASURED_LEARNER.gpu, MEASURED_LEARNER.commit)
    assert row["dppo_step_seconds"] == MEASURED_LEARNER.seconds
    assert row["learners"]["dppo"]["model_flops_per_step"] == MEASURED_LEARNER.model_flops
    assert row["dppo_peak_mem_gib"] == MEASURED_LEARNER.step_gib
    assert MEASURED_LEARNER.start_gib + MEASURED_LEARNER.step_gib == pytest.approx(row["peak_mem_total_gib"]["dppo"])
    config = row["config"]
    assert (config["zero_stage"], config["dtype"], config["gradient_checkpointing"]) == (
        MEASURED_SETTING["zero_stage"], "bfloat16", MEASURED_SETTING["gradient_checkpointing"])
    shape = SHAPES["qwen3-1.7b"]
    assert (shape.vocab, shape.hidden, shape.layers) == (config["vocab"], config["hidden"], config["layers"])
    assert shape.parameters == pytest.approx(config["parameters"], rel=1e-4)  # norms left out
    counts = row["per_step"]["dppo"]
    sequence = config["prompt_tokens"] + config["response_tokens"]
    grad, no_grad = counts["decoder_tokens_grad"] // sequence, counts["decoder_tokens_no_grad"] // sequence
    assert counts["lm_head_rows_grad"] == grad * config["response_tokens"]
    flops = learner_flops(shape, grad, no_grad, sequence, config["response_tokens"])
    assert flops == pytest.approx(MEASURED_LEARNER.model_flops, rel=1e-4)


def test_the_other_scripts_are_priced_from_the_shape_table():
    for script, model in (("math.sh", "OctoThinker-3B-Hybrid-Base"),
                          ("sanity_test.sh", "DeepSeek-R1-Distill-Qwen-1.5B")):
        text = render_plan(priced_plan(script_args(script, *(["pg_is"] if script == "sanity_test.sh" else []))))
        assert f"the shape table's {model} (--pretrain" in text and "unknown" not in text
        assert "  run: at most" in text and "  learner memory per GPU: about" in text


@pytest.mark.parametrize("pretrain", ["no/such-model", "my-org/my-finetune"])
def test_a_model_without_config_or_known_shape_gets_one_line_that_says_what_to_give(pretrain):
    text = render_plan(priced_plan(sudoku(1, pretrain=pretrain)))
    asks = [line for line in text.splitlines() if "--price_model" in line]
    assert len(asks) == 1 and asks[0].startswith(f"price: the shape of '{pretrain}' is not known here")
    assert "Qwen3-1.7B-Base" in asks[0] and "a config.json" in asks[0]
    assert "unknown" not in text and "actors per round" not in text and "learner memory" not in text
    named = render_plan(priced_plan(sudoku(1, pretrain=pretrain, price_model="Qwen3-1.7B-Base")))
    assert "the shape table's Qwen3-1.7B-Base (--price_model)" in named and "learner per round: at most" in named


def qwen3_config(**changes) -> dict:
    return {"vocab_size": 151_936, "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144, "tie_word_embeddings": True,
            **changes}


def test_the_shape_comes_from_the_models_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(qwen3_config(vocab_size=32_000, num_hidden_layers=14)))
    plan = priced_plan(sudoku(1, pretrain=str(tmp_path)))
    assert plan.shape == ModelShape(32_000, 2048, 14, 16, 8, 128, 6144, tied=True)
    text = render_plan(plan)
    assert f"model: {tmp_path}'s config.json (--pretrain)" in text and "12800 tokens × V=32000" in text
    given = priced_plan(sudoku(1, pretrain="no/such-model", price_model=str(tmp_path / "config.json")))
    assert given.shape == plan.shape and given.price.learner_seconds == plan.price.learner_seconds


def test_a_config_json_without_a_decoders_shape_says_what_to_give(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 50_257, "n_embd": 768}))
    text = render_plan(priced_plan(sudoku(1, pretrain=str(tmp_path))))
    assert "config.json (--pretrain) does not give a decoder's shape" in text and "give --price_model" in text


def test_the_gpu_comes_from_the_flag_else_nvidia_smi_else_the_measured_one():
    assert resolve_gpu("a100", "NVIDIA H200") == (GPUS["a100"], "--price_gpu a100")
    assert resolve_gpu(None, "NVIDIA H100 80GB HBM3") == (GPUS["h100"], "nvidia-smi")
    gpu, note = resolve_gpu(None, "NVIDIA H100 PCIe")  # not an SXM H100: its numbers are not in the table
    assert gpu is GPUS["h200"] and "nvidia-smi's NVIDIA H100 PCIe is not in the table" in note
    gpu, note = resolve_gpu(None, None)
    assert gpu is GPUS["h200"] and "--price_gpu a100|h100|h200" in note
    on_h100 = priced_plan(sudoku(1, price_gpu="h100")).price
    assert on_h100.actor_seconds == pytest.approx(priced_plan(sudoku(1)).price.actor_seconds * 4.8 / 3.35)


@pytest.mark.parametrize("changes,flag", [(dict(zero_stage=3), "--zero_stage 3"),
                                          (dict(gradient_checkpointing=False), "--gradient_checkpointing False"),
                                          (dict(adam_offload=True), "--adam_offload True")])
def test_a_learner_setting_never_measured_is_not_priced(changes, flag):
    text = render_plan(priced_plan(sudoku(1, **changes)))
    assert f"  learner per round: not measured with {flag} (the learner was measured with ZeRO-2" in text
    assert f"  learner memory per GPU: not measured with {flag}" in text
    assert "  run: not priced: the learner is not" in text and "  actors per round: at most" in text


def test_actors_whose_vllm_share_holds_no_sequence_are_not_priced():
    text = render_plan(priced_plan(sudoku(1, vllm_gpu_ratio=0.02)))
    assert "  actors per round: not priced: vLLM's share of the GPU (--vllm_gpu_ratio 0.02" in text
    assert "  run: not priced: the actors are not" in text


def test_the_logits_path_adds_its_logits_to_the_backward():
    memory = priced_plan(sudoku(8, lm_head="logits")).price.memory
    assert memory.logits / GiB == pytest.approx(12.6, abs=0.05)
    assert memory.backward == pytest.approx(12_800 * 2048 * 90 + memory.logits)


@pytest.mark.fault("oat engine: `--price_gpu`, `--price_model` or `--price_decode_efficiency` the price cannot use "
                   "(with `--dry_run` too)",
                   "one line before the plan is printed, naming the flag and what it accepts (exit 2)")
@pytest.mark.parametrize("changes,message", [
    (dict(price_gpu="rtx4090"), "--price_gpu 'rtx4090': the price knows a100, h100, h200"),
    (dict(price_model="no/such-model"), "--price_model 'no/such-model' is neither a readable config.json nor one of "
                                        "Qwen3-1.7B"),
    (dict(price_decode_efficiency=0.0), "--price_decode_efficiency must be in (0, 1]"),
    (dict(price_decode_efficiency=1.5), "--price_decode_efficiency must be in (0, 1]"),
])
def test_price_flags_the_price_cannot_use_are_refused_in_one_line(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        check_price_flags(SimpleNamespace(**{**PLAN_DEFAULTS, **changes}))
    assert "\n" not in str(refused.value)
    check_price_flags(SimpleNamespace(**{**PLAN_DEFAULTS, "price_model": "qwen3-1.7b"}))


# ------------------------------------------------------------------------------------------- turns and generate calls


def slots(*limits, mean=None):
    return [EpisodeTurns(f"env{i}", limit, "", mean, "") for i, limit in enumerate(limits)]


def actor_step(wanted: int, draw_round) -> tuple[int, int]:
    """Calls and sequences of ``DPPOGemActor.collect_transitions``'s loop: rounds of episodes (``draw_round()``: their
    turn counts) in lock-step, one call per turn over the running ones, until ``wanted`` samples (one per episode
    and turn)."""
    calls = samples = 0
    while samples < wanted:
        lengths = draw_round()
        calls, samples = calls + max(lengths), samples + sum(lengths)
    return calls, samples


@functools.cache
def worst_calls(wanted: int, batch: int, limit: int, held: int = 0) -> int:
    """The most calls any episode lengths in [1, limit] make, by exhaustive search over each round's lengths."""
    if held >= wanted:
        return 0
    return max(max(lengths) + worst_calls(wanted, batch, limit, held + sum(lengths))
               for lengths in itertools.product(range(1, limit + 1), repeat=batch))


@pytest.mark.parametrize("wanted,batch,limit", [(w, b, t) for w in (1, 2, 5, 9, 16) for b in (1, 2, 3)
                                                for t in (1, 2, 4, 6)])
def test_the_bound_on_calls_is_the_worst_case_of_the_actors_loop(wanted, batch, limit):
    assert step_calls(wanted, slots(*[limit] * batch)).bound_calls == worst_calls(wanted, batch, limit)


@given(wanted=st.integers(1, 200), limits=st.lists(st.integers(1, 30), min_size=1, max_size=6), data=st.data())
def test_no_episode_lengths_make_more_calls_or_sequences_than_the_bound(wanted, limits, data):
    bound = step_calls(wanted, slots(*limits))
    calls, sequences = actor_step(wanted, lambda: [data.draw(st.integers(1, limit)) for limit in limits])
    assert calls <= bound.bound_calls and sequences <= bound.bound_sequences
    assert sequences <= calls * len(limits)


def test_the_bound_and_the_expected_calls_by_hand():
    """16 samples from 2 episodes of at most 15 turns: a 14- and a 1-turn episode (15 samples, 14 calls), then two of
    15 (15 calls): 29; at 11.49 turns each, one round of 11.49 calls. 128 samples: 7 rounds of (15, 1), one of
    (14, 1), one of (15, 15): 134 calls; at the mean 6 rounds. Single-turn: ceil(wanted / B) calls of B."""
    sudoku_slots = slots(15, 15, mean=SUDOKU_MEAN)
    assert step_calls(16, sudoku_slots) == StepCalls(29, 45, SUDOKU_MEAN, 2 * SUDOKU_MEAN)
    assert step_calls(128, sudoku_slots) == StepCalls(134, 157, 6 * SUDOKU_MEAN, 12 * SUDOKU_MEAN)
    assert step_calls(16, slots(15, 15)) == StepCalls(29, 45, None, None)
    assert step_calls(128, slots(1, 1, mean=1.0)) == StepCalls(64, 128, 64.0, 128.0)
    assert step_calls(16, slots(*[1] * 16, mean=1.0)) == StepCalls(1, 16, 1.0, 16.0)


def test_actor_step_calls_gives_the_plans_calls():
    """The function the CPU rehearsal's counts are compared with: the plan's generate calls per actor step."""
    assert actor_step_calls(priced_plan(sudoku(8))) == StepCalls(29, 45, SUDOKU_MEAN, 2 * SUDOKU_MEAN)
    assert actor_step_calls(priced_plan(sudoku(1))).bound_calls == 134
    with pytest.raises(ValueError, match="priced_plan"):
        actor_step_calls(plan_of(sudoku(8)))


@pytest.mark.parametrize("own,flag,limit,mean", [
    (15, None, 15, SUDOKU_MEAN), (15, 20, 15, SUDOKU_MEAN), (15, 10, 10, None), (None, None, 100, None),
    (None, 7, 7, None), (1, None, 1, 1.0), (1, 5, 1, 1.0)])
def test_the_turn_limit_is_the_envs_own_under_max_turns_else_the_actors_cap(own, flag, limit, mean):
    """The env ends its episodes at its own limit, the collector at --max_turns, else at 100 turns for an env
    without one (``EpisodeCollector.turn_cap``); the measured mean holds at the limit it was measured at only."""
    turns = episode_turns("game:Sudoku-v0-easy", own, "its own", flag)
    assert (turns.limit, turns.mean) == (limit, mean)
    if limit == 10:
        assert turns.mean_note == "no measured mean at a 10-turn limit (measured at 15)"
        assert turns.limit_note == "--max_turns, below its own's 15"
    if own is None and flag is None:
        assert turns.limit_note.startswith("the actor's cap for an env without a limit")
    assert episode_turns("game:Wordle-v0-easy", 15, "its own").mean_note == "no measured mean"


def test_each_envs_turn_limit_comes_from_gem():
    assert env_turn_limit("game:Sudoku-v0-easy") == (15, "its own limit, Gem's registration")
    assert env_turn_limit("game:Sudoku-v0-easy-compact-wrong") == (15, "its own limit, the env's max_turns")
    assert env_turn_limit("rg:arc_1d")[0] == env_turn_limit("local-math:any:train")[0] == 1
    assert env_turn_limit("game:Sudoku-v0-random") == (  # drawn per episode and never made: the actor's cap bounds it
        None, "game:Sudoku-v0-random's Gem registration gives no fixed turn limit")
    assert episode_turns("game:Sudoku-v0-random", None, "").limit == 100
    assert env_turn_limit("no:such-env") == (None, "no:such-env is not registered here")


class TurnLimitedEnv:
    """A plugin env whose turn limit is fixed (``limits`` one value) or drawn at each reset from ``limits``."""

    def __init__(self, limits=(4,), seed=0, fail=False):
        if fail:
            raise RuntimeError("no data here")
        self.limits, self.max_turns, self.unwrapped = limits, None, self

    def reset(self, seed=None):
        self.max_turns = self.limits[(seed or 0) % len(self.limits)]
        return "board", {}

    def close(self):
        pass


@pytest.mark.parametrize("kwargs,expected", [
    ({}, (4, "its own limit, the env's max_turns")),
    ({"limits": (3, 7)}, (7, "its own limit, drawn per episode: 3 to 7 over 8 resets, the largest seen")),
    ({"fail": True}, (None, "test:turns could not be made here (RuntimeError)")),
])
def test_a_plugin_envs_turn_limit_is_read_from_it_made_and_reset(kwargs, expected):
    from gem.envs.registration import ENV_REGISTRY, register

    register("test:turns", TurnLimitedEnv, **kwargs)
    try:
        assert env_turn_limit("test:turns") == expected
    finally:
        del ENV_REGISTRY["test:turns"]


def test_the_measured_mean_turns_are_the_committed_runs():
    episodes = samples = 0
    for path in sorted((REPO / "notebooks" / "example_runs").glob("*/metrics.jsonl")):
        config = json.loads((path.parent / "config.json").read_text())
        assert config["env_ids"] == ["game:Sudoku-v0-easy-compact-wrong"] and config["max_turns"] is None
        for line in path.read_text().splitlines():
            row = json.loads(line)
            samples, episodes = samples + row["rollout/turn_samples"], episodes + row["rollout/episodes"]
    assert (samples, episodes) == (52_962, 4_608)
    assert MEASURED_TURNS["game:Sudoku-v0-easy"].mean == samples / episodes
    assert MEASURED_TURNS["game:Sudoku-v0-easy"].limit == 15 == env_turn_limit("game:Sudoku-v0-easy")[0]


# ------------------------------------------------------------------------------------------------------------ LoRA

QWEN3_ADAPTERS = 28 * 64 * ((2048 + 2048) + 2 * (2048 + 1024) + (2048 + 2048) + 2 * (2048 + 6144) + (6144 + 2048))
"""Rank-64 adapters on Qwen3-1.7B's seven projections: r·(in + out) for q, k, v, o, gate, up and down, 28 layers."""
PSI = QWEN3_DECODER + QWEN3_HEAD


def test_lora_counts_its_adapters_and_prices_a_frozen_base_by_hand():
    """Sudoku on 8 GPUs with --lora_rank 64: the base's bf16 weights (2Ψ) plus ZeRO-2's states of the adapters alone
    ((2 + 14/8)Ψ_A), the backward's activations as in full fine-tuning; the learner's FLOPs without the base's
    weight gradients (4 per weight and token with the backward), the adapters' 6."""
    assert QWEN3_ADAPTERS == 69_730_304
    full, lora = priced_plan(sudoku(8)), priced_plan(sudoku(8, lora_rank=64))
    assert lora.lora.adapter_parameters == QWEN3_ADAPTERS and lora.lora.adapted_parameters == QWEN3_DECODER
    memory = lora.price.memory
    backward = 12_800 * 2048 * (2 * 28 + 34)
    assert memory.peak == pytest.approx(2 * PSI + 2 * QWEN3_ADAPTERS + 14 * QWEN3_ADAPTERS / 8 + backward, rel=1e-12)
    assert memory.peak < full.price.memory.peak - 2 * GiB
    per_token = 28 * 2048 * 12_800  # attention over a 12,800-token sequence
    flops = ((4 * 32 + 2 * 4) * QWEN3_DECODER + (6 * 32 + 2 * 4) * (per_token + QWEN3_ADAPTERS)) * 12_800 \
        + (4 * 32 + 2 * 4) * QWEN3_HEAD * 4096
    assert lora.price.learner_seconds == pytest.approx(flops / MEASURED_RATE, rel=1e-12)
    assert lora.price.actor_seconds == full.price.actor_seconds
    text = render_plan(lora)
    assert "\nLoRA: rank 64 on q_proj, k_proj, v_proj, o_proj, down_proj, up_proj, gate_proj (oat's default " \
           "--target_modules) in 28 layers: 69.7M adapter parameters trained" in text
    assert "0.36 TFLOP and 33.8 GB of GPU memory traffic" in text  # 4·64·Ψ_adapted and 24 B per adapted weight
    assert "the frozen base's bf16 weights 2Ψ, 3.2 GiB, + ZeRO-2's states (2 + 14/N)Ψ_A of the adapters" in text
    assert "LoRA" not in render_plan(full)


def test_a_lora_checkpoint_holds_the_frozen_base_twice_under_zero2_and_the_adapters_optimizer_state():
    """DeepSpeed 0.16.8's save_checkpoint writes the module's bf16 state dict (2(Ψ + Ψ_A)), under ZeRO-2 a copy of
    every frozen parameter (frozen_param_fragments, 2Ψ), and ZeRO's fp32 partition and Adam's moments of the trained
    ones (12Ψ_A); full fine-tuning 14Ψ, as the launcher's line has said."""
    full, lora = priced_plan(sudoku(8)), priced_plan(sudoku(8, lora_rank=64))
    assert full.checkpoint[0] == 14 * PSI
    assert lora.checkpoint[0] == 2 * (PSI + QWEN3_ADAPTERS) + 2 * PSI + 12 * QWEN3_ADAPTERS
    assert plan_of(sudoku(8, lora_rank=64, zero_stage=1)).checkpoint[0] == 2 * PSI + 14 * QWEN3_ADAPTERS
    assert plan_of(sudoku(8, bf16=False)).checkpoint[0] == 16 * PSI
    assert checkpoint_size(full) == f", about {PSI * 14 / 1e9:.1f} GB each ({PSI / 1e9:.2f}B parameters)"
    assert checkpoint_size(lora) == (
        ", about 7.9 GB each (LoRA rank 64: the state dict of base and adapters (2(Ψ + Ψ_A)), DeepSpeed's copy of "
        "every frozen parameter under ZeRO-2 (2Ψ again), and the adapters' fp32 master weights and Adam's moments "
        "(12Ψ_A))")
    assert "a resumable checkpoint holds about 7.9 GB" in render_plan(lora)
    assert checkpoint_size(plan_of(sudoku(8, pretrain="no/such-model"))) == ""


@pytest.mark.parametrize("targets,adapters", [
    ("all-linear", QWEN3_ADAPTERS),
    (("q_proj", "v_proj"), 28 * 8 * ((2048 + 2048) + (2048 + 1024))),
])
def test_lora_target_modules_choose_the_adapted_projections(targets, adapters):
    plan = plan_of(sudoku(8, lora_rank=64 if targets == "all-linear" else 8, target_modules=targets))
    assert plan.lora.adapter_parameters == adapters


def test_lora_on_modules_the_price_does_not_know_is_not_priced_and_says_why():
    plan = priced_plan(sudoku(8, lora_rank=16, target_modules=("q_proj", "lm_head")))
    text = render_plan(plan)
    assert "LoRA: rank 16, not priced: --target_modules q_proj lm_head: the price counts adapters on q_proj" in text
    assert "  learner per round: not priced: --target_modules q_proj lm_head" in text
    assert plan.checkpoint is None and checkpoint_size(plan) == ""


def test_oats_default_target_modules_are_the_ones_priced():
    oat_args = pytest.importorskip("oat.args")  # where oat is installed (the node's and the oat tests' environments)
    field = {f.name: f for f in dataclasses.fields(oat_args.OATArgs)}["target_modules"]
    assert tuple(field.default_factory()) == OAT_TARGET_MODULES


def test_the_ppo_script_plan_differs_from_dppos_by_its_trust_region():
    """`gem.sh sudoku ppo --dry-run` printed DPPO's plan: now its trust-region line names PPO's clip range (with an
    override as given), and nothing else differs."""
    dppo = render_plan(priced_plan(sudoku(8))).splitlines()
    ppo = render_plan(priced_plan(script_args("gem.sh", "sudoku", "ppo", "--gpus", "8", "--tr_eps_low", "0.3")))
    differs = [(a, b) for a, b in zip(dppo, ppo.splitlines(), strict=True) if a != b]
    assert differs == [(
        "trust region: --trust_region dppo_binary_tv (DPPO-Binary-TV, rule binary_tv): band δ 0.2 (--tr_delta; the "
        "preset's 0.15); also reads C inf, τ 0",
        "trust region: --trust_region ppo (PPO, rule ratio): band ε_low 0.3 (--tr_eps_low; the preset's 0.2), ε_high "
        "0.2; also reads C inf, τ 0")]


def test_the_docs_sudoku_price_is_what_the_price_computes():
    """docs/engines/oat.md's first run, step 1, and its LoRA section quote the Sudoku price on H200s."""
    from dppo_oat.engines.oat.price import duration

    one, eight = priced_plan(sudoku(1)).price, priced_plan(sudoku(8)).price
    lora = priced_plan(sudoku(8, lora_rank=64))
    full_checkpoint = priced_plan(sudoku(8)).checkpoint[0] / 1e9
    def run(price, expected=False) -> str:
        return duration(price.rounds * (price.expected_round_seconds if expected else price.round_seconds))

    step_1 = (
        f"For Sudoku on 1 H200: at most {duration(one.round_seconds)} per round and {run(one).split(' (')[0]} in "
        f"all (about {duration(one.expected_round_seconds)} and {run(one, True).split(' (')[0]} at the measured mean "
        f"turns), {one.memory.peak / GiB:.1f} GiB; on 8 GPUs at most {run(eight)} (about {run(eight, True)}), "
        f"{eight.memory.peak / GiB:.1f} GiB; with `--lora_rank 64` on 8 GPUs at most {run(lora.price)} (about "
        f"{run(lora.price, True)}), {lora.price.memory.peak / GiB:.1f} GiB, checkpoints of "
        f"{lora.checkpoint[0] / 1e9:.1f} GB instead of {full_checkpoint:.1f} GB.")
    lora_section = (f"Ψ_A = {lora.lora.adapter_parameters / 1e6:.1f}M, {lora.checkpoint[0] / 1e9:.1f} GB; full "
                    f"fine-tuning 14Ψ, {full_checkpoint:.1f} GB")
    page = " ".join((REPO / "docs" / "engines" / "oat.md").read_text().split())
    assert step_1 in page and lora_section in page
    assert f"mean turns per episode with its source (for Sudoku-v0-easy, {SUDOKU_MEAN:.2f}:" in page


@settings(max_examples=60, deadline=None)
@given(wanted=st.integers(1, 40), batch=st.integers(2, 6), limit=st.integers(1, 15), data=st.data(),
       model=st.sampled_from(sorted(SHAPES)), gpu=st.sampled_from(sorted(GPUS)), prompt=st.integers(1, 9000),
       response=st.integers(1, 5000))
def test_the_priced_bound_covers_the_decode_time_of_any_episode_lengths(wanted, batch, limit, data, model, gpu,
                                                                          prompt, response):
    """The bound's calls of k ≤ B running episodes are priced on the chord of the decode roofline from 1 to B
    sequences, C·f(1) + (S − C)·(f(B) − f(1))/(B − 1): no lengths within the limit make an actor step slower."""
    def f(k):
        return decode_seconds(SHAPES[model], GPUS[gpu], k, prompt, response)

    bound = step_calls(wanted, slots(*[limit] * batch))
    priced = bound.bound_calls * f(1) + (bound.bound_sequences - bound.bound_calls) * (f(batch) - f(1)) / (batch - 1)
    spent = samples = 0.0
    while samples < wanted:
        lengths = [data.draw(st.integers(1, limit)) for _ in range(batch)]
        spent += sum(f(sum(length > turn for length in lengths)) for turn in range(max(lengths)))
        samples += sum(lengths)
    assert spent <= priced * (1 + 1e-12)
