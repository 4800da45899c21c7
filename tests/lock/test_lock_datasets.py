"""The GPU node's lock (requirements/gpu-node-py310.txt): its ``datasets`` and ``fsspec`` load what ``save_to_disk``
wrote (``make test-lock-data``, an environment holding that pair; marked ``lock``).

envs/math_local.py loads oat's math data, saved ``DatasetDict`` folders, with ``load_from_disk(path,
keep_in_memory=True)`` when the learner starts. datasets <= 2.14.4 beside fsspec >= 2023.9.0 takes the local
filesystem for a remote one: loading a ``DatasetDict`` raises "Protocol not known", and a ``Dataset`` is copied to a
temporary folder before it is read.
"""

import os
import re
from pathlib import Path

import datasets
import fsspec
import pytest
from datasets import Dataset, DatasetDict, load_from_disk

pytestmark = pytest.mark.lock

REPO = Path(__file__).resolve().parents[2]
# The Makefile names the lock it installed from (GPU_LOCK); by default the repository's.
LOCK = Path(os.environ.get("GPU_LOCK") or REPO / "requirements" / "gpu-node-py310.txt")

ROWS = {
    "train": {"problem": ["1 + 1 = ?", "2 + 3 = ?", "7 * 6 = ?"], "answer": ["2", "5", "42"]},
    "eval": {"problem": ["10 - 4 = ?"], "answer": ["6"]},
}


def lock_pin(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", LOCK.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert match, f"{LOCK} pins no {name}"
    return match.group(1)


@pytest.mark.parametrize("module", [datasets, fsspec], ids=lambda m: m.__name__)
def test_environment_holds_the_lock_pair(module):
    """The other tests say something about the lock only if this environment holds the lock's versions."""
    assert module.__version__ == lock_pin(module.__name__)


def test_local_filesystem_is_not_remote():
    filesystems = pytest.importorskip("datasets.filesystems")
    if not hasattr(filesystems, "is_remote_filesystem"):
        pytest.skip("this datasets has no datasets.filesystems.is_remote_filesystem")
    assert not filesystems.is_remote_filesystem(fsspec.filesystem("file"))


def rows(dataset):
    return {column: dataset[column] for column in dataset.column_names}


@pytest.mark.parametrize("splits", [("train", "eval"), ("eval",)], ids=["two-splits", "one-split"])
@pytest.mark.parametrize("keep_in_memory", [True, False], ids=["in-memory", "mapped"])
def test_dataset_dict_round_trip(tmp_path, splits, keep_in_memory):
    folder = tmp_path / "math_set"
    DatasetDict({split: Dataset.from_dict(ROWS[split]) for split in splits}).save_to_disk(str(folder))
    for loader in (load_from_disk, DatasetDict.load_from_disk):
        loaded = loader(str(folder), keep_in_memory=keep_in_memory)
        assert isinstance(loaded, DatasetDict)
        assert list(loaded) == list(splits)
        for split in splits:
            assert rows(loaded[split]) == ROWS[split]


@pytest.mark.parametrize("keep_in_memory", [True, False], ids=["in-memory", "mapped"])
def test_dataset_round_trip(tmp_path, keep_in_memory):
    folder = tmp_path / "gsm8k_test"
    Dataset.from_dict(ROWS["train"]).save_to_disk(str(folder))
    for loader in (load_from_disk, Dataset.load_from_disk):
        loaded = loader(str(folder), keep_in_memory=keep_in_memory)
        assert isinstance(loaded, Dataset)
        assert rows(loaded) == ROWS["train"]
        # read in place: a local folder taken for a remote one is copied to a temporary folder first
        for cache_file in loaded.cache_files:
            assert Path(cache_file["filename"]).resolve().parent == folder.resolve()
