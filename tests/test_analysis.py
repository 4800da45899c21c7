"""Run loading, labels, smoothing and seed aggregation of ``dppo_oat.analysis``, on small run directories written
here in the trainers' format (:func:`write_run`; ``test_plot`` and ``test_notebooks`` use the same writers)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.ndimage import gaussian_filter1d

from dppo_oat.analysis import (
    PANELS,
    aggregate_seeds,
    available_panels,
    compare_methods,
    comparison_notes,
    disagreements,
    label_runs,
    load_run,
    load_runs,
    load_tokens,
    masked_by_bucket,
    shadow_notes,
    shadow_summary,
    smooth,
    summarize_runs,
    token_step_metrics,
    top_clipped_side_by_side,
    top_clipped_tokens,
    top_disagreement_tokens,
)
from dppo_oat.analysis.runs import mixed_settings, resolve_run_dirs, run_patterns, variant_name

ENV = "game:Sudoku-v0-easy"
SHADOW_BUCKETS = ("mu_lt_0.1", "mu_0.1_0.5", "mu_ge_0.5")
# how each synthetic preset behaves: final reward, and whether its mismatch grows until it collapses
BEHAVIOUR = {"dppo_binary_tv": (0.9, False), "grpo_clip_higher": (0.6, False), "cispo": (0.7, True)}
EXAMPLE_RUNS = Path(__file__).resolve().parents[1] / "notebooks" / "example_runs"
TOKENS = (" the", " \\(", "1", "Let", ",", "Wait", " +", "4", " =", "Since", " so", "\n\n")


# --------------------------------------------------------------------------------------------- run writers


def synthetic_metrics(algo: str, seed: int, steps: int) -> list[dict]:
    """Per-step metric rows with every key the trainers log: a saturating reward, collapsing for an unstable
    preset (mismatch and bad updates growing), noise fixed by ``seed``. For tests only."""
    final, collapses = BEHAVIOUR.get(algo, (0.5, False))
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        progress = 1 - math.exp(-step / (steps / 4))
        collapse = max(0.0, step / steps - 0.6) * 2.5 if collapses else 0.0
        reward = final * progress * (1 - collapse) + rng.normal(0, 0.04)
        mismatch = 0.01 + (0.2 * collapse if collapses else 0.002 * rng.random())
        row = {
            "step": step, "wall_time": 2.0 * step, "reward": reward, "success": float(np.clip(reward, 0, 1)),
            "entropy": 0.8 - 0.3 * progress + rng.normal(0, 0.01), "response_length": 40 + 10 * progress,
            "loss": rng.normal(0, 0.1), "grad_norm": 1 + rng.random(), "time/rollout": 1.5, "time/update": 0.5,
            "tokens_per_s/rollout": 900.0, "tokens_per_s/update": 2500.0, "tokens": 4096,
            "mask/fraction": 0.02, "mask/fraction_pos_adv": 0.015 + 0.005 * rng.random(),
            "mask/fraction_neg_adv": 0.025 + 0.005 * rng.random(), "mismatch/abs_diff_mean": mismatch,
            "mismatch/abs_diff_max": 10 * mismatch, "bad_update/fraction": 0.001 + 0.02 * collapse,
            "is/truncated_fraction": 0.01 if algo == "cispo" else 0.0, "ratio/mean": 1.0,
            "divergence/mean": mismatch, "divergence/max": 5 * mismatch,
        }
        for preset, scale in (("ppo", 1.2), ("grpo_clip_higher", 1.0)):
            buckets = dict(zip(SHADOW_BUCKETS, (0.12 * scale, 0.03 * scale, 0.004 * scale), strict=True))
            row[f"shadow/{preset}/mask_fraction"] = 0.04 * scale
            row.update({f"shadow/{preset}/mask_fraction_{b}": v + 0.01 * rng.random() for b, v in buckets.items()})
        rows.append(row)
    return rows


def synthetic_tokens(seed: int, steps: int, per_step: int = 40) -> list[dict]:
    """Per-token rows of ``tokens.jsonl`` whose masks follow the PPO ratio clip and DPPO's TV rule. For tests only."""
    rng = np.random.default_rng(100 + seed)
    rows = []
    for step in range(1, steps + 1, max(1, steps // 5)):
        for _ in range(per_step):
            mu = float(rng.beta(0.5, 0.5))
            pi = float(np.clip(mu * math.exp(rng.normal(0, 0.4)), 1e-6, 1.0))
            advantage = float(rng.choice([-1.0, 1.0]))
            ratio = pi / mu
            rows.append({
                "step": step, "token": str(rng.choice(TOKENS)), "mu": mu, "pi": pi, "advantage": advantage,
                "entropy": float(rng.gamma(2.0, 0.3) * (1.5 - mu)),
                "ppo_masked": bool((advantage > 0 and ratio > 1.28) or (advantage < 0 and ratio < 0.8)),
                "dppo_masked": bool(abs(pi - mu) > 0.15 and (ratio > 1) == (advantage > 0)),
            })
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """One JSON object per line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_run(
    root: Path, name: str, *, algo: str = "dppo_binary_tv", env: str = ENV, seed: int = 0, steps: int = 30,
    metrics: list[dict] | None = None, drop: tuple[str, ...] = (), eval_every: int = 5, tokens: bool = False,
    trust_region: dict | None = None,
) -> Path:
    """A run directory as the trainers write it: config.json, metrics.jsonl (keys in ``drop`` left out),
    eval.jsonl, and optionally tokens.jsonl. Returns its path."""
    run = root / name
    run.mkdir(parents=True)
    tr = {"rule": "binary_tv", "delta": 0.15, "eps_low": 0.2, "eps_high": 0.28, "is_cap": "inf",
          "anchor": "behavior", "alpha": 0.1, "relax": "none", "k": 20, **(trust_region or {})}
    config = {"run_name": name, "engine": "local", "algo": algo, "trust_region": tr, "env_ids": [env],
              "seed": seed, "lr": 1e-6}
    (run / "config.json").write_text(json.dumps(config), encoding="utf-8")
    rows = metrics if metrics is not None else synthetic_metrics(algo, seed, steps)
    write_jsonl(run / "metrics.jsonl", [{k: v for k, v in row.items() if k not in drop} for row in rows])
    evals = [{"step": r["step"], "eval/success": r["success"], "eval/return": r["reward"], "eval/episodes": 32}
             for r in rows if r["step"] % eval_every == 0 and "success" in r]
    write_jsonl(run / "eval.jsonl", evals)
    if tokens:
        write_jsonl(run / "tokens.jsonl", synthetic_tokens(seed, len(rows)))
    return run


def write_synthetic_runs(root: Path, *, tokens: bool = True, steps: int = 60) -> list[Path]:
    """DPPO-Binary-TV, GRPO-ClipHigher and CISPO on one env, two seeds each (tokens.jsonl for seed 0)."""
    paths = []
    for algo in BEHAVIOUR:
        overrides = {"rule": "ratio"} if algo == "grpo_clip_higher" else {"rule": "none", "is_cap": 3.0}
        overrides = {} if algo.startswith("dppo") else overrides
        for seed in (0, 1):
            paths.append(write_run(root, f"{algo}-s{seed}", algo=algo, seed=seed, steps=steps,
                                   tokens=tokens and seed == 0, trust_region=overrides))
    return paths


def hand_metrics(rewards: list[float]) -> list[dict]:
    """Metric rows with just a reward per step."""
    return [{"step": step, "reward": reward} for step, reward in enumerate(rewards, start=1)]


# --------------------------------------------------------------------------------------------- loading


def test_load_run_reads_config_metrics_and_eval(tmp_path):
    run = load_run(write_run(tmp_path, "a", steps=12, seed=3))
    assert run.name == "a" and run.algo == "dppo_binary_tv" and run.env == ENV and run.seed == 3
    assert list(run.metrics["step"]) == list(range(1, 13))
    assert list(run.eval["step"]) == [5, 10] and "eval/success" in run.eval
    assert run.trust_region["is_cap"] == math.inf


@pytest.mark.parametrize("is_cap, expected", [("inf", math.inf), (None, math.inf), ("Infinity", math.inf), (3, 3.0)])
def test_is_cap_as_string_null_or_number(tmp_path, is_cap, expected):
    run = load_run(write_run(tmp_path, "a", steps=3, trust_region={"is_cap": is_cap}))
    assert run.trust_region["is_cap"] == expected
    assert run.config["trust_region"]["is_cap"] == expected


def write_config_run(folder: Path, config: dict) -> Path:
    """A run directory of ``config`` and one metrics row."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    write_jsonl(folder / "metrics.jsonl", [{"step": 1, "reward": 0.5}])
    return folder


def test_an_oat_runs_algo_key_is_not_read_as_its_preset(tmp_path):
    """An oat run's config may record oat's algorithm (PPO) as ``algo``, the analysis's name for a trust-region
    preset: the preset comes from the trust region, and never from oat's algorithm."""
    oat = write_config_run(tmp_path / "oat", {"engine": "oat", "algo": "PPO",
                                              "trust_region": {"name": "dppo_binary_tv"}})
    assert load_run(oat).algo == "dppo_binary_tv"
    nameless = write_config_run(tmp_path / "nameless", {"engine": "oat", "algo": "PPO",
                                                        "trust_region": {"rule": "ratio"}})
    with pytest.warns(UserWarning, match="names no trust region: its curve is drawn as 'custom'"):
        assert load_run(nameless).algo == "custom"
    local = write_config_run(tmp_path / "local", {"engine": "local", "algo": "cispo"})
    assert load_run(local).algo == "cispo"


def copy_recording(run: Path, into: Path, key: str) -> Path:
    """A copy of run directory ``run`` in ``into`` whose config.json records the folder of runs under ``key``
    (``run_dir`` as written before ``--run-dir`` became ``--runs-dir``, or ``runs_dir``), in its place."""
    copy = Path(shutil.copytree(run, into / run.name))
    config = json.loads((copy / "config.json").read_text())
    renamed = {(key if name in ("run_dir", "runs_dir") else name): value for name, value in config.items()}
    (copy / "config.json").write_text(json.dumps(renamed, indent=2))
    return copy


def test_a_config_recorded_before_the_runs_dir_rename_is_analysed_as_one_recorded_after(tmp_path):
    """The committed example runs, each as it would record the folder of runs before the rename (``run_dir``) and
    after it (``runs_dir``): the analysis reads the old key as the new one, so both give the same configs, the same
    long table and the same settings."""
    for name in ("cispo-s0", "cispo-s1"):
        old = copy_recording(EXAMPLE_RUNS / name, tmp_path / "old", "run_dir")
        new = copy_recording(EXAMPLE_RUNS / name, tmp_path / "new", "runs_dir")
        assert load_run(old).config == load_run(new).config
        assert "run_dir" not in load_run(old).config and "runs_dir" in load_run(old).config
    before, after = load_runs(tmp_path / "old" / "*"), load_runs(tmp_path / "new" / "*")
    pd.testing.assert_frame_equal(before.drop(columns="path"), after.drop(columns="path"))
    assert mixed_settings(before) == mixed_settings(after) == {}


def test_load_runs_long_table(tmp_path):
    write_run(tmp_path, "a", steps=10)
    write_run(tmp_path, "b", algo="grpo_clip_higher", steps=8, trust_region={"rule": "ratio"})
    df = load_runs(str(tmp_path / "*"))
    assert {"run", "label", "algo", "env", "seed", "step", "metric", "value"} <= set(df.columns)
    assert list(pd.unique(df["run"])) == ["a", "b"]
    reward = df[(df["run"] == "a") & (df["metric"] == "reward")]
    assert list(reward["step"]) == list(range(1, 11))
    assert set(df.loc[df["run"] == "b", "label"]) == {"GRPO-ClipHigher"}
    assert len(df[(df["run"] == "a") & (df["metric"] == "eval/success")]) == 2


def test_labels_say_only_what_tells_runs_apart(tmp_path):
    write_run(tmp_path, "d0", seed=0, steps=3)
    write_run(tmp_path, "d1", seed=1, steps=3)
    write_run(tmp_path, "g0", algo="grpo_clip_higher", seed=0, steps=3, env="math:Orz57K",
              trust_region={"rule": "ratio"})
    df = load_runs([tmp_path / "d0", tmp_path / "d1", tmp_path / "g0"])
    labels = df.drop_duplicates("run").set_index("run")["label"].to_dict()
    assert labels == {"d0": f"DPPO-Binary-TV · {ENV} · seed 0", "d1": f"DPPO-Binary-TV · {ENV} · seed 1",
                      "g0": "GRPO-ClipHigher · math:Orz57K"}
    one_env = label_runs(df[df["env"] == ENV])
    assert set(one_env["method"]) == {"DPPO-Binary-TV"}
    assert set(one_env["label"]) == {"DPPO-Binary-TV · seed 0", "DPPO-Binary-TV · seed 1"}


def test_labels_name_non_default_trust_region_settings():
    assert variant_name("dppo_binary_tv", {"rule": "binary_tv", "delta": 0.2, "eps_high": 9.0}) == \
        "DPPO-Binary-TV (δ=0.2)"
    assert variant_name("relax_both", {"rule": "ratio", "relax": "both", "alpha": 0.5}) == "Relax-both (α=0.5)"
    assert variant_name("cispo", {"rule": "none", "is_cap": math.inf}) == "CISPO (PG-TIS) (C=∞)"
    assert variant_name("my_rule", {"delta": 1.0}) == "my_rule"


def test_same_run_name_in_two_directories(tmp_path):
    write_run(tmp_path / "x", "same", steps=3)
    write_run(tmp_path / "y", "same", steps=3, seed=1)
    df = load_runs([tmp_path / "x" / "same", tmp_path / "y" / "same"])
    assert df["run"].nunique() == 2


def test_bad_paths_raise_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="not a run directory"):
        load_runs([tmp_path / "other"])
    with pytest.warns(UserWarning, match="empty directory"), \
            pytest.raises(ValueError, match="empty is an empty directory"):
        load_runs([tmp_path / "empty"])
    with pytest.raises(ValueError, match="not a directory"):
        load_run(tmp_path / "file.txt")
    with pytest.raises(ValueError, match="no such file"):
        resolve_run_dirs([tmp_path / "missing"])
    with pytest.raises(ValueError, match="no run directory matches"):
        load_runs(str(tmp_path / "nothing-*"))


def test_partial_last_line_and_string_values_are_tolerated(tmp_path):
    run = write_run(tmp_path, "a", metrics=hand_metrics([0.1, 0.2]))
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 3, "reward": "nan", "note": "text", "divergence/max": "inf"}\n{"step": 4, "rew')
    df = load_runs([run])
    assert list(df.loc[df["metric"] == "reward", "value"]) == [0.1, 0.2]
    assert "note" not in set(df["metric"]) and "divergence/max" not in set(df["metric"])


# --------------------------------------------------------------------------------------------- curves


def test_smooth_is_scipy_gaussian_filter():
    series = pd.Series([0.0, 1.0, 0.0, 4.0, 2.0, 2.0, 8.0, 3.0], index=range(10, 18), name="reward")
    smoothed = smooth(series, sigma=2)
    np.testing.assert_allclose(smoothed.to_numpy(), gaussian_filter1d(series.to_numpy(), 2))
    assert list(smoothed.index) == list(series.index) and smoothed.name == "reward"
    np.testing.assert_allclose(smooth(series.to_numpy(), sigma=0.5), gaussian_filter1d(series.to_numpy(), 0.5))
    np.testing.assert_array_equal(smooth(series.to_numpy(), sigma=0), series.to_numpy())


def test_smooth_leaves_nans_in_place():
    values = np.array([1.0, np.nan, 3.0, 5.0])
    out = smooth(values, 1)
    assert np.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2, 3]], gaussian_filter1d(np.array([1.0, 3.0, 5.0]), 1))


