"""config.json's schema: an older config is brought up to the current one by version, and an old run still resumes.

``tests/data/config_schema1.json`` is the config.json a 1-step run with ``test_faults.TINY``'s flags wrote before
configs carried a schema (code at 6c80ebf; its run and cache folders renamed): no ``schema``, no ``max_staleness``,
none of the settings added since.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_faults import TINY, one_error, run

from dppo_oat.engines.local.config import TrainConfig, logged_config, run_spec
from dppo_oat.engines.local.config_schema import CONFIG_SCHEMA, as_written, migrate_config
from dppo_oat.engines.local.validation import settings_free_on_resume
from dppo_oat.run.log import settings_hash
from dppo_oat.train import main

OLD_CONFIG = Path(__file__).parent / "data" / "config_schema1.json"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("policy-cache"))


def current_defaults() -> dict:
    config = TrainConfig()
    return logged_config(config, run_spec(config))


def test_a_schema_1_config_is_filled_by_what_its_absences_meant_and_says_so():
    old = json.loads(OLD_CONFIG.read_text())
    assert "schema" not in old and "max_staleness" not in old
    migrated = migrate_config(old, current_defaults())
    assert migrated["schema"] == CONFIG_SCHEMA and migrated["max_staleness"] == 0
    assert migrated["lr_schedule"] == old["lr_schedule"]  # present: kept, not reset to the default
    step, later = migrated["schema_migrations"]
    assert (step["from"], step["to"]) == (1, 2) and later == {"from": 2, "to": 3, "filled": []}
    assert set(step["filled"]) == set(current_defaults()) - set(old) - {"schema"} | {
        f"trust_region.{name}" for name in set(current_defaults()["trust_region"]) - set(old["trust_region"])}
    assert "trust_region.tau_pos" in step["filled"] and "max_staleness" in step["filled"]
    assert as_written(migrated) == old  # the settings the old checkpoint was hashed with, recovered


def test_a_schema_1_config_without_the_lr_schedule_meant_a_constant_rate():
    old = {key: value for key, value in json.loads(OLD_CONFIG.read_text()).items() if key != "lr_schedule"}
    assert migrate_config(old, current_defaults())["lr_schedule"] == "constant"  # today's default is linear


def test_a_current_config_needs_no_migration():
    current = current_defaults()
    assert migrate_config(current, current) == current


@pytest.mark.parametrize("schema, fragment", [(CONFIG_SCHEMA + 1, "newer dppo_oat"), ("2", "not a version number"),
                                              (0, "not a version number"), (True, "not a version number")])
def test_a_schema_this_version_cannot_read_is_one_line(schema, fragment):
    with pytest.raises(ValueError, match=fragment):
        migrate_config({**current_defaults(), "schema": schema}, current_defaults())


@pytest.mark.parametrize("migrations", [3, [1], [{"from": 1, "filled": "lr_schedule"}], [{"filled": [5]}],
                                        [{"filled": [None, "lr_schedule"]}]])
def test_a_damaged_record_of_migrations_is_one_line(migrations):
    with pytest.raises(ValueError, match="schema_migrations is .* not a list of the migrations"):
        migrate_config({**current_defaults(), "schema_migrations": migrations}, current_defaults())


@pytest.fixture(scope="module")
def old_run(tmp_path_factory, cache_dir):
    """A 1-step run as the code before schemas left it: the committed schema-1 config.json (with this run's id) and a
    checkpoint whose identity is that config's settings hash, with no ``config_schema``."""
    runs = tmp_path_factory.mktemp("runs")
    main(["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--steps", "1", *TINY])
    directory = runs / "one"
    written = json.loads((directory / "config.json").read_text())
    old = {**json.loads(OLD_CONFIG.read_text()), "run_id": written["run_id"], "run_dir": str(runs),
           "cache_dir": cache_dir}
    (directory / "config.json").write_text(json.dumps(old, indent=2))
    state = torch.load(directory / "checkpoint.pt", weights_only=False)
    del state["config_schema"]
    config = TrainConfig()
    state["settings_hash"] = old_settings_hash(old, config)
    torch.save(state, directory / "checkpoint.pt")
    return runs


def old_settings_hash(config: dict, train_config: TrainConfig) -> str:
    """The settings hash the code before ``--run-dir`` became ``--runs-dir`` gave ``config``: ``run_dir`` was what a
    resume may change."""
    return settings_hash(config, [*settings_free_on_resume(run_spec(train_config)), "run_dir"])


def resume(runs, cache_dir, capsys, steps):
    return run(["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                str(steps), *TINY], capsys)


@pytest.mark.fault("`--resume` of a run whose `config.json` has no schema (written by dppo_oat 0.1, settings added "
                   "since absent)",
                   "it resumes: each absent setting is read as what its absence meant, the filled keys are recorded "
                   "under `schema_migrations`, and a kill before the next checkpoint still resumes")
def test_an_old_run_resumes_and_its_config_records_the_migration(old_run, tmp_path, capsys, cache_dir):
    runs = Path(shutil.copytree(old_run, tmp_path / "runs"))
    legacy_checkpoint = (runs / "one" / "checkpoint.pt").read_bytes()
    code, errors, text = resume(runs, cache_dir, capsys, 2)
    assert code == 0 and not errors, text
    config = json.loads((runs / "one" / "config.json").read_text())
    assert config["schema"] == CONFIG_SCHEMA and config["max_staleness"] == 0
    assert "max_staleness" in config["schema_migrations"][0]["filled"]
    # killed after the config was rewritten and before a new checkpoint: the old checkpoint still resumes
    (runs / "one" / "checkpoint.pt").write_bytes(legacy_checkpoint)
    code, errors, text = resume(runs, cache_dir, capsys, 2)
    assert code == 0 and not errors, text


def test_an_old_run_refuses_a_setting_its_absence_excluded(old_run, tmp_path, capsys, cache_dir):
    runs = Path(shutil.copytree(old_run, tmp_path / "runs"))
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                       "2", *TINY, "--max-staleness", "1"], 2, "other settings", "max_staleness: 0 → 1")


def test_an_edited_old_config_is_still_told_from_the_one_its_checkpoint_was_trained_under(old_run, tmp_path, capsys,
                                                                                         cache_dir):
    runs = Path(shutil.copytree(old_run, tmp_path / "runs"))
    config = json.loads((runs / "one" / "config.json").read_text())
    config["seed"] = config["seed"] + 1
    (runs / "one" / "config.json").write_text(json.dumps(config))
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                       "2", *TINY, "--seed", str(config["seed"])], 2, "was changed after step 1")


