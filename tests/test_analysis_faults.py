"""Damaged run directories: the shared loader of ``dppo_oat.analysis`` (what ``dppo-plot`` and the notebooks read)
skips each with one warning that names it and goes on with the others; the command line says so in one line."""

from __future__ import annotations

import gzip
import json
import math
import warnings
from pathlib import Path

import pytest
from test_analysis import hand_metrics, write_run

from dppo_oat.analysis import load_run, load_runs
from dppo_oat.analysis.run_checks import DamagedRun
from dppo_oat.plot import main
from studies.cpu.report import load_study


@pytest.fixture
def good(tmp_path) -> Path:
    """A healthy run: three steps of reward."""
    return write_run(tmp_path, "good", metrics=hand_metrics([0.1, 0.2, 0.3]))


def damaged(tmp_path: Path, name: str, *, config: bytes | None = None, metrics: bytes | None = None) -> Path:
    """A run directory named ``name`` whose config.json and/or metrics.jsonl are replaced by the bytes given."""
    run = write_run(tmp_path, name, seed=1, metrics=hand_metrics([1.0, 2.0]))
    (run / "eval.jsonl").write_text("")
    if config is not None:
        (run / "config.json").write_bytes(config)
    if metrics is not None:
        (run / "metrics.jsonl").write_bytes(metrics)
    return run


