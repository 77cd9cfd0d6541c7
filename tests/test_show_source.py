"""The library code a page shows is the library code the tests test.

Chapters display mylib's source with ``mylib.figures.show.show_source``; the site is
built from the outputs stored in the notebooks. nbval does not compare
Markdown outputs, so this test does: every code block a notebook shows from
``mylib/`` must still appear, verbatim, in that file today. If it fails, the
file changed after the notebook was executed: ``make notebooks``.
"""

import glob
import json
import os
import re

import pytest

from mylib.figures.show import source_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOWN = re.compile(
    r"^`(mylib/[\w/]+\.py), lines (\d+)-(\d+)`\n\n```python\n(.*)\n```\s*$", re.S
)


def _shown_blocks():
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
        nb = json.load(open(path))
        for i, cell in enumerate(nb["cells"]):
            for out in cell.get("outputs", []):
                md = out.get("data", {}).get("text/markdown")
                if md is None:
                    continue
                match = SHOWN.match("".join(md) if isinstance(md, list) else md)
                if match:
                    yield pytest.param(
                        *match.group(1, 4), id=f"{os.path.basename(path)}-cell{i}"
                    )


@pytest.mark.parametrize("source_file,code", list(_shown_blocks()))
def test_shown_source_is_current(source_file, code):
    with open(os.path.join(ROOT, source_file)) as f:
        assert code in f.read(), (
            f"{source_file} changed since the notebook showed it: run `make notebooks`"
        )


def test_show_source_names_file_and_lines():
    text, where = source_of(source_of)
    assert text.startswith("def source_of(") and where.startswith(
        "mylib/figures/show.py, lines "
    )


def test_some_notebook_shows_library_code():
    assert list(_shown_blocks()), (
        "no show_source output found: has the output format changed?"
    )
