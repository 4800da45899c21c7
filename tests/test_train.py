"""The local engine end to end: a short real run (tiny policy, real Sudoku), resume equality, bad input."""

import json
import math
import re

import pytest

import dppo_oat.engines.local.trainer as trainer_module
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.trainer import LocalTrainer, scheduled_lr
from dppo_oat.train import main

TINY_WARM_START = ["--warm-start.demo-episodes", "150", "--warm-start.max-steps", "20", "--warm-start.check-every",
                   "20", "--warm-start.check-episodes", "8", "--warm-start.vocab-size", "300"]
SHORT = ["--groups-per-step", "4", "--group-size", "2", "--minibatch-size", "32", "--eval-episodes", "8",
         "--eval-every", "2", *TINY_WARM_START]
TIMING_KEYS = ("time/", "tokens_per_s/")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("policy-cache"))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_short_run_writes_the_metrics_schema(tmp_path, cache_dir):
    main(["--steps", "2", "--runs-dir", str(tmp_path), "--run-name", "short", "--cache-dir", cache_dir, *SHORT])
    run = tmp_path / "short"
    config = json.loads((run / "config.json").read_text())
    assert config["trust_region"]["name"] == "dppo_binary_tv" and config["trust_region"]["delta"] == 0.15
    assert config["trust_region"]["is_cap"] == "inf" and config["engine"] == "local"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    required = ["reward", "success", "entropy", "response_length", "loss", "grad_norm", "mask/fraction",
                "mask/fraction_pos_adv", "mask/fraction_neg_adv", "mismatch/abs_diff_mean", "bad_update/fraction",
                "is/truncated_fraction", "shadow/ppo/mask_fraction_mu_lt_0.1", "shadow/grpo_clip_higher/mask_fraction",
                "shadow/icepop/mask_fraction", "shadow/seq_geo_mask/mask_fraction_mu_ge_0.5",
                "shadow/seq_geo_mask/sequence_fraction",
                "time/rollout", "time/update", "tokens_per_s/rollout", "tokens_per_s/update"]
    for row in rows:
        assert all(key in row for key in required), set(required) - set(row)
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, (int, float)))
        assert 0 <= row["success"] <= 1 and row["entropy"] > 0
    evals = read_jsonl(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and all(e["eval/episodes"] == 8 for e in evals)
    assert (run / "checkpoint.pt").exists()


SHIPPED = ["--groups-per-step", "4", "--group-size", "4", "--minibatch-size", "32", "--eval-episodes", "8",
           "--eval-every", "2"]
"""Short runs from the shipped warm-started policy (default warm-start settings): it solves some puzzles, so groups
differ and advantages are not all zero."""


def test_a_one_step_run_writes_token_samples(tmp_path):
    """tokens.jsonl: at most --token-samples rows of A ≠ 0 tokens per step, with every field of the schema."""
    main(["--steps", "1", "--runs-dir", str(tmp_path), "--run-name", "one", "--cache-dir", str(tmp_path / "cache"),
          *SHIPPED])
    tokens = read_jsonl(tmp_path / "one" / "tokens.jsonl")
    assert 0 < len(tokens) <= 32 and {t["step"] for t in tokens} == {1}
    fields = {"step", "token", "token_id", "turn", "position", "mu", "pi", "advantage", "entropy", "divergence",
              "masked", "ppo_masked", "grpo_clip_higher_masked", "dppo_masked", "stratum", "weight"}
    assert all(set(t) == fields for t in tokens)
    assert all(0 < t["mu"] <= 1 and 0 < t["pi"] <= 1 and t["entropy"] >= 0 and t["weight"] >= 1 for t in tokens)
    assert all(t["advantage"] != 0 and t["token"] and t["turn"] >= 0 for t in tokens)
    assert not (tmp_path / "one" / "token_exports").exists()  # --token-export is off by default


def test_token_export_all_writes_every_trained_token(tmp_path):
    """``--token-export all``: one file for the step whose records hold every response token the update trained on
    (the step's ``tokens``, one epoch), each with π, μ and the run's mask (the default writes no folder:
    ``test_a_one_step_run_writes_token_samples``)."""
    from dppo_oat.run.token_export import read_token_export

    main(["--steps", "1", "--runs-dir", str(tmp_path), "--run-name", "export", "--cache-dir", str(tmp_path / "cache"),
          "--token-export", "all", *SHIPPED])
    frame = read_token_export(tmp_path / "export")
    row = read_jsonl(tmp_path / "export" / "metrics.jsonl")[0]
    assert set(frame["step"]) == {1} and int(frame["loss_mask"].sum()) == row["tokens"]
    trained = frame[frame["loss_mask"]]
    assert (trained["importance_ratio"] > 0).all() and trained["entropy"].notna().all()
    active = trained[trained["advantages"] != 0]  # mask/fraction: over A ≠ 0 tokens, averaged over minibatches
    assert active["is_masked"].mean() == pytest.approx(row["mask/fraction"], abs=2e-3)


def test_a_model_the_sampling_loop_cannot_run_says_so_and_trains_with_generate(tmp_path, monkeypatch, capsys):
    """A model (or transformers version) whose layers the sampling loop cannot run itself: one note, then a run
    sampled with ``model.generate`` whose μ is π (the first minibatch, before any update, at rounding level)."""
    import dppo_oat.rollout.hf_generator as hf_generator

    monkeypatch.setattr(hf_generator, "runs_direct", lambda model: False)
    main(["--steps", "1", "--runs-dir", str(tmp_path), "--run-name", "generate", "--cache-dir", str(tmp_path / "cache"),
          *SHIPPED])
    assert "rollouts sample with model.generate" in " ".join(capsys.readouterr().out.split())
    row = read_jsonl(tmp_path / "generate" / "metrics.jsonl")[0]
    assert row["mismatch/first_abs_diff_mean"] < 1e-4 and row["tokens_per_s/rollout"] > 0  # before any update
    for name in ("rollout_corr/k3_kl", "rollout_corr/k3_kl_seq", "rollout_corr/chi2_token", "rollout_corr/chi2_seq",
                 "rollout_corr/ppl_ratio", "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/first_k3_kl",
                 "policy/rollout_train_logprobs_abs_diff_mean", "policy/rollout_train_logprobs_abs_diff_std",
                 "policy/rollout_train_logprobs_abs_diff_max", "mismatch/abs_diff_std"):
        assert math.isfinite(row[name]), name  # the mismatch diagnostics, under verl's and SkyRL's names
    assert row["rollout_corr/first_k3_kl"] < 1e-6  # μ = π_θ' at rounding level before any update


@pytest.mark.fault("a kill (`kill -9`)",
                   "`--resume` continues exactly as an uninterrupted run (checkpoints and logs are written "
                   "atomically)")
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, cache_dir):
    """With a linear learning-rate decay too: the rate comes from the step, so a resumed run gets the same ones."""
    common = ["--runs-dir", str(tmp_path), "--cache-dir", cache_dir, "--lr-schedule", "linear", *SHORT]
    main(["--steps", "2", "--run-name", "straight", *common])
    main(["--steps", "1", "--run-name", "killed", *common])  # stops after step 1, as a kill after its checkpoint
    main(["--steps", "2", "--run-name", "killed", "--resume", *common])
    straight = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    resumed = read_jsonl(tmp_path / "killed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2]
    assert [r["lr"] for r in straight] == pytest.approx([3e-4, 1.5e-4])
    for a, b in zip(straight, resumed, strict=True):
        for key, value in a.items():
            if not key.startswith(TIMING_KEYS):
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    straight_tokens = read_jsonl(tmp_path / "straight" / "tokens.jsonl")
    resumed_tokens = read_jsonl(tmp_path / "killed" / "tokens.jsonl")  # step 2 once, the same tokens
    assert [(t["step"], t["token_id"], t["position"]) for t in resumed_tokens] == \
        [(t["step"], t["token_id"], t["position"]) for t in straight_tokens]


@pytest.mark.fault("a kill (`kill -9`) of a run with `--max-staleness k`",
                   "`--resume` continues exactly as an uninterrupted run: the checkpoint keeps the older weights the "
                   "next rollouts sample with")
def test_stale_rollouts_follow_their_schedule_and_resume_exactly(tmp_path, capsys):
    """--max-staleness 2: the rollout of step t samples with the weights after step max(0, t − 3), whatever the
    threads' timing; a run stopped after step 2 (its rollout of step 3 pending) and resumed is the uninterrupted run
    token for token, and resuming it as a synchronous run is refused."""
    synchronous = ["--runs-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache"), "--lr-schedule", "constant",
                   "--minibatches-per-rollout", "2", *SHIPPED]
    common = [*synchronous, "--max-staleness", "2"]
    main(["--steps", "4", "--run-name", "straight", *common])
    main(["--steps", "2", "--run-name", "killed", *common])
    main(["--steps", "4", "--run-name", "killed", "--resume", *common])
    straight = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    assert [r["staleness/mean"] for r in straight] == [0, 1, 2, 2] == [r["staleness/max"] for r in straight]
    assert all(r["time/rollout_wait"] >= 0 for r in straight)
    # μ before the first update is π; later, μ is older weights than the π the update starts from
    assert straight[0]["mismatch/first_abs_diff_mean"] < 1e-4 < straight[1]["mismatch/first_abs_diff_mean"]
    resumed = read_jsonl(tmp_path / "killed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(TIMING_KEYS)} == \
            {k: v for k, v in b.items() if not k.startswith(TIMING_KEYS)}
    for name in ("tokens.jsonl", "eval.jsonl"):
        assert read_jsonl(tmp_path / "killed" / name) == read_jsonl(tmp_path / "straight" / name)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--steps", "5", "--run-name", "killed", "--resume", *synchronous])
    assert "max_staleness: 2 → 0" in " ".join(capsys.readouterr().err.split())


def test_learning_rate_schedules():
    assert [scheduled_lr(1e-3, "constant", t, 4) for t in (1, 4)] == [1e-3, 1e-3]
    assert [scheduled_lr(1e-3, "linear", t, 4) for t in (1, 2, 3, 4)] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    with pytest.raises(ValueError, match="schedule"):
        scheduled_lr(1e-3, "cosine", 1, 4)


def test_probe_pool_and_shared_warm_start(tmp_path, cache_dir):
    """--probe-every logs binary ≤ top-K ≤ exact divergences; --train-pool draws puzzles from [0, pool);
    --warm-start.seed lets RL seeds share one cached policy."""
    common = ["--steps", "2", "--runs-dir", str(tmp_path), "--cache-dir", cache_dir, "--probe-every", "1",
              "--train-pool", "3", "--rollout-dtype", "bfloat16", "--warm-start.seed", "0", *SHORT]
    main(["--run-name", "seed1", "--seed", "1", *common])
    main(["--run-name", "seed2", "--seed", "2", *common])
    from pathlib import Path

    assert len(list((Path(cache_dir) / "policies").glob("tiny-*"))) == 1  # every test here warm-starts with seed 0
    for name in ("seed1", "seed2"):
        for row in read_jsonl(tmp_path / name / "metrics.jsonl"):
            for d in ("tv", "kl"):
                binary, topk, exact = (row[f"probe/{e}_{d}_mean"] for e in ("binary", "topk", "exact"))
                assert 0 <= binary <= topk + 1e-6 and topk <= exact + 1e-6
            assert exact > 0  # a bf16 rollout copy differs from the fp32 learner even before any update
    from dppo_oat.engines.local.seeds import train_group_seeds

    assert all(0 <= s < 3 for step in range(1, 50) for s in train_group_seeds(1, step, 4, pool=3))


@pytest.mark.parametrize("preset", ["seq_geo_mask", "decoupled_ppo", "dppo_binary_tv_kl"])
def test_mismatch_presets_run_a_step(tmp_path, cache_dir, preset):
    """The mismatch fixes of other frameworks run in the local engine (π_θ' recomputed where they read it), here
    with a bf16 rollout so that π_θ' ≠ μ."""
    main(["--steps", "1", "--runs-dir", str(tmp_path), "--run-name", preset, "--cache-dir", cache_dir,
          "--trust-region", preset, "--rollout-dtype", "bfloat16", *SHORT])
    config = json.loads((tmp_path / preset / "config.json").read_text())
    assert config["trust_region"]["name"] == preset
    (row,) = read_jsonl(tmp_path / preset / "metrics.jsonl")
    assert all(math.isfinite(v) for v in row.values() if isinstance(v, (int, float)))
    assert 0 <= row["mask/fraction"] <= 1 and 0 <= row["shadow/seq_geo_mask/sequence_fraction"] <= 1


@pytest.mark.parametrize("preset", ["drpo", "cppo", "m2po"])
def test_later_presets_run_a_step(tmp_path, cache_dir, preset):
    """DRPO, CPPO (top-K: the rollout returns μ's top 20) and M2PO train in the local engine and log their own
    metrics."""
    main(["--steps", "1", "--runs-dir", str(tmp_path), "--run-name", preset, "--cache-dir", cache_dir,
          "--trust-region", preset, "--minibatches-per-rollout", "2", *SHORT])
    (row,) = read_jsonl(tmp_path / preset / "metrics.jsonl")
    assert all(math.isfinite(v) for v in row.values() if isinstance(v, (int, float)))
    prefix = {"drpo": "drpo/weight_mean", "cppo": "cppo/delta_b_mean", "m2po": "m2po/m2_before"}[preset]
    assert prefix in row and 0 <= row["mask/fraction"] <= 1


def test_a_finished_run_is_not_overwritten(tmp_path, cache_dir):
    main(["--steps", "1", "--runs-dir", str(tmp_path), "--run-name", "done", "--cache-dir", cache_dir, *SHORT])
    with pytest.raises(SystemExit):
        main(["--steps", "1", "--runs-dir", str(tmp_path), "--run-name", "done", "--cache-dir", cache_dir, *SHORT])


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"env_ids": ("game:Sudoku-v9",)}, "unknown env id 'game:Sudoku-v9'"),
        ({"tr_delta": 0.0}, "delta"),
        ({"trust_region": "dppo_topk_tv", "tr_k": 100000}, "exceeds the policy's vocabulary"),
        ({"env_ids": ("local-math:/no/such/data",)}, "does not exist"),
        ({"runs_dir": "/proc/no-such-dir"}, "not writable"),
        ({"resume": True, "run_name": "never-ran"}, "no checkpoint"),
        ({"steps": 0}, "--steps"),
        ({"pretrain": "./not-a-model"}, "not a model directory"),
        ({"prompt_template": "llama"}, "unknown prompt template"),
        ({"generator": "vllm", "temperature": 0.7}, "vLLM"),
        ({"wrappers": ("concat",)}, "--wrappers needs --pretrain"),
        ({"temperature": 0.0}, "greedy decoding has no μ"),
        ({"max_staleness": -1}, "--max-staleness must be >= 0"),
        ({"max_staleness": 1, "generator": "vllm"}, "only the HF generator"),
        ({"max_staleness": 1, "probe_every": 2}, "leave it out with --max-staleness"),
    ],
)
def test_bad_input_fails_before_any_model_is_built(tmp_path, monkeypatch, overrides, message):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the input was validated")

    monkeypatch.setattr(trainer_module, "load_or_build_tiny_policy", no_model)
    monkeypatch.setattr(trainer_module, "load_pretrained", no_model)
    config = TrainConfig(**{"runs_dir": str(tmp_path), **overrides})
    with pytest.raises(ValueError, match=message):
        LocalTrainer(config)


