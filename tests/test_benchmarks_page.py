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


REFERENCE = pathlib.Path(__file__).resolve().parent.parent / "book" / "bench-reference"


def test_a_reference_run_is_committed_with_its_machine_and_date():
    """The published page always has figures: the reference run of every benchmark."""
    found = benchmarks.read_results(REFERENCE)
    sys.path.insert(0, str(REFERENCE.parent.parent / "tests"))
    names = set(__import__("bench").benchmarks())
    assert set(found) == names, f"reference runs {sorted(found)}, benchmarks {names}"
    for name, (filename, result) in found.items():
        assert isinstance(result, dict), f"{filename}: {result}"
        machine = result["machine"]
        for key in ("cpu", "cores", "torch"):
            assert machine.get(key), f"{filename}: no {key} in its machine"
        assert result.get("date"), f"{filename}: no date"
        assert benchmarks._tables_of(result), f"{filename}: no table"


def test_commands_in_the_note_are_code_not_backticks():
    paragraph = benchmarks._text_with_commands("run `make bench` then `make book`.")
    assert "`" not in paragraph.astext()
    assert [n.astext() for n in paragraph.findall(docutils.nodes.literal)] == [
        "make bench",
        "make book",
    ]
