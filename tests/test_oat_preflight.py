"""The oat engine's preflight without oat (these run in the main suite): the numbers oat, DeepSpeed, vLLM, torch and
NumPy take, the files ``--pretrain`` and ``--save_path`` name, vLLM's context against the model's, LoRA's target
modules against the model's architecture, a checkpoint's resume record, and a resume's settings compared in the form
the run recorded them. The dry run itself, which runs these through oat's argument parsing, is tested in
``tests/oat/test_oat_preflight.py``."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dppo_oat.engines.oat import resume
from dppo_oat.engines.oat.preflight import (
    NUMBER_RULES,
    Accepts,
    architecture_modules,
    check_context_lengths,
    check_lora_targets,
    check_model_source,
    check_numbers,
    check_save_path,
    context_limit,
    looks_local,
)
from dppo_oat.engines.oat.resume import (
    CHECKPOINTS_DIR,
    RECORD_COUNTS,
    checkpoint_tag,
    commit_checkpoint,
    find_resume_point,
    free_on_resume,
    partial_path,
)
from dppo_oat.trust_region import TrustRegion

WITH_FIXTURES = dict(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
"""hypothesis settings of the tests that use a function-scoped fixture (tmp_path, monkeypatch) across examples."""

TINY_QWEN3 = {"model_type": "qwen3", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
              "max_position_embeddings": 2048, "tie_word_embeddings": False}
"""A Qwen3 config.json of the tiny policy's shape (oat's default --target_modules are Qwen's projections)."""


def refusal(call, *args, **kwargs) -> str:
    """The one line ``call`` refuses with."""
    with pytest.raises(ValueError) as error:
        call(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message and message
    return message


# ------------------------------------------------------------------------------------------------------ the numbers


def outside(accepts: Accepts) -> list:
    """Values just outside what ``accepts`` admits: below, above, between whole numbers, ∞, NaN."""
    values = [accepts.low - 1, math.nan]
    if not accepts.low_in:
        values.append(accepts.low)
    if accepts.high != math.inf:
        values += [accepts.high + 1] + ([accepts.high] if not accepts.high_in else [])
    elif math.inf not in accepts.also:
        values.append(math.inf)
    if accepts.integer:
        values.append(accepts.low + 1.5)
    return [value for value in values if value not in accepts.also]


@pytest.mark.fault("oat dry run: a number the launch would refuse (`--zero_stage 4`, `--gpus 0`, "
                   "`--sync_params_every 0`, `--learning_rate nan`, `--max_model_len` past the model's context, ...)",
                   "`error: --X must be <range> (<what it is>), got V` (exit 2), before any model loads")
@pytest.mark.parametrize("name", sorted(NUMBER_RULES))
def test_every_number_out_of_its_range_is_refused_in_one_line_naming_the_flag(name):
    accepts = NUMBER_RULES[name]
    for value in outside(accepts):
        message = refusal(check_numbers, SimpleNamespace(**{name: value}))
        assert message.startswith(f"--{name} ")
        assert "NaN" in message if value != value else f"must be {accepts.requirement()}" in message


@settings(max_examples=200, **WITH_FIXTURES)
@given(name=st.sampled_from(sorted(NUMBER_RULES)), data=st.data())
def test_a_number_in_its_range_passes_and_one_outside_does_not(name, data):
    accepts = NUMBER_RULES[name]
    high = accepts.high if accepts.high != math.inf else accepts.low + 1e6
    if accepts.integer:
        value = data.draw(st.integers(int(accepts.low) - 5, int(min(high, accepts.low + 1e6)) + 5))
    else:
        value = data.draw(st.floats(accepts.low - 5, high + 5, allow_nan=False))
    inside = ((value >= accepts.low if accepts.low_in else value > accepts.low)
              and (value <= accepts.high if accepts.high_in else value < accepts.high))
    if inside:
        check_numbers(SimpleNamespace(**{name: value}))
    else:
        assert refusal(check_numbers, SimpleNamespace(**{name: value})).startswith(f"--{name} must be")


@given(name=st.from_regex(r"[a-z][a-z_]{0,20}", fullmatch=True))
def test_nan_is_refused_in_any_numeric_flag(name):
    assert refusal(check_numbers, SimpleNamespace(**{name: math.nan})) == f"--{name} is NaN: give a number"


@pytest.mark.parametrize("name, special", [("max_model_len", None), ("groups_per_step", None), ("max_turns", None),
                                           ("master_port", None), ("eval_batch_size", -1),
                                           ("buffer_clear_every", math.inf)])
def test_the_values_outside_a_range_that_mean_something_pass(name, special):
    check_numbers(SimpleNamespace(**{name: special}))
    assert str(special) in NUMBER_RULES[name].requirement()


def test_a_flag_the_arguments_lack_is_not_checked():
    check_numbers(SimpleNamespace())


# -------------------------------------------------------------------------------------------------------- the files


def write_model(folder: Path, config: dict | None = None, weights: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config or TINY_QWEN3))
    if weights:
        (folder / "model.safetensors").write_bytes(b"weights")
    return folder


