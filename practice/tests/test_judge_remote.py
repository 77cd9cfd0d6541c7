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


def test_grades_on_threads_take_turns_with_torch_s_generator(tmp_path):
    """Grades on two threads of one process (as the tests grade) share torch's RNG.

    A check's case, seeded and drawn, is never cut into by another grade's
    checks, which would seed it again (a right answer then fails: this happened
    in CI); and a grade waiting for its reader's process lets the other grade's
    checks run meanwhile (else the grades would take turns for whole grades).
    """
    import socket
    import threading
    import time

    import torch

    from _judge import wire
    from _judge.remote import Client, checks_turn

    def case(seed):
        torch.manual_seed(seed)
        first = torch.rand(3).tolist()
        time.sleep(0.05)  # where the other thread runs, without the turns
        return first + torch.rand(3).tolist()

    alone = {seed: case(seed) for seed in (1, 2)}
    ours, theirs = socket.socketpair()
    output = tmp_path / "output.txt"
    output.write_text("")
    client = Client(ours, str(output), 1 << 20, "mine.py", b"")
    seen, started = {}, threading.Event()

    def grade(name, work):
        try:
            work()
        except BaseException as e:  # reported below, not lost in the thread
            seen[name] = e

    def waiting():
        with checks_turn():
            started.set()
            seen[1] = case(1)
            seen["reply"] = client.receive(10.0)  # the other's checks run now

    def computing():
        started.wait(10.0)
        with checks_turn():
            seen[2] = case(2)
            wire.send(theirs, ("ok", "drawn"))

    threads = [
        threading.Thread(target=grade, args=(n, w))
        for n, w in (("waiting", waiting), ("computing", computing))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30.0)
    ours.close()
    theirs.close()
    assert not any(t.is_alive() for t in threads), "the grades deadlocked"
    assert seen.get("reply") == ("ok", "drawn"), seen
    assert seen[1] == alone[1] and seen[2] == alone[2], "the checks' draws mixed"
