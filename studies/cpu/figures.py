"""The report's figures as files: the committed study's in ``docs/figures/cpu-study/``, which the study's page shows
and the committed notebook links to, so that neither carries them inline.

:func:`save_figure` writes a figure as a small PNG (:data:`DPI`, its colours reduced to a palette of
:data:`COLORS`, without a timestamp or a version: the same figure gives the same bytes); :func:`shown` is what a
notebook cell displays for it: a link to the file when the file lies in the checkout, where Jupyter serves it from
the notebook's folder, else the image itself (a study read from elsewhere, whose figures are nowhere else to see).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = Path(__file__).resolve().parent
"""The report notebook's folder: where Jupyter starts a relative link."""
COMMITTED = ROOT / "studies" / "cpu" / "data"
"""The committed study (``python -m studies.cpu.pack``'s default ``--out``)."""
FIGURES = ROOT / "docs" / "figures" / "cpu-study"
"""Where the committed study's figures go."""
DPI = 72
COLORS = 64
"""Colours of a written figure's palette: enough for its curves, bands and text."""


def figure_folder(study: Path, environ: dict | None = None) -> Path:
    """Where the figures of ``study`` go: ``DPPO_FIGURES`` when set, else :data:`FIGURES` for the committed study,
    else ``<study>/figures``."""
    environ = os.environ if environ is None else environ
    if environ.get("DPPO_FIGURES"):
        return Path(environ["DPPO_FIGURES"])
    return FIGURES if Path(study).resolve() == COMMITTED else Path(study) / "figures"


STRENGTH_FILE = "band-sweep.png"
"""The file name of the figure of strength against outcome (``band_sweep``)."""


def curves_file(task: str, condition: str) -> str:
    """The file name of the learning curves of one condition of one task."""
    return f"{task}-{condition}.png"


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` as a palette PNG (:data:`DPI`, :data:`COLORS`; the same figure, the same bytes);
    returns ``path``."""
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", facecolor="white", metadata={"Software": None})
    image = PILImage.open(buffer).convert("RGB").quantize(COLORS, method=PILImage.Quantize.MEDIANCUT,
                                                          dither=PILImage.Dither.NONE)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=True)
    return path


def shown(path: Path, title: str = ""):
    """What a notebook cell displays for the figure at ``path``: a link from the notebook's folder when the file
    lies in the checkout, else the image."""
    from IPython.display import HTML, Image

    path = Path(path).resolve()
    if not path.is_relative_to(ROOT):
        return Image(filename=str(path))
    link = Path(os.path.relpath(path, NOTEBOOK_DIR)).as_posix()
    return HTML(f'<img src="{link}" alt="{title or path.stem}"/>')