def test_unknown_preset_is_rejected_by_the_cli(capsys):
    with pytest.raises(SystemExit):
        main(["--trust-region", "dpo"])
    assert "dpo" in capsys.readouterr().err


@pytest.mark.parametrize("cpus, load, threads", [
    (2, 0.0, 2), (2, 0.3, 2), (2, 0.6, 1), (2, 1.5, 1), (2, 7.0, 1), (1, 0.0, 1), (16, 3.2, 13), (16, 0.0, 16),
    (8, 8.4, 1), (2, None, 1), (8, None, 4), (1, None, 1)])
def test_the_default_thread_count_is_the_cpus_free_at_the_start(cpus, load, threads):
    """--threads left out: the usable CPUs less the CPUs busy now, rounded, at least 1 and at most the
    CPUs (an idle machine uses every core, a busy one is not oversubscribed: docs/engines/local.md#cpu-threads);
    half the CPUs where the system reports no load."""
    from dppo_oat.engines.local.config import threads_for_free_cpus

    assert threads_for_free_cpus(cpus, load) == threads


def test_the_trainer_gives_torch_the_default_count_and_says_so(tmp_path, monkeypatch, capsys):
    """The count the default chose is the one torch gets, and the run's first lines say it and why; --threads N
    is N; config.json keeps --threads as given (None), which a resume compares."""
    import torch
    from rich.console import Console

    import dppo_oat.engines.local.config as config_module

    before = torch.get_num_threads()
    monkeypatch.setattr(config_module, "usable_cpus", lambda: 6)
    monkeypatch.setattr(config_module, "busy_cpus_now", lambda: 2.2)
    assert TrainConfig(threads=3).torch_threads() == 3
    try:
        trainer = LocalTrainer(TrainConfig(runs_dir=str(tmp_path), run_name="threads", steps=1), Console())
        assert torch.get_num_threads() == 4
        assert json.loads((tmp_path / "threads" / "config.json").read_text())["threads"] is None
        trainer.close(failed=True)
    finally:
        torch.set_num_threads(before)
    assert "torch threads: 4 (the CPUs free at the start: 6 usable, CPUs busy now 2.20" in capsys.readouterr().out


