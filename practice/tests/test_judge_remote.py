"""Checks run in the judge; ``sol`` is a stand-in whose calls run elsewhere.

What a ``checks.py`` could do with the reader's module before still works:
arguments the reader's function changes in place (tensors, lists, dicts)
change for the check too, a lambda can be an argument, an instance of the
reader's class keeps its state between calls and is named by its class,
a tensor comes back as a tensor, and a built-in exception is the same class
for ``expect_raises``.
"""

import os

import pytest

from _judge import catalog, manifest
from _judge.sandbox import grade_file

CHECKS = """
import torch
from _judge.checking import check, expect_equal, expect_raises, expect_type


@check("changes in place reach the check")
def in_place(sol):
    t, buf, d = torch.zeros(3), [torch.ones(2)], {"a": [1]}
    inner = buf[0]
    out = sol.f(t, buf, d, lambda x: x + 1)
    expect_equal(t.tolist(), [1.0, 1.0, 1.0], input="t")
    expect_equal(inner.tolist(), [2.0, 2.0], input="buf[0]")
    expect_equal(d, {"a": [1, 2]}, input="d")
    expect_type(out, torch.Tensor, input="f(...)")
    expect_equal(out.tolist(), [5.0], input="f(...)")


@check("objects keep their state and their class name")
def objects(sol):
    acc = sol.Acc()
    acc.add(3)
    acc.add(4)
    expect_equal(acc.total, 7, input="acc.total")
    expect_equal(type(acc).__name__, "Acc", input="type(acc)")
    expect_raises(lambda: acc.add(-1), ValueError, input="acc.add(-1)")
"""

SOLUTION = """
import torch


def f(t, buf, d, g):
    t += 1
    buf[0].mul_(2)
    d["a"].append(2)
    return torch.tensor([float(g(4))])


class Acc:
    def __init__(self):
        self.total = 0

    def add(self, x):
        if x < 0:
            raise ValueError("only additions")
        self.total += x
"""


@pytest.mark.parametrize("ranks", [True, False])
def test_the_stand_in_behaves_like_the_module(tmp_path, ranks):
    root = tmp_path / "exercises"
    folder = root / "01_stand_in"
    folder.mkdir(parents=True)
    (root / "chapters.toml").write_text("[titles]\n")
    (folder / "exercise.toml").write_text(
        'title = "t"\nchapter = 1\ndifficulty = "easy"\nsummary = "s"\n'
        f"ranks = {'true' if ranks else 'false'}\n"
    )
    for name in ("README.md", "hints.md", "solution.py", "starter.py"):
        (folder / name).write_text("## Hint 1\nx\n")
    (folder / "checks.py").write_text(CHECKS)
    manifest.write(str(root))
    exercise = catalog.load_exercises(str(root))[0]
    mine = tmp_path / "mine.py"
    mine.write_text(SOLUTION)
    report = grade_file(exercise, str(mine))
    assert report.passed, report.results
    broken = tmp_path / "broken.py"
    broken.write_text(SOLUTION.replace("t += 1", "t = t + 1"))
    report = grade_file(exercise, os.fspath(broken))
    assert report.results[0]["status"] == "failed"
