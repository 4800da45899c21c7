"""Modules that moved into the core's folders or took clearer names keep their old import paths, as the modules
themselves; a name made clearer still resolves under the one users import, with a deprecation warning."""

import importlib
import json

import pytest

from dppo_oat._moved import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_import_path_is_the_module_itself(old, new):
    module = importlib.import_module(old)
    assert module is importlib.import_module(new) and module.__name__ == new
    package, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(package), name) is module  # `from dppo_oat import runlog` too


def test_what_is_set_on_an_old_path_is_set_where_the_code_reads_it(monkeypatch):
    import dppo_oat.runlog
    from dppo_oat.run import log

    monkeypatch.setattr(dppo_oat.runlog, "append_text", lambda path, text: None)
    assert log.append_text is dppo_oat.runlog.append_text


def test_the_progress_lines_old_names_warn_and_give_the_new_ones():
    from dppo_oat.engines.local import progress

    with pytest.warns(DeprecationWarning, match="use PROGRESS_LINES"):
        assert progress.PLAIN_LINES == progress.PROGRESS_LINES
    with pytest.warns(DeprecationWarning, match="use line_every"):
        assert progress.plain_every is progress.line_every
    with pytest.raises(AttributeError):
        _ = progress.no_such_name


def write_run(folder, config):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    return folder


def test_an_oat_runs_algo_key_is_not_read_as_its_preset(tmp_path):
    """Earlier oat runs recorded oat's algorithm (PPO) as ``algo``, the analysis's name for a trust-region preset: the
    preset comes from the trust region, and never from oat's algorithm."""
    from dppo_oat.analysis import load_run

    oat = write_run(tmp_path / "oat", {"engine": "oat", "algo": "PPO", "trust_region": {"name": "dppo_binary_tv"}})
    assert load_run(oat).algo == "dppo_binary_tv"
    nameless = write_run(tmp_path / "nameless", {"engine": "oat", "algo": "PPO", "trust_region": {"rule": "ratio"}})
    assert load_run(nameless).algo == "custom"
    local = write_run(tmp_path / "local", {"engine": "local", "algo": "cispo"})
    assert load_run(local).algo == "cispo"