def test_the_cpus_busy_now_are_read_from_the_machines_idle_time(monkeypatch):
    """/proc/stat's idle time over a short sample: work that ended before the run (an install) does not count, as
    it would in the 1-minute load average; where the system cannot tell, the load average answers."""
    import dppo_oat.engines.local.config as config_module

    samples = iter(["cpu  100 0 100 800 0 0 0 0 0 0\n", "cpu  150 0 150 900 0 0 0 0 0 0\n"])  # half busy

    class Stat:
        def __init__(self, path):
            assert path == "/proc/stat"

        def read_text(self):
            return next(samples)

    monkeypatch.setattr(config_module, "Path", Stat)
    monkeypatch.setattr(config_module.os, "cpu_count", lambda: 4)
    assert config_module.busy_cpus_now(seconds=0) == pytest.approx(2.0)
    assert config_module.cpu_times("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 1 1 1 1 1 1 1\n") == (9, 36)
    monkeypatch.setattr(config_module, "busy_cpus_now", lambda: None)
    monkeypatch.setattr(config_module, "one_minute_load", lambda: 0.4)
    monkeypatch.setattr(config_module, "usable_cpus", lambda: 2)
    assert config_module.resolved_threads(None) == (
        2, "torch threads: 2 (the CPUs free at the start: 2 usable, 1-minute load 0.40; --threads N pins the count)")


