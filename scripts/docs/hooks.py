"""MkDocs hooks: what the site's pages need beyond Markdown, applied to each page's HTML when the site is built.

- **Formulas** become MathML (:func:`formulas_to_mathml`), so pages show them as formulas without any script or font
  served from elsewhere (browsers render MathML natively), from a server or from disk. ``pymdownx.arithmatex``
  (``generic: true``, in ``mkdocs.yml``) finds them in Markdown and docstrings, ``$...$`` inline and ``$$...$$`` on
  their own lines, outside code, and wraps their TeX in ``<span class="arithmatex">\\(...\\)</span>`` or
  ``<div class="arithmatex">\\[...\\]</div>``; ``latex2mathml`` converts each. A formula it cannot convert fails
  the build, naming the page and the TeX.
- **Docstrings' reST markup** (:func:`without_rest_markup`): the Sphinx roles before code (``:class:``, ``:func:``,
  ...) are dropped, and the ``::`` that ends a paragraph before a literal block becomes ``:``.
- **The paper's labels** (``eq:unified_grad``, ``sec:stability``, ...) in running text link to their entry on the
  page that lists them (:data:`PAPER_PAGE`, whose table holds every label the project cites).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from latex2mathml.converter import convert

FORMULA = re.compile(r'<(span|div) class="arithmatex">\s*\\([(\[])(?P<tex>.*?)\\[)\]]\s*</\1>', re.S)
"""An arithmatex wrapper (generic mode): inline ``\\( \\)`` in a span, display ``\\[ \\]`` in a div."""
ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj|ref|py:\w+):(?=<code>)")
"""A Sphinx role left before its code span (``:class:<code>TrustRegion</code>``)."""
PAPER_PAGE = "paper.md"
"""The page listing the paper's labels, each in a row whose first cell is the label in a code span."""
LABEL = re.compile(r"\b(?:eq|sec|app|fig):[A-Za-z_\-]+[A-Za-z_]")
"""A label of the paper as the project cites it."""
NO_LINK_INSIDE = {"a", "code", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "script", "style", "math"}
"""Elements whose text keeps a label as it is (a link inside a link or code is not wanted)."""


def to_mathml(tex: str, display: bool) -> str:
    """The MathML of one formula's TeX (HTML-escaped as arithmatex leaves it)."""
    mathml = convert(html.unescape(tex).strip(), display="block" if display else "inline")
    return f'<div class="formula">{mathml}</div>' if display else mathml


def formulas_to_mathml(content: str, source: str) -> str:
    """Every arithmatex formula of a page (``source``: its file, for errors) as MathML."""

    def replace(match: re.Match) -> str:
        try:
            return to_mathml(match.group("tex"), display=match.group(2) == "[")
        except Exception as error:
            raise ValueError(f"{source}: cannot convert the formula {match.group('tex')!r}: {error}") from error

    return FORMULA.sub(replace, content)


def without_rest_markup(content: str) -> str:
    """Sphinx roles before code dropped; a paragraph's closing ``::`` before a literal block made ``:``."""
    return ROLE.sub("", content).replace("::</p>", ":</p>")


def paper_labels(docs_dir: Path) -> set[str]:
    """The labels :data:`PAPER_PAGE` lists (the first cell of its table rows)."""
    page = docs_dir / PAPER_PAGE
    rows = re.findall(r'^\| <a id="[^"]+"></a>`([a-z]+:[^`]+)` \|', page.read_text(encoding="utf-8"), re.M)
    return set(rows)


def label_anchor(label: str) -> str:
    """The anchor of a label's row on :data:`PAPER_PAGE` (the ``<a id>`` its table row carries)."""
    return label.replace(":", "-")


def link_labels(content: str, labels: set[str], paper_url: str) -> str:
    """Each known label in a page's running text as a link to its row on the paper page (``paper_url``); labels in
    code, links, headings and formulas stay as they are."""
    parts, open_tags, out = re.split(r"(<[^>]+>)", content), [], []
    for part in parts:
        tag = re.match(r"<(/?)([a-zA-Z0-9]+)", part)
        if tag:
            name = tag.group(2).lower()
            if name in NO_LINK_INSIDE and not part.endswith("/>"):
                if tag.group(1):
                    if name in open_tags:
                        open_tags.remove(name)
                else:
                    open_tags.append(name)
            out.append(part)
        elif open_tags:
            out.append(part)
        else:
            out.append(LABEL.sub(lambda m: (f'<a class="paper-label" href="{paper_url}#{label_anchor(m.group(0))}">'
                                            f"{m.group(0)}</a>") if m.group(0) in labels else m.group(0), part))
    return "".join(out)


def on_page_content(content: str, page, config, **kwargs) -> str:
    """A page's HTML with its formulas, docstring markup and paper labels done."""
    content = without_rest_markup(formulas_to_mathml(content, page.file.src_path))
    if page.file.src_path == PAPER_PAGE:
        return content
    depth = page.file.dest_uri.count("/")
    paper_url = "../" * depth + PAPER_PAGE.replace(".md", ".html")
    return link_labels(content, paper_labels(Path(config["docs_dir"])), paper_url)
