"""The CPU-testable logic of ``scripts/bench/oat_learner_step.py --device cuda`` (which needs oat, DeepSpeed and a GPU
to run): its FLOP count against torch's own FLOP counter, the GPU set-up's choices, the import stand-ins for vLLM and
``pyarrow.plasma`` (tests/oat/import_stand_ins), and the docs table's line of its row."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dppo_oat.models.tiny import build_tiny_model, tiny_qwen3_config

ROOT = Path(__file__).resolve().parents[1]


def load(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(ROOT / "scripts" / "bench"))
bench = load("scripts/bench/oat_learner_step.py")
setup = load("scripts/bench/oat_gpu_setup.py")


def qwen3(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, tied=True):
    config = tiny_qwen3_config(vocab, pad_token_id=0, eos_token_id=1, bos_token_id=1, hidden_size=hidden,
                               num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                               head_dim=head_dim, intermediate_size=3 * hidden, tie_word_embeddings=tied)
    config._attn_implementation = "eager"  # every product a visible matmul for the counter
    return build_tiny_model(config, seed=0)


def test_the_shape_counts_every_decoder_weight_once_and_the_tied_head_apart():
    model = qwen3()
    shape = bench.model_shape(model)
    hidden, head_dim, layers = 64, 16, 2
    per_layer = (hidden * head_dim * (4 + 4 + 2 + 2)  # q, o (4 heads) and k, v (2 heads)
                 + 3 * hidden * 3 * hidden  # gate, up, down
                 + 2 * hidden + 2 * head_dim)  # two RMSNorms, q_norm and k_norm
    assert shape["decoder_parameters"] == layers * per_layer + hidden  # + the final norm
    assert shape["head_parameters"] == 512 * 64 and shape["attention_width"] == 64


def test_a_no_grad_forward_counts_what_torch_counts_less_the_causal_half_of_attention():
    """torch's counter sees the full [s, s] score and value products (4·L·width·s per token); the formula counts
    the causal half. Norm weights are in N_dec but are no matmul: well under 1% here."""
    model, rows, length = qwen3(), 3, 24
    ids = torch.randint(0, 512, (rows, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    shape = bench.model_shape(model)
    counts = {"decoder_tokens_no_grad": rows * length, "lm_head_rows_no_grad": rows * length}
    ours = bench.step_flops(counts, shape, length)
    causal_half = 2 * shape["layers"] * shape["attention_width"] * length * rows * length
    assert ours + causal_half == pytest.approx(counter.get_total_flops(), rel=5e-3)


def test_a_step_with_grad_counts_three_times_its_forward():
    model, rows, length = qwen3(), 2, 16
    ids = torch.randint(0, 512, (rows, length), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    shape = bench.model_shape(model)
    counts = {"decoder_tokens_grad": rows * length, "lm_head_rows_grad": rows * length}
    causal_half = 6 * shape["layers"] * shape["attention_width"] * length * rows * length
    # torch's backward skips the embedding lookup's weight (no matmul); the head's weight gradient is counted
    assert bench.step_flops(counts, shape, length) + causal_half == pytest.approx(counter.get_total_flops(), rel=1e-2)


def test_mfu_is_each_learners_flops_at_its_median_time_over_the_peak():
    shape = {"decoder_parameters": 100, "head_parameters": 10, "layers": 1, "attention_width": 2}
    counts = {"decoder_tokens_grad": 4, "decoder_tokens_no_grad": 2, "lm_head_rows_grad": 3, "lm_head_rows_no_grad": 1}
    flops = 6 * (100 + 1 * 2 * 8) * 4 + 2 * (100 + 16) * 2 + 6 * 10 * 3 + 2 * 10 * 1
    assert bench.step_flops(counts, shape, 8) == flops
    pairs = [{"ppo": {**counts, "seconds": s}, "dppo": {**counts, "seconds": s / 2}} for s in (1.0, 3.0, 2.0)]
    facts = {"shape": shape, "gpu": {"peak_flops": 1000.0}}
    result = bench.learner_mfu(pairs, facts, 8)
    assert result["ppo"]["mfu"] == pytest.approx(flops / 2.0 / 1000) and result["dppo"]["achieved_flops"] == flops
    assert bench.learner_mfu(pairs, {**facts, "gpu": {"peak_flops": None}}, 8)["ppo"]["mfu"] is None


def test_attention_is_flash_where_installed_else_sdpa():
    assert setup.attention_implementation(True) == "flash_attention_2"
    assert setup.attention_implementation(False) == "sdpa"


def test_library_headers_come_from_pip_packages_only_when_the_toolkit_lacks_them(tmp_path):
    toolkit, site = tmp_path / "cuda", tmp_path / "site-packages"
    (toolkit / "include").mkdir(parents=True)
    for folder, header in (("cu13", "cusparse.h"), ("cublas", "cublas_v2.h"), ("nccl", "nccl.h")):
        (site / "nvidia" / folder / "include").mkdir(parents=True)
        (site / "nvidia" / folder / "include" / header).write_text("")
    found = setup.header_dirs_for_extensions(str(toolkit), [str(site)])
    assert found == [str(site / "nvidia" / "cu13" / "include"), str(site / "nvidia" / "cublas" / "include")]
    for header in setup.EXTENSION_HEADERS:
        (toolkit / "include" / header).write_text("")
    assert setup.header_dirs_for_extensions(str(toolkit), [str(site)]) == []


STAND_IN_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("stand_ins", sys.argv[1] + "/stand_ins.py")
stand_ins = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stand_ins)
stood_in = stand_ins.install()
import vllm
from vllm.lora.request import LoRARequest
from pyarrow import plasma
errors = []
for make in (lambda: vllm.SamplingParams(n=1), lambda: vllm.LLM(model="x"), lambda: LoRARequest("a", 1, "p"),
             lambda: plasma.connect("/tmp/x")):
    try:
        make()
    except RuntimeError as error:
        errors.append(str(error))
print(json.dumps({"stood_in": stood_in, "version": vllm.__version__, "errors": errors}))
"""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed: nothing stands in")
def test_the_import_stand_ins_serve_oats_imports_and_fail_in_one_line_on_use():
    pytest.importorskip("pyarrow")
    done = subprocess.run([sys.executable, "-c", STAND_IN_PROBE, str(ROOT / "tests" / "oat" / "import_stand_ins")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["stood_in"][0] == "vllm" and result["version"] == "0.8.4"
    assert len(result["errors"]) == 4 and all("stand-in" in error and "\n" not in error for error in result["errors"])


def test_the_docs_table_reads_an_oat_learner_row(tmp_path):
    tables = load("scripts/docs_tables.py")
    row = {"bench": "oat_learner_step", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0",
           "commit": "0123456789ab", "date": "2026-11-27T00:00:00+00:00", "smoke": False,
           "dppo_vs_ppo_step_time": 0.71, "peak_mem_total_gib": {"ppo": 40.2, "dppo": 35.1},
           "learners": {"ppo": {"mfu": 0.31}, "dppo": {"mfu": 0.36}}, "deepspeed": "0.16.8", "attention": "sdpa",
           "fused_adam": {"compiled": True, "error": None},
           "config": {"hidden": 2048, "layers": 28, "sequences": 16, "prompt_tokens": 512, "response_tokens": 1536}}
    (tmp_path / "oat_learner_step_h200.jsonl").write_text(json.dumps(row) + "\n")
    line = next(r for r in tables.gpu_rows_table(tmp_path).splitlines() if r.startswith("| `oat_learner_step`"))
    assert "NVIDIA H200: DPPO ÷ PPO step time 0.71 (H 2048, 28 layers, 16 × 512 + 1536 tokens)" in line
    assert "MFU 0.310 / 0.360 (PPO / DPPO); FusedAdam compiled, DeepSpeed 0.16.8, sdpa attention (0123456)" in line


def test_a_profile_counts_the_devices_kernels_once_and_ranks_host_ops_by_the_kernels_they_launched():
    from types import SimpleNamespace

    def event(key, device_type, host_us, device_us, count=1):
        return SimpleNamespace(key=key, count=count, device_type=f"DeviceType.{device_type}",
                               self_cpu_time_total=host_us, self_device_time_total=device_us)

    events = [event("aten::mm", "CPU", 100.0, 3000.0, 10), event("aten::copy_", "CPU", 900.0, 500.0, 40),
              event("sm90_gemm_kernel", "CUDA", 0.0, 3000.0, 10), event("copy_kernel", "CUDA", 0.0, 500.0, 40)]
    summary = bench.profile_summary(events, wall_seconds=0.01, on_gpu=True)
    assert summary["device_busy_seconds"] == pytest.approx(0.0035)  # the kernels alone, not again through their ops
    assert summary["device_busy_fraction"] == pytest.approx(0.35)
    assert [row["op"] for row in summary["top"]] == ["aten::mm", "aten::copy_"]
    assert summary["top"][0] == {"op": "aten::mm", "calls": 10, "own_device_ms": 3.0, "own_host_ms": 0.1}
    on_cpu = bench.profile_summary(events[:2], wall_seconds=0.01, on_gpu=False)
    assert on_cpu["device_busy_fraction"] is None and on_cpu["top"][0]["op"] == "aten::copy_"


@pytest.mark.parametrize("sizes, message", [
    (dict(micro_batch=0), "--micro-batch must be at least 1, got 0"),
    (dict(dppo_micro_batch=0), "--dppo-micro-batch must be at least 1, got 0"),
    (dict(dppo_micro_batch=3), "--minibatch must be a multiple of --dppo-micro-batch"),
    (dict(minibatch=3), "--sequences must be a multiple of --minibatch"),
])
def test_the_bench_refuses_sizes_it_cannot_split_in_one_line(sizes, message):
    from types import SimpleNamespace

    args = SimpleNamespace(**{"sequences": 16, "minibatch": 8, "micro_batch": 1, "dppo_micro_batch": None,
                              "group_size": 4, **sizes})
    with pytest.raises(SystemExit, match=message):
        bench.check_sizes(args)
    assert bench.micro_batch("ppo", args) == args.micro_batch
