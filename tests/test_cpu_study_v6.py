"""The CPU study's v6 design (studies/cpu): held arms run with the band set at every step, the cells' placebo blocks
random tokens of int4's own cells (its control the other two) at int4's rates, and every v6 claim is primary in a
family that asks one question."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import tyro

from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import validate_config
from dppo_oat.run.safe_io import read_jsonl
from dppo_oat.trust_region import PRESETS, MaskInputs
from dppo_oat.trust_region.metrics import MU_BUCKETS
from studies.cpu import placebo
from studies.cpu import run as cpu_study
from studies.cpu.claims import (
    HALVES_CONTRASTS,
    HELD_ARMS,
    HELD_CONTRASTS,
    HELD_STALE_CONTRASTS,
    PLACEBO_CELLS_CONTRASTS,
)
from studies.cpu.report import condition_of, load_study, study_variant

TINY = ("--warm-start.demo-episodes", "150", "--warm-start.max-steps", "20", "--warm-start.check-every", "20",
        "--warm-start.check-episodes", "8", "--warm-start.vocab-size", "300")


@pytest.mark.parametrize("condition", ["mech-int4", "field-mb4"])
def test_a_held_arm_sets_its_band_like_dppo_binary_kl_at_every_step(tmp_path, condition):
    config = cpu_study.StudyConfig(out_dir=str(tmp_path))
    for method, _ in HELD_ARMS:
        run = cpu_study.StudyRun("sudoku", method, condition, 0)
        spec, _ = validate_config(tyro.cli(TrainConfig, args=cpu_study.train_args(run, config, resume=False)))
        preset = method.partition("@")[0]
        assert spec.trust_region.name == preset and spec.calibration.like == "dppo_binary_kl"
        assert spec.calibration.every == 1
        assert spec.calibration.band == ("both" if preset in ("trm_max", "trm_avg", "opsm", "vaco") else None)
        assert study_variant(method).endswith("(held as strong as DPPO-Binary-KL)")
        assert condition_of(run.name) == condition


def cell_inputs(seed: int, rows: int = 64, tokens: int = 12) -> MaskInputs:
    """A loss call's mask inputs under a mismatched μ: μ spread over the μ buckets, π on either side of it, mixed-sign
    Â per row, some padding."""
    gen = torch.Generator().manual_seed(seed)
    behavior = torch.rand(rows, tokens, generator=gen).clamp(min=1e-3).log()
    logp = (behavior + 0.05 * torch.randn(rows, tokens, generator=gen)).clamp(max=0.0)
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, tokens).clone()
    advantages[:4] = 0.0
    response = torch.rand(rows, tokens, generator=gen) > 0.1
    return MaskInputs(logp, behavior, behavior, advantages, response, torch.zeros(rows, tokens))


RATES = {"negative": {"mu_lt_0.1": 0.002, "mu_0.1_0.5": 0.01, "mu_ge_0.5": 0.03},
         "positive": {"mu_lt_0.1": 0.001, "mu_0.1_0.5": 0.004, "mu_ge_0.5": 0.02}}


@pytest.mark.parametrize("own", [True, False])
def test_the_cells_placebo_blocks_its_cells_at_their_rates(monkeypatch, own):
    """``placebo_cells`` blocks only Â < 0 where μ > π and Â > 0 where μ < π (its control only the other two), in each
    cell and μ bucket as many as the rate × the call's A ≠ 0 tokens on average; the same call gives the same tokens."""
    monkeypatch.setattr(placebo, "PLACEBO_RATES", RATES)
    keep_of = placebo.int4_cells_keep if own else placebo.other_cells_keep
    shares = {(half, bucket): [] for half in RATES for _, _, bucket in MU_BUCKETS}
    for seed in range(200):
        x = cell_inputs(seed)
        blocked = ~keep_of(x, None)
        assert torch.equal(blocked, ~keep_of(x, None))
        above, below = x.behavior_logp > x.logp, x.behavior_logp < x.logp
        cells = {"negative": (x.advantages < 0) & (above if own else below),
                 "positive": (x.advantages > 0) & (below if own else above)}
        assert not (blocked & ~(x.response & (cells["negative"] | cells["positive"]))).any()
        active = int((x.response & (x.advantages != 0)).sum())
        mu = x.behavior_logp.exp()
        for half, cell in cells.items():
            for low, high, bucket in MU_BUCKETS:
                shares[half, bucket].append(int((blocked & cell & (mu >= low) & (mu < high)).sum()) / active)
    for (half, bucket), values in shares.items():
        assert sum(values) / len(values) == pytest.approx(RATES[half][bucket], rel=0.15), (half, bucket)


