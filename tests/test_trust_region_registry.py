"""What the trust region knows it says once: a rule's capabilities are what its registration declares (never its
function's identity or its divergence's name), the fields the command line overrides are the config's field
registry, and the names that meant two things have one meaning each (the deprecated aliases work, with a
warning)."""

import dataclasses
import typing

import pytest
import torch

from dppo_oat import trust_region as T
from dppo_oat.trust_region import (
    CHOICE_FIELDS,
    DIVERGENCES,
    INTEGER_FIELDS,
    NUMBER_FIELDS,
    PRESETS,
    RULE_TABLE,
    TrustRegion,
    divergence_keep,
    policy_loss,
    register_rule,
)


@pytest.fixture
def registered():
    """Rules a test registers, removed after it: ``registered(name)`` marks one for removal."""
    names = []
    yield names.append
    for name in names:
        RULE_TABLE.pop(name, None)


def test_the_field_registry_is_the_dataclass_numeric_fields_in_order():
    numeric = [f.name for f in dataclasses.fields(TrustRegion) if f.type in ("float", "int")]
    assert list(NUMBER_FIELDS) == numeric
    assert INTEGER_FIELDS == tuple(f.name for f in dataclasses.fields(TrustRegion) if f.type == "int")
    assert set(CHOICE_FIELDS) == {f.name for f in dataclasses.fields(TrustRegion) if f.type == "str"} - {"name"}
    assert set(T.FIELD_SYMBOLS) == {*NUMBER_FIELDS, *CHOICE_FIELDS}  # one table: every field its symbol


def test_the_command_line_overrides_the_registrys_fields():
    from dppo_oat.settings.spec import TRUST_REGION_OVERRIDES, DPPOFlags

    assert TRUST_REGION_OVERRIDES == NUMBER_FIELDS
    hints = typing.get_type_hints(DPPOFlags)
    assert hints["tr_k"] == int | None and hints["tr_delta"] == float | None


def test_a_decorated_function_is_a_rule_and_stays_a_function(registered):
    @register_rule("twice_tv", divergence="binary_tv", threshold="delta")
    @register_rule("once_tv", divergence="binary_tv", threshold="delta")
    def keep_small(x, tr):
        return x.divergence <= tr.delta

    registered("twice_tv"), registered("once_tv")
    assert RULE_TABLE["once_tv"].keep is keep_small and RULE_TABLE["twice_tv"].keep is keep_small
    assert list(RULE_TABLE)[-2:] == ["once_tv", "twice_tv"]  # the decorator nearest the function registers first
    assert TrustRegion(rule="once_tv").fields_read == {"delta", "is_cap", "kl_tau"}
    with pytest.raises(TypeError, match="declare"):
        register_rule("third", RULE_TABLE["once_tv"], threshold="delta")


def test_mask_side_follows_the_declaration_not_the_function(registered):
    """A rule of its own function that declares ``reads_mask_side`` takes ``mask_side``; DPPO's own function
    registered without the declaration refuses it (the check compared function identity)."""

    @register_rule("my_dppo", divergence="binary_kl", threshold="delta", reads_mask_side=True)
    def my_dppo(x, tr):
        return divergence_keep(x.ratio, x.advantages, x.divergence, tr.delta, tr.mask_side)

    registered("my_dppo")
    register_rule("plain_dppo", T.Rule("binary_kl", RULE_TABLE["binary_kl"].keep, threshold="delta"))
    registered("plain_dppo")
    mu = torch.tensor([[0.5, 0.5]]).log()
    logp = torch.tensor([[0.9, 0.1]]).log()
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = policy_loss(logp, mu, adv, mask, TrustRegion(rule="my_dppo", delta=0.05, mask_side="negative"))
    assert out.keep.tolist() == [[True, False]]  # only the A<0 half blocks
    with pytest.raises(ValueError, match="mask_side='negative' keeps one half"):
        TrustRegion(rule="plain_dppo", mask_side="negative")