@pytest.mark.fault("`--resume` of a run whose `config.json` has a newer schema than this dppo_oat reads",
                   "one line naming the file: upgrade dppo_oat to resume it")
def test_a_newer_schema_is_one_line_before_any_model(old_run, tmp_path, capsys, cache_dir, no_model):
    runs = Path(shutil.copytree(old_run, tmp_path / "runs"))
    config = json.loads((runs / "one" / "config.json").read_text())
    (runs / "one" / "config.json").write_text(json.dumps({**config, "schema": CONFIG_SCHEMA + 1}))
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                       "2", *TINY], 2, "config.json", f"schema {CONFIG_SCHEMA + 1}", "upgrade dppo_oat")


def schema_2_run(runs: Path, cache_dir: str) -> Path:
    """A 1-step run as the code of schema 2 left it: config.json without the band-calibration flags (schema 3), and a
    checkpoint of schema 2 whose identity is that config's settings hash."""
    main(["--runs-dir", str(runs), "--run-name", "two", "--cache-dir", cache_dir, "--steps", "1", *TINY])
    directory = runs / "two"
    config = json.loads((directory / "config.json").read_text())
    old = {key: value for key, value in config.items() if not key.startswith("tr_calibrate")} | {"schema": 2}
    (directory / "config.json").write_text(json.dumps(old, indent=2))
    state = torch.load(directory / "checkpoint.pt", weights_only=False)
    state.update(config_schema=2, settings_hash=settings_hash(old, settings_free_on_resume(run_spec(TrainConfig()))))
    torch.save(state, directory / "checkpoint.pt")
    return directory