@pytest.mark.fault("oat dry run: a `--pretrain` folder that does not exist, a `--save_path` that is a file, LoRA "
                   "`--target_modules` the model lacks",
                   "one `error:` line naming the flag and what to change (exit 2), before any model loads")
@pytest.mark.parametrize("name", ["/nonexistent/model", "./missing-model", "../missing-model", ".missing", "~/m",
                                  "~", "models/missing", "models/deeper/missing"])
def test_a_local_looking_pretrain_that_is_no_folder_is_refused(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "deeper").mkdir(parents=True)  # models/missing is a path here: models/ exists
    assert looks_local(name)
    message = refusal(check_model_source, "--pretrain", name)
    assert message.startswith(f"--pretrain {name}: no such folder here")
    assert ("write $HOME for ~" in message) == name.startswith("~")


@settings(max_examples=100, **WITH_FIXTURES)
@given(org=st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_-]{0,14}[A-Za-z0-9])?", fullmatch=True),
       name=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}[A-Za-z0-9]", fullmatch=True))
def test_a_hub_id_is_taken_as_it_is(org, name, tmp_path, monkeypatch):
    """A hub id cannot be checked offline (nor the node's cache from elsewhere): any well-formed one passes, where
    no folder here of its org's name makes it a path."""
    assume("--" not in name and ".." not in name and "--" not in org)
    monkeypatch.chdir(tmp_path)
    for hub_id in (f"{org}/{name}", name):
        assert not looks_local(hub_id)
        check_model_source("--pretrain", hub_id)


@pytest.mark.parametrize("name, fragment", [("a/b/c", "Repo id must be in the form"),
                                            ("bad name", "Repo id must use alphanumeric chars"),
                                            ("org/-name", "Repo id must use alphanumeric chars")])
def test_a_name_that_is_neither_a_folder_nor_a_hub_id_is_refused(name, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = refusal(check_model_source, "--pretrain", name)
    assert message.startswith(f"--pretrain {name!r} is neither a folder here nor a hub id") and fragment in message


def test_a_pretrain_folder_must_hold_a_model_and_a_tokenizer_folder_must_exist(tmp_path):
    model = write_model(tmp_path / "model")
    check_model_source("--pretrain", str(model))
    check_model_source("--tokenizer", str(model), model=False)
    assert "has no weights" in refusal(check_model_source, "--pretrain",
                                       str(write_model(tmp_path / "no-weights", weights=False)))
    (tmp_path / "empty").mkdir()
    assert "no config.json" in refusal(check_model_source, "--pretrain", str(tmp_path / "empty"))
    check_model_source("--tokenizer", str(tmp_path / "empty"), model=False)  # transformers' own files: not checked
    (tmp_path / "weights.bin").write_bytes(b"")
    assert refusal(check_model_source, "--tokenizer", str(tmp_path / "weights.bin")).startswith(
        f"--tokenizer {tmp_path / 'weights.bin'} is a file")


def test_a_save_path_that_is_a_file_or_under_one_or_not_writable_is_refused(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    assert refusal(check_save_path, str(tmp_path / "file")).endswith("is a file: give a folder (oat writes each "
                                                                     "run into <save_path>/<run>_<start time>)")
    assert f"{tmp_path / 'file'} is a file" in refusal(check_save_path, str(tmp_path / "file" / "runs" / "deeper"))
    check_save_path(str(tmp_path / "new" / "runs"))  # made by oat's learner: nothing is made here
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr("os.access", lambda path, mode: False)
    assert "is not writable" in refusal(check_save_path, str(tmp_path / "new"))


# -------------------------------------------------------------------------------------------------------- the model


@pytest.mark.parametrize("changes, limit", [
    ({}, 2048),
    ({"n_positions": 1024}, 1024),  # the smallest length key
    ({"model_max_length": 8192}, 8192),  # Command-R's own key wins
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 8192),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 4096),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}}, 4096),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 2048),  # already in max_position_embeddings
    ({"max_position_embeddings": None}, None),  # vLLM then takes --max_model_len as it is
])
def test_the_models_context_is_vllms(changes, limit):
    assert context_limit({**TINY_QWEN3, **changes}) == limit