def load_skipping_one(paths: list[Path], skipped: Path, reason: str):
    """``load_runs(paths)``, checking that it warned exactly once, naming ``skipped`` and ``reason``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = load_runs(paths)
    messages = [str(warning.message) for warning in caught]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{skipped}: skipped, ") and reason in messages[0], messages[0]
    return df


def config_with(**fields) -> bytes:
    """A config.json of run ``bad`` with ``fields`` set."""
    return json.dumps({"run_name": "bad", "trust_region": {"name": "dppo_binary_tv"}, **fields}).encode()


# --------------------------------------------------------------------------------------------- config.json


@pytest.mark.parametrize("text, reason", [
    (b"[1, 2]", "its config.json holds a list, not a JSON object"),
    (b"null", "its config.json holds null, not a JSON object"),
    (b'"dppo"', "its config.json holds a string, not a JSON object"),
    (b"{not json", "its config.json is not JSON (Expecting property name"),
    (b"", "its config.json is not JSON (Expecting value"),
    (b"\xff\xfe{}", "its config.json is not JSON ("),
])
def test_a_config_that_is_not_a_json_object_skips_its_run(tmp_path, good, text, reason):
    bad = damaged(tmp_path, "bad", config=text)
    df = load_skipping_one([bad, good], bad, reason)
    assert set(df["run"]) == {"good"}


@pytest.mark.fault("a run whose `config.json` holds a field of the wrong type, given to `dppo_oat.plot` or the "
                   "notebooks",
                   "skipped with one warning naming it, the field and its value; the other runs are read")
@pytest.mark.parametrize("fields, reason", [
    ({"seed": "abc"}, 'its config.json has "seed": "abc", not an integer'),
    ({"seed": [1]}, 'its config.json has "seed": [1], not an integer'),
    ({"seed": 1.5}, 'its config.json has "seed": 1.5, not an integer'),
    ({"env_ids": 5}, 'its config.json has "env_ids": 5, not a list of environment ids'),
    ({"env_ids": [["a"]]}, 'its config.json has "env_ids": [["a"]], not a list of environment ids'),
    ({"run_name": {"a": 1}}, 'its config.json has "run_name": {"a": 1}, not a string'),
    ({"algo": ["ppo"]}, 'its config.json has "algo": ["ppo"], not a string'),
    ({"trust_region": "dppo"}, 'its config.json has "trust_region": "dppo", not an object'),
    ({"trust_region": [1]}, 'its config.json has "trust_region": [1], not an object'),
    ({"trust_region": {"name": "ppo", "rule": ["ratio"]}},
     'its config.json has "trust_region.rule": ["ratio"], not a string'),
    ({"trust_region": {"name": "ppo", "delta": {"x": 1}}},
     'its config.json has "trust_region.delta": {"x": 1}, not a number'),
    ({"trust_region": {"name": 3}}, 'its config.json has "trust_region.name": 3, not a string'),
])
def test_a_config_field_of_the_wrong_type_skips_its_run(tmp_path, good, fields, reason):
    bad = damaged(tmp_path, "bad", config=config_with(**fields))
    df = load_skipping_one([bad, good], bad, reason)
    assert set(df["run"]) == {"good"}


def test_a_long_wrong_value_is_named_by_its_type(tmp_path, good):
    bad = damaged(tmp_path, "bad", config=config_with(seed=list(range(40))))
    load_skipping_one([bad, good], bad, 'its config.json has "seed": a list, not an integer')


def test_load_run_names_the_damaged_file(tmp_path):
    bad = damaged(tmp_path, "bad", config=b"[]")
    with pytest.raises(DamagedRun, match=f"^{bad}: its config.json holds a list"):
        load_run(bad)
    assert issubclass(DamagedRun, ValueError)


def test_a_config_with_missing_keys_loads_with_defaults(tmp_path):
    bare = damaged(tmp_path, "bare", config=b"{}")
    with pytest.warns(UserWarning, match="names no trust region"):
        run = load_run(bare)
    assert (run.name, run.algo, run.env, run.seed) == ("bare", "custom", "unknown", None)
    with pytest.warns(UserWarning, match="names no trust region"):
        assert set(load_runs([bare])["label"]) == {"custom"}


def test_env_ids_given_as_one_string_is_one_environment(tmp_path):
    run = load_run(damaged(tmp_path, "one", config=config_with(env_ids="game:Sudoku-v0-easy")))
    assert run.env == "game:Sudoku-v0-easy"


# --------------------------------------------------------------------------------------------- metrics.jsonl


@pytest.mark.fault("a run whose `metrics.jsonl` is empty, unreadable or has no numeric `step`",
                   "skipped with one warning naming it and why; the other runs are read")
@pytest.mark.parametrize("text, reason", [
    (b"", "no step logged yet (its metrics.jsonl holds no row)"),
    (b"not json\nnor this\n", "no line of its metrics.jsonl is a JSON object"),
    (b"[1, 2]\n[3]\n", "no line of its metrics.jsonl is a JSON object"),
    (b'{"reward": 1.0}\n{"loss": 2.0}\n', 'no row of its metrics.jsonl has a numeric "step"'),
    (b'{"step": "first", "reward": 1.0}\n', 'no row of its metrics.jsonl has a numeric "step"'),
    (b'{"step": 1, "reward": "high"}\n{"step": 2, "reward": [1, 2]}\n{"step": 3, "reward": {"a": 1}}\n',
     "its metrics.jsonl holds no number besides the steps"),
])
def test_a_run_without_readable_metrics_is_skipped(tmp_path, good, text, reason):
    bad = damaged(tmp_path, "bad", metrics=text)
    df = load_skipping_one([bad, good], bad, reason)
    assert set(df["run"]) == {"good"}


def test_a_run_without_a_metrics_file_is_skipped(tmp_path, good):
    bad = damaged(tmp_path, "bad")
    (bad / "metrics.jsonl").unlink()
    load_skipping_one([bad, good], bad, "no step logged yet (no metrics.jsonl)")


def test_a_metrics_folder_skips_its_run(tmp_path, good):
    bad = damaged(tmp_path, "bad")
    (bad / "metrics.jsonl").unlink()
    (bad / "metrics.jsonl").mkdir()
    load_skipping_one([bad, good], bad, "its metrics.jsonl is a directory")


def test_an_unreadable_packed_log_skips_its_run(tmp_path, good):
    bad = damaged(tmp_path, "bad")
    (bad / "metrics.jsonl").unlink()
    (bad / "metrics.jsonl.gz").write_bytes(gzip.compress(b'{"step": 1, "reward": 1.0}\n')[:-8])
    load_skipping_one([bad, good], bad, "its metrics.jsonl.gz cannot be read (")


def test_when_every_run_is_skipped_the_error_says_so(tmp_path):
    bad = damaged(tmp_path, "bad", metrics=b"")
    with pytest.warns(UserWarning, match="skipped"), pytest.raises(ValueError, match="^no run left to read: the 1 run"):
        load_runs([bad])


def test_unreadable_lines_of_a_kept_run_still_warn(tmp_path):
    run = damaged(tmp_path, "partly", metrics=b'{"step": 1, "reward": 1.0}\nnot json\n{"step": 2, "reward": 2.0}\n')
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):
        df = load_runs([run])
    assert list(df.loc[df["metric"] == "reward", "step"]) == [1, 2]


@pytest.mark.parametrize("step", ["1e400", '"inf"', '"-Infinity"', "1e30", "100000000000000000000000000000", "true"])
def test_a_step_that_is_no_step_number_drops_its_row(tmp_path, step):
    run = damaged(tmp_path, "a", metrics=f'{{"step": {step}, "reward": 9.0}}\n{{"step": 2, "reward": 1.0}}\n'.encode())
    df = load_runs([run])
    assert df[["step", "metric", "value"]].values.tolist() == [[2, "reward", 1.0]]


def test_a_huge_integer_value_is_a_number(tmp_path):
    run = damaged(tmp_path, "a", metrics=b'{"step": 1, "tokens": 100000000000000000000000000000}\n')
    assert load_runs([run])["value"].tolist() == [1e29]


def test_metrics_named_like_the_long_tables_columns(tmp_path):
    run = damaged(tmp_path, "a", metrics=b'{"step": 1, "value": 0.5, "metric": 2, "run": 3}\n')
    df = load_runs([run])
    assert sorted(df[["metric", "value"]].values.tolist()) == [["metric", 2.0], ["run", 3.0], ["value", 0.5]]
    assert set(df["run"]) == {"a"}


@pytest.mark.fault("a run whose `metrics.jsonl` (or `eval.jsonl`) logs a negative step or one past 1e9 (a hand-edited "
                   "or damaged log), given to `load_runs`, `dppo_oat.plot` or the notebooks",
                   "those rows are left out with one warning naming the log, how many and the first such step; a run "
                   "with no step in range is skipped, saying so")
@pytest.mark.parametrize("log", ["metrics.jsonl", "eval.jsonl"])
@pytest.mark.parametrize("step", [-1, -1000, 10**9 + 1, 2**40, 9.5e17])
def test_a_step_out_of_range_is_left_out_with_a_warning(tmp_path, log, step):
    run = write_run(tmp_path, "a", metrics=hand_metrics([0.1, 0.2]))
    row = {"step": step, "reward": 5.0} if log == "metrics.jsonl" else {"step": step, "eval/success": 0.5}
    with (run / log).open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = load_runs([run])
    messages = [str(warning.message) for warning in caught]
    assert messages == [f"{run / log}: 1 row(s) with a step outside [0, 1,000,000,000] left out (step {int(step)} "
                        "first)"], messages
    assert df["step"].between(0, 2).all()


def test_a_run_with_no_step_in_range_is_skipped_saying_so(tmp_path, good):
    bad = damaged(tmp_path, "bad", metrics=b'{"step": -3, "reward": 1.0}\n{"step": 2e9, "reward": 2.0}\n')
    df = load_skipping_one([good, bad], bad, "no row of its metrics.jsonl has a step in [0, 1,000,000,000]")
    assert set(df["run"]) == {"good"}


@pytest.mark.fault("a run without `config.json`, or whose `config.json` has `\"trust_region\": null` (or names no "
                   "trust region), given to `load_runs`, `dppo_oat.plot` or the notebooks",
                   "drawn, with one warning naming the run and what its curve is drawn as (`custom`, or its preset "
                   "with the preset's own settings)")
@pytest.mark.parametrize("config, fragment", [
    (None, "no config.json: its curve is drawn as 'custom', with no environment or seed"),
    (b'{"run_name": "bad", "trust_region": null}', '"trust_region": null: its curve is drawn as \'custom\''),
    (b'{"run_name": "bad", "algo": "dppo_binary_tv", "trust_region": null}',
     '"trust_region": null: its curve is drawn as \'dppo_binary_tv\' with the preset\'s own settings'),
    (b'{"run_name": "bad", "seed": 1}', "names no trust region: its curve is drawn as 'custom'"),
])
def test_a_run_that_does_not_say_its_trust_region_warns(tmp_path, good, config, fragment):
    bad = damaged(tmp_path, "bad", config=config)
    if config is None:
        (bad / "config.json").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = load_runs([good, bad])
    messages = [str(warning.message) for warning in caught]
    assert len(messages) == 1 and messages[0].startswith(f"{bad}: ") and fragment in messages[0], messages
    assert set(df["run"]) == {"good", "bad"}


def test_plot_says_which_run_has_no_config_in_one_line(tmp_path, good, capsys):
    bad = damaged(tmp_path, "bad")
    (bad / "config.json").unlink()
    main([str(good), str(bad), "-o", str(tmp_path / "figure.png")])
    err = capsys.readouterr().err
    assert f"dppo-plot: warning: {bad}: no config.json" in err and (tmp_path / "figure.png").exists()
    assert all(line.startswith("dppo-plot: ") for line in err.splitlines()), err


# --------------------------------------------------------------------------------------------- the study


@pytest.mark.fault("a damaged run in a study folder that the notebooks read",
                   "skipped with one warning; the study's other runs are read")
@pytest.mark.parametrize("config, reason", [(b"[]", "holds a list"), (b"{not json", "is not JSON")])
def test_a_study_skips_a_damaged_run(tmp_path, config, reason):
    study = tmp_path / "study"
    write_run(study / "sudoku", "dppo_binary_tv-mb1-fp32-s0", metrics=hand_metrics([0.1, 0.2]))
    bad = damaged(study / "sudoku", "cispo-mb1-fp32-s0", config=config)
    with pytest.warns(UserWarning, match=f"{bad}: skipped, its config.json {reason}"):
        df = load_study(study)
    assert set(df["run"]) == {"sudoku/dppo_binary_tv-mb1-fp32-s0"}


# --------------------------------------------------------------------------------------------- dppo-plot


def one_line(text: str) -> str:
    """The one line ``text`` holds."""
    assert len(text.splitlines()) == 1, text
    return text.strip()


@pytest.mark.fault("a run whose `config.json` is not a JSON object, given to `dppo_oat.plot`",
                   "skipped with one warning naming it and why (`dppo-plot: warning: runs/x: skipped, its config.json "
                   "holds a list, not a JSON object`); the other runs are drawn")
def test_plot_skips_a_run_whose_config_is_a_list(tmp_path, good, capsys):
    bad = damaged(tmp_path, "bad", config=b"[1, 2]")
    out = tmp_path / "f.png"
    main([str(bad), str(good), "-o", str(out), "--metrics", "reward"])
    captured = capsys.readouterr()
    assert one_line(captured.err) == \
        f"dppo-plot: warning: {bad}: skipped, its config.json holds a list, not a JSON object"
    assert out.stat().st_size > 0 and f"wrote {out}" in captured.out


@pytest.mark.fault("`dppo_oat.plot` given only damaged runs",
                   "`dppo-plot: error: no run left to read: …` (exit 1)")
def test_plot_with_no_readable_run_ends_in_one_error(tmp_path, capsys):
    bad = damaged(tmp_path, "bad", metrics=b"garbage\n")
    out = tmp_path / "f.png"
    with pytest.raises(SystemExit) as exit_info:
        main([str(bad), "-o", str(out)])
    assert exit_info.value.code == 1 and not out.exists()
    warning, error = capsys.readouterr().err.splitlines()
    assert warning == f"dppo-plot: warning: {bad}: skipped, no line of its metrics.jsonl is a JSON object"
    assert error == "dppo-plot: error: no run left to read: the 1 run given was skipped (see the warning above)"


@pytest.mark.fault("an empty directory given to `dppo_oat.plot`",
                   "skipped with one warning: `dppo-plot: warning: …: an empty directory, skipped (not a run)`")
def test_plot_warnings_are_one_line_each(tmp_path, good, capsys):
    (tmp_path / "empty").mkdir()
    main([str(tmp_path / "empty"), str(good), "-o", str(tmp_path / "f.png"), "--metrics", "reward"])
    assert one_line(capsys.readouterr().err) == \
        f"dppo-plot: warning: {tmp_path / 'empty'}: an empty directory, skipped (not a run)"


def refuse_before_reading(monkeypatch) -> None:
    """Make reading any run fail the test: an output refused must be refused before."""
    import dppo_oat.plot

    monkeypatch.setattr(dppo_oat.plot, "load_runs", lambda *a, **k: pytest.fail("read the runs"))


@pytest.mark.fault("`python -m dppo_oat.plot … -o figs` where `figs` is a directory",
                   "one line before any run is read: `dppo-plot: error: -o figs is a directory: give a file name such "
                   "as figs/figure.png` (exit 2)")
def test_plot_refuses_an_output_that_is_a_directory(tmp_path, good, capsys, monkeypatch):
    refuse_before_reading(monkeypatch)
    folder = tmp_path / "figures"
    folder.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main([str(good), "-o", str(folder)])
    assert exit_info.value.code == 2
    assert one_line(capsys.readouterr().err) == \
        f"dppo-plot: error: -o {folder} is a directory: give a file name such as {folder / 'figure.png'}"
    assert not list(folder.iterdir()) and not (tmp_path / "figures.png").exists()


@pytest.mark.fault("`dppo_oat.plot -o figure.jpgg`, a suffix matplotlib cannot write",
                   "one line before any run is read, naming the suffixes it can write (exit 2)")
def test_plot_refuses_a_format_matplotlib_cannot_write(tmp_path, good, capsys, monkeypatch):
    refuse_before_reading(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main([str(good), "-o", str(tmp_path / "figure.jpgg")])
    assert exit_info.value.code == 2
    error = one_line(capsys.readouterr().err)
    assert error.startswith(f"dppo-plot: error: -o {tmp_path / 'figure.jpgg'}: matplotlib cannot write .jpgg files")
    assert ".png" in error and ".pdf" in error


def test_plot_refuses_an_output_inside_a_file(tmp_path, good, capsys, monkeypatch):
    refuse_before_reading(monkeypatch)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        main([str(good), "-o", str(tmp_path / "notes.txt" / "f.png")])
    assert exit_info.value.code == 2
    assert one_line(capsys.readouterr().err) == \
        f"dppo-plot: error: -o {tmp_path / 'notes.txt' / 'f.png'}: {tmp_path / 'notes.txt'} is a file, not a folder"


@pytest.mark.fault("`dppo_oat.plot -o figure`, without a suffix",
                   "writes `figure.png` and says so")
def test_plot_without_a_suffix_says_the_file_it_wrote(tmp_path, good, capsys):
    main([str(good), "-o", str(tmp_path / "figure"), "--metrics", "reward"])
    assert (tmp_path / "figure.png").is_file() and not (tmp_path / "figure").exists()
    assert f"wrote {tmp_path / 'figure.png'}" in capsys.readouterr().out


@pytest.mark.fault("a run whose `metrics.jsonl` (or `eval.jsonl`, `config.json`) is a directory, a dangling link or "
                   "another file that is not a regular, readable file, given to `load_runs`, `dppo_oat.plot` or the "
                   "notebooks",
                   "skipped with one warning naming it and the file (`…: skipped, its metrics.jsonl is a directory`); "
                   "the other runs are read, never an empty run loaded silently")
@pytest.mark.parametrize("name", ["metrics.jsonl", "eval.jsonl", "config.json"])
@pytest.mark.parametrize("kind", ["a directory", "a dangling link"])
def test_a_run_file_that_is_not_a_regular_file_skips_its_run(name, kind, tmp_path, good):
    other = write_run(tmp_path, "other", metrics=hand_metrics([0.3, 0.2, 0.1]))
    (other / name).unlink()
    if kind == "a directory":
        (other / name).mkdir()
    else:
        (other / name).symlink_to(tmp_path / "nowhere")
    with pytest.warns(UserWarning) as caught:
        df = load_runs([good, other])
    assert set(df["run"]) == {"good"}
    [warning] = [str(w.message) for w in caught]
    assert warning.startswith(f"{other}: skipped") and f"its {name} is {kind}" in warning


@pytest.mark.fault("`dppo_oat.plot --sigma -1` (or `nan`, `inf`), `--ncols 0`, `--dpi 0`",
                   "one line before any run is read: `dppo-plot: error: --sigma must be a finite number >= 0 …` "
                   "(exit 2)")
@pytest.mark.fault("`dppo_oat.plot --ncols 1000` or `--dpi 100000`: past 16 panels a row (hours of layout) or 1200 "
                   "dpi (more pixels than memory holds)",
                   "one line before any run is read: `dppo-plot: error: --ncols must be in [1, 16] …` (exit 2)")
@pytest.mark.parametrize("flag, value", [("--sigma", "-1"), ("--sigma", "nan"), ("--sigma", "inf"),
                                         ("--ncols", "0"), ("--dpi", "0"), ("--ncols", "1000"), ("--ncols", "17"),
                                         ("--dpi", "100000"), ("--dpi", "1201"), ("--dpi", "-5")])
def test_plot_refuses_options_out_of_range(flag, value, tmp_path, good, capsys, monkeypatch):
    refuse_before_reading(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main([str(good), "-o", str(tmp_path / "figure.png"), flag, value])
    assert exit_info.value.code == 2
    assert one_line(capsys.readouterr().err).startswith(f"dppo-plot: error: {flag} must be")
    assert not (tmp_path / "figure.png").exists()


def test_plot_takes_options_at_the_ends_of_their_ranges(tmp_path):
    from dppo_oat.plot import MAX_DPI, MAX_NCOLS, PlotArgs, options_problem

    for ncols, dpi in ((1, 1), (MAX_NCOLS, MAX_DPI)):
        assert options_problem(PlotArgs(runs=("x",), ncols=ncols, dpi=dpi)) is None


# --------------------------------------------------------------------------------------------- runs counted once


@pytest.mark.fault("`dppo_oat.plot \"runs/x*\"` over a run and its backup copy (`cp -r runs/x runs/x-backup`: the same "
                   "run id, or the same `metrics.jsonl`)",
                   "the copy is skipped with one warning naming both (a copy is not another seed); the curve is the "
                   "run's own")
@pytest.mark.parametrize("same", ["run id", "metrics"])
def test_a_copy_of_a_run_is_not_another_seed(tmp_path, same):
    import shutil

    from dppo_oat.analysis import aggregate_seeds

    original = write_run(tmp_path, "x", metrics=hand_metrics([0.1, 0.5, 0.9]))
    if same == "run id":
        config = json.loads((original / "config.json").read_text())
        (original / "config.json").write_text(json.dumps({**config, "run_id": "abc123"}))
    copy = Path(shutil.copytree(original, tmp_path / "x-backup"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "run_name": "x-backup"}))
    with pytest.warns(UserWarning, match=rf"{copy}: skipped, the same run as {original}"):
        df = load_runs(str(tmp_path / "x*"))
    assert set(df["run"]) == {"x"}
    assert list(aggregate_seeds(df, "reward")["n"]) == [1, 1, 1]


@pytest.mark.fault("a run whose `metrics.jsonl` logs a step twice (two logs appended together)",
                   "one warning naming the log and the first repeated step; the last line of each step is kept, so "
                   "no curve draws a step twice")
def test_a_step_logged_twice_is_drawn_once(tmp_path):
    run = write_run(tmp_path, "a", metrics=hand_metrics([0.1, 0.2]) + hand_metrics([0.3, 0.4]))
    with pytest.warns(UserWarning, match=r"metrics.jsonl: step 1 is logged more than once \(2 step\(s\) repeated\)"):
        df = load_runs([run])
    rewards = df[df["metric"] == "reward"]
    assert list(rewards["step"]) == [1, 2] and list(rewards["value"]) == [0.3, 0.4]


@pytest.mark.fault("a std band across seeds that would leave a metric's range (two seeds of success 0 and 1: "
                   "mean ± std is −0.21 to 1.21)",
                   "the band is clipped to the smallest and largest value the metric took (a success rate's stays in "
                   "[0, 1])")
def test_a_std_band_stays_in_the_metrics_range(tmp_path):
    from dppo_oat.analysis import aggregate_seeds

    for seed, success in ((0, 0.0), (1, 1.0)):
        write_run(tmp_path, f"s{seed}", seed=seed, metrics=[{"step": 1, "success": success}])
    stats = aggregate_seeds(load_runs(str(tmp_path / "*")), "success")
    assert stats["std"].iloc[0] == pytest.approx(math.sqrt(0.5))
    assert (stats["lo"].iloc[0], stats["hi"].iloc[0]) == (0.0, 1.0)


# --------------------------------------------------------------------------------------------- what is missing


@pytest.mark.fault("`read_token_export(run)` of a run trained without `--token-export all`, a step it did not "
                   "export, or a run whose exports miss steps",
                   "a `ValueError` naming the run and the steps it has (never an empty table or a FileNotFoundError); "
                   "missing steps between the first and last are one warning")
def test_token_exports_that_are_missing_are_said(tmp_path):
    from dppo_oat.run.token_export import read_token_export

    run = write_run(tmp_path, "a", metrics=hand_metrics([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="has no token exports .* trained without --token-export all"):
        read_token_export(run)
    (run / "token_exports").mkdir()
    record = {"schema_version": 1, "row": 0, "turn": 0, "env_name": "e", "token_ids": [5], "loss_mask": [True],
              "is_masked": [False], "is_masked_high": [False], "is_masked_low": [False], "advantages": [1.0],
              "inference_logprobs": [-0.1], "trainer_logprobs": [-0.1], "importance_ratio": [1.0], "entropy": [None]}
    for step in (1, 3):
        (run / "token_exports" / f"step_{step:06d}.jsonl").write_text(json.dumps({**record, "step": step}) + "\n")
    with pytest.raises(ValueError, match=r"no token export of step 2 \(2 exported, steps 1–3\)"):
        read_token_export(run, 2)
    with pytest.warns(UserWarning, match="lacks 1 of steps 1–3 \\(step 2 first\\)"):
        assert list(read_token_export(run)["step"]) == [1, 3]


@pytest.mark.fault("`dppo_oat.plot` given only an empty directory",
                   "`error: no run directory to read: DIR is an empty directory (a run directory holds config.json "
                   "and metrics.jsonl)` (exit 1), never \"no run directories given\"")
def test_plot_of_an_empty_directory_says_what_it_found(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "empty"), "-o", str(tmp_path / "f.png")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and f"{tmp_path / 'empty'} is an empty directory" in err, err


@pytest.mark.fault("`dppo_oat.plot` of a run whose rewards are all NaN (or infinite)",
                   "the reward panel is skipped with a note on stderr that says every value of `reward` is NaN or "
                   "infinite in that run (not \"no run logs reward\"); every note and warning goes to stderr, stdout "
                   "names only the image")
def test_a_panel_of_nan_values_says_nan(tmp_path, capsys):
    run = write_run(tmp_path, "nan", metrics=[{"step": step, "reward": "nan", "success": 0.5} for step in (1, 2)])
    main([str(run), "-o", str(tmp_path / "f.png"), "--metrics", "reward", "success"])
    out = capsys.readouterr()
    assert "skipped panel reward (every value of reward is NaN or infinite, in nan)" in out.err, out.err
    assert out.out.strip() == f"wrote {tmp_path / 'f.png'}"


# --------------------------------------------------------------------------------------------- labels


@pytest.mark.fault("a run of a preset the analysis has no name for, or one that changes a trust-region field the "
                   "labels do not know (SAPO's `tau_pos`/`tau_neg`, `mask_side`)",
                   "every preset of the registry has its legend name and every field its symbol (a test fails while "
                   "one lacks it), so SAPO runs with other temperatures are a curve of their own, never pooled with "
                   "the default's")
def test_every_preset_and_field_of_the_registry_has_a_label(tmp_path):
    from dppo_oat.analysis.runs import PRESET_NAMES
    from dppo_oat.trust_region import CHOICE_FIELDS, FIELD_SYMBOLS, NUMBER_FIELDS, PRESETS, TrustRegion

    assert sorted(set(PRESETS) - set(PRESET_NAMES)) == [], "presets without a legend name"
    assert sorted({*CHOICE_FIELDS, *NUMBER_FIELDS, "k"} - set(FIELD_SYMBOLS)) == [], "fields without a symbol"
    sapo = vars(TrustRegion.preset("sapo"))
    write_run(tmp_path, "default", algo="sapo", trust_region=sapo, metrics=hand_metrics([0.1]))
    write_run(tmp_path, "warm", algo="sapo", trust_region={**sapo, "tau_pos": 2.0}, metrics=hand_metrics([0.2]))
    methods = load_runs(str(tmp_path / "*")).drop_duplicates("run").set_index("run")["method"]
    assert methods["default"] == "SAPO" and methods["warm"] == "SAPO (τ_pos=2)"
