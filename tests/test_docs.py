"""The README stays short, and the documentation's relative links and snippet includes point at files that exist.

`make docs` (MkDocs, --strict) checks the site as a whole; these checks need no MkDocs and take a fraction of a
second, so the suite catches a moved page or a grown README on its own.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_MAX_BYTES = 12_500
"""The README's own text, its generated tables (``<!-- generated:NAME -->`` blocks, which grow with the code) aside."""
GENERATED_BLOCK = re.compile(r"<!-- generated:([\w-]+) -->\n.*?<!-- end generated:\1 -->", re.S)
DOCS = sorted((REPO / "docs").rglob("*.md"))

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)
SECTION = "<!-- --8<-- [{}:{}] -->"


def relative_links(text: str) -> list[str]:
    """The link and image targets of a Markdown text that name a file of the repository (no scheme, no bare anchor),
    outside code."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = [match.group(1) for match in LINK.finditer(prose)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file does not exist (anchors are MkDocs' to check)."""
    return [t for t in relative_links(page.read_text()) if not (page.parent / t.split("#", 1)[0]).exists()]


def broken_snippets(page: Path) -> list[str]:
    """The ``--8<-- "file[:section]"`` includes of ``page`` whose file (from the repository root, as mkdocs.yml's
    base_path) or section markers are missing."""
    broken = []
    for include in SNIPPET.findall(page.read_text()):
        name, _, section = include.partition(":")
        source = REPO / name
        if not source.is_file():
            broken.append(include)
        elif section:
            text = source.read_text()
            if not (SECTION.format("start", section) in text and SECTION.format("end", section) in text):
                broken.append(include)
    return broken


def written_text(text: str) -> str:
    """A page without its generated blocks."""
    return GENERATED_BLOCK.sub("", text)


def test_the_readme_stays_short():
    size = len(written_text(README.read_text(encoding="utf-8")).encode())
    assert size <= README_MAX_BYTES, (f"README.md's own text is {size} bytes (at most {README_MAX_BYTES}, its "
                                      "generated tables aside): move text to docs/")


README_TOTAL_MAX_BYTES = 15_000
"""The whole README, its generated tables included (the presets table gives the paper's presets a row each)."""


def test_the_readme_with_its_tables_stays_under_its_cap():
    size = len(README.read_bytes())
    assert size <= README_TOTAL_MAX_BYTES, (
        f"README.md is {size} bytes (at most {README_TOTAL_MAX_BYTES}): move text to docs/")