# --------------------------------------------------------------------------------------------- band calibration

CALIBRATE = ["--trust-region", "gspo", "--tr-calibrate", "0.05", *SHIPPED]
"""GSPO's band (ε 3e-4 / 4e-4, tuned at another scale) blocks about a third of the shipped policy's first batch;
calibrated, 5%."""


def test_calibration_records_its_band_and_a_resume_reuses_it(tmp_path, capsys):
    """``--tr-calibrate``: step 1 trains with the preset's band, then the band is set on step 1's batch and recorded
    in config.json, and step 2 trains with it; a resumed run reads the band back (no new calibration) and continues
    exactly as the uninterrupted run; the offline command finds the same band on step 1's token export."""
    from dppo_oat.calibrate import main as calibrate_main

    common = ["--runs-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache"), *CALIBRATE]
    main(["--steps", "2", "--run-name", "straight", "--token-export", "all", *common])
    assert capsys.readouterr().out.count("calibrated gspo: ε_low 0.0003 → ") == 1
    main(["--steps", "1", "--run-name", "killed", *common])
    main(["--steps", "2", "--run-name", "killed", "--resume", *common])
    assert "calibrated" not in capsys.readouterr().out.split("resumed")[-1]
    straight = json.loads((tmp_path / "straight" / "config.json").read_text())
    record, tr = straight["calibration"], straight["trust_region"]
    assert record["step"] == 1 and record["target"] == 0.05 and record["band"] == "clip_range"
    assert record["before"] == {"eps_low": 3e-4, "eps_high": 4e-4} and record["after"]["eps_high"] > 1e-2
    assert (tr["eps_low"], tr["eps_high"]) == (record["after"]["eps_low"], record["after"]["eps_high"])
    assert abs(record["achieved"] - 0.05) < 0.01 and record["before_fraction"] > 0.2
    resumed = json.loads((tmp_path / "killed" / "config.json").read_text())
    assert resumed["calibration"] == record and resumed["trust_region"] == tr
    rows = [read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("straight", "killed")]
    assert rows[0][0]["mask/fraction"] > 0.2 > rows[0][1]["mask/fraction"]  # step 1 the preset's band, 2 calibrated
    for a, b in zip(*rows, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(TIMING_KEYS)} == \
            pytest.approx({k: v for k, v in b.items() if not k.startswith(TIMING_KEYS)}, rel=1e-5, abs=1e-7)
    calibrate_main([str(tmp_path / "straight"), "--trust-region", "gspo", "--target", "0.05", "--json"])
    offline = json.loads(capsys.readouterr().out)
    assert offline["after"] == record["after"] and offline["achieved"] == record["achieved"]


