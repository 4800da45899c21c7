"""--lr's default follows the policy (``default_lr``): 3e-4 × (128 / hidden) × (2 / layers) for the built-in policy,
the paper's 1e-6 for a --pretrain model; an explicit --lr wins, and config.json records the number either way.
The rule's reason is measured on real models: at its lr one AdamW step moves the policy about as far whatever the
shape, where at a fixed lr the move grows with width and depth (``scripts/bench/first_step_kl.py`` on qwen3-100m)."""

import importlib.util
import json
from pathlib import Path

import pytest

from dppo_oat.engines.local.config import PRETRAINED_LR, REFERENCE_LR, default_lr, logged_config, parse_config, run_spec

ROOT = Path(__file__).resolve().parents[1]


def load_probe():
    """scripts/bench/first_step_kl.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("first_step_kl", ROOT / "scripts" / "bench" / "first_step_kl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("flags", "expected"), [
    ([], 3e-4),  # the tiny default: make train's documented run is unchanged
    (["--warm-start.shape", "qwen3-100m"], 3e-4 / 36),  # hidden 768, 12 layers: 6 × 6
    (["--warm-start.shape", "tiny-8k"], 3e-4),  # the tiny architecture over a padded vocabulary
    (["--warm-start.hidden-size", "256", "--warm-start.num-layers", "4"], 3e-4 / 4),
    (["--warm-start.hidden-size", "64"], 6e-4),
    (["--pretrain", "some/model"], 1e-6),
    (["--warm-start.shape", "qwen3-100m", "--lr", "2e-5"], 2e-5),  # an explicit --lr wins
    (["--pretrain", "some/model", "--lr", "3e-4"], 3e-4),
])
def test_the_default_lr_follows_the_policy(flags, expected):
    assert parse_config(flags).lr == pytest.approx(expected, rel=1e-12)


def test_the_rule_is_anchored_on_the_measured_tiny_default_and_the_papers_rate():
    assert default_lr(shape="tiny", hidden_size=128, num_layers=2, pretrain=None) == REFERENCE_LR == 3e-4
    assert default_lr(shape="qwen3-100m", hidden_size=128, num_layers=2, pretrain=None) == pytest.approx(3e-4 / 36)
    assert default_lr(shape="tiny", hidden_size=128, num_layers=2, pretrain="m") == PRETRAINED_LR == 1e-6


def test_config_json_records_the_resolved_number(tmp_path):
    """A resume compares settings by number: the logged config holds the lr the run trains at, never None."""
    config = parse_config(["--warm-start.shape", "qwen3-100m", "--runs-dir", str(tmp_path)])
    logged = json.loads(json.dumps(logged_config(config, run_spec(config))))
    assert logged["lr"] == pytest.approx(3e-4 / 36)


def test_at_the_default_lr_one_step_moves_every_shape_about_as_far():
    """One AdamW step of a policy gradient on a fixed batch (real Qwen3s, random weights): at a fixed 3e-4 the
    per-token KL grows more than 10-fold from the tiny default (hidden 128, 2 layers) to hidden 256 × 4 layers; at
    each shape's default lr the KLs stay within 4× of each other. The rule is for shapes at or above the tiny default:
    below it (hidden 64) it overshoots, a step there moving the policy less. (qwen3-100m: 155-fold at 3e-4, 1.6×
    the tiny default's at 8.3e-6, in docs/bench/first_step_kl_cpu.jsonl.)"""
    probe = load_probe()
    fixed, scaled = [], []
    for hidden, layers in ((128, 2), (256, 2), (128, 4), (256, 4)):
        model = probe.width_model(hidden, layers, seed=0)
        ids, advantages = probe.fixed_batch(model.config.vocab_size, sequences=4, length=48, seed=0)
        rule = default_lr(shape="tiny", hidden_size=hidden, num_layers=layers, pretrain=None)
        fixed.append(probe.first_step_kl(model, ids, advantages, 3e-4)["kl_per_token"])
        scaled.append(probe.first_step_kl(model, ids, advantages, rule)["kl_per_token"])
    assert max(fixed) / min(fixed) > 10, fixed
    assert max(scaled) / min(scaled) < 4, scaled