def test_a_cells_placebo_run_trains_under_int4_with_its_rule_registered_in_its_own_process(tmp_path):
    """``python -m studies.cpu.placebo`` plays ``placebo_cells`` under the int4 copy: its config records the study's
    rule, it blocks tokens, and this process's presets stay the package's."""
    config = cpu_study.StudyConfig(out_dir=str(tmp_path / "study"), steps=2, groups_per_step=2, group_size=2,
                                   probe_every=1, eval_episodes=4,
                                   extra_args=" ".join([*TINY, "--cache-dir", str(tmp_path / "cache")]))
    assert cpu_study.trainer_module("placebo_cells") == "studies.cpu.placebo"
    result = cpu_study.play(cpu_study.StudyRun("sudoku", "placebo_cells", "mech-int4", 0), config)
    assert result["returncode"] == 0 and result["state"] == "done", Path(result["log"]).read_text()[-2000:]
    run = tmp_path / "study" / "sudoku" / "placebo_cells-mech-int4-s0"
    trust_region = json.loads((run / "config.json").read_text())["trust_region"]
    assert (trust_region["rule"], trust_region["name"]) == ("placebo_int4_cells", "placebo_cells")
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert "placebo_cells" not in PRESETS
    assert load_study(tmp_path / "study")["variant"].unique().tolist() == [placebo.PLACEBO_LABELS["placebo_cells"]]


def test_every_v6_claim_is_primary_in_a_family_asking_one_question():
    """The held rules against each reference are a family of eight (Holm over them); the cells' placebo and the
    halves three primary claims each; every reference reused from an earlier experiment is declared played before."""
    families = {}
    for contrast in HELD_CONTRASTS + HELD_STALE_CONTRASTS + PLACEBO_CELLS_CONTRASTS + HALVES_CONTRASTS:
        if contrast.family == "primary":
            families.setdefault(contrast.experiment, set()).add(contrast.right if contrast.experiment.startswith(
                "held") else contrast.claim)
    assert {name: len(claims) for name, claims in families.items()} == {
        "held": 1, "held_pg_is": 1, "held_stale": 1, "held_stale_pg_is": 1, "placebo_cells": 3, "halves": 3}
    assert sum(c.experiment == "held" for c in HELD_CONTRASTS) == 8
    new = {"placebo_cells", "placebo_cells_other", "dppo_binary_kl_neg", "dppo_binary_kl_pos",
           *(method for method, _ in HELD_ARMS)}
    for contrast in HELD_CONTRASTS + HELD_STALE_CONTRASTS + PLACEBO_CELLS_CONTRASTS + HALVES_CONTRASTS:
        for arm in (contrast.left, contrast.right):
            assert arm[0] in new or arm in contrast.played_before, (contrast.claim, arm)


def test_the_v6_experiments_play_only_new_arms():
    for name in ("held", "held_stale", "placebo_cells", "halves"):
        methods = cpu_study.EXPERIMENTS[name].methods
        assert not {"pg_is", "dppo_binary_kl"} & set(methods), name



def long_rows(condition: str, method: str, seed: int, metric: str, values: list[float]) -> list[dict]:
    """Rows of a study's long table: one run's ``metric`` at steps 1, 2, ..."""
    return [{"condition": condition, "arm_method": method, "seed": seed, "step": step, "metric": metric,
             "value": value} for step, value in enumerate(values, start=1)]


