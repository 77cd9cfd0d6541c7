"""Chapter 6's tables, in units of psi bytes, agree with the memory model.

The chapter writes every byte count with its factor of psi, the number of
parameters (``2 psi`` bytes: psi parameters in bf16), in two tables: the ZeRO
paper's accounting per stage, and PyTorch's mixed-precision setups. Each cell
is read back (``a psi``, ``b psi/N`` and sums of them) and compared with
:mod:`mylib.models.memory` at several N: the bytes kept, and the bytes sent per
step for large N.
"""

import json
import pathlib
import re

import pytest

from mylib.models.memory import (
    RECIPES,
    STAGE_NAMES,
    comm_per_step,
    memory_per_rank,
)

CHAPTER = pathlib.Path(__file__).resolve().parent.parent / "notebooks/06_zero.ipynb"
COLUMNS = ["parameters", "gradients", "optimizer state", "total", "sent per step"]
TERM = re.compile(r"^(\d+(?:\.\d+)?)\\Psi(/N)?$")


def tables():
    """``{first header cell: {row name: [cells]}}`` of the chapter's tables."""
    found = {}
    for cell in json.loads(CHAPTER.read_text())["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        rows = [
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in "".join(cell["source"]).splitlines()
            if line.startswith("|")
        ]
        if rows and rows[0][1:] == COLUMNS:
            body = {r[0]: r[1:] for r in rows[2:]}
            assert rows[0][0] not in found, "two tables of the same kind"
            found[rows[0][0]] = body
    return found


def value(cell, n):
    """``$a\\Psi + b\\Psi/N$`` at psi = 1 and N = ``n``."""
    total = 0.0
    for term in cell.strip("$").split("+"):
        match = TERM.match(term.strip())
        assert match, f"not in psi units: {cell!r}"
        total += float(match[1]) / (n if match[2] else 1)
    return total


def model_row(memory, sent):
    return [memory.params, memory.grads, memory.optimizer, memory.total, sent]


@pytest.mark.parametrize("n", [2, 8, 64])
def test_the_stage_table_is_the_papers_accounting(n):
    table = tables()["stage"]
    assert list(table) == list(STAGE_NAMES.values())
    for stage, name in STAGE_NAMES.items():
        memory = memory_per_rank(1.0, n, stage)
        # large N: (N-1)/N -> 1
        sent = sum(comm_per_step(1.0, n, stage).values()) * n / (n - 1)
        want = model_row(memory, sent)
        got = [value(cell, n) for cell in table[name]]
        assert got == pytest.approx(want), name


@pytest.mark.parametrize("n", [2, 8, 64])
def test_the_setup_table_is_the_recipes(n):
    table = tables()["setup"]
    assert set(table) <= set(RECIPES) and len(table) >= 5
    for name, cells in table.items():
        recipe = RECIPES[name]
        want = model_row(recipe.memory(1.0, n), recipe.sent_per_param())
        got = [value(cell, n) for cell in cells]
        assert got == pytest.approx(want), name
