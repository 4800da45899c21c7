"""``--token-export all``: every trained token of a step in ``token_exports/step_<step>.jsonl``, written by a
background thread, its records' fields named as prime-rl's token export names them; nothing when off."""

import json
import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from dppo_oat.run.token_export import (
    BOOL_COLUMNS,
    FLOAT_COLUMNS,
    TokenExporter,
    TokenObservers,
    export_path,
    read_token_export,
)
from dppo_oat.trust_region import TrustRegion, policy_loss

FIELDS = {"schema_version", "step", "row", "turn", "env_name", "token_ids", *BOOL_COLUMNS, *FLOAT_COLUMNS}


def micro_batch():
    """Two rows of a prompt token then responses: row 0 three response tokens, row 1 one then padding. Row 0's
    first token moves up under A > 0 far enough for DPPO (δ 0.15) to block it; row 1's moves down under A < 0."""
    mu = torch.tensor([[0.5, 0.2, 0.4, 0.5], [0.5, 0.6, 0.5, 0.5]]).log()
    pi = torch.tensor([[0.5, 0.5, 0.45, 0.5], [0.5, 0.3, 0.5, 0.5]]).log()
    mask = torch.tensor([[False, True, True, True], [False, True, False, False]])
    adv = torch.tensor([[1.0], [-1.0]])
    micro = SimpleNamespace(input_ids=torch.arange(10).reshape(2, 5), behavior_logp=mu, advantages=adv,
                            response_mask=mask)
    result = policy_loss(pi, mu, adv, mask, TrustRegion.preset("dppo_binary_tv"))
    return micro, pi, result


def test_records_by_hand(tmp_path):
    micro, pi, result = micro_batch()
    exporter = TokenExporter(tmp_path)
    exporter.observe(torch.tensor([3, 7]), micro, pi, None, result)
    exporter.write(2, turns=[0] * 8, envs=[f"env{i}" for i in range(8)])
    exporter.close()
    records = [json.loads(line) for line in export_path(tmp_path, 2).read_text().splitlines()]
    assert [r["row"] for r in records] == [3, 7] and all(set(r) == FIELDS for r in records)
    first, second = records
    assert first["token_ids"] == [2, 3, 4] and second["token_ids"] == [7]  # targets: input_ids shifted by one
    assert first["env_name"] == "env3" and first["step"] == 2 and first["schema_version"] == 1
    assert first["inference_logprobs"] == pytest.approx([math.log(0.2), math.log(0.4), math.log(0.5)])
    assert first["importance_ratio"] == pytest.approx([2.5, 1.125, 1.0])
    assert first["is_masked"] == [True, False, False] and first["is_masked_high"] == [True, False, False]
    assert second["is_masked"] == [True] and second["is_masked_low"] == [True] and second["is_masked_high"] == [False]
    assert first["entropy"] == [None, None, None]  # no entropy: null, never NaN
    frame = read_token_export(tmp_path, 2)
    assert len(frame) == 4 and list(frame["position"]) == [0, 1, 2, 0]


def test_every_observer_sees_every_micro_batch(tmp_path):
    micro, pi, result = micro_batch()
    seen = []
    probe = SimpleNamespace(observe=lambda *args: seen.append(args[0]))
    exporter = TokenExporter(tmp_path)
    TokenObservers(probe, None, exporter).observe(torch.tensor([0, 1]), micro, pi, None, result)
    exporter.write(1)
    exporter.close()
    assert len(seen) == 1 and export_path(tmp_path, 1).exists()


def test_a_failed_write_is_raised_at_the_next_step(tmp_path):
    micro, pi, result = micro_batch()
    (tmp_path / "token_exports").write_text("a file where the folder goes")
    exporter = TokenExporter(tmp_path)
    exporter.observe(torch.tensor([0, 1]), micro, pi, None, result)
    exporter.write(1)
    with pytest.raises(OSError):
        exporter.write(2)
    exporter.close()


# --------------------------------------------------------------------------------------------- reading it back

RECORD = {"schema_version": 1, "step": 1, "row": 0, "turn": 0, "env_name": "e", "token_ids": [5, 6],
          "loss_mask": [True, True], "is_masked": [False, False], "is_masked_high": [False, False],
          "is_masked_low": [False, False], "advantages": [1.0, 1.0], "inference_logprobs": [-0.1, -0.2],
          "trainer_logprobs": [-0.1, -0.2], "importance_ratio": [1.0, 1.0], "entropy": [None, None]}