def test_aggregate_seeds_by_hand(tmp_path):
    write_run(tmp_path, "s0", seed=0, metrics=hand_metrics([1.0, 2.0, 3.0]))
    write_run(tmp_path, "s1", seed=1, metrics=hand_metrics([3.0, 4.0]))
    write_run(tmp_path, "t", algo="grpo_clip_higher", metrics=hand_metrics([0.0, 0.5]), trust_region={"rule": "ratio"})
    df = load_runs(str(tmp_path / "*"))
    stats = aggregate_seeds(df, "reward", by="algo")
    dppo = stats[stats["algo"] == "dppo_binary_tv"]
    assert list(dppo["step"]) == [1, 2, 3] and list(dppo["n"]) == [2, 2, 1]
    np.testing.assert_allclose(dppo["mean"], [2.0, 3.0, 3.0])
    np.testing.assert_allclose(dppo["std"], [math.sqrt(2), math.sqrt(2), 0.0])  # sample std of (1, 3), (2, 4)
    np.testing.assert_allclose(dppo["lo"], [2 - math.sqrt(2), 3 - math.sqrt(2), 3.0])
    np.testing.assert_allclose(dppo["hi"], [2 + math.sqrt(2), 4.0, 3.0])  # no run's reward passed 4: clipped there
    minmax = aggregate_seeds(df, "reward", by="algo", band="minmax")
    np.testing.assert_allclose(minmax.loc[minmax["algo"] == "dppo_binary_tv", "lo"], [1.0, 2.0, 3.0])
    np.testing.assert_allclose(minmax.loc[minmax["algo"] == "dppo_binary_tv", "hi"], [3.0, 4.0, 3.0])
    assert list(stats["algo"].unique()) == ["dppo_binary_tv", "grpo_clip_higher"]
    per_run = aggregate_seeds(df, "reward", by="run")
    np.testing.assert_allclose(per_run.loc[per_run["run"] == "s1", "mean"], [3.0, 4.0])


