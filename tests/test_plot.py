"""``plot_runs`` and the ``dppo-plot`` command line, on small run directories written by ``test_analysis``."""

from __future__ import annotations

import json
import subprocess
import sys

import matplotlib.image
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image
from test_analysis import write_run, write_synthetic_runs

from dppo_oat.analysis import (
    DEFAULT_PANELS,
    PANELS,
    TOKEN_PANELS,
    figures,
    load_runs,
    load_tokens,
    plot_blocked_tokens,
    plot_runs,
)
from dppo_oat.analysis.tokens import token_step_metrics
from dppo_oat.plot import main


def visible_titles(fig: Figure) -> list[str]:
    """The titles of the figure's drawn panels, in order."""
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


@pytest.fixture
def runs(tmp_path):
    """Three presets × two seeds on one env, 20 steps each."""
    write_synthetic_runs(tmp_path / "runs", steps=20)
    return tmp_path / "runs"


def test_plot_runs_draws_one_panel_per_metric_and_one_legend(runs):
    df = load_runs(str(runs / "*"))
    fig = plot_runs(df)
    assert visible_titles(fig) == [PANELS[name].title for name in DEFAULT_PANELS]
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["CISPO (PG-TIS)", "DPPO-Binary-TV", "GRPO-ClipHigher"]
    reward_ax = fig.axes[0]
    # per method: the raw mean (faint) and its smoothing; a seed band behind
    assert len(reward_ax.lines) == 2 * 3 and len(reward_ax.collections) == 3
    assert min(line.get_alpha() or 1 for line in reward_ax.lines) < 0.5


def test_plot_runs_one_curve_per_run_and_raw_only(runs):
    df = load_runs(str(runs / "*"))
    fig = plot_runs(df, ["reward", "mask_fraction"], sigma=0, by="label", title="Sudoku")
    assert fig.legends[0].get_title().get_text() == "Sudoku"
    assert len(fig.axes[0].lines) == 6 and not fig.axes[0].collections
    assert len(fig.axes[1].lines) == 12 and fig.axes[1].get_legend() is not None  # A > 0 / A < 0 key
    assert len(fig.legends[0].get_texts()) == 6


def test_a_few_evaluations_are_drawn_raw(runs):
    """20 steps evaluated every 5: four points, drawn as they are (smoothing would move the first and the last)."""
    df = load_runs(str(runs / "*"))
    fig = plot_runs(df.query("method == 'DPPO-Binary-TV'"), ["eval", "reward"], sigma=2.0)
    eval_line, reward_lines = fig.axes[0].lines, fig.axes[1].lines
    assert len(eval_line) == 1 and len(eval_line[0].get_xdata()) == 4
    raw = df.query("method == 'DPPO-Binary-TV' and metric == 'eval/success'").groupby("step")["value"].mean()
    assert list(eval_line[0].get_ydata()) == pytest.approx(list(100 * raw))
    assert len(reward_lines) == 2  # 20 points: raw (faint) and smoothed


def test_missing_metrics_skip_their_panel_with_a_note(tmp_path):
    write_run(tmp_path, "a", steps=6, drop=("bad_update/fraction",))
    df = load_runs([tmp_path / "a"])
    fig = plot_runs(df, ["reward", "bad_update", "grad_norm"])
    assert visible_titles(fig) == ["Training reward", "Gradient norm"]
    notes = [text.get_text() for text in fig.texts]
    assert any(note.startswith("Not plotted: bad_update") for note in notes)
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_runs(df, ["bad_update"])


def test_plot_runs_into_given_axes(runs):
    df = load_runs(str(runs / "*"))
    fig = Figure(layout="constrained")
    axes = fig.subplots(1, 2)
    assert plot_runs(df, ["reward", "entropy"], axes=list(axes)) is fig
    with pytest.raises(ValueError, match="axes given"):
        plot_runs(df, ["reward", "entropy"], axes=[axes[0]])


def test_token_panels(runs):
    df = load_runs(str(runs / "*"))
    fig = plot_runs(token_step_metrics(load_tokens(df)), TOKEN_PANELS)
    assert visible_titles(fig) == [panel.title for panel in TOKEN_PANELS]