def test_a_schema_2_run_resumes_and_a_kill_before_its_next_checkpoint_still_resumes(tmp_path, capsys, cache_dir):
    """Schema 3 added the band-calibration flags: a schema-2 run resumes with them filled at their defaults (no
    calibration) and recorded; its config.json, rewritten, still matches its schema-2 checkpoint."""
    directory = schema_2_run(tmp_path, cache_dir)
    legacy_checkpoint = (directory / "checkpoint.pt").read_bytes()
    argv = ["--runs-dir", str(tmp_path), "--run-name", "two", "--cache-dir", cache_dir, "--resume", "--steps", "2",
            *TINY]
    code, errors, text = run(argv, capsys)
    assert code == 0 and not errors, text
    config = json.loads((directory / "config.json").read_text())
    assert config["schema"] == 3 and config["tr_calibrate"] is None and "calibration" not in config
    assert config["schema_migrations"] == [{"from": 2, "to": 3, "filled": ["tr_calibrate", "tr_calibrate_like",
                                                                          "tr_calibrate_unit", "tr_calibrate_band",
                                                                          "tr_calibrate_every"]}]
    (directory / "checkpoint.pt").write_bytes(legacy_checkpoint)  # killed before the next checkpoint
    code, errors, text = run(argv, capsys)
    assert code == 0 and not errors, text


@pytest.mark.fault("`--resume` of an old run whose `config.json` holds a damaged record of its schema migrations "
                   "(`\"schema_migrations\": [{\"filled\": [5]}]`)",
                   "one line naming `schema_migrations`: restore the file, or another `--run-name`; before any model")
def test_a_damaged_migration_record_of_an_old_run_is_one_line(old_run, tmp_path, capsys, cache_dir, no_model):
    runs = Path(shutil.copytree(old_run, tmp_path / "runs"))
    config = json.loads((runs / "one" / "config.json").read_text())
    (runs / "one" / "config.json").write_text(json.dumps({**config, "schema_migrations": [{"filled": [5]}]}))
    one_error(capsys, ["--runs-dir", str(runs), "--run-name", "one", "--cache-dir", cache_dir, "--resume", "--steps",
                       "2", *TINY], 2, "schema_migrations", "restore the file")


@pytest.mark.fault("`--resume` of a run whose `config.json` records `run_dir` (written before `--run-dir` became "
                   "`--runs-dir`)",
                   "it resumes as a run that records `runs_dir` does: the old key is read as the new one (its "
                   "rewritten `config.json` records `runs_dir`)")
def test_a_run_recorded_before_the_runs_dir_rename_resumes(tmp_path, capsys, cache_dir):
    """The key is renamed where configs are read (:func:`~dppo_oat.run.directory.current_config`): the checkpoint of a
    run that recorded ``run_dir`` carries the hash its settings had then, which is the hash they have now."""
    main(["--runs-dir", str(tmp_path), "--run-name", "one", "--cache-dir", cache_dir, "--steps", "1", *TINY])
    path = tmp_path / "one" / "config.json"
    written = json.loads(path.read_text())
    old = {("run_dir" if key == "runs_dir" else key): value for key, value in written.items()}
    path.write_text(json.dumps(old, indent=2))
    state = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True, mmap=True)
    assert state["settings_hash"] == old_settings_hash(old, TrainConfig())  # the checkpoint as the old code wrote it
    code, errors, text = run(["--runs-dir", str(tmp_path), "--run-name", "one", "--cache-dir", cache_dir, "--resume",
                              "--steps", "2", *TINY], capsys)
    assert code == 0 and not errors, text
    resumed = json.loads(path.read_text())
    assert "run_dir" not in resumed and resumed["runs_dir"] == written["runs_dir"] == str(tmp_path)