"""A record of two tokens, as :func:`~dppo_oat.run.token_export.row_records` writes one."""


def write_export(run_dir, step: int, lines: list) -> None:
    """Step ``step``'s export file of ``run_dir``: a line per item (a record as JSON, or the bytes given)."""
    path = export_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n"
                              for line in lines))


def without(*names: str) -> dict:
    return {key: value for key, value in RECORD.items() if key not in names}


@pytest.mark.fault("`read_token_export(run)` (the notebooks, `dppo_oat.calibrate`) on a step export with a damaged "
                   "record (not JSON, not UTF-8, not a JSON object, a field missing, not a list or of another length "
                   "than the others) or whose file is a directory",
                   "a `ValueError` naming the file, the step and the line (never a bare `TypeError`, `KeyError` or "
                   "`IsADirectoryError`, or a JSON error naming no file)")
@pytest.mark.parametrize("damage, reason", [
    (b'{"step": 1, "row"', "not JSON"),
    (b"\xff\xfe not text", "not UTF-8"),
    ([1, 2], "a list, not a JSON object"),
    ("a string", "a string, not a JSON object"),
    (None, "null, not a JSON object"),
    (without("token_ids"), "lacks token_ids"),
    (without("step", "row"), "lacks step, row"),
    ({**RECORD, "token_ids": 5}, "its token_ids is not a list"),
    ({**RECORD, "entropy": [0.5]}, "its per-token fields differ in length"),
    ({**RECORD, "row": "0"}, "its row is not an integer"),
    ({**RECORD, "step": True}, "its step is not an integer"),
])
def test_a_damaged_record_is_a_value_error_naming_the_file_step_and_line(tmp_path, damage, reason):
    write_export(tmp_path, 1, [RECORD, damage])
    with pytest.raises(ValueError) as raised:
        read_token_export(tmp_path, 1)
    line = "" if reason == "not UTF-8" else ", line 2"
    assert str(raised.value).startswith(f"token export {export_path(tmp_path, 1)} (step 1){line}: "), raised.value
    assert reason in str(raised.value) and type(raised.value) is ValueError
    with pytest.raises(ValueError, match=r"\(step 1\)"):  # read with every step as well
        read_token_export(tmp_path)


def test_an_export_file_that_is_a_directory_is_a_value_error_naming_it(tmp_path):
    export_path(tmp_path, 3).mkdir(parents=True)
    with pytest.raises(ValueError) as raised:
        read_token_export(tmp_path, 3)
    assert str(raised.value).startswith(f"token export {export_path(tmp_path, 3)} (step 3) is a directory")


@pytest.mark.fault("a step export that holds a record twice (the same step and row: a file appended to, or a copy's "
                   "lines)",
                   "one warning naming the file, the step and the row (and how many were repeated); the last copy of "
                   "each is kept, so no token is counted twice")
@pytest.mark.parametrize("copies", [2, 3])
def test_a_record_written_twice_is_read_once_with_a_warning(tmp_path, copies):
    other = {**RECORD, "row": 4}
    last = {**RECORD, "advantages": [-1.0, -1.0]}
    write_export(tmp_path, 1, [RECORD] * (copies - 1) + [other, last])
    with pytest.warns(UserWarning) as caught:
        frame = read_token_export(tmp_path, 1)
    assert [str(w.message) for w in caught] == [
        f"{export_path(tmp_path, 1)}: the record of step 1, row 0 is written more than once (1 record(s) repeated): "
        "the last copy of each is kept"]
    assert sorted(frame["row"]) == [0, 0, 4, 4] and list(frame.loc[frame["row"] == 0, "advantages"]) == [-1.0, -1.0]


