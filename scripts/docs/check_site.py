"""The built documentation site, checked in a real headless browser (Chromium, driven by selenium), opened from disk.

- **Formulas render as formulas.** On each page of :data:`MATH_PAGES` there are MathML formulas and no TeX left as
  text; every formula has a laid-out box, and every fraction is drawn stacked, its numerator above its denominator,
  which a browser without MathML layout (or a formula left as text) does not draw.
- **Links work from disk.** Every relative link of every page leads to a file of the site (the build writes
  ``page.html``, not ``page/index.html``), and its ``#anchor``, if any, to an element of that page.

A screenshot of the first page goes to ``--screenshot``. Exit 1 with one line per problem; 2 when no browser runs,
unless ``--skip-without-browser``: then a machine without Chromium and chromedriver gets one line saying the check
was skipped, and exit 0 (``make docs``: building the site needs no browser; ``make docs-check``, which CI runs,
requires one).

    python scripts/docs/check_site.py --site site            # after `mkdocs build` (make docs-check runs both)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

MATH_PAGES = ("trust-region.html", "api/divergence.html")
"""Pages whose formulas must render (the paper's unified gradient, DRPO/CPPO/M2PO, the divergences)."""
STACKED_OVERLAP = 1.0
"""Pixels a fraction's numerator box may reach below its denominator's top and still count as drawn above it (a
browser without MathML layout draws them side by side on one line)."""

FORMULA_BOXES = """
const boxes = [...document.querySelectorAll('article math')].map(m => m.getBoundingClientRect());
const fractions = [...document.querySelectorAll('article math mfrac')].map(f => {
  const [top, bottom] = [f.children[0].getBoundingClientRect(), f.children[1].getBoundingClientRect()];
  return bottom.top - top.bottom;  // >= 0: the numerator drawn above the denominator
});
const text = document.querySelector('article').innerText;
return {formulas: boxes.length, empty: boxes.filter(b => !(b.width > 0 && b.height > 0)).length,
        fractions: fractions, tex_left: /\\\\\\(|\\\\\\[|\\$\\$/.test(text)};
"""
BROWSER_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--no-first-run", "--window-size=1280,2000")
"""Chromium without a screen, a sandbox (root in CI) or a network to reach."""
LINKS = """
return [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));
"""


def browser(executable: str | None):
    """A headless Chromium under selenium (``executable``: the browser; its driver from the PATH)."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.arguments.extend(BROWSER_FLAGS)
    if executable:
        options.binary_location = executable
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def formula_problems(page: str, boxes: dict) -> list[str]:
    """What is wrong with a page's formulas, from :data:`FORMULA_BOXES`' measurements."""
    problems = []
    if boxes["formulas"] == 0:
        problems.append(f"{page}: no MathML formula")
    if boxes["empty"]:
        problems.append(f"{page}: {boxes['empty']} of {boxes['formulas']} formulas have no laid-out box")
    flat = [round(gap, 1) for gap in boxes["fractions"] if not gap >= -STACKED_OVERLAP]
    if flat:
        problems.append(f"{page}: {len(flat)} fractions are not drawn stacked (numerator below its denominator's "
                        f"top by {flat[:5]} px)")
    if boxes["tex_left"]:
        problems.append(f"{page}: TeX left as text")
    return problems


def link_problems(site: Path, page: Path, hrefs: list[str], anchors: dict[Path, set[str]]) -> list[str]:
    """Relative links of ``page`` that lead to no file of ``site``, or to no element of their ``#anchor``."""
    problems = []
    for href in hrefs:
        parts = urlsplit(href)
        if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
            continue
        target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or site not in target.parents:
            problems.append(f"{page.relative_to(site)}: link {href!r} leads to no file of the site")
        elif parts.fragment and target.suffix == ".html" and parts.fragment not in anchors.setdefault(
                target, element_ids(target)):
            problems.append(f"{page.relative_to(site)}: link {href!r} names no element of its page")
    return problems


def element_ids(page: Path) -> set[str]:
    """The ``id``s of a built page (the anchors a link may name)."""
    import re

    return set(re.findall(r'\sid="([^"]+)"', page.read_text(encoding="utf-8")))


def check(site: Path, executable: str | None, screenshot: Path | None) -> list[str]:
    """Every problem of the site, one line each."""
    driver = browser(executable)
    problems, anchors = [], {}
    try:
        for page in sorted(site.rglob("*.html")):
            if page.name == "404.html":  # served at the site's root only: its links are absolute
                continue
            driver.get(page.as_uri())
            if page.relative_to(site).as_posix() in MATH_PAGES:
                problems += formula_problems(page.relative_to(site).as_posix(), driver.execute_script(FORMULA_BOXES))
                if screenshot is not None and not screenshot.exists():
                    driver.save_screenshot(str(screenshot))
            problems += link_problems(site, page, driver.execute_script(LINKS), anchors)
    finally:
        driver.quit()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default="site", help="the built site")
    parser.add_argument("--browser", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                        help="Chromium's executable (default: chromium on the PATH)")
    parser.add_argument("--screenshot", default=None, help="save a screenshot of the first formula page here")
    parser.add_argument("--skip-without-browser", action="store_true",
                        help="without Chromium and chromedriver, say so in one line and exit 0 instead of 2")
    args = parser.parse_args(argv)
    site = Path(args.site).resolve()
    if not (site / "index.html").is_file():
        print(f"check_site: no built site in {site}: run mkdocs build first", file=sys.stderr)
        return 1
    if not args.browser or not shutil.which("chromedriver"):
        missing = "no Chromium and chromedriver on the PATH (Debian: apt-get install chromium chromium-driver)"
        if args.skip_without_browser:
            print(f"check_site: the site is built in {site}; its browser check (formulas, links) was skipped: "
                  f"{missing}")
            return 0
        print(f"check_site: {missing}", file=sys.stderr)
        return 2
    screenshot = Path(args.screenshot) if args.screenshot else None
    if screenshot is not None and screenshot.exists():
        screenshot.unlink()
    problems = check(site, args.browser, screenshot)
    for problem in problems:
        print(f"check_site: {problem}", file=sys.stderr)
    pages = len(list(site.rglob("*.html")))
    print(f"check_site: {pages} pages, {len(problems)} problems" + (f"; screenshot {screenshot}" if screenshot else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
