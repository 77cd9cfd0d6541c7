"""nbval's runs of the chapters: which cells a run executes.

``make test-notebooks`` runs every cell and compares every output that is not
tagged ``nbval-ignore-output``. ``make test-portable`` runs the notebooks again
under other CPU kernels, to show that no compared output depends on them; there
a cell whose output is not compared (a timing, a figure of measured times) is
skipped, unless a compared cell needs what it computes (tag
``nbval-portable``), since it can show nothing about the stored outputs. So is
a compared cell tagged ``nbval-no-floats``: it prints no number that a floating-point
kernel computes (counts, settings, the True or False of a comparison of two runs
on the same machine), which tests/test_notebook_outputs.py checks of its stored
output; chapter 9's restarts under torchrun are such cells, a minute each, and the
cells that write a script (``%%writefile``): make test runs the portable run beside
the unit tests, which read those scripts, so it must not rewrite them. And so
is a cell tagged ``nbval-portable-test:FILE::TEST``: that test of tests/ runs the
cell's computation under the same kernels and asserts the cell's claims
(tests/portable_kernels.py), as for chapter 5's training runs, half a minute.
"""

import os

COMPARED_ONLY = os.environ.get("NBVAL_COMPARED_ONLY") == "1"
PORTABLE_TEST = "nbval-portable-test:"  # then FILE::TEST, under tests/


def _tags(item):
    cell = getattr(item, "cell", None)
    return set((cell or {}).get("metadata", {}).get("tags", [])) if cell else set()


def pytest_collection_modifyitems(config, items):
    if not COMPARED_ONLY:
        return
    keep, skipped = [], []
    for item in items:
        tags = _tags(item)
        ignored = "nbval-ignore-output" in tags and "nbval-portable" not in tags
        tested = any(tag.startswith(PORTABLE_TEST) for tag in tags)
        if ignored or tested or "nbval-no-floats" in tags:
            skipped.append(item)
        else:
            keep.append(item)
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = keep