HELD_BEFORE_UPDATE = ["--trust-region", "dppo_binary_tv", "--rollout-dtype", "bfloat16", "--groups-per-step", "4",
                      "--group-size", "4", "--minibatch-size", "10000", "--eval-episodes", "8", "--eval-every", "2"]
"""One optimizer step per rollout batch, sampled by a bfloat16 copy: π_θ ≠ μ before the update, so the band is set on
the step's own loss calls before it."""
HELD_AFTER_UPDATE = ["--trust-region", "gspo", *SHIPPED]
"""On-policy, several optimizer steps per batch: π_θ = μ before the update, so the band is set on the update's own
loss calls and holds from the next step."""
BLOCKED_SHARE_TOLERANCE = 0.002
"""How near the target a band set on the step's own batch blocks: the mask is a step function over ~1,450 A ≠ 0
tokens (one token is 0.0007), and the band search stops at the token nearest the target."""


@pytest.mark.parametrize("flags, before_update", [(HELD_BEFORE_UPDATE, True), (HELD_AFTER_UPDATE, False)])
def test_a_held_band_is_set_at_every_step_and_a_resume_restores_it_exactly(tmp_path, capsys, flags, before_update):
    """``--tr-calibrate 0.05 --tr-calibrate-every 1``: each step logs the band it trained with and the step whose
    batch set it. Where π_θ ≠ μ before the update, every step (the first too) blocks the target; where π_θ = μ
    there, step 1 trains at the preset's band and each later step at the band of the step before. A run killed after
    step 1 resumes with the band its checkpoint kept: its metrics equal the uninterrupted run's."""
    common = ["--runs-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache"), "--tr-calibrate", "0.05",
              "--tr-calibrate-every", "1", *flags]
    main(["--steps", "2", "--run-name", "straight", *common])
    main(["--steps", "1", "--run-name", "killed", *common])
    main(["--steps", "2", "--run-name", "killed", "--resume", *common])
    assert capsys.readouterr().out.count("set again every 1 step(s)") == 3  # the first band each command sets
    rows = [read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("straight", "killed")]
    for a, b in zip(*rows, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(TIMING_KEYS)} == \
            pytest.approx({k: v for k, v in b.items() if not k.startswith(TIMING_KEYS)}, rel=1e-5, abs=1e-7)
    first, second = rows[0]
    moved = "band/delta" if before_update else "band/eps_high"
    assert second[moved] != first[moved]
    if before_update:
        assert [row["band/set_on_step"] for row in rows[0]] == [1.0, 2.0]
        assert all(abs(row["mask/fraction"] - 0.05) <= BLOCKED_SHARE_TOLERANCE for row in rows[0])
    else:
        assert [row["band/set_on_step"] for row in rows[0]] == [0.0, 1.0]
        assert (first["band/eps_low"], first["band/eps_high"]) == (3e-4, 4e-4)  # gspo's own band on step 1
    assert "calibration" not in json.loads((tmp_path / "straight" / "config.json").read_text())