def lengths(max_model_len=None, prompt=1024, generate=512, eval_generate=512) -> SimpleNamespace:
    return SimpleNamespace(max_model_len=max_model_len, prompt_max_length=prompt, generate_max_length=generate,
                           eval_generate_max_length=eval_generate)


@settings(max_examples=300, **WITH_FIXTURES)
@given(max_model_len=st.one_of(st.none(), st.integers(1, 5000)), prompt=st.integers(1, 3000),
       generate=st.integers(1, 3000), eval_generate=st.integers(1, 3000), readable=st.booleans())
def test_vllms_context_must_hold_the_longest_turn_and_fit_the_model(max_model_len, prompt, generate, eval_generate,
                                                                    readable, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    args = lengths(max_model_len, prompt, generate, eval_generate)
    config = TINY_QWEN3 if readable else None
    context = max_model_len if max_model_len is not None else (2048 if readable else None)
    too_long = readable and max_model_len is not None and max_model_len > 2048
    too_short = context is not None and prompt + max(generate, eval_generate) > context
    if not (too_long or too_short):
        check_context_lengths(args, config, "tiny")
        return
    message = refusal(check_context_lengths, args, config, "tiny")
    if too_long:
        assert message == (f"--max_model_len {max_model_len} is longer than tiny's context (2048 tokens, from its "
                           "config.json), which vLLM refuses when the actors start: give --max_model_len 2048 or "
                           "less (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")
    else:
        assert f"is shorter than the longest turn, --prompt_max_length {prompt} + " in message
        assert f"= {prompt + max(generate, eval_generate)} tokens" in message


def test_vllms_own_override_lets_a_longer_context_through(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    check_context_lengths(lengths(max_model_len=4096), TINY_QWEN3, "tiny")


def test_a_context_too_short_says_which_flag_to_change():
    message = refusal(check_context_lengths, lengths(max_model_len=1500), None, "m")
    assert message.endswith("give --max_model_len 1536 or lower --prompt_max_length to 988")
    message = refusal(check_context_lengths, lengths(prompt=2000, eval_generate=600), TINY_QWEN3, "tiny")
    assert message.startswith("tiny's context (2048 tokens) is shorter than the longest turn, --prompt_max_length "
                              "2000 + --eval_generate_max_length 600 = 2600 tokens")
    assert message.endswith("lower --prompt_max_length to 1448")  # a longer context than the model's would not do
    assert refusal(check_context_lengths, lengths(max_model_len=400), None, "m").endswith(
        "or lower --generate_max_length")


@pytest.fixture(scope="module")
def tiny_modules():
    modules = architecture_modules(TINY_QWEN3)
    assert modules is not None
    return modules


OAT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "up_proj", "gate_proj"]
"""oat 0.2.4's default --target_modules (OATArgs.target_modules)."""


def test_oats_default_targets_and_each_layer_of_the_model_pass(tiny_modules):
    check_lora_targets(OAT_TARGETS, tiny_modules, "tiny")
    for name in [*OAT_TARGETS, "lm_head", "embed_tokens", "model.layers.0.self_attn.q_proj"]:
        check_lora_targets([name], tiny_modules, "tiny")
    check_lora_targets(r".*\.(q|v)_proj", tiny_modules, "tiny")  # peft's regular expression (not from the CLI)
    check_lora_targets(None, tiny_modules, "tiny")  # peft's default for the model type
    check_lora_targets("all-linear", tiny_modules, "tiny")  # peft's shorthand, as a string (not from the CLI)


@settings(max_examples=100, **WITH_FIXTURES)
@given(name=st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True))
def test_a_target_the_model_lacks_is_refused_even_beside_ones_it_has(name, tiny_modules):
    """peft skips a name that matches nothing when another one matches: a misspelt layer would go untrained."""
    assume(not any(key == name or key.endswith(f".{name}") for key, _ in tiny_modules))
    message = refusal(check_lora_targets, ["q_proj", name], tiny_modules, "tiny")
    assert message.startswith(f"--target_modules {name}: tiny has no module of that name; its layers LoRA can "
                              "adapt are down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, q_proj")