def test_records_of_distinct_steps_and_rows_are_all_kept(tmp_path):
    write_export(tmp_path, 1, [RECORD, {**RECORD, "row": 1}])
    write_export(tmp_path, 2, [{**RECORD, "step": 2}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = read_token_export(tmp_path)
    assert frame[["step", "row"]].drop_duplicates().values.tolist() == [[1, 0], [1, 1], [2, 0]]


# --------------------------------------------------------------------------------------------- offline calibration


def exported_run(tmp_path, step=2):
    """A run directory whose token export holds :func:`micro_batch` as step ``step``: A ≠ 0 tokens with
    |π − μ| 0.3 (up, A > 0), 0.05 (up, A > 0), 0 and 0.3 (down, A < 0), which DPPO-Binary-TV may all block but the
    unmoved one."""
    micro, pi, result = micro_batch()
    exporter = TokenExporter(tmp_path)
    exporter.observe(torch.tensor([0, 1]), micro, pi, None, result)
    exporter.write(step)
    exporter.close()
    return tmp_path


def calibrate_cli(argv, capsys):
    """``python -m dppo_oat.calibrate argv``: (exit code, stdout, the ``error:`` lines of stderr)."""
    from dppo_oat.calibrate import main

    code = 0
    try:
        main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, [line for line in out.err.splitlines() if line.startswith("error:")]


def test_the_export_is_read_back_as_the_batch_the_loss_saw(tmp_path):
    from dppo_oat.calibrate import export_batch

    micro, pi, _ = micro_batch()
    batch = export_batch(exported_run(tmp_path), 2)
    response = micro.response_mask[:, 1:]  # a record spans its first to last response token
    assert torch.equal(batch.response, response)
    assert torch.allclose(batch.logp[response], pi[:, 1:][response])
    assert torch.allclose(batch.behavior_logp[response], micro.behavior_logp[:, 1:][response])
    assert batch.advantages[response].tolist() == [1.0, 1.0, 1.0, -1.0]


def test_the_offline_command_prints_the_band_and_the_flags_to_train_with_it(tmp_path, capsys):
    """δ 0.15 blocks the two A ≠ 0 tokens with |π − μ| = 0.3 (2 of 4); blocking none puts δ at 0.3; DPPO-Binary-KL
    (δ 0.05) blocks the same two, so matching it keeps δ; --json gives the report."""
    run = str(exported_run(tmp_path))
    code, out, errors = calibrate_cli([run, "--trust-region", "dppo_binary_tv", "--target", "0"], capsys)
    assert code == 0 and not errors and len(out.splitlines()) == 1
    assert "dppo_binary_tv: δ 0.15 → 0.3 blocks 0.0000 of the 4 A ≠ 0 tokens of step 2's token export" in out
    assert "the band before blocked 0.5000" in out and "train with --trust-region dppo_binary_tv --tr-delta 0.3" in out
    code, out, _ = calibrate_cli([run, "--trust-region", "dppo_binary_tv", "--like", "dppo_binary_kl", "--json"],
                                 capsys)
    report = json.loads(out)
    assert code == 0 and report["like"] == "dppo_binary_kl" and report["source"] == "step 2's token export"
    assert report["achieved"] == report["target"] == 0.5 and report["after"] == {"delta": 0.15}


@pytest.mark.fault("`python -m dppo_oat.calibrate` on a run without a token export or the step asked for, or for a "
                   "rule whose mask reads μ's top-K set or π_θ', or with a target out of range",
                   "one line (exit 2) saying what to do")
@pytest.mark.parametrize("flags, message", [
    (["--trust-region", "dppo_binary_tv", "--target", "0.5", "--step", "3"], "has no step 3: it has step(s) 2"),
    (["--trust-region", "dppo_topk_tv", "--target", "0.1"], "calibrate its binary twin (dppo_binary_tv)"),
    (["--trust-region", "minirl", "--target", "0.1"], "reads the recomputed π_θ', which a token export does not hold"),
    (["--trust-region", "dppo_binary_tv", "--like", "icepop"], "--like icepop: its mask reads the recomputed π_θ'"),
    (["--trust-region", "cispo", "--target", "0.1"], "trust region cispo has no band to calibrate"),
    (["--trust-region", "ppo", "--target", "2"], "in [0, 1), got 2.0"),
    (["--trust-region", "ppo"], "give --target (a fraction of tokens to block) or --like"),
    (["--target", "0.1"], "has no config.json to read its trust region from: give --trust-region"),
    (["--trust-region", "dppo_binary_tv", "--target", "0.9"], "blocks between 0 and 0.75 of them"),
])
def test_offline_calibration_refuses_in_one_line(tmp_path, capsys, flags, message):
    code, out, errors = calibrate_cli([str(exported_run(tmp_path)), *flags], capsys)
    assert code == 2 and not out and len(errors) == 1 and message in errors[0], errors


@pytest.mark.fault("`python -m dppo_oat.calibrate` on a run whose config.json records its trust region as a string "
                   "(or not at all), or whose export holds log-probs above 0",
                   "one line naming what the file holds (exit 2), never \"has no config.json\" for a file that is "
                   "there")
@pytest.mark.parametrize("config, message", [
    ({"trust_region": "dppo_binary_tv"}, "records trust_region as str 'dppo_binary_tv', not the settings of one"),
    ({"seed": 0}, "records no trust_region: give --trust-region"),
])
def test_offline_calibration_names_what_the_config_records(tmp_path, capsys, config, message):
    run = exported_run(tmp_path)
    (run / "config.json").write_text(json.dumps(config))
    code, out, errors = calibrate_cli([str(run), "--target", "0.1"], capsys)
    assert code == 2 and not out and len(errors) == 1 and message in errors[0], errors


def test_offline_calibration_refuses_log_probs_above_zero(tmp_path, capsys):
    from dppo_oat.run.directory import RunDir

    run = exported_run(tmp_path)
    step_file = RunDir(run).export(2)
    records = [json.loads(line) for line in step_file.read_text().splitlines()]
    records[0]["trainer_logprobs"] = [abs(value) + 0.5 if value is not None else value
                                      for value in records[0]["trainer_logprobs"]]
    step_file.write_text("".join(json.dumps(record) + "\n" for record in records))
    code, out, errors = calibrate_cli([str(run), "--trust-region", "dppo_binary_tv", "--target", "0.1"], capsys)
    assert code == 2 and not out and len(errors) == 1 and "holds values > 0" in errors[0], errors


@pytest.mark.fault("`python -m dppo_oat.calibrate` without a run directory, with a value that does not parse "
                   "(`--target abc`) or a mistyped flag (`--targt`)",
                   "one `error:` line naming what is missing or wrong (and the flag meant), exit 2: never tyro's box")
@pytest.mark.parametrize("argv, said", [([], "Missing from python -m dppo_oat.calibrate: RUN_DIR"),
                                        (["runs/x", "--target", "abc"], "--target takes {None}|FLOAT, got 'abc'"),
                                        (["runs/x", "--targt", "0.1"], "did you mean --target?")])
def test_offline_calibration_usage_errors_are_one_line(capsys, argv, said):
    code, out, errors = calibrate_cli(argv, capsys)
    assert code == 2 and not out and len(errors) == 1 and said in errors[0], errors
    assert "╭" not in capsys.readouterr().err


def test_offline_calibration_without_an_export_says_how_to_get_one(tmp_path, capsys):
    code, _, errors = calibrate_cli([str(tmp_path), "--trust-region", "ppo", "--target", "0.1"], capsys)
    assert code == 2 and errors == [f"error: {tmp_path} has no token export (token_exports/step_*.jsonl): train it "
                                    "with --token-export all"]


@pytest.mark.fault("`python -m dppo_oat.calibrate` on an empty or damaged step file of a token export",
                   "one `error:` line naming the file and the step (and the line of a damaged record) and what to do, "
                   "never a `KeyError` nor the reader's message wrapped twice")
@pytest.mark.parametrize("content, message", [(b"", "(step 1) holds no record (an empty file)"),
                                              (b"not json\n", "(step 1), line 1: not JSON")])
def test_offline_calibration_on_an_empty_or_damaged_step_file_names_it(tmp_path, capsys, content, message):
    from dppo_oat.run.directory import RunDir

    run = exported_run(tmp_path)
    step_file = RunDir(run).export(1)
    step_file.write_bytes(content)
    code, out, errors = calibrate_cli([str(run), "--trust-region", "dppo_binary_tv", "--target", "0.1", "--step", "1"],
                                      capsys)
    assert code == 2 and not out and len(errors) == 1, errors
    assert message in errors[0] and str(step_file) in errors[0] and errors[0].count(str(step_file)) == 1, errors


def test_the_training_collector_keeps_each_loss_call_with_its_top_k_divergence():
    """``--tr-calibrate`` on a top-K rule: the collector keeps each loss call's own top-K divergence (the rollout's
    set is not kept), and calibration reads it: a batch a top-K rule could not calibrate on without it."""
    from dppo_oat.engines.local.calibration import BatchCollector
    from dppo_oat.trust_region import TopK, calibrate

    micro, pi, _ = micro_batch()
    ids = torch.tensor([0, 1, -1]).expand(2, 4, 3).clone()
    mu_top = torch.stack([micro.behavior_logp, (1 - micro.behavior_logp.exp()).log()], -1)
    pi_top = torch.stack([pi, (1 - pi.exp()).log()], -1)
    topk = TopK(ids, torch.cat([mu_top, mu_top[..., :1]], -1), torch.cat([pi_top, pi_top[..., :1]], -1), ids != -1)
    tr = TrustRegion.preset("dppo_topk_tv", k=2)
    result = policy_loss(pi, micro.behavior_logp, micro.advantages, micro.response_mask, tr, topk=topk)
    collector = BatchCollector(tr)
    collector.observe(torch.tensor([0, 1]), SimpleNamespace(**vars(micro), recomputed_logp=None), pi, None, result)
    [call] = collector.calls
    assert set(call.divergences) == {"topk_tv"} and torch.equal(call.divergences["topk_tv"], result.divergence)
    calibrated, report = calibrate(tr, collector.calls, 0.0)
    assert report.before_fraction == 0.5 and report.achieved == 0.0 and calibrated.delta == pytest.approx(0.3)


# ---------------------------------------------------------------- faults of a run's exports: nothing is lost

RUN = ["--groups-per-step", "2", "--group-size", "4", "--minibatch-size", "32", "--eval-episodes", "2",
       "--eval-every", "5", "--token-samples", "4", "--threads", "1", "--token-export", "all"]
"""A run of the shipped tiny policy that exports every trained token."""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("policy-cache"))


def argv_of(run_dir, cache_dir, *flags):
    return ["--runs-dir", str(run_dir.parent), "--run-name", run_dir.name, "--cache-dir", cache_dir, *RUN, *flags]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, cache_dir):
    """An uninterrupted 3-step run: the exports every faulted run must end with."""
    from dppo_oat.train import main

    run_dir = tmp_path_factory.mktemp("straight") / "run"
    main(argv_of(run_dir, cache_dir, "--steps", "3"))
    return run_dir