@pytest.mark.fault("`--tr-calibrate` with a target no band reaches on the first step's batch, or on a batch whose "
                   "π_θ is μ (one optimizer step per rollout batch, no mismatch)",
                   "one line at the end of step 1 naming the fractions any band blocks there, or what gives the batch "
                   "several optimizer steps (exit 1); nothing is left of the run")
@pytest.mark.parametrize("flags, message", [
    (["--trust-region", "ppo", "--tr-calibrate", "0.95"],
     "--tr-calibrate 0.95 at step 1: no band of ppo blocks 0.95 of this batch's A ≠ 0 tokens: any ε_low/ε_high "
     "blocks between 0 and"),
    (["--tr-calibrate", "0.01", "--minibatch-size", "10000"],
     "--tr-calibrate 0.01 at step 1: π_θ equals μ on the step's batch up to rounding, so no band blocks a token that "
     "moved: give each rollout batch several optimizer steps (--minibatches-per-rollout 4"),
])
def test_a_calibration_the_first_batch_cannot_give_ends_the_run_in_one_line(tmp_path, capsys, flags, message):
    argv = ["--steps", "2", "--runs-dir", str(tmp_path), "--run-name", "far", "--cache-dir", str(tmp_path / "cache"),
            *SHIPPED, *flags]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert exit_.value.code == 1 and len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "far").exists()