def test_the_readme_limit_leaves_out_only_the_generated_blocks():
    text = "intro\n<!-- generated:t -->\n| a |\n<!-- end generated:t -->\nend\n"
    assert written_text(text) == "intro\n\nend\n"
    assert written_text("<!-- generated:t -->\nno end\n") == "<!-- generated:t -->\nno end\n"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_files_that_exist(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_snippet_includes_point_at_files_and_sections_that_exist(page):
    assert broken_snippets(page) == []


def test_the_checks_see_a_broken_link_and_a_missing_section(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# there\n")
    page.write_text("[ok](there.md#top) ![gone](gone.png) [web](https://example.org) [a](#anchor) `[x](no.md)`\n"
                    '```\n[y](no.md)\n```\n--8<-- "README.md:no-such-section"\n')
    assert broken_links(page) == ["gone.png"]
    assert broken_snippets(page) == ["README.md:no-such-section"]


def load_docs_tables():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "scripts" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_tables_are_those_the_code_makes():
    """The presets table, the local and oat engines' flags tables and the faults table are generated from PRESETS,
    TrainConfig, DPPOOatArgs and the tests' fault markers; one of them changed without `python
    scripts/docs_tables.py` fails here."""
    assert load_docs_tables().drifted() == []


def test_a_changed_preset_is_caught(monkeypatch):
    """Both preset tables (the README's and docs/trust-region.md's) are generated from PRESETS: a changed number
    changes both, a changed label the README's alone."""
    import dataclasses

    from dppo_oat.trust_region import PRESETS, Preset

    tables = load_docs_tables()
    ppo = PRESETS["ppo"]
    monkeypatch.setitem(PRESETS, "ppo", Preset({"rule": "ratio", "eps_low": 0.3, "eps_high": 0.3}, ppo.source,
                                               label=ppo.label, blocks=ppo.blocks))
    assert tables.drifted() == ["README.md (readme-presets)", "docs/trust-region.md (presets)"]
    monkeypatch.setitem(PRESETS, "ppo", dataclasses.replace(ppo, label="PPO-ratio"))
    assert tables.drifted() == ["README.md (readme-presets)"]


@pytest.mark.parametrize("old, new, table", [
    ('"""Constructor seed of the training envs', '"""Constructor seed of every training env', "oat-flags"),
    ("env_seed: int = 42", "env_seed: int = 7", "oat-flags"),
    ('"reward_scale": (1.0, "rewards', '"reward_scale": (2.0, "rewards', "oat-refused"),
    ('eval_top_p: float = 0.95', 'eval_top_p: float = 0.9', "oat-defaults"),
])
def test_a_changed_oat_flag_is_caught(old, new, table, tmp_path, monkeypatch):
    """The oat engine's arguments are read from its source (oat need not be installed): a docstring, a default or a
    refused flag changed there is a stale table."""
    tables = load_docs_tables()
    source = tables.OAT_ARGS.read_text()
    assert old in source
    (tmp_path / "args.py").write_text(source.replace(old, new))
    monkeypatch.setattr(tables, "OAT_ARGS", tmp_path / "args.py")
    assert tables.drifted() == [f"docs/engines/oat.md ({table})"]


def copied_tests(tmp_path: Path) -> Path:
    """A copy of ``tests/`` to edit."""
    import shutil

    return Path(shutil.copytree(REPO / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__")))


MARKED = """

@pytest.mark.fault("{situation}", "what the user sees")
def test_{name}():
    pass
"""


@pytest.mark.parametrize("edit", ["added", "removed", "changed", "renamed"])
def test_a_fault_test_added_removed_or_changed_is_caught(edit, tmp_path, monkeypatch):
    tables = load_docs_tables()
    tests = copied_tests(tmp_path)
    faults, train = tests / "test_faults.py", tests / "test_train.py"
    if edit == "added":
        train.write_text(train.read_text() + MARKED.format(situation="a new fault", name="a_new_fault"))
    elif edit == "removed":
        train.unlink()  # its one marked test, a kill, goes with it
    elif edit == "changed":
        faults.write_text(faults.read_text().replace('@pytest.mark.fault("Ctrl-C",', '@pytest.mark.fault("Ctrl-D",'))
    else:
        faults.write_text(faults.read_text().replace("def test_ctrl_c_says_how", "def test_ctrl_c_tells_how"))
    monkeypatch.setattr(tables, "TESTS", tests)
    assert tables.drifted() == ["docs/faults.md (faults)"]


def test_a_fault_is_marked_once(tmp_path):
    tables = load_docs_tables()
    (tmp_path / "test_one.py").write_text(MARKED.format(situation="A full disk", name="one"))
    (tmp_path / "test_two.py").write_text(MARKED.format(situation="a full   disk", name="two"))
    with pytest.raises(ValueError, match=r"marked twice: .*test_one.py::test_one and .*test_two.py::test_two"):
        tables.faults(tmp_path)


@pytest.mark.parametrize("marker, message", [
    ('@pytest.mark.fault("only the situation")', "takes two strings"),
    ('@pytest.mark.fault("a fault", "")', "takes two strings"),
    ('@pytest.mark.fault("a fault", OUTCOME)', "takes two strings"),
])
def test_a_fault_marker_states_the_fault_and_what_the_user_sees(marker, message, tmp_path):
    tables = load_docs_tables()
    (tmp_path / "test_marker.py").write_text(f"{marker}\ndef test_it():\n    pass\n")
    with pytest.raises(ValueError, match=message):
        tables.faults(tmp_path)


def test_a_fault_marker_sits_on_a_test(tmp_path):
    tables = load_docs_tables()
    (tmp_path / "test_helper.py").write_text(MARKED.format(situation="a fault", name="x").replace("test_x", "helper"))
    with pytest.raises(ValueError, match="not a test"):
        tables.faults(tmp_path)


def test_every_fault_row_names_a_test_of_its_file():
    """Each row of docs/faults.md names ``tests/…py::test_…``, a test function of that file (the table is made from
    the markers on them, so this holds unless the page was edited by hand)."""
    rows = re.findall(r"^\|.*\| `(tests/[^`:]+)::([^`]+)` \|$", (REPO / "docs" / "faults.md").read_text(), re.M)
    assert len(rows) >= 40
    for path, name in rows:
        assert re.search(rf"^\s*(async )?def {name.split('::')[-1]}\(", (REPO / path).read_text(), re.M), (path, name)


def train_commands(text: str) -> list[str]:
    """The ``python -m dppo_oat.train`` commands of a Markdown text, each with its ``\\`` continuation lines."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if "python -m dppo_oat.train " in line]


def test_documented_trust_region_comparisons_give_several_optimizer_steps_per_rollout():
    """A documented local-engine command that picks a trust region splits each rollout batch into several
    optimizer steps: with one step per batch (a small game under --minibatch-size 256) every rule lets everything
    through and the comparison shows nothing."""
    pages = [README, REPO / "envs" / "README.md", *DOCS]
    commands = [(page.name, command) for page in pages for command in train_commands(page.read_text())
                if "--trust-region" in command and "--engine oat" not in command]
    assert commands, "no documented --trust-region command found"
    assert [c for c in commands if "--minibatches-per-rollout" not in c[1]] == []


def readme_preset_names() -> set[str]:
    """The preset names the README's presets table lists (``a`` / ``b`` and ``x_{tv,kl}_y`` spelled out)."""
    import re

    text = README.read_text()
    table = text[text.index("| preset | name |"): text.index("<!-- --8<-- [end:trust-region] -->")]
    names = set()
    for line in [row for row in table.splitlines()[2:] if row.startswith("|")]:
        for name in re.findall(r"`([a-z0-9_{},]+)`", line.split("|")[1]):
            head, _, rest = name.partition("{")
            options, _, tail = rest.partition("}")
            names |= {head + option + tail for option in options.split(",")} if rest else {name}
    return names


def test_the_readme_presets_table_lists_every_preset_and_no_other():
    from dppo_oat.trust_region import PRESETS

    assert readme_preset_names() == set(PRESETS)


PAPER_LABEL = re.compile(r"\b((?:eq|sec|app|fig):[A-Za-z_\-]*[A-Za-z_])")
"""A label of the paper as the code and the docs cite it (``eq:unified_grad``, ``sec:stability``, ...)."""


def cited_labels() -> dict[str, str]:
    """Every paper label cited in the package, the scripts, the studies, the notebooks, the README and the docs:
    ``{label: a file citing it}``."""
    files = [*REPO.glob("dppo_oat/**/*.py"), *REPO.glob("scripts/**/*.py"), *REPO.glob("envs/*.py"),
             *REPO.glob("studies/**/*.py"), *REPO.glob("notebooks/*.ipynb"), *REPO.glob("studies/*/*.ipynb"), README,
             *DOCS]
    cited = {}
    for path in files:
        for label in PAPER_LABEL.findall(path.read_text(encoding="utf-8")):
            cited.setdefault(label, str(path.relative_to(REPO)))
    return cited


def test_every_cited_paper_label_is_on_the_labels_page():
    labels_page = (REPO / "docs/paper.md").read_text()
    listed = set(re.findall(r"^\| <a id=\"[^\"]+\"></a>`([a-z]+:[^`]+)` \|", labels_page, re.M))
    missing = {label: path for label, path in cited_labels().items() if label not in listed}
    assert not missing, f"labels cited but not on docs/paper.md (is each the paper's own?): {missing}"
    anchors = re.findall(r'<a id="([^"]+)"></a>`([a-z]+:[^`]+)`', (REPO / "docs/paper.md").read_text())
    assert all(anchor == label.replace(":", "-") for anchor, label in anchors)


def site_check_command(target: str) -> list[str]:
    """The browser check's command line in ``make <target>`` (as ``make -n`` prints it), run by this interpreter."""
    recipe = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, check=True).stdout
    [line] = [line for line in recipe.splitlines() if "scripts/docs/check_site.py" in line]
    program, script, *args = shlex.split(line)
    assert program.endswith("/bin/python"), line
    return [sys.executable, str(REPO / script), *args]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_docs_needs_no_browser_and_ci_still_checks_with_one(tmp_path):
    """Without Chromium and chromedriver, ``make docs`` (the build, then the browser check) says in one line that
    the browser check was skipped and succeeds; ``make docs-check``, which CI runs, refuses (exit 2)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<html><body></body></html>")
    no_browser = {**os.environ, "PATH": str(tmp_path / "bin")}  # neither chromium nor chromedriver found
    docs = subprocess.run(site_check_command("docs"), cwd=tmp_path, env=no_browser, capture_output=True, text=True)
    assert docs.returncode == 0, docs.stderr
    assert len(docs.stdout.splitlines()) == 1 and "browser check (formulas, links) was skipped" in docs.stdout
    check = subprocess.run(site_check_command("docs-check"), cwd=tmp_path, env=no_browser, capture_output=True,
                           text=True)
    assert check.returncode == 2 and "no Chromium and chromedriver" in check.stderr
    assert "make docs-check" in (REPO / ".ci" / "run").read_text()


def test_the_performance_page_shows_every_gpu_row_of_the_oat_learner(tmp_path):
    """docs/performance.md's learner-step section lists each GPU row of ``docs/bench/oat_learner_step_*.jsonl`` (a
    generated block), and says so when there is none."""
    tables = load_docs_tables()
    rows = tables.gpu_rows("oat_learner_step", REPO / "docs" / "bench")
    page = (REPO / "docs" / "performance.md").read_text()
    section = page.split("## DPPO's learner step against oat's PPO step", 1)[1].split("\n## ", 1)[0]
    assert rows and all(f"- {tables.gpu_result(row)}" in section.splitlines() for row in rows)
    assert "no GPU row" not in section
    assert tables.oat_learner_gpu_rows(tmp_path) == "- none recorded yet"