@pytest.fixture
def one_step(straight, cache_dir, tmp_path):
    """A 1-step run of the same settings (the first checkpoint of the straight run), to resume."""
    from dppo_oat.train import main

    run_dir = tmp_path / "run"
    main(argv_of(run_dir, cache_dir, "--steps", "1"))
    return run_dir


PATCHED = """
import resource, signal, sys, threading, time
import dppo_oat.run.token_export as token_export
from dppo_oat.train import main
fault, argv = sys.argv[1], sys.argv[2:]
if fault == "full":  # a write past the limit fails with EFBIG, as a full disk's does
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.RLIM_INFINITY))
if fault == "hung":  # the file system never answers the write of step 2
    real_write = token_export.write_records
    def write_records(path, records):
        if path.name == "step_000002.jsonl":
            threading.Event().wait()
        real_write(path, records)
    token_export.write_records = write_records
    token_export.WRITE_TIMEOUT_S = 3.0
if fault == "slow":  # step 1's export takes 2 s, and the process is killed right after step 1's checkpoint
    import os
    from dppo_oat.engines.local.trainer import LocalTrainer
    real_write, real_save = token_export.write_records, LocalTrainer.save_checkpoint
    def write_records(path, records):
        if path.name == "step_000001.jsonl":
            time.sleep(2)
        real_write(path, records)
    def save_checkpoint(self):
        real_save(self)
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    token_export.write_records, LocalTrainer.save_checkpoint = write_records, save_checkpoint
main(argv)
"""


