"""Exercise 08 refuses both wrong placements of forward and backward around no_sync().

PyTorch's DDP decides in the forward whether the backward synchronises, and so
does the exercise's ``TinyDDP``. A ``train_step`` that runs an earlier
micro-batch's forward outside ``no_sync()`` (only its backward inside)
all-reduces every micro-batch; one that runs the last micro-batch's forward
inside (only its backward outside) all-reduces nothing. Each is refused with a
message that names the fix; so is a ``TinyDDP`` changed to decide in the
backward.
"""

import pathlib
import textwrap

import pytest

from _judge import catalog
from _judge.sandbox import grade_file

EXERCISE = catalog.find(catalog.load_exercises(), "08")
SOLUTION = pathlib.Path(EXERCISE.path("solution.py")).read_text()
TRAIN_STEP = SOLUTION[SOLUTION.index("def train_step(") :]

WRONG_TRAIN_STEPS = {
    # the backward inside no_sync(), its forward outside: every micro-batch syncs
    "forward outside": """\
        def train_step(ddp, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            k = len(micro_batches)
            for i, (x, y) in enumerate(micro_batches):
                loss = loss_fn(ddp(x), y) / k
                if i < k - 1:
                    with ddp.no_sync():
                        loss.backward()
                else:
                    loss.backward()
            optimizer.step()
        """,
    # every forward inside no_sync(), the last backward outside: nothing syncs
    "last forward inside": """\
        def train_step(ddp, optimizer, micro_batches, loss_fn):
            optimizer.zero_grad()
            k = len(micro_batches)
            with ddp.no_sync():
                for x, y in micro_batches[:-1]:
                    (loss_fn(ddp(x), y) / k).backward()
                x, y = micro_batches[-1]
                loss = loss_fn(ddp(x), y) / k
            loss.backward()
            optimizer.step()
        """,
}
FIXES = {
    "forward outside": "Run each earlier micro-batch's forward and backward both "
    "inside",
    "last forward inside": "run the last micro-batch's forward and backward both "
    "outside no_sync()",
}


def first_problem(report):
    return next(r for r in report.results if r["status"] != "passed")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("placement", sorted(WRONG_TRAIN_STEPS))
def test_a_wrong_placement_is_refused_with_the_fix(tmp_path, placement):
    wrong = SOLUTION.replace(TRAIN_STEP, textwrap.dedent(WRONG_TRAIN_STEPS[placement]))
    path = tmp_path / "mine.py"
    path.write_text(wrong)
    report = grade_file(EXERCISE, str(path))
    assert not report.passed
    problem = first_problem(report)
    assert problem["status"] == "failed", problem
    assert "The forward decides" in problem["message"], problem
    assert FIXES[placement] in problem["message"], problem


@pytest.mark.timeout(600)
def test_a_tinyddp_that_decides_in_the_backward_is_refused(tmp_path):
    # the hook reads the flag itself: the backward decides, not the forward
    wrong = SOLUTION.replace(
        "        if self._backward_syncs:\n",
        "        if self.require_backward_grad_sync:\n",
    )
    assert wrong != SOLUTION
    path = tmp_path / "mine.py"
    path.write_text(wrong)
    problem = first_problem(grade_file(EXERCISE, str(path)))
    assert problem["status"] == "failed", problem
    assert "decides in forward()" in problem["message"], problem
    assert "Leave TinyDDP as given" in problem["message"], problem