def test_aggregate_seeds_errors_and_missing_metric(tmp_path):
    df = load_runs([write_run(tmp_path, "a", metrics=hand_metrics([1.0]))])
    assert aggregate_seeds(df, "no/such/metric").empty
    with pytest.raises(ValueError, match="cannot group by"):
        aggregate_seeds(df, "reward", by="colour")
    with pytest.raises(ValueError, match="unknown band"):
        aggregate_seeds(df, "reward", band="iqr")


def test_missing_metrics_are_skipped_with_a_note(tmp_path):
    write_run(tmp_path, "a", steps=5, drop=("bad_update/fraction", "is/truncated_fraction"))
    df = load_runs(str(tmp_path / "*"))
    kept, skipped = available_panels(df, ["reward", "bad_update", "is_truncated", "typo"])
    assert [name for name, _ in kept] == ["reward"]
    assert skipped[0].startswith("bad_update (no run logs bad_update/fraction")
    assert "neither a standard panel" in skipped[2]
    assert set(PANELS["shadow"].metrics) <= set(df["metric"])


# --------------------------------------------------------------------------------------------- clipped tokens


def test_token_analysis(tmp_path):
    paths = write_synthetic_runs(tmp_path, steps=10)
    df = load_runs(paths)
    tokens = load_tokens(df)
    assert set(tokens["run"]) == {"dppo_binary_tv-s0", "grpo_clip_higher-s0", "cispo-s0"}
    table = masked_by_bucket(tokens)
    assert {"ratio clip (PPO) %", "DPPO %", "tokens"} <= set(table.columns)
    assert table["tokens"].sum() == (tokens["advantage"] != 0).sum()
    positive = tokens[(tokens["sample"] == "positive") & tokens["ppo_masked"]]
    top = top_clipped_tokens(tokens, "positive", n=3)
    assert len(top) == 3 and top["count"].iloc[0] == positive["token"].value_counts().iloc[0]
    assert top["token"].iloc[0] == repr(positive["token"].value_counts().index[0])
    side_by_side = top_clipped_side_by_side(tokens, "dppo_masked", n=50)
    assert list(dict.fromkeys(side_by_side.columns.get_level_values(0))) == ["positive samples", "negative samples"]
    assert not side_by_side.isna().any().any()
    steps = token_step_metrics(tokens)
    assert {"tokens/ppo_masked/mu", "tokens/dppo_masked/entropy", "tokens/all/entropy"} <= set(steps["metric"])
    summary = shadow_summary(df)
    assert "own mask" in summary.columns and len(summary) == 3