def test_held_strength_compares_each_band_with_its_target_and_with_dppo_binary_kl_runs_from_its_first_held_step():
    """Under staleness a held band acts from step 2: step 1 (the preset's own band, here 0.5) is left out. GSPO
    blocked 0.03 and 0.06 on seeds 0 and 1 where set to 0.02 and 0.04, and DPPO-Binary-KL's runs blocked 0.02 and
    0.02: 0.045 over the seeds, 1.5× its target and 2.25× the runs (per seed 1.5× and 3×), outside 1.25×."""
    from studies.cpu.report import held_strength

    gspo = HELD_ARMS[0][0]
    rows = []
    for seed, (blocked, target) in enumerate(((0.03, 0.02), (0.06, 0.04))):
        rows += long_rows("field-mb4", gspo, seed, "mask/fraction", [0.5, blocked, blocked])
        rows += long_rows("field-mb4", gspo, seed, "band/target", [float("nan"), target, target])
        rows += long_rows("field-mb4", "dppo_binary_kl", seed, "mask/fraction", [0.02, 0.01, 0.03])
    table = held_strength(pd.DataFrame(rows).dropna(), "field-mb4", (gspo, HELD_ARMS[1][0]))
    assert list(table.index) == [gspo]  # an arm not run yet has no row
    row = table.loc[gspo]
    assert row["runs"] == 2 and row["blocked %"] == pytest.approx(4.5) and row["target %"] == pytest.approx(3.0)
    assert row["reference %"] == pytest.approx(2.0) and row["to target"] == pytest.approx(1.5)
    assert row["to reference"] == pytest.approx(2.25) and (row["lowest"], row["highest"]) == pytest.approx((1.5, 3.0))
    assert not row["within"]
    under_int4 = held_strength(pd.DataFrame(rows).assign(condition="mech-int4").dropna(), "mech-int4", (gspo,))
    assert under_int4.loc[gspo, "reference %"] == pytest.approx(2.0)  # from step 1: (0.02+0.01+0.03)/3 per seed
    assert held_strength(pd.DataFrame(rows).query("arm_method != 'dppo_binary_kl'"), "field-mb4", (gspo,)).empty


def scored(contrasts, verdict: str, family: str, holm_size: int) -> pd.DataFrame:
    """A contrast table (:func:`~studies.cpu.report.contrast_table`'s columns the page reads) scoring every claim
    of ``contrasts`` alike."""
    return pd.DataFrame([{"claim": c.claim, "verdict": verdict, "difference": 0.1, "ci_low": 0.05, "ci_high": 0.15,
                          "pairs": 8, "left_flag": "", "right_flag": "", "family": family, "holm_size": holm_size}
                         for c in contrasts])


def test_the_v6_lines_say_not_played_then_their_verdicts_corrected_as_scored_and_the_strength_held():
    """Before its runs a v6 line says so; after, it gives each verdict and how it was corrected (Holm over its
    family once every seed has run, else uncorrected), and the held lines name the arms outside the design's
    1.25× of DPPO-Binary-KL's runs."""
    from studies.cpu.page import HELD_HEADING, ScaleEvidence, halves_line, held_line, placebo_cells_line

    v6 = HELD_CONTRASTS + PLACEBO_CELLS_CONTRASTS + HALVES_CONTRASTS
    waiting = scored(v6, "not run", "primary", 0)
    assert held_line(waiting, HELD_CONTRASTS, HELD_HEADING, None).endswith(": not played yet.")
    assert placebo_cells_line(waiting, None).endswith(": not played yet.")
    assert halves_line(waiting, None).endswith(": not played yet.")
    strength = pd.DataFrame({"runs": [8, 8], "blocked %": [1.0, 2.0], "target %": [1.0, 2.0],
                             "reference %": [1.5, 1.5], "to target": [1.0, 1.0], "to reference": [0.67, 1.33],
                             "lowest": [0.5, 1.1], "highest": [0.9, 1.6], "within": [False, False]},
                            index=[HELD_ARMS[0][0], HELD_ARMS[1][0]])
    evidence = ScaleEvidence(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), held={"mech-int4": strength})
    line = held_line(scored(v6, "holds", "primary", 8), HELD_CONTRASTS, HELD_HEADING, evidence)
    assert line.count("(primary, Holm over the 8)") == 2 and line.count("**holds** (+0.100") == 16
    assert "GSPO 1.00% (1.00× its target, 0.67× DPPO-Binary-KL's runs, per seed 0.50–0.90×)" in line
    assert line.endswith("The design asks for 1.25×: outside 1.25× of DPPO-Binary-KL's runs, so compared at "
                         "another strength than its runs': GSPO, VACO.")
    early = placebo_cells_line(scored(v6, "inconclusive", "exploratory", 0), None)
    assert "Primary (uncorrected until every seed has run)" in early