@pytest.mark.parametrize("targets, fragment", [
    (["mlp"], "--target_modules mlp matches model.layers.0.mlp, a Qwen3MLP, which LoRA cannot adapt"),
    (["self_attn"], "a Qwen3Attention, which LoRA cannot adapt"),
    (["input_layernorm"], "a Qwen3RMSNorm, which LoRA cannot adapt"),
    (["all-linear"], "--target_modules all-linear: tiny has no module of that name"),  # a shorthand as a string only
    ([], "--target_modules names no module"),
])
def test_targets_lora_cannot_adapt_are_refused(targets, fragment, tiny_modules):
    assert fragment in refusal(check_lora_targets, targets, tiny_modules, "tiny")


def test_an_architecture_transformers_cannot_build_here_is_not_checked():
    assert architecture_modules({"model_type": "no-such-architecture"}) is None
    assert architecture_modules({"hidden_size": 8}) is None


# ------------------------------------------------------------------------------------------------ the resume record


def write_checkpoint(run: Path, record: object, learners: int = 1, learning_round: int = 2) -> Path:
    """A whole checkpoint of round ``learning_round`` whose resume.json holds ``record`` (any JSON)."""
    root = run / CHECKPOINTS_DIR
    partial = partial_path(root, checkpoint_tag(learning_round))
    partial.mkdir(parents=True)
    for rank in range(learners):
        (partial / resume.learner_file(rank)).write_bytes(b"state")
    (partial / resume.RESUME_RECORD).write_text(json.dumps(record))
    return commit_checkpoint(root, checkpoint_tag(learning_round))


SOUND = {"learning_round": 2, "actor_steps": 4, "learners": 1, "pi_beta_version": 2, "code_commit": "abc"}

BAD_COUNTS = st.one_of(st.none(), st.booleans(), st.integers(max_value=0), st.floats(allow_nan=False),
                       st.text(max_size=5), st.lists(st.integers(), max_size=2))


@pytest.mark.fault("oat engine: `--resume_dir` whose checkpoint record is damaged (a count missing, null or "
                   "mistyped, the wrong round)",
                   "`error: <path> is damaged (...): resume from an older checkpoint with --resume_tag, or start a new "
                   "run` (exit 2), before any model loads")