def test_weighted_shares_and_disagreements_by_hand(tmp_path):
    """Four sampled tokens, all μ < 0.1 with A > 0: two blocked-stratum tokens of weight 1 (one blocked by ratio
    clipping only, one by both rules) and two others of weight 9. Of the 20 tokens they stand for, ratio clipping
    blocks 2 (10 %), DPPO 1 (5 %); 1 (5 %) is blocked by ratio clipping only, none by DPPO only."""
    (run,) = write_synthetic_runs(tmp_path, tokens=False, steps=5)[:1]
    rows = [
        {"step": 1, "token": "4", "mu": 0.05, "pi": 0.08, "advantage": 1.0, "ppo_masked": True, "dppo_masked": False,
         "weight": 1.0},
        {"step": 1, "token": "Wait", "mu": 0.05, "pi": 0.4, "advantage": 1.0, "ppo_masked": True, "dppo_masked": True,
         "weight": 1.0},
        *({"step": 1, "token": "a", "mu": 0.05, "pi": 0.05, "advantage": 1.0, "ppo_masked": False,
           "dppo_masked": False, "weight": 9.0} for _ in range(2)),
    ]
    write_jsonl(run / "tokens.jsonl", rows)
    tokens = load_tokens(load_runs([run]))
    table = masked_by_bucket(tokens)
    assert table[["tokens", "ratio clip (PPO) %", "DPPO %"]].values.tolist() == [[4, 10.0, 5.0]]
    table = disagreements(tokens)
    assert table[["sample", "tokens", "clip_only %", "dppo_only %"]].values.tolist() == [["positive", 4, 5.0, 0.0]]
    top = top_disagreement_tokens(tokens, "clip_only", n=5)
    assert top[("positive samples", "token")].tolist() == ["'4'"]
    assert top_clipped_tokens(tokens, "positive")["blocked %"].tolist() == [100.0, 100.0]


