"""No stored output prints digits that the CPU's kernels decide.

A difference at rounding level (8.3e-17 on one machine, 1.9e-16 on the next)
changes with ATen's SIMD level, MKL's code path and the thread count, so nbval
would fail on a reader's machine. A chapter prints the bound its claim makes
instead (``mylib.figures.show.below``: "below 1e-12"). This test reads every
notebook's stored outputs and fails on a number in scientific notation below
1e-6 in an output nbval compares, and below 1e-9 in any output (a timing's cell
is not compared, but the page still shows it). ``make test-portable`` shows the
rest: the compared outputs are the same under other kernels. It skips the cells
tagged ``nbval-no-floats`` (notebooks/conftest.py), so this test holds them to
it: no decimal fraction and no exponent in their stored outputs.
"""

import ast
import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# notebooks/conftest.py, which decides what make test-portable runs (tests/ has a
# conftest.py of its own, so it is loaded under another name)
_spec = importlib.util.spec_from_file_location(
    "notebooks_conftest", ROOT / "notebooks" / "conftest.py"
)
notebooks_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks_conftest)
PORTABLE_TEST = notebooks_conftest.PORTABLE_TEST

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# A printed value (8.3e-17); a bound is printed without decimals ("below 1e-12").
SMALL = re.compile(r"\b\d\.\d+e-(\d+)\b")
# Lines that print a constant, not a computed difference: the formats' own
# numbers (torch.finfo) and a chosen input's value through each cast.
CONSTANTS = re.compile(r"^\s*(float32|float16|bfloat16|tiny:)\s")


def _text(output):
    data = output.get("data", {})
    text = output.get("text", "") or data.get("text/markdown", "") or ""
    text = "".join(text) if isinstance(text, list) else text
    plain = data.get("text/plain", "")
    return text + ("".join(plain) if isinstance(plain, list) else plain)


def small_numbers(notebook):
    """``(cell index, compared, line, exponent)`` of each small number printed."""
    found = []
    cells = json.loads(notebook.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        compared = "nbval-ignore-output" not in cell["metadata"].get("tags", [])
        for output in cell.get("outputs", []):
            for line in _text(output).splitlines():
                if CONSTANTS.match(line):
                    continue
                for exponent in SMALL.findall(line):
                    found.append((i, compared, line.strip(), int(exponent)))
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_rounding_digits_in_stored_outputs(notebook):
    bad = [
        f"cell {i} ({'compared' if compared else 'not compared'}): {line}"
        for i, compared, line, exponent in small_numbers(notebook)
        if exponent > (6 if compared else 9)
    ]
    assert not bad, (
        f"{notebook.name} prints rounding-level digits, which differ from CPU to CPU; "
        "print the bound the claim makes (mylib.figures.show.below) and assert it:\n"
        + "\n".join(bad)
    )


def one_cell_notebook(folder, printed, tags=()):
    """A notebook of one code cell that printed ``printed``, tagged ``tags``."""
    notebook = folder / "nb.ipynb"
    cell = {
        "cell_type": "code",
        "metadata": {"tags": list(tags)},
        "outputs": [{"output_type": "stream", "text": [printed]}],
    }
    notebook.write_text(json.dumps({"cells": [cell]}))
    return notebook


def test_the_check_sees_a_rounding_digit(tmp_path):
    notebook = one_cell_notebook(tmp_path, "max |diff| = 8.3e-17\n")
    assert small_numbers(notebook) == [(0, True, "max |diff| = 8.3e-17", 17)]


# A number with a fractional part or an exponent: 4.76e-02, 2.410, 1e-12.
FLOAT = re.compile(r"\d\.\d|\de[-+]?\d")


def float_lines(notebook):
    """``(cell index, line)`` of each line with a float in a cell tagged
    ``nbval-no-floats``, and ``(cell index, None)`` for such a cell that is not
    compared (the tag would hide nothing)."""
    found = []
    cells = json.loads(notebook.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        tags = cell["metadata"].get("tags", [])
        if "nbval-no-floats" not in tags:
            continue
        if "nbval-ignore-output" in tags:
            found.append((i, None))
        for output in cell.get("outputs", []):
            found += [
                (i, line) for line in _text(output).splitlines() if FLOAT.search(line)
            ]
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_the_portable_run_skips_print_no_float(notebook):
    bad = [
        f"cell {i}: " + (line if line is not None else "not compared anyway")
        for i, line in float_lines(notebook)
    ]
    assert not bad, (
        f"{notebook.name}: a cell tagged nbval-no-floats prints a float, which other "
        "kernels may change; remove the tag, so that make test-portable runs it:\n"
        + "\n".join(bad)
    )


def test_the_check_sees_a_float_in_a_no_floats_cell(tmp_path):
    notebook = one_cell_notebook(tmp_path, "3 steps\nloss 2.410\n", ["nbval-no-floats"])
    assert float_lines(notebook) == [(0, "loss 2.410")]


def portable_tests(notebook):
    """``(cell index, file, test)`` of each cell whose portable check a test makes
    (tag ``nbval-portable-test:FILE::TEST``, notebooks/conftest.py)."""
    found = []
    cells = json.loads(notebook.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        for tag in cell["metadata"].get("tags", []):
            if tag.startswith(PORTABLE_TEST):
                file, _, test = tag[len(PORTABLE_TEST) :].partition("::")
                found.append((i, file, test))
    return found


def runs_on_portable_kernels(file, test):
    """Whether ``test``, a function of tests/``file``, uses tests/portable_kernels.py
    (``run_ranks_on_portable_kernels``, or ``portable_kernels.ENV``)."""
    path = pathlib.Path(__file__).resolve().parent / file
    if not path.is_file():
        return False
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == test:
            return any(
                isinstance(name, ast.Name)
                and name.id in ("run_ranks_on_portable_kernels", "portable_kernels")
                for name in ast.walk(node)
            )
    return False


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_left_to_a_test_are_run_by_it_on_the_portable_kernels(notebook):
    bad = [
        f"cell {i}: {file}::{test}"
        for i, file, test in portable_tests(notebook)
        if not runs_on_portable_kernels(file, test)
    ]
    assert not bad, (
        f"{notebook.name}: make test-portable skips these cells for a test that does "
        "not run on the portable kernels (tests/portable_kernels.py); fix the tag or "
        "the test:\n" + "\n".join(bad)
    )


def test_the_check_sees_a_test_that_is_not_on_the_portable_kernels(tmp_path):
    tag = PORTABLE_TEST + "test_notebook_outputs.py::one_cell_notebook"
    notebook = one_cell_notebook(tmp_path, "3 steps\n", [tag])
    assert portable_tests(notebook) == [
        (0, "test_notebook_outputs.py", "one_cell_notebook")
    ]
    assert not runs_on_portable_kernels("test_notebook_outputs.py", "one_cell_notebook")
    assert runs_on_portable_kernels(
        "test_powersgd.py", "test_training_with_compression"
    )
