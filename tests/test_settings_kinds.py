"""A flag declares on its own field whether a resume may change it and whether it is an experiment setting
(:mod:`dppo_oat.settings.kinds`): the local engine's resume check and the analysis' seed pooling read those
declarations, so a new flag is one field."""

import dataclasses

from dppo_oat.analysis.runs import is_setting
from dppo_oat.engines.local.config import TrainConfig
from dppo_oat.engines.local.validation import RESUMABLE
from dppo_oat.settings.kinds import flag, non_settings, resumable_fields
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


def test_runs_pooled_as_seeds_agree_on_the_settings_alone():
    for name in ("lr", "group_size", "steps", "eval_every", "warm_start.lr", "advantage_mode"):
        assert is_setting(name), name
    for name in ("seed", "device", "overwrite", "token_export", "run_name", "code_commit", "resumes", "tr_delta",
                 "calibration"):
        assert not is_setting(name), name