@pytest.mark.fault("`--tr-calibrate` / `--tr-calibrate-like` the run cannot use (a target outside [0, 1), a preset "
                   "without a band, both flags, a preset to match whose mask reads what the run does not compute, "
                   "a `--tr-calibrate-band` the rule lacks)",
                   "one line naming the flag, before any model")
@pytest.mark.parametrize("overrides, message", [
    ({"tr_calibrate": 1.5}, "--tr-calibrate: a calibration target is the fraction of tokens to block, in [0, 1)"),
    ({"trust_region": "pg_is", "tr_calibrate": 0.01}, "--tr-calibrate: trust region pg_is has no band to calibrate"),
    ({"tr_calibrate": 0.01, "tr_calibrate_like": "ppo"}, "--tr-calibrate, --tr-calibrate-like: calibration takes"),
    ({"tr_calibrate_unit": "sequence"}, "--tr-calibrate-unit: calibration takes a target fraction or a preset"),
    ({"tr_calibrate_like": "dppo_topk_kl"}, "--tr-calibrate-like: the mask of dppo_topk_kl reads μ's top-K set"),
    ({"tr_calibrate_like": "vaco"}, "--tr-calibrate-like: the mask of vaco reads the recomputed π_θ'"),
    ({"tr_calibrate": 0.01, "tr_calibrate_band": "both"},
     "--tr-calibrate, --tr-calibrate-band: trust region dppo_binary_tv has no band 'both' to calibrate"),
    ({"tr_calibrate_band": "both"}, "--tr-calibrate-band: calibration takes a target fraction or a preset"),
    ({"tr_calibrate": 0.01, "tr_calibrate_every": 0},
     "--tr-calibrate, --tr-calibrate-every: the band is set again every N >= 1 RL steps, got 0"),
    ({"tr_calibrate_every": 2}, "--tr-calibrate-every: calibration takes a target fraction or a preset"),
])
def test_calibration_flags_are_refused_before_any_model_is_built(tmp_path, no_model, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        LocalTrainer(TrainConfig(**{"runs_dir": str(tmp_path), **overrides}))
    assert "\n" not in str(error.value) and not any(tmp_path.iterdir())