@settings(max_examples=60, **WITH_FIXTURES)
@given(field=st.sampled_from(RECORD_COUNTS), value=BAD_COUNTS, drop=st.booleans())
def test_a_resume_record_with_a_missing_null_or_mistyped_count_is_one_line(field, value, drop, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    record = {key: item for key, item in SOUND.items() if not (drop and key == field)}
    if not drop:
        record[field] = value
    write_checkpoint(run, record)
    message = refusal(find_resume_point, run)
    where = run / CHECKPOINTS_DIR / "round_000002" / "resume.json"
    said = "has no" if drop else f"has {json.dumps(value)} for"
    assert message == (f"{where} is damaged (it {said} {field}, a whole number >= 1): resume from an older "
                       "checkpoint with --resume_tag, or start a new run")


@pytest.mark.parametrize("record, fragment", [
    ([1, 2], "is damaged (a JSON list, not an object)"),
    ("round 2", "is damaged (a JSON str, not an object)"),
    (None, "is damaged (a JSON NoneType, not an object)"),
    ({**SOUND, "learning_round": 3}, "its learning_round 3 is not the round of the folder round_000002"),
    ({**SOUND, "actor_steps": 1}, "actor_steps 1 is fewer than its learning_round 2"),
    ({**SOUND, "learners": 2}, "lacks learner_1.pt of the 2 learner(s) resume.json names"),
])
def test_a_resume_record_that_contradicts_its_checkpoint_is_one_line(record, fragment, tmp_path):
    write_checkpoint(tmp_path, record)
    message = refusal(find_resume_point, tmp_path)
    assert fragment in message and message.endswith("resume from an older checkpoint with --resume_tag, or start a "
                                                    "new run")


def test_a_sound_resume_record_is_read_back(tmp_path):
    write_checkpoint(tmp_path, {**SOUND, "learners": 2}, learners=2)
    point = find_resume_point(tmp_path)
    assert point.learning_round == 2 and point.record["learners"] == 2


# ------------------------------------------------------------------------------------------- the resume's settings


def recorded(trust_region: TrustRegion, **flags) -> dict:
    """What an oat run's config.json holds of these settings: the flags as given, the trust region resolved."""
    overrides = {f"tr_{name}": None for name in ("delta", "eps_low", "eps_high", "k")}
    return {"learning_rate": 1e-6, "wb_run_name": "a", "run_name": "a", **overrides, **flags,
            "trust_region": dataclasses.asdict(trust_region)}


@pytest.mark.fault("oat engine: a resume with another `--trust_region` (or `--tr_*` that resolves to another band)",
                   "`error: ... trust_region.name: 'dppo_binary_tv' → 'ppo' ...` (exit 2): the run's settings are "
                   "compared in their canonical form")
@pytest.mark.parametrize("preset", ["ppo", "dppo_binary_kl", "cispo"])
def test_a_resume_with_another_preset_is_refused_though_the_flag_was_never_compared_as_a_name(preset):
    """config.json records the trust region as the settings it resolved to; the flag names a preset."""
    run = TrustRegion.preset("dppo_binary_tv", delta=0.2)
    other = TrustRegion.preset(preset)
    message = refusal(resume.check_resume_settings, recorded(run, tr_delta=0.2), recorded(other),
                      free_on_resume(other))
    assert f"trust_region.name: 'dppo_binary_tv' → '{preset}'" in message
    assert "a resume may change only where and how the run logs and saves" in message


def test_an_override_is_compared_as_the_trust_region_it_resolves_to():
    run = TrustRegion.preset("dppo_binary_tv")  # δ 0.15, the preset's
    same = TrustRegion.preset("dppo_binary_tv", delta=0.15)
    resume.check_resume_settings(recorded(run), recorded(same, tr_delta=0.15), free_on_resume(same))
    wider = TrustRegion.preset("dppo_binary_tv", delta=0.2)
    message = refusal(resume.check_resume_settings, recorded(run), recorded(wider, tr_delta=0.2),
                      free_on_resume(wider))
    assert "1 setting(s) differ" in message and "trust_region.delta: 0.15 → 0.2" in message


def test_a_field_the_rule_never_reads_may_differ_and_logging_may_change():
    run, current = TrustRegion.preset("dppo_binary_tv"), TrustRegion.preset("dppo_binary_tv")
    stored = recorded(run)
    stored["trust_region"]["k"] = 99  # a value a binary rule never reads (the run recorded another)
    resume.check_resume_settings(stored, recorded(current, wb_run_name="b", run_name="b", token_samples=0),
                                 free_on_resume(current))
    assert "k" not in current.fields_read
    message = refusal(resume.check_resume_settings, stored, recorded(current, learning_rate=2e-6),
                      free_on_resume(current))
    assert "learning_rate: 1e-06 → 2e-06" in message
