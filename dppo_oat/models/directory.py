"""What a model directory must hold before any engine loads it: a readable ``config.json`` object and weights."""

from __future__ import annotations

import json
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
"""The files a Hugging Face model directory keeps its weights in (one of them)."""


def check_model_directory(flag_value: str, path: Path) -> None:
    """A local ``--pretrain`` directory has a readable config.json and weights (else a traceback from deep in
    transformers or vLLM, after the models began to load): the rule of every engine."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ValueError(f"--pretrain {flag_value!r} is not a model directory (no config.json)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--pretrain {flag_value!r}: {config_path} is not valid JSON ({error}): restore it from "
                         "the model's source") from None
    if not isinstance(config, dict):
        raise ValueError(f"--pretrain {flag_value!r}: {config_path} is not a model config (a JSON object)")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"--pretrain {flag_value!r} has no weights ({' or '.join(WEIGHT_FILES[::2])}): save the "
                         "model with save_pretrained, or give the directory that holds them")
