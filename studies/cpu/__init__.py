"""The CPU study of the paper's mechanism (docs/cpu-study.md): ``claims`` (written before the runs), ``run`` (plays
it), ``pack`` (commits its logs to ``data/``), ``report`` and ``page`` (scores the claims; the page's blocks) and the
report notebook ``cpu_study.ipynb``."""