def test_top_k_comes_from_the_divergence_not_its_name(registered, monkeypatch):
    monkeypatch.setitem(DIVERGENCES, "wide_tv", T.Divergence(DIVERGENCES["topk_tv"].compute, needs_topk=True))
    monkeypatch.setitem(DIVERGENCES, "topk_lookalike", T.Divergence(DIVERGENCES["binary_tv"].compute))
    register_rule("wide", T.Rule("wide_tv", T.keep_all, binary_twin="binary_tv"))
    register_rule("lookalike", T.Rule("topk_lookalike", T.keep_all))
    registered("wide"), registered("lookalike")
    assert TrustRegion(rule="wide").uses_topk and "k" in TrustRegion(rule="wide").fields_read
    assert not TrustRegion(rule="lookalike").uses_topk


@pytest.mark.parametrize("rule, message", [
    (T.Rule("topk_tv", T.keep_all, binary_twin="no_such_rule"), "binary_twin 'no_such_rule' is no registered"),
    (T.Rule("topk_tv", T.keep_all, binary_twin="topk_kl"), "binary_twin 'topk_kl' is no registered binary"),
    (T.Rule("log_ratio_sq", T.keep_all, reads_batch=True), "reads the whole batch: declare couples_tokens"),
])
def test_a_rule_whose_declarations_contradict_is_refused(rule, message):
    before = dict(RULE_TABLE)
    with pytest.raises(ValueError, match=message):
        register_rule("contradicted", rule)
    assert RULE_TABLE == before


def test_vaco_compares_pi_prime_with_mu_so_it_is_anchored_on_pi_prime():
    assert RULE_TABLE["vaco"].needs_recompute and TrustRegion.preset("vaco").anchor == "recompute"
    with pytest.raises(ValueError, match="rule 'vaco' compares the recomputed π_θ' with μ"):
        TrustRegion.preset("vaco", anchor="behavior")


def test_only_m2po_reads_the_batch():
    assert [name for name, rule in RULE_TABLE.items() if rule.reads_batch] == ["m2po"]
    assert all(rule.couples_tokens for rule in RULE_TABLE.values() if rule.reads_batch)


def test_the_thresholds_name_fields():
    assert set(T.THRESHOLDS) == {"delta", "clip_range", "tau_m2"}
    assert all(set(fields) <= set(NUMBER_FIELDS) for fields in T.THRESHOLDS.values())
    assert {rule.threshold for rule in RULE_TABLE.values()} - {None} <= set(T.THRESHOLDS)
    assert TrustRegion.preset("ppo").fields_read >= {"eps_low", "eps_high"}


def test_the_row_reductions_leave_empty_rows_at_zero():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    response = torch.tensor([[True, False, True], [False, False, False]])
    assert T.row_sum(values, response).tolist() == [[4.0], [0.0]]
    assert T.row_mean(values, response).tolist() == [[2.0], [0.0]]
    assert T.row_max(values, response).tolist() == [[3.0], [0.0]]


def test_every_preset_has_its_legend_name():
    from dppo_oat.analysis.runs import preset_name

    for name, preset in PRESETS.items():
        assert preset_name(name) == preset.label, name
    assert preset_name("trm_max") == "TRM-Max" and preset_name("my_rule") == "my_rule"


def test_the_docs_table_shows_every_choice_a_preset_sets():
    """The ablation presets differ from DPPO-Binary-KL in ``mask_side`` alone: their rows say so."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "docs_tables.py"
    spec = importlib.util.spec_from_file_location("docs_tables", path)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    assert "mask_side `negative`" in tables.preset_settings("dppo_binary_kl_neg")
    assert "mask_side" not in tables.preset_settings("dppo_binary_kl")
    assert tables.preset_numbers("cppo") == "δ 0.15, K 20, w_min 0.8, δ_b 0.02"
    assert tables.preset_numbers("pg_is") == "—"


def test_the_shadow_bands_are_the_presets():
    bands = T.shadow_mismatch_bands()
    for name, (kind, low, high) in bands.items():
        tr = TrustRegion.preset(name)
        assert (kind, low, high) == (tr.mismatch_mask, tr.mismatch_low, tr.mismatch_high)
    assert set(bands) == set(T.SHADOW_MISMATCH_PRESETS)


def test_the_package_exports_what_it_lists():
    assert set(T.__all__) <= set(dir(T)) and len(T.__all__) == len(set(T.__all__))
    assert {"TrustRegion", "policy_loss", "PRESETS", "Preset", "Rule", "register_rule", "TopK"} <= set(T.__all__)
