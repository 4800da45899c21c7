"""A trust-region rule is one registered entry (:func:`dppo_oat.trust_region.register_rule`): a throwaway rule and a
preset of it, registered in one call each, reach the loss (mask, loss term, metrics), the fields a command line may
override, the local engine's command line, the verl engine's mapping and the docs' presets table, with no other
edit; and the registry refuses a malformed entry in one line."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dppo_oat import trust_region as T

ROOT = Path(__file__).resolve().parents[1]

# A rule no method uses: block every token with A < 0 whose μ is below δ, and add δ·log π_θ to each token's loss.
THROWAWAY = """
import torch
from dppo_oat import trust_region as T

def keep_low_mu_positive(x, tr):
    return ~((x.advantages < 0) & (x.behavior_logp.exp() < tr.delta))

def plus_delta_logp(logp, x, tr):
    return tr.delta * torch.where(x.response, logp, 0.0)

def count_blocked(x, keep, tr):
    return {"throwaway/blocked": (~keep & x.response).sum().float()}

T.register_rule("throwaway", T.Rule("binary_tv", keep_low_mu_positive, threshold="delta", loss_term=plus_delta_logp,
                                    metrics=count_blocked))
T.PRESETS["throwaway_preset"] = T.Preset({"rule": "throwaway", "delta": 0.3}, "a test's throwaway rule")
"""


@pytest.fixture
def throwaway():
    """The throwaway rule and preset registered for one test (in the tables every module reads), removed after it."""
    exec(THROWAWAY, {})
    try:
        yield T.TrustRegion.preset("throwaway_preset")
    finally:
        del T.RULE_TABLE["throwaway"], T.PRESETS["throwaway_preset"]


def test_the_registered_rule_is_the_loss(throwaway):
    logp = torch.tensor([[0.5, 0.2, 0.9]], dtype=torch.float64).log().requires_grad_()
    mu = torch.tensor([[0.1, 0.6, 0.2]], dtype=torch.float64).log()
    adv = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = T.policy_loss(logp, mu, adv, mask, throwaway)
    assert out.keep.tolist() == [[False, True, True]]  # A < 0 and μ = 0.1 < δ = 0.3: blocked
    out.loss.sum().backward()
    ratio = torch.tensor([[5.0, 1 / 3, 4.5]], dtype=torch.float64)
    # ∂/∂log π of −M·r·A + δ·log π: −M·r·A + δ
    assert torch.allclose(logp.grad, -out.keep.double() * ratio * adv + 0.3)
    assert out.metrics["throwaway/blocked"] == 1.0
    assert throwaway.fields_read == {"delta", "is_cap", "kl_tau"}


def test_its_band_calibrates_with_no_other_edit(throwaway):
    """Its declared threshold δ is the band calibration moves: blocking 1 of 3 tokens (A < 0, μ 0.1, 0.2, 0.4)
    puts δ at 0.2, the second smallest μ (kept: μ < δ blocks)."""
    mu = torch.tensor([[0.1, 0.2, 0.4]]).log()
    batch = T.CalibrationBatch(mu - 1e-3, mu, torch.full((1, 1), -1.0), torch.ones(1, 3, dtype=torch.bool))
    calibrated, report = throwaway.calibrate(batch, 1 / 3)
    assert report.band == "delta" and report.achieved == pytest.approx(1 / 3)
    assert calibrated.delta == pytest.approx(0.2, rel=1e-4) and report.before_fraction == pytest.approx(2 / 3)


def test_the_command_line_overrides_what_the_rule_reads_and_refuses_the_rest(throwaway):
    from dppo_oat.settings.spec import DPPOFlags

    assert DPPOFlags(trust_region="throwaway_preset", tr_delta=0.4).build_trust_region().delta == 0.4
    with pytest.raises(ValueError, match="--tr-eps-low: not read by the trust region throwaway_preset"):
        DPPOFlags(trust_region="throwaway_preset", tr_eps_low=0.1).build_trust_region()


def test_the_verl_mapping_and_the_docs_table_list_it(throwaway):
    mapping = load("dppo_oat/engines/verl/mapping.py")  # the mapping needs no verl (its package imports verl)
    assert mapping.supported_presets()["throwaway_preset"] is None
    assert mapping.verl_settable_fields(throwaway) == ("delta", "is_cap")
    tables = load("scripts/docs_tables.py")
    assert "| `throwaway_preset` | rule `throwaway`, delta 0.3" in tables.presets_table()


def test_the_local_engines_command_line_takes_a_rule_registered_before_it_is_built(tmp_path):
    """The command line's preset names are read when it is built: a plugin that registers first is one of them."""
    plugin = tmp_path / "throwaway_plugin.py"
    plugin.write_text(THROWAWAY)
    program = ("import sys, json, tyro; sys.path.insert(0, sys.argv[1]); import throwaway_plugin\n"
               "from dppo_oat.engines.local.config import TrainConfig\n"
               "config = tyro.cli(TrainConfig, args=['--trust-region', 'throwaway_preset', '--tr-delta', '0.25'])\n"
               "tr = config.build_trust_region()\n"
               "print(json.dumps({'rule': tr.rule, 'delta': tr.delta}))")
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"rule": "throwaway", "delta": 0.25}


