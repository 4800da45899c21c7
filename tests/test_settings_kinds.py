"""A flag declares on its own field whether a resume may change it and whether it is an experiment setting
(:mod:`dppo_oat.settings.kinds`): the local engine's resume check and the analysis' seed pooling read those
declarations, so a new flag is one field. A renamed flag declares its former name there too: the command line refuses
it, and a record under it reads under the new one."""

import dataclasses

import pytest

from dppo_oat.analysis.runs import is_setting
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import RESUMABLE
from dppo_oat.settings.grouped_cli import FlagGroup, former_flag_refusal, parse_grouped
from dppo_oat.settings.kinds import flag, former_names, non_settings, resumable_fields, with_current_names
from dppo_oat.settings.run_flags import RunFlags


def test_a_new_flag_declares_itself_in_one_field():
    @dataclasses.dataclass
    class WithANewFlag(TrainConfig):
        log_gradients_every: int = flag(0, resumable=True, setting=False)
        """A test's flag."""

    assert "log_gradients_every" in resumable_fields(WithANewFlag)
    assert "log_gradients_every" not in resumable_fields(TrainConfig)
    assert "log_gradients_every" in non_settings(WithANewFlag)
    assert WithANewFlag(log_gradients_every=3).log_gradients_every == 3


def test_a_field_without_a_declaration_is_a_setting_a_resume_keeps():
    @dataclasses.dataclass
    class Plain:
        lr: float = 1e-3

    assert resumable_fields(Plain) == () and non_settings(Plain) == frozenset()


def test_the_local_resume_check_reads_the_declarations():
    assert set(RESUMABLE) == set(resumable_fields(TrainConfig))
    logged = {"steps", "eval_every", "device", "threads", "token_samples", "token_export", "probe_every"}
    assert logged <= set(RESUMABLE)
    assert not {"lr", "seed", "run_name", "trust_region", "group_size"} & set(RESUMABLE)


def test_the_run_flags_change_nothing_a_run_trains_and_all_but_its_name_may_change_on_resume():
    names = {f.name for f in dataclasses.fields(RunFlags)}
    assert non_settings(RunFlags) == names
    assert set(resumable_fields(RunFlags)) == names - {"run_name"}


@dataclasses.dataclass
class Renamed:
    """Flags of a test, one of them renamed."""

    seed: int = 0
    """A flag that kept its name."""
    pool_size: int = flag(8, formerly="pool")
    """How many rows the pool holds."""


def test_a_renamed_flag_declares_its_former_name():
    assert former_names(Renamed) == {"pool": "pool_size"}
    assert former_names(RunFlags) == former_names(TrainConfig) == {"run_dir": "runs_dir"}


def test_a_record_under_a_former_name_reads_under_the_new_one_in_its_place():
    old = {"seed": 1, "pool": 4, "lr": 0.1}
    assert list(with_current_names(old, former_names(Renamed)).items()) == [("seed", 1), ("pool_size", 4), ("lr", 0.1)]
    assert with_current_names({"pool": 4, "pool_size": 5}, {"pool": "pool_size"}) == {"pool_size": 5}
    assert old == {"seed": 1, "pool": 4, "lr": 0.1}, "the record read is left as it was"


def test_a_former_flag_name_is_refused_in_one_line_naming_the_new_one():
    assert former_flag_refusal(Renamed, ["--seed", "1", "--pool", "4"]) == \
        "--pool is now --pool-size (how many rows the pool holds)"
    assert former_flag_refusal(Renamed, ["--pool=4"]) == "--pool is now --pool-size (how many rows the pool holds)"
    assert former_flag_refusal(Renamed, ["--pool-size", "4", "--seed", "1"]) is None
    with pytest.raises(ValueError, match="^--pool is now --pool-size"):
        parse_grouped(Renamed, [FlagGroup("common", "", ("seed", "pool_size"))], ["--pool", "4"])


def test_runs_pooled_as_seeds_agree_on_the_settings_alone():
    for name in ("lr", "group_size", "steps", "eval_every", "warm_start.lr", "advantage_mode"):
        assert is_setting(name), name
    for name in ("seed", "device", "overwrite", "token_export", "run_name", "code_commit", "resumes", "tr_delta",
                 "calibration", "runs_dir", "run_dir"):
        assert not is_setting(name), name
