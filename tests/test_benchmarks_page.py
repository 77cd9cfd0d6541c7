"""The benchmarks page (book/benchmarks.py) shows whatever `make bench` wrote."""

import pathlib
import sys

import pytest

docutils = pytest.importorskip("docutils")
from docutils.frontend import get_default_settings  # noqa: E402
from docutils.parsers.rst import Parser  # noqa: E402
from docutils.utils import new_document  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "book"))
import benchmarks  # noqa: E402


def _render(result, name="ddp.json"):
    document = new_document("bench", get_default_settings(Parser))
    return benchmarks.render_result(result, name, document)


def test_result_with_tables_and_machine():
    section = _render(
        {
            "title": "MyDDP against PyTorch's DDP",
            "summary": "Median ratio at 25 MB: 1.010.",
            "machine": {"cpu": "Test CPU", "cores": 2},
            "date": "2026-01-01T00:00:00",
            "model picks the measured best cap": True,
            "tables": [
                {
                    "title": "Step time",
                    "columns": ["cap (MB)", "ratio"],
                    "rows": [[25, 1.0101234]],
                    "note": "below 1: MyDDP faster",
                }
            ],
        }
    )
    text = section.astext()
    for expected in (
        "MyDDP against PyTorch's DDP",
        "Median ratio at 25 MB: 1.010.",
        "Test CPU",
        "2026-01-01",
        "model picks the measured best cap",
        "yes",
        "Step time",
        "cap (MB)",
        "1.01",
        "below 1: MyDDP faster",
        "bench-results/ddp.json",
    ):
        assert expected in text, expected
    assert "1.0101234" not in text  # floats are shown to 4 significant digits


def test_a_list_of_dicts_becomes_a_table():
    section = _render(
        {"rows_by_cap": [{"cap": 1, "ms": 2.5}, {"cap": 25, "ms": None}]},
        "other_bench.json",
    )
    text = section.astext()
    assert (
        "other bench" in text
        and "rows by cap" in text
        and "2.5" in text
        and "-" in text
    )


def test_cell_formatting():
    assert benchmarks._fmt(True) == "yes" and benchmarks._fmt(None) == "-"
    assert benchmarks._fmt(0.000123456) == "0.0001235" and benchmarks._fmt(12) == "12"
