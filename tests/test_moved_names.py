"""The progress lines' deprecated names resolve to their current ones, with a deprecation warning."""

import pytest


def test_the_progress_lines_old_names_warn_and_give_the_new_ones():
    from dppo_oat.engines.local import progress

    with pytest.warns(DeprecationWarning, match="use PROGRESS_LINES"):
        assert progress.PLAIN_LINES == progress.PROGRESS_LINES
    with pytest.warns(DeprecationWarning, match="use line_every"):
        assert progress.plain_every is progress.line_every
    with pytest.raises(AttributeError):
        _ = progress.no_such_name