def run_with(fault, argv, timeout=300):
    """``python -m dppo_oat.train argv`` with ``fault`` (``full``: no file grows past 50 kB; ``hung``: the export
    of step 2 never returns; ``slow``: step 1's export takes 2 s and a SIGKILL follows step 1's checkpoint;
    ``none``): (exit status, ``error:`` lines, all output); a hang fails the test."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PATCHED, fault, *argv], capture_output=True, text=True,
                          timeout=timeout)
    text = done.stdout + done.stderr
    return done.returncode, [line for line in text.splitlines() if line.startswith("error:")], text


def same_exports(run_dir, straight):
    from dppo_oat.run.log import temporaries

    assert sorted(p.name for p in (run_dir / "token_exports").iterdir()) == [f"step_00000{s}.jsonl" for s in (1, 2, 3)]
    for step in (1, 2, 3):
        assert export_path(run_dir, step).read_text() == export_path(straight, step).read_text(), step
    assert not temporaries(run_dir)


def checkpoint_step(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=True, mmap=True)["step"]


@pytest.mark.fault("a full disk (or a quota) while `--token-export all` writes a step's export",
                   "`error: No space left on device: runs/…/token_exports/step_N.jsonl; free disk space; step N−1 is "
                   "checkpointed …` (exit 1): a step is checkpointed only once its export is on disk, so `--resume` "
                   "writes it again; no temporary file is left")
def test_a_full_disk_while_exporting_loses_no_step(one_step, straight, cache_dir):
    code, errors, text = run_with("full", argv_of(one_step, cache_dir, "--steps", "3", "--resume"))
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text
    assert f"File too large: {export_path(one_step, 2)}" in errors[0] and "free disk space" in errors[0], errors[0]
    assert "step 1 is checkpointed" in errors[0] and checkpoint_step(one_step) == 1
    code, errors, text = run_with("none", argv_of(one_step, cache_dir, "--steps", "3", "--resume"))
    assert code == 0, text
    same_exports(one_step, straight)


@pytest.mark.fault("a kill (`kill -9`) right after a step's checkpoint while its export is still being written (a "
                   "slow disk)",
                   "nothing is lost: a step is checkpointed only once its export is on disk, so `--resume` ends "
                   "with every step's export")
def test_a_kill_after_a_checkpoint_never_loses_that_steps_export(tmp_path, straight, cache_dir):
    run_dir = tmp_path / "run"
    code, errors, text = run_with("slow", argv_of(run_dir, cache_dir, "--steps", "3"))
    assert code == -9 and checkpoint_step(run_dir) == 1, text
    code, errors, text = run_with("none", argv_of(run_dir, cache_dir, "--steps", "3", "--resume"))
    assert code == 0, text
    same_exports(run_dir, straight)


@pytest.mark.fault("a blocked or hung file system under `token_exports/` while a step's export is written",
                   "after `WRITE_TIMEOUT_S` (300 s): `error: the token export of step N did not reach the disk in 300 "
                   "s (its file system is blocked or hung): …/step_N.jsonl; step N−1 is checkpointed …` (exit 1), "
                   "never a hang; `--resume` writes it again")
def test_a_hung_export_write_is_one_line_and_loses_no_step(one_step, straight, cache_dir):
    code, errors, text = run_with("hung", argv_of(one_step, cache_dir, "--steps", "3", "--resume"))
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text
    assert "did not reach the disk in 3 s" in errors[0] and "step_000002.jsonl" in errors[0], errors[0]
    assert "step 1 is checkpointed" in errors[0] and checkpoint_step(one_step) == 1
    code, errors, text = run_with("none", argv_of(one_step, cache_dir, "--steps", "3", "--resume"))
    assert code == 0, text
    same_exports(one_step, straight)


@pytest.mark.fault("a step export's temporary file left by an earlier run (a killed write's `.step_N.jsonl.XXXXXXXX`, "
                   "a `step_N.jsonl.partial`, even a FIFO that would block a writer)",
                   "removed by the next start or `--resume` of the run, under its lock (said in one note line); the "
                   "run exports every step")
def test_stale_export_temporaries_go_at_the_next_resume(one_step, straight, cache_dir):
    import os

    exports = one_step / "token_exports"
    (exports / "step_000002.jsonl.partial").write_text("half a step")
    (exports / ".step_000002.jsonl.k1ll3d00").write_text("half a step")
    os.mkfifo(exports / "step_000003.jsonl.partial")  # opened for writing, it blocks until a reader comes
    code, errors, text = run_with("none", argv_of(one_step, cache_dir, "--steps", "3", "--resume"))
    assert code == 0 and not errors, text
    assert "removed 3 temporary file(s)" in text, text
    same_exports(one_step, straight)


@pytest.mark.fault("`token_exports` is a file (not a folder) with `--token-export all`, or a folder it cannot write",
                   "one line before any model: move that file away, or another `--run-name`; nothing is trained")
def test_an_export_path_that_is_not_a_folder_is_one_line_before_any_model(tmp_path, cache_dir, capsys, no_model):
    from dppo_oat.train import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "token_exports").write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        main(argv_of(run_dir, cache_dir, "--steps", "2"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
    assert str(run_dir / "token_exports") in " ".join(err.split()) and "not a folder" in err, err
    assert (run_dir / "token_exports").read_text() == "mine" and sorted(p.name for p in run_dir.iterdir()) == [
        "token_exports"]


def test_a_hung_folder_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    """The probe write of :func:`check_export_folder` does not answer: one line after its timeout."""
    import threading

    import dppo_oat.run.token_export as token_export

    (tmp_path / "token_exports").mkdir()
    monkeypatch.setattr(token_export, "_probe_folder", lambda folder: threading.Event().wait())
    with pytest.raises(ValueError, match="did not reach the disk in 0.5 s"):
        token_export.check_export_folder(tmp_path, timeout=0.5)
