"""Messages that name what happened: one test per message the issue found wrong.

Exercise 03: "a sum instead of a mean" only when the gradients are the
number of ranks times the right ones, another message when the average
never reached ``.grad``, and another when a reduce left the mean on one
rank. Exercise 08: an off-by-one says which micro-step synchronised.
Exercise 01: an off-by-one chunk is not "must be summed in place". A busy
loop on ranks is not a collective hang, and comes back within the check's
limit. An empty file: one message. A load error:
said once.
"""

import os
import subprocess
import sys
import textwrap

from _judge import catalog
from _judge.sandbox import grade_file

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUDGE = os.path.join(PRACTICE_DIR, "judge.py")
EXERCISES = catalog.load_exercises()
RING = catalog.find(EXERCISES, "01")
AVERAGE = catalog.find(EXERCISES, "03")
BUCKETS = catalog.find(EXERCISES, "06")


def write(tmp_path, source, name="mine.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def first_problem(report):
    return next(r for r in report.results if r["status"] != "passed")


AVERAGE_BODY = """\
import torch.distributed as dist


def average_gradients(model):
    n = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            {body}
"""


def test_03_a_sum_is_called_a_sum(tmp_path):
    path = write(tmp_path, AVERAGE_BODY.format(body="dist.all_reduce(p.grad)"))
    problem = first_problem(grade_file(AVERAGE, str(path)))
    assert "a sum instead of a mean" in problem["message"], problem


def test_03_an_average_never_written_to_grad_is_not_called_a_sum(tmp_path):
    body = "g = p.grad.clone()\n            dist.all_reduce(g)\n            g /= n"
    path = write(tmp_path, AVERAGE_BODY.format(body=body))
    problem = first_problem(grade_file(AVERAGE, str(path)))
    assert "sum instead of a mean" not in problem["message"], problem
    assert "still this rank's own gradients" in problem["message"]
    assert ".grad" in problem["message"]


def test_03_a_reduce_to_one_rank_is_called_that(tmp_path):
    """Reduce to rank 0, then divide: the mean reached rank 0 only."""
    body = "dist.reduce(p.grad, 0)\n            p.grad /= n"
    path = write(tmp_path, AVERAGE_BODY.format(body=body))
    problem = first_problem(grade_file(AVERAGE, str(path)))
    assert "on rank 1" in problem["message"], problem
    assert "while rank 0 holds the right mean" in problem["message"]
    assert "dist.reduce sends the sum to one rank" in problem["message"]
    assert "sum instead" not in problem["message"]


def test_08_an_off_by_one_names_the_micro_step_that_synchronised(tmp_path):
    """`last = i == 0`: the first micro-step all-reduced, not the last."""
    exercise = catalog.find(EXERCISES, "08")
    solution = open(exercise.path("solution.py"), encoding="utf-8").read()
    off_by_one = """

import contextlib


def train_step(ddp, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == 0  # the bug: the first, not i == k - 1
        with contextlib.nullcontext() if last else ddp.no_sync():
            (loss_fn(ddp(x), y) / k).backward()
    optimizer.step()
"""
    path = tmp_path / "mine.py"
    path.write_text(solution + off_by_one)
    problem = first_problem(grade_file(exercise, str(path)))
    assert "micro-step 1 of 2 all-reduced the gradients" in problem["message"], problem
    assert "only the last, micro-step 2, should" in problem["message"]


def test_13_the_ledger_shows_where_the_ranks_part(tmp_path):
    """The hang exercise runs in chapter 8's collective ledger: per rank, the last
    call all agree on and each rank's next call, with its line."""
    exercise = catalog.find(EXERCISES, "13")
    report = grade_file(exercise, exercise.path("starter.py"))
    problem = first_problem(report)
    assert "the ranks' collectives part ways" in problem["message"], problem
    zero, zero_at, one, one_at = problem["where"].splitlines()
    assert (
        zero
        == "rank 0: last matching #4; then #5 all_reduce float32 [] [stopped at #5]"
    )
    assert zero_at.endswith("dist.all_reduce(total)"), zero_at
    assert one == (
        "rank 1: last matching #4; then #5 all_reduce float32 [6, 4] [stopped at #5]"
    )
    assert one_at.endswith("dist.all_reduce(p.grad)"), one_at
    # The loss logged by every rank, the uneven batches left: rank 1 leaves the
    # loop while rank 0 starts a third step.
    starter = open(exercise.path("starter.py"), encoding="utf-8").read()
    path = write(
        tmp_path,
        starter.replace(
            "        if rank == 0:  # log the mean loss over all ranks\n", ""
        )
        .replace("            total = ", "        total = ")
        .replace("            dist.all_reduce(total)", "        dist.all_reduce(total)")
        .replace("            losses.append", "        losses.append"),
    )
    uneven = grade_file(exercise, str(path)).results[1]
    assert "part ways" in uneven["message"], uneven
    assert (
        "rank 1: last matching #10; then #11 (none) [left after #10]"
        in (uneven["where"])
    ), uneven


def test_03_another_wrong_factor_gets_neither_guess(tmp_path):
    body = "dist.all_reduce(p.grad)\n            p.grad /= 3 * n"
    path = write(tmp_path, AVERAGE_BODY.format(body=body))
    problem = first_problem(grade_file(AVERAGE, str(path)))
    assert "differ from the whole batch's" in problem["message"]
    assert "sum instead" not in problem["message"]
    assert "own gradients" not in problem["message"]


OFF_BY_ONE = """\
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return tensor
    flat = tensor.view(-1)
    size = flat.numel() // n  # off by one: the remainder is in no chunk
    chunks = [flat[i * size:(i + 1) * size] for i in range(n)]
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send_index, recv_index):
        incoming = torch.empty_like(chunks[recv_index])
        request = dist.isend(chunks[send_index].contiguous(), right)
        dist.recv(incoming, left)
        request.wait()
        return incoming

    for step in range(n - 1):
        s, r = (rank - step) % n, (rank - step - 1) % n
        chunks[r] += exchange(s, r)
    for step in range(n - 1):
        s, r = (rank - step + 1) % n, (rank - step) % n
        chunks[r].copy_(exchange(s, r))
    return tensor
"""


def test_01_an_off_by_one_chunk_is_not_called_not_in_place(tmp_path):
    path = write(tmp_path, OFF_BY_ONE)
    report = grade_file(RING, str(path))
    problem = first_problem(report)
    assert problem["status"] == "failed", problem
    assert "in place" not in problem["message"], problem
    assert "chunks cover every element" in problem["message"]


def test_01_a_sum_not_written_in_place_is_called_so(tmp_path):
    path = write(
        tmp_path,
        """\
        import torch.distributed as dist

        def ring_all_reduce(tensor):
            out = tensor.clone()
            for peer in range(dist.get_world_size()):
                pass
            gathered = [tensor.clone() for _ in range(dist.get_world_size())]
            total = sum(gathered)  # not a sum over ranks, and not in place
            return total
        """,
    )
    problem = first_problem(grade_file(RING, str(path)))
    assert "must be summed in place" in problem["message"], problem


def test_a_busy_loop_on_ranks_is_not_called_a_hang(tmp_path):
    path = write(
        tmp_path,
        """\
        def average_gradients(model):
            x = 0
            while True:
                x += 1
        """,
    )
    report = grade_file(AVERAGE, str(path), check_timeout_s=6)
    problem = first_problem(report)
    assert problem["status"] == "timeout", problem
    assert "hung" not in problem["message"] and "busy" in problem["message"]
    assert "line 4" in problem["where"] or "line 3" in problem["where"], problem


def test_an_empty_file_is_one_message(tmp_path):
    path = write(tmp_path, "")
    report = grade_file(BUCKETS, str(path))
    assert report.verdict == "load error" and "empty" in report.message
    assert report.results == []


def test_a_missing_function_is_said_once(tmp_path):
    path = write(tmp_path, "# nothing here yet\n")
    report = grade_file(BUCKETS, str(path))
    said = [r for r in report.results if "defines no" in r.get("message", "")]
    assert len(said) == 1, report.results


def test_a_load_error_is_printed_once(tmp_path):
    path = write(tmp_path, "import no_such_module_anywhere\n")
    out = subprocess.run(
        [sys.executable, JUDGE, "06", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    )
    assert out.returncode == 1
    assert out.stdout.count("an import in your file failed") == 1, out.stdout