def test_no_tokens_file_gives_an_empty_table(tmp_path):
    df = load_runs(write_synthetic_runs(tmp_path, tokens=False, steps=5))
    tokens = load_tokens(df)
    assert tokens.empty
    assert token_step_metrics(tokens).empty and masked_by_bucket(tokens).empty
    assert top_clipped_tokens(tokens, "positive").empty and top_clipped_side_by_side(tokens).empty


def test_a_run_without_steps_yet_has_no_rows(tmp_path):
    fresh = write_run(tmp_path, "fresh", metrics=[])
    (fresh / "metrics.jsonl").unlink()
    (fresh / "eval.jsonl").unlink()
    with pytest.warns(UserWarning, match="fresh: skipped, no step logged yet"):
        df = load_runs([fresh, write_run(tmp_path, "a", steps=3)])
    assert set(df["run"]) == {"a"}
    assert load_run(fresh).metrics.empty


def test_token_metrics_when_a_mask_blocked_nothing(tmp_path):
    df = load_runs([write_run(tmp_path, "a", steps=5, tokens=True)])
    tokens = load_tokens(df).assign(dppo_masked=False)
    steps = token_step_metrics(tokens)
    assert "tokens/dppo_masked/mu" not in set(steps["metric"]) and "tokens/ppo_masked/mu" in set(steps["metric"])


