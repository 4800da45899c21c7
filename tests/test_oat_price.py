"""The oat engine's price before launch (``--dry_run``): time per learning round and for the run, and the learner's
memory per GPU, each with its source. Arithmetic on the arguments and the committed GPU rows: no oat, GPU or model
needed, so these run in the main suite. The GPU scripts' own flags are read by running them with ``PYTHON=echo``."""

import json
import math
import os
import re
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from dppo_oat.engines.oat.plan import check_plan, priced_plan, render_plan
from dppo_oat.engines.oat.price import (
    GPUS,
    MEASURED_LEARNER,
    MEASURED_SETTING,
    SHAPES,
    ModelShape,
    check_price_flags,
    learner_flops,
    learner_seconds,
    resolve_gpu,
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
    assert re.search(r"\n  actors per round: at most [\d.]+ (s|min): \d+ generate call", text)
    assert "an assumed vLLM efficiency (not measured: vLLM has not run on a GPU here" in text
    assert re.search(r"\n  learner per round: at most [\d.]+ (s|min): [\d.]+ PFLOP", text)
    assert "NVIDIA H200, commit 318a79e, docs/bench/oat_learner_step_h200.jsonl" in text
    assert re.search(r"\n  run: at most [\d.]+ h.*: 507 learning round\(s\) × ", text)
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


def test_the_actor_time_is_the_decode_roofline_over_the_assumed_efficiency_by_hand():
    """Sudoku on 1 GPU: Gem's 2 episodes at a time, so 128 turn samples are 64 generate calls of 2 sequences; each
    of the 4,096 decode steps reads the bf16 weights (the tied head once) and every sequence's keys and values."""
    weights = 2 * (QWEN3_DECODER + QWEN3_HEAD)
    kv_per_token = 2 * 28 * 8 * 128 * 2
    context = 4096 * 8704 + 4096 * 4095 // 2  # tokens of context summed over the decode steps of a sequence
    call = (4096 * weights + 2 * context * kv_per_token) / 4.8e12
    price = priced_plan(sudoku(1)).price
    assert price.actor_seconds == pytest.approx(64 * call / 0.5, rel=1e-12)
    assert "64 generate call(s) of 2 sequence(s) × 4,096 tokens" in price.actor_note
    slower = priced_plan(sudoku(1, price_decode_efficiency=0.25)).price
    assert slower.actor_seconds == pytest.approx(2 * price.actor_seconds, rel=1e-12)
    assert priced_plan(sudoku(8)).price.actor_seconds == pytest.approx(8 * call / 0.5, rel=1e-12)


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
