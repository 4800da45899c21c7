"""The code and the docs say what the project does now; what changed, and the numbers it used to give, belong in
CHANGELOG.md. This check looks for the phrases that narrate an earlier version, in every tracked text file but the
changelog (a phrase that is not history can be rewritten, never allow-listed)."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HISTORY = re.compile(
    r"earlier versions?|previous versions?|than before\b|the version before|predates|old shipped|used to give"
    r"|earlier spellings?|old spellings?|still accepted|legacy flags?|was renamed|were renamed"
    r"|no longer (?:accepted|supported)"
    r"|before the flag existed",
    re.I,
)
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ipynb"}
EXEMPT = {"CHANGELOG.md", "tests/test_no_history.py"}


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / name for name in listed if Path(name).suffix in TEXT_SUFFIXES and name not in EXEMPT]


def history_phrases(path: Path) -> list[str]:
    """``file:line: phrase`` for each phrase of ``path`` that narrates an earlier version of the project."""
    hits = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        hits += [f"{path.relative_to(REPO)}:{number}: {m.group(0)!r}" for m in HISTORY.finditer(line)]
    return hits


def test_no_file_narrates_an_earlier_version_of_the_project():
    hits = [hit for path in tracked_text_files() for hit in history_phrases(path)]
    assert not hits, "history belongs in CHANGELOG.md:\n" + "\n".join(hits)


def test_the_check_sees_a_history_phrase(tmp_path):
    (tmp_path / "x.md").write_text("fine\nThe old shipped policy was slower than before.\n")
    hits = HISTORY.findall((tmp_path / "x.md").read_text())
    assert [h.lower() for h in hits] == ["old shipped", "than before"]