def test_a_folder_of_runs_is_named_as_such(tmp_path):
    write_run(tmp_path / "runs", "a", steps=2)
    with pytest.raises(ValueError, match="a folder of runs"):
        load_runs([tmp_path / "runs"])
    assert run_patterns(f"{tmp_path / 'runs'} {tmp_path}/x-*") == [str(tmp_path / "runs" / "*"), f"{tmp_path}/x-*"]


def test_summarize_runs_final_values(tmp_path):
    write_run(tmp_path, "a", metrics=hand_metrics([0.0] * 10 + [1.0, 3.0]))  # last 10 % of 12 points: 1 point
    write_run(tmp_path, "b", seed=1, metrics=hand_metrics([2.0] * 20), eval_every=100)
    summary = summarize_runs(load_runs(str(tmp_path / "*")), tail=0.1).set_index("run")
    assert summary.loc["a", "reward"] == 3.0 and summary.loc["b", "reward"] == 2.0
    assert summary.loc["a", "steps"] == 12 and math.isnan(summary.loc["b", "eval/success"])
    assert summary.loc["b", "label"] == "DPPO-Binary-TV · seed 1"


def test_token_rows_with_missing_fields(tmp_path):
    run = write_run(tmp_path, "a", steps=2)
    write_jsonl(run / "tokens.jsonl", [
        {"step": 1, "token": "4", "mu": 0.05, "pi": 0.2, "advantage": 1.0, "entropy": 2.0, "ppo_masked": True,
         "dppo_masked": None},
        {"step": 1, "token": None, "mu": 0.9, "pi": 0.5, "advantage": -1.0, "ppo_masked": 1},
        {"step": 2, "mu": 0.3, "pi": 0.3, "advantage": 0.0, "dppo_masked": False},
    ])
    tokens = load_tokens(load_runs([run]))
    assert list(tokens["ppo_masked"]) == [True, True, False] and not tokens["dppo_masked"].any()
    assert list(tokens["token"]) == ["4", "", ""] and list(tokens["sample"]) == ["positive", "negative", "zero"]
    assert [str(b) for b in tokens["mu_bucket"]] == ["μ < 0.1", "μ ≥ 0.5", "0.1 ≤ μ < 0.5"]
    assert math.isnan(tokens["entropy"].iloc[1])