@pytest.mark.parametrize("rule,message", [
    (T.Rule("binary_tv", T.keep_all), "a trust-region rule named 'binary_tv' exists"),
    (T.Rule("no_such", T.keep_all), "unknown divergence 'no_such'"),
    (T.Rule("ratio", T.keep_all, threshold="sigma"), "unknown threshold 'sigma'"),
    (T.Rule("topk_tv", T.keep_all), "reads a top-K divergence: name its binary_twin"),
])
def test_a_malformed_rule_is_refused_in_one_line(rule, message):
    name = "binary_tv" if "exists" in message else "new_rule"
    before = dict(T.RULE_TABLE)
    with pytest.raises(ValueError, match=message):
        T.register_rule(name, rule)
    assert T.RULE_TABLE == before


def test_every_top_k_rule_has_a_binary_twin_of_the_same_mask():
    for name, rule in T.RULE_TABLE.items():
        if rule.uses_topk:
            twin = T.RULE_TABLE[rule.binary_twin]
            assert not twin.uses_topk and twin.keep is rule.keep and twin.threshold == rule.threshold, name


def load(relative: str):
    """A module of the repository loaded from its file (not through its package)."""
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_override_flags_are_the_trust_regions_numeric_fields_with_their_docstrings_as_help():
    """One ``--tr-<field>`` per numeric TrustRegion field, generated (a field added there is a flag), its help the
    field's docstring without reST markup (its section of ``--help`` says that each overrides the preset's number),
    and ``--trust-region``'s choices are every preset."""
    import dataclasses
    import typing

    from dppo_oat.settings.docstrings import field_docstrings
    from dppo_oat.settings.spec import CalibrationFlags, DPPOFlags, TrustRegionFlags

    numeric = [f.name for f in dataclasses.fields(T.TrustRegion) if f.type in ("float", "int")]
    flags = [f.name.removeprefix("tr_") for f in dataclasses.fields(TrustRegionFlags) if f.name.startswith("tr_")]
    assert flags == numeric
    others = [f.name for f in dataclasses.fields(DPPOFlags) if f.name.startswith("tr_") and f.name[3:] not in numeric]
    assert others == []  # calibration's flags are the engines' that calibrate (CalibrationFlags), no field
    assert [f.name for f in dataclasses.fields(CalibrationFlags)] == ["tr_calibrate", "tr_calibrate_like",
                                                                      "tr_calibrate_unit", "tr_calibrate_band",
                                                                      "tr_calibrate_every"]
    hints, docs = typing.get_type_hints(DPPOFlags, include_extras=True), field_docstrings(T.TrustRegion)
    for name in numeric:
        help_text = hints[f"tr_{name}"].__metadata__[0].help
        assert "``" not in help_text and ":func:" not in help_text
        first_words = docs[name].split("(")[0].strip().replace("``", "")
        assert help_text.startswith((first_words, first_words[:1].upper() + first_words[1:])), name
    choices = typing.get_args(typing.get_args(hints["trust_region"])[0])
    assert set(T.PRESETS) <= set(choices)


def test_a_rule_may_set_w_t_itself():
    """``Rule.weight`` replaces the IS weight (and C with it): a rule whose w_t is 2 everywhere gives −M·2·A."""
    T.register_rule("doubled", T.Rule("ratio", T.keep_all, weight=lambda x, tr: torch.full_like(x.logp, 2.0)))
    T.PRESETS["doubled_preset"] = T.Preset({"rule": "doubled", "is_cap": 1.5}, "a test's rule with its own w_t")
    try:
        tr = T.TrustRegion.preset("doubled_preset")
        logp = torch.tensor([[0.5, 0.2]], dtype=torch.float64).log().requires_grad_()
        out = T.policy_loss(logp, torch.tensor([[0.1, 0.6]], dtype=torch.float64).log(),
                            torch.tensor([[1.0, -1.0]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool), tr)
        out.loss.sum().backward()
        assert logp.grad.tolist() == [[-2.0, 2.0]]  # r = 5 and 1/3 play no part; C = 1.5 neither
        assert tr.fields_read == {"kl_tau"} and out.metrics["is/truncated_fraction"] == 0.0
    finally:
        del T.RULE_TABLE["doubled"], T.PRESETS["doubled_preset"]