def test_cli_renders_a_png(runs, tmp_path, capsys):
    out = tmp_path / "figs" / "curves.png"
    main([str(runs / "*"), "-o", str(out), "--metrics", "reward", "success", "mismatch", "--sigma", "1"])
    assert out.stat().st_size > 10_000
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 600
    with Image.open(out) as png:
        assert png.format == "PNG"
    assert f"wrote {out}" in capsys.readouterr().out


def test_cli_notes_skipped_panels(tmp_path, capsys):
    run = write_run(tmp_path, "a", steps=6, drop=("is/truncated_fraction",))
    main([str(run), "-o", str(tmp_path / "f.png"), "--metrics", "reward", "is_truncated"])
    out = capsys.readouterr()
    assert "dppo-plot: skipped panel is_truncated" in out.err and "skipped panel" not in out.out  # notes go to stderr


def test_cli_rejects_a_path_that_is_not_a_run_before_plotting(runs, tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")  # an empty directory is skipped instead (test_faults)
    out = tmp_path / "f.png"
    with pytest.raises(SystemExit) as exit_info:
        main([str(runs / "cispo-s0"), str(tmp_path / "notes"), "-o", str(out)])
    assert exit_info.value.code == 1
    assert "not a run directory" in capsys.readouterr().err
    assert not out.exists()


def test_cli_subprocess_writes_nothing_to_stderr(runs, tmp_path):
    out = tmp_path / "f.png"
    ok = subprocess.run([sys.executable, "-m", "dppo_oat.plot", str(runs / "*"), "-o", str(out)],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stderr == "" and out.exists()
    bad = subprocess.run([sys.executable, "-m", "dppo_oat.plot", str(tmp_path / "missing"), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "dppo-plot: error:" in bad.stderr and "no such file" in bad.stderr


@pytest.mark.parametrize("panels", [["reward"], ["reward", "mismatch", "mask_fraction", "entropy", "success"]])
def test_a_legend_of_many_runs_stays_inside_the_figure(tmp_path, panels):
    """27 runs drawn one curve each (by label): the figure grows by the legend's rows, so the legend stays inside it
    and every panel keeps most of its height."""
    paths = [write_run(tmp_path, f"sweep-{i:02d}", seed=i, steps=20, trust_region={"delta": 0.05 + 0.01 * i})
             for i in range(27)]
    fig = plot_runs(load_runs(paths), panels, by="label")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    figure_box, legend_box = fig.bbox, fig.legends[0].get_window_extent(renderer)
    assert figure_box.y0 <= legend_box.y0 and legend_box.y1 <= figure_box.y1 + 1
    assert figure_box.x0 <= legend_box.x0 and legend_box.x1 <= figure_box.x1 + 1
    heights = [ax.get_window_extent(renderer).height / fig.dpi for ax in fig.axes if ax.get_visible()]
    assert min(heights) > 2.0, heights


def test_blocked_token_bars_are_weighted(tmp_path):
    """The clipped-token figure's bars are weighted shares: one blocked token of weight 1 beside an unblocked one
    of weight 9 (μ < 0.1, A > 0) is 10 % blocked, not 50 %."""
    from test_analysis import write_jsonl

    run = write_run(tmp_path, "one", steps=5)
    rows = [{"step": 1, "token": "4", "mu": 0.05, "pi": 0.2, "advantage": 1.0, "entropy": 1.0, "ppo_masked": True,
             "dppo_masked": False, "weight": 1.0},
            {"step": 1, "token": "a", "mu": 0.05, "pi": 0.05, "advantage": 1.0, "entropy": 0.5, "ppo_masked": False,
             "dppo_masked": False, "weight": 9.0}]
    write_jsonl(run / "tokens.jsonl", rows)
    fig = plot_blocked_tokens(load_tokens(load_runs([run])))
    heights = [patch.get_height() for patch in fig.axes[0].patches]
    assert heights[0] == pytest.approx(10.0) and max(heights[1:]) == 0.0


def set_config(run, **fields):
    """Change fields of a run's config.json."""
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, **fields}))


def test_a_curve_of_runs_with_different_settings_warns_once_naming_them(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "_warned", set())
    write_run(tmp_path, "a", seed=0, steps=6)
    set_config(write_run(tmp_path, "b", seed=1, steps=6), lr=1e-3, threads=1, runs_dir="elsewhere",
               warm_start={"lr": 0.01})
    set_config(tmp_path / "a", warm_start={"lr": 0.001})
    df = load_runs(tmp_path / "*")
    with pytest.warns(UserWarning) as caught:
        plot_runs(df, ["reward"])
        plot_runs(df, ["reward", "success"])  # the same curve again: no second warning
    assert [str(w.message) for w in caught] == [
        "curve DPPO-Binary-TV averages runs whose settings differ: lr 1e-06 vs 0.001; warm_start.lr 0.001 vs 0.01 "
        "(plotting them as seeds; by='label' draws each run)"]


def test_runs_that_differ_only_in_seed_name_and_threads_draw_without_a_warning(tmp_path, monkeypatch, recwarn):
    monkeypatch.setattr(figures, "_warned", set())
    write_run(tmp_path, "a", seed=0, steps=6)
    set_config(write_run(tmp_path, "b", seed=1, steps=6), threads=1, device="cuda", runs_dir="x", wandb=True)
    set_config(write_run(tmp_path, "c", algo="cispo", steps=6, trust_region={"rule": "none", "is_cap": 3.0}),
               lr=1.0)  # another method: a curve of its own
    plot_runs(load_runs(tmp_path / "*"), ["reward"])
    plot_runs(load_runs([tmp_path / "a", tmp_path / "c"]), ["reward"], by="env")  # pooling methods on purpose
    assert not [w for w in recwarn if "settings differ" in str(w.message)]


def test_the_cli_prints_the_mixed_settings_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(figures, "_warned", set())
    write_run(tmp_path / "runs", "a", seed=0, steps=6)
    set_config(write_run(tmp_path / "runs", "b", seed=1, steps=6), minibatches_per_rollout=4, steps=40)
    main([str(tmp_path / "runs" / "*"), "-o", str(tmp_path / "f.png"), "--metrics", "reward"])
    err = capsys.readouterr().err
    assert ("dppo-plot: warning: curve DPPO-Binary-TV averages runs whose settings differ: minibatches_per_rollout "
            "None vs 4; steps None vs 40") in err


def test_a_runs_identity_and_resumes_are_not_settings():
    """Every run has its own run_id, and a resumed one a record of resumes: seeds differ in both."""
    from dppo_oat.analysis.runs import differing_settings

    first = {"run_id": "a" * 32, "seed": 0, "lr": 3e-4, "resumes": [{"step": 4, "steps": 8}]}
    assert differing_settings([first, {"run_id": "b" * 32, "seed": 1, "lr": 3e-4}]) == {}


def test_a_calibrated_band_is_not_a_setting():
    """Runs that ask for the same calibration measure their band on their own first batch: the seeds of one
    calibrated arm differ in the band it found, not in what they were asked to train with."""
    from dppo_oat.analysis.runs import differing_settings

    asked = {"tr_calibrate_like": "dppo_binary_kl", "lr": 3e-4}
    first = {**asked, "seed": 0, "calibration": {"after": {"delta": 0.136}, "target": 0.0022}}
    second = {**asked, "seed": 1, "calibration": {"after": {"delta": 0.117}, "target": 0.0031}}
    assert differing_settings([first, second]) == {}
    assert differing_settings([first, {**second, "lr": 1e-4}]) == {"lr": [3e-4, 1e-4]}


def test_the_legend_and_the_cli_name_a_flagged_curve(tmp_path, capsys):
    """SAPO blocking nothing and GSPO blocking most tokens, dead from its second step, are named with their flags
    in the legend and in the command line's notes; PG-IS (no trust region by design) and a DPPO that blocks 2% of
    its tokens are not."""
    from test_analysis_degenerate import write_arms

    write_arms(tmp_path / "runs")
    fig = plot_runs(load_runs(str(tmp_path / "runs" / "*")), ["reward", "success"])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "DPPO-Binary-TV",
        "GSPO: blocks most tokens (blocked 60.00%); collapsed within 5 steps in 2 of 2 runs (blocked 60.00% in steps "
        "1–5)",
        "PG-IS", "SAPO: no trust region in effect (blocked 0.00%)"]
    main([str(tmp_path / "runs" / "*"), "-o", str(tmp_path / "f.png"), "--metrics", "success"])
    notes = capsys.readouterr().err  # notes go to stderr, beside the skipped panels'
    assert "dppo-plot: flagged curve SAPO: no trust region in effect (blocked 0.00%)" in notes
    assert "flagged curve GSPO: blocks most tokens" in notes and "flagged curve PG-IS" not in notes
