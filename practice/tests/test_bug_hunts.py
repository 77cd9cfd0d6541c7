"""The bug hunts: each one's known wrong fix is named by the judge.

Exercises 22 to 27 each start from a script with a bug a real project shipped
(their statements cite the threads). Their reference solutions pass and their
starters fail in test_judge_exercises.py; here, for each, a fix that looks
right and is not gets a message that says what it did.
"""

import textwrap

from _judge import catalog
from _judge.sandbox import grade_file

EXERCISES = catalog.load_exercises()


def grade(tmp_path, number, source):
    path = tmp_path / f"fix{number}.py"
    path.write_text(textwrap.dedent(source))
    report = grade_file(catalog.find(EXERCISES, number), str(path))
    assert not report.passed, report.results
    return report


def first_problem(report):
    return next(r for r in report.results if r["status"] != "passed")


def solution(number):
    return open(catalog.find(EXERCISES, number).path("solution.py")).read()


def replaced(number, old, new):
    text = solution(number)
    assert old in text, (number, old)
    return text.replace(old, new)


def test_22_every_micro_step_inside_no_sync_is_named(tmp_path):
    source = replaced(
        "22",
        "with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():",
        "with ddp.no_sync():  # the last one too",
    )
    problem = first_problem(grade(tmp_path, "22", source))
    assert "no micro-step all-reduced" in problem["message"], problem
    assert "the last of the" in problem["message"]


def test_22_the_starter_is_told_every_micro_step_all_reduced(tmp_path):
    exercise = catalog.find(EXERCISES, "22")
    report = grade_file(exercise, exercise.path("starter.py"))
    assert [r["status"] for r in report.results[:2]] == ["passed", "passed"]
    assert "every micro-step all-reduced" in report.results[2]["message"]


def test_23_set_epoch_after_the_epoch_is_named(tmp_path):
    source = replaced("23", "        sampler.set_epoch(epoch)\n", "").replace(
        "        read.append(order)",
        "        read.append(order)\n        sampler.set_epoch(epoch)",
    )
    problem = first_problem(grade(tmp_path, "23", source))
    assert "the shuffle the epoch before should have had" in problem["message"]


def test_23_a_seed_per_rank_is_named(tmp_path):
    source = replaced(
        "23",
        "DistributedSampler(dataset, shuffle=True, seed=0)",
        "DistributedSampler(dataset, shuffle=True, seed=dist.get_rank())",
    )
    problem = first_problem(grade(tmp_path, "23", source))
    assert "the ranks' shares overlap" in problem["message"], problem


def test_23_the_statement_shows_the_sampler_s_real_order():
    from torch.utils.data import DistributedSampler

    order = list(DistributedSampler(range(20), 2, 0, shuffle=True, seed=0))
    readme = open(catalog.find(EXERCISES, "23").path("README.md")).read()
    assert f"reads samples {', '.join(map(str, order[:4]))}, ..." in readme


def test_24_a_tensor_hook_is_named(tmp_path):
    source = replaced(
        "24",
        "p.register_post_accumulate_grad_hook(self._allreduce_grads)",
        "p.register_hook(self._allreduce_grads)",
    )
    source = source.replace(
        "            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n"
        "            param.grad /= dist.get_world_size()",
        "            dist.all_reduce(param, op=dist.ReduceOp.SUM)\n"
        "            param /= dist.get_world_size()\n"
        "        return param",
    )
    problem = first_problem(grade(tmp_path, "24", source))
    assert "averaging only the last micro-batch's gradient" in problem["message"]


def test_24_the_starter_is_told_it_averaged_the_weights(tmp_path):
    exercise = catalog.find(EXERCISES, "24")
    problem = first_problem(grade_file(exercise, exercise.path("starter.py")))
    assert "applied to tensors that are the model's weights" in problem["message"]


def test_25_the_global_count_without_the_world_size_is_named(tmp_path):
    source = replaced(
        "25",
        "loss = total / count.clamp(min=1) * world",
        "loss = total / count.clamp(min=1)",
    )
    problem = first_problem(grade(tmp_path, "25", source))
    assert "after step 1, a full batch" in problem["message"], problem
    assert "DDP divides by the number of ranks" in problem["message"]


def test_25_the_starter_is_told_where_the_curves_part(tmp_path):
    exercise = catalog.find(EXERCISES, "25")
    problem = first_problem(grade_file(exercise, exercise.path("starter.py")))
    assert "after step 4, the padded last batch of epoch 1" in problem["message"]
    assert "held 10 and 2 real tokens" in problem["message"]


def test_26_clipping_after_the_step_is_named(tmp_path):
    source = replaced(
        "26",
        "    norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm)\n"
        "    optimizer.step()",
        "    optimizer.step()\n"
        "    norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm)",
    )
    problem = first_problem(grade(tmp_path, "26", source))
    assert "those of training without clipping" in problem["message"], problem


def test_26_the_starter_is_told_it_clipped_every_micro_step(tmp_path):
    exercise = catalog.find(EXERCISES, "26")
    problem = first_problem(grade_file(exercise, exercise.path("starter.py")))
    assert "clipping after every micro-step" in problem["message"], problem


def test_27_a_barrier_in_place_of_the_step_is_named(tmp_path):
    exercise = catalog.find(EXERCISES, "27")
    starter = open(exercise.path("starter.py")).read()
    source = starter.replace(
        "            continue  # nothing to learn from on this rank",
        "            dist.barrier()  # wait for the others\n            continue",
    )
    problem = first_problem(grade(tmp_path, "27", source))
    assert "part ways" in problem["message"]
    assert "a barrier does not stand in" in problem["message"], problem
    assert "#9 barrier" in problem["where"]


def test_27_stopping_every_rank_loses_data_and_is_named(tmp_path):
    source = replaced(
        "27",
        "        optimizer.zero_grad()\n        loss =",
        "        empty = torch.tensor(float(len(x) == 0))\n"
        "        dist.all_reduce(empty)\n"
        "        if empty > 0:  # some rank has nothing: everyone skips\n"
        "            continue\n"
        "        optimizer.zero_grad()\n        loss =",
    ).replace("import torch.distributed", "import torch\nimport torch.distributed")
    report = grade(tmp_path, "27", source)
    problem = first_problem(report)
    assert report.results[0]["status"] == "passed"  # no hang: the ledger agrees
    assert (
        "skipped the steps in which some rank's batch was empty" in (problem["message"])
    ), problem