def test_compare_methods_reads_collapse_and_mismatch_growth_from_the_runs(tmp_path):
    """The notebooks' comparison says what the user's runs did: a reward that rises then falls back is named, a
    steady one is not; |π − μ| growth is measured first tenth against last tenth."""
    rising = [{"step": s, "reward": s / 20, "mismatch/abs_diff_mean": 0.01, "mask/fraction": 0.001}
              for s in range(1, 21)]
    collapsing = [{"step": s, "reward": min(s, 21 - s) / 10, "mismatch/abs_diff_mean": 0.01 * s,
                   "mask/fraction": 0.0} for s in range(1, 21)]
    write_run(tmp_path, "steady", metrics=rising)
    write_run(tmp_path, "falls", algo="cispo", metrics=collapsing, trust_region={"rule": "none", "is_cap": 3.0})
    table = compare_methods(load_runs(tmp_path / "*"))
    assert table.loc["DPPO-Binary-TV", "final reward"] > table.loc["CISPO (PG-TIS)", "final reward"]
    assert table.loc["CISPO (PG-TIS)", "drop from peak"] > 0.5 > table.loc["DPPO-Binary-TV", "drop from peak"]
    notes = comparison_notes(table)
    assert notes[0].startswith("final reward, highest first: DPPO-Binary-TV")
    assert notes[1] == "reward fell 0.1 or more below its peak: CISPO (PG-TIS)"
    assert notes[2] == "|π − μ| grew 1.5× or more from the first to the last tenth: CISPO (PG-TIS)"
    assert notes[3].startswith("masked tokens, most first: DPPO-Binary-TV 0.10 %")


def test_shadow_notes_name_the_bucket_each_ratio_clip_hits_most():
    summary = pd.DataFrame({"PPO · μ < 0.1": [0.5], "PPO · 0.1 ≤ μ < 0.5": [2.0], "PPO · μ ≥ 0.5": [0.25],
                            "own mask": [0.1]}, index=pd.Index(["DPPO-Binary-TV"], name="method"))
    assert shadow_notes(summary) == [
        "DPPO-Binary-TV: PPO's ratio clip would block most at 0.1 ≤ μ < 0.5 (2.00 % of tokens; 0.25 % at μ ≥ 0.5)"]
