"""The judge reports only what its checks found: six ways to fake a pass, each refused.

Each case is a reader's file that tries to make the judge say PASS without
solving the exercise (the starter's ``NotImplementedError`` stays in place,
or the answer is wrong), as the issue that asked for this judge found they
could: replace the judge's ``run_one``; make ``fail`` and ``expect_*``
no-ops; forge the messages the judge reads and exit; rewrite the
exercise's ``checks.py``; leave a detached process that writes the progress
file after the run; in exercise 01, reach ``all_reduce`` by a path a
module-level spy does not wrap.

What makes each fail: the checks run in the judge's process, not in the one
running the reader's code (fakes 1, 2, 3); ``checks.py`` is checked against
``MANIFEST.sha256`` and sent as bytes before the reader's code runs, and the
reader's code cannot write it (4; the attacks of issue 29, graded code
rewriting the checks and the manifest among them, are in
test_judge_attacks.py); every process below the run is killed at its end
(5); the spy sees every path to a collective (6).
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

from _judge import catalog, manifest
from _judge.sandbox import grade_file

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUDGE = os.path.join(PRACTICE_DIR, "judge.py")
EXERCISES = catalog.load_exercises()
BUCKETS = catalog.find(EXERCISES, "06")
RING = catalog.find(EXERCISES, "01")
STARTER_BODY = """
def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
    raise NotImplementedError("write buckets_for_parameters")
"""


def write(tmp_path, source, name="mine.py", then=""):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source) + then)
    return path


def test_fake_1_replacing_run_one_changes_nothing(tmp_path):
    path = write(
        tmp_path,
        """\
        import sys
        import _judge.running

        def passed(fn, solution, path, guard=None):
            return {"name": fn.check_name, "status": "passed"}

        _judge.running.run_one = passed
        for module in list(sys.modules.values()):
            if hasattr(module, "run_one"):
                module.run_one = passed
        """,
        then=STARTER_BODY,
    )
    report = grade_file(BUCKETS, str(path))
    assert not report.passed
    assert report.results[0]["status"] == "todo"


def test_fake_2_no_op_fail_and_expect_change_nothing(tmp_path):
    path = write(
        tmp_path,
        """\
        import sys
        import _judge.checking

        def nothing(*args, **kwargs):
            return None

        NAMES = ("fail", "expect_equal", "expect_close", "expect_type",
                 "expect_raises")
        for module in list(sys.modules.values()):
            for name in NAMES:
                if hasattr(module, name):
                    setattr(module, name, nothing)

        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            return [[0]]
        """,
    )
    report = grade_file(BUCKETS, str(path))
    assert not report.passed
    assert report.results[0]["status"] == "failed"


def test_fake_3_forged_messages_and_exit_are_an_exit(tmp_path):
    """Writing 'passed' wherever it can (every open file and socket), then exiting."""
    path = write(
        tmp_path,
        """\
        import json, os, pickle, struct, sys
        from _judge import wire

        lines = [json.dumps({"event": "check", "index": i,
                             "result": {"name": "x", "status": "passed"}})
                 for i in range(20)] + [json.dumps({"event": "done"})]
        for arg in sys.argv[1:]:
            try:
                with open(arg, "a") as f:
                    f.write("\\n".join(lines) + "\\n")
            except OSError:
                pass
        for fd in map(int, os.listdir("/proc/self/fd")):
            for message in (("ok", [[0], [1]], ()), ("loaded",), ("passed",)):
                data = pickle.dumps(message)
                try:
                    os.write(fd, struct.pack("!Q", len(data)) + data)
                except OSError:
                    pass
        os._exit(0)
        """,
        then=STARTER_BODY,
    )
    report = grade_file(BUCKETS, str(path))
    assert not report.passed
    assert report.verdict in ("exit", "load error", "failed"), report.verdict


def copy_exercise(tmp_path, exercise):
    """A private copy of an exercise and its manifest, for the reader to vandalise."""
    root = tmp_path / "exercises"
    shutil.copytree(exercise.dir, root / os.path.basename(exercise.dir))
    shutil.copy(os.path.join(catalog.EXERCISES_DIR, "chapters.toml"), root)
    manifest.write(str(root))
    return catalog.load_exercises(str(root))[0]


def test_fake_4_rewriting_checks_py_is_refused_by_name(tmp_path):
    """A checks.py changed on disk (here by the test: graded code cannot write it,
    test_judge_attacks.py) is refused by name, with the command that restores it."""
    exercise = copy_exercise(tmp_path, BUCKETS)
    with open(exercise.path("checks.py"), "a") as f:
        f.write("\n# changed\n")
    starter = grade_file(exercise, exercise.path("starter.py"))
    assert starter.verdict == "refused"
    assert "checks.py has been changed" in starter.message
    assert "git checkout -- " in starter.message


def test_fake_5_a_detached_process_dies_with_the_run(tmp_path):
    pid_file, wrote = tmp_path / "daemon.pid", tmp_path / "daemon.wrote"
    progress = tmp_path / ".progress.json"
    path = write(
        tmp_path,
        f"""\
        import json, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open({str(pid_file)!r}, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(4)
                everything = {{"version": 1, "exercises": {{
                    name: {{"state": "passed"}} for name in
                    {[ex.id for ex in EXERCISES]!r}}}}}
                with open({str(progress)!r}, "w") as f:
                    json.dump(everything, f)
                open({str(wrote)!r}, "w").close()
            os._exit(0)
        """,
        then=STARTER_BODY,
    )
    out = subprocess.run(
        [sys.executable, JUDGE, "06", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    )
    assert out.returncode == 1, out.stdout
    # (On a busy machine the run may end, and kill it, before it writes its pid.)
    if pid_file.exists() and pid_file.read_text():
        daemon = int(pid_file.read_text())
        assert not os.path.exists(f"/proc/{daemon}") or _zombie(daemon), (
            "the detached process outlived the run"
        )
    time.sleep(5)
    assert not wrote.exists()
    listing = subprocess.run(
        [sys.executable, JUDGE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    ).stdout
    assert "Progress: 0 of" in listing


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


RING_FAKE = """\
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    {call}
    if n > 1:  # the bytes a real ring would send, so that the byte count matches
        size = 2 * (n - 1) * tensor.numel() // n
        reqs = [dist.isend(torch.zeros(size, dtype=tensor.dtype), (rank + 1) % n),
                dist.irecv(torch.zeros(size, dtype=tensor.dtype), (rank - 1) % n)]
        for r in reqs:
            r.wait()
    return tensor
"""


def test_fake_6_every_path_to_all_reduce_is_refused(tmp_path):
    for name, call in (
        ("c10d", "c10d.all_reduce(tensor)"),
        ("method", "c10d._get_default_group().allreduce([tensor]).wait()"),
        (
            "backend",
            "c10d._get_default_group()._get_backend(torch.device('cpu'))"
            ".allreduce([tensor]).wait()",
        ),
        ("unwrapped", "dist.all_reduce.__wrapped__(tensor)"),
        (
            "functional",
            "import torch.distributed._functional_collectives as fc\n"
            "    tensor.copy_(fc.all_reduce(tensor, 'sum', c10d._get_default_group()))",
        ),
        (
            "functional-op",
            "tensor.copy_(torch.ops._c10d_functional.wait_tensor(\n"
            "        torch.ops._c10d_functional.all_reduce(tensor, 'sum', '0')))",
        ),
        (
            "c10d-op",
            "torch.ops.c10d.allreduce_.default([tensor], "
            "c10d._get_default_group(), None, None, None, False, -1)",
        ),
    ):
        path = write(tmp_path, RING_FAKE.format(call=call), f"{name}.py")
        report = grade_file(RING, str(path))
        assert not report.passed, name
        problem = next(r for r in report.results if r["status"] != "passed")
        assert "does not allow torch.distributed.all_reduce" in (problem["message"]), (
            name,
            problem,
        )


# Every way to an all-gather or a reduce-scatter below torch.distributed's own
# names, and through its old names; "bound" ones are taken before the spy starts,
# as a module-level `from ... import` or `OP = torch.ops...` would be.
GATHER_SCATTER_PATHS = (
    "dist.all_gather_single",
    "dist.all_gather_into_tensor",
    "c10d._all_gather_base",
    "dist.all_gather",
    "dist.all_gather_object",
    "pg.all_gather_single",
    "pg._allgather_base",
    "pg.allgather_into_tensor_coalesced",
    "pg.all_gather_single_coalesced",
    "pg.allgather",
    "backend._allgather_base",
    "bound pg._allgather_base",
    "fc.all_gather_single",
    "fc.all_gather_single_autograd",
    "fc.all_gather_tensor",
    "fc.all_gather_tensor_autograd",
    "ops._c10d_functional.all_gather_into_tensor",
    "ops._c10d_functional_autograd.all_gather_into_tensor",
    "ops.c10d._allgather_base_",
    "bound ops._c10d_functional.all_gather_into_tensor",
    "bound ops.c10d._allgather_base_",
    "dist.reduce_scatter_single",
    "dist.reduce_scatter_tensor",
    "c10d._reduce_scatter_base",
    "dist.reduce_scatter",
    "pg.reduce_scatter_single",
    "pg._reduce_scatter_base",
    "pg.reduce_scatter_tensor_coalesced",
    "pg.reduce_scatter",
    "backend._reduce_scatter_base",
    "bound pg._reduce_scatter_base",
    "fc.reduce_scatter_single",
    "fc.reduce_scatter_tensor",
    "fc.reduce_scatter_tensor_autograd",
    "ops._c10d_functional.reduce_scatter_tensor",
    "ops.c10d._reduce_scatter_base_",
    "bound ops._c10d_functional.reduce_scatter_tensor",
)


def _paths(n):
    """Each path of GATHER_SCATTER_PATHS: a function that makes that call."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    import torch.distributed.distributed_c10d as c10d

    pg = c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    name, ops = pg.group_name, torch.ops
    one, many = torch.ones(2), torch.ones(2 * n)

    def out(k=1):
        return torch.empty(2 * n * k)

    def gathered(t):
        return ops._c10d_functional.wait_tensor(t)

    rs = ops.c10d._reduce_scatter_base_.default
    total = torch.classes.c10d.ReduceOp()  # the operators' own ReduceOp: a sum
    return {
        "dist.all_gather_single": lambda: dist.all_gather_single(out(), one),
        "dist.all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out(), one),
        "c10d._all_gather_base": lambda: c10d._all_gather_base(out(), one),
        "dist.all_gather": lambda: dist.all_gather([torch.empty(2)] * n, one),
        "dist.all_gather_object": lambda: dist.all_gather_object([None] * n, 1),
        "pg.all_gather_single": lambda: pg.all_gather_single(out(), one).wait(),
        "pg._allgather_base": lambda: pg._allgather_base(out(), one).wait(),
        "pg.allgather_into_tensor_coalesced": lambda: (
            pg.allgather_into_tensor_coalesced([out()], [one]).wait()
        ),
        "pg.all_gather_single_coalesced": lambda: pg.all_gather_single_coalesced(
            [out()], [one]
        ).wait(),
        "pg.allgather": lambda: pg.allgather([[torch.empty(2)] * n], [one]).wait(),
        "backend._allgather_base": lambda: backend._allgather_base(out(), one).wait(),
        "bound pg._allgather_base": (lambda f: lambda: f(out(), one).wait())(
            pg._allgather_base
        ),
        "fc.all_gather_single": lambda: gathered(fc.all_gather_single(one, 0, pg)),
        "fc.all_gather_single_autograd": lambda: gathered(
            fc.all_gather_single_autograd(one, 0, pg)
        ),
        "fc.all_gather_tensor": lambda: gathered(fc.all_gather_tensor(one, 0, pg)),
        "fc.all_gather_tensor_autograd": lambda: gathered(
            fc.all_gather_tensor_autograd(one, 0, pg)
        ),
        "ops._c10d_functional.all_gather_into_tensor": lambda: gathered(
            ops._c10d_functional.all_gather_into_tensor(one, n, name)
        ),
        "ops._c10d_functional_autograd.all_gather_into_tensor": lambda: gathered(
            ops._c10d_functional_autograd.all_gather_into_tensor(one, n, name)
        ),
        "ops.c10d._allgather_base_": lambda: ops.c10d._allgather_base_(
            out(), one, pg.boxed(), False, -1
        )[1].wait(),
        "bound ops._c10d_functional.all_gather_into_tensor": (
            lambda f: lambda: gathered(f(one, n, name))
        )(ops._c10d_functional.all_gather_into_tensor.default),
        "bound ops.c10d._allgather_base_": (
            lambda f: lambda: f(out(), one, pg.boxed(), False, -1)[1].wait()
        )(ops.c10d._allgather_base_.default),
        "dist.reduce_scatter_single": lambda: dist.reduce_scatter_single(
            torch.empty(2), many
        ),
        "dist.reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(2), many
        ),
        "c10d._reduce_scatter_base": lambda: c10d._reduce_scatter_base(
            torch.empty(2), many
        ),
        "dist.reduce_scatter": lambda: dist.reduce_scatter(
            torch.empty(2), [torch.ones(2)] * n
        ),
        "pg.reduce_scatter_single": lambda: pg.reduce_scatter_single(
            torch.empty(2), many
        ).wait(),
        "pg._reduce_scatter_base": lambda: pg._reduce_scatter_base(
            torch.empty(2), many
        ).wait(),
        "pg.reduce_scatter_tensor_coalesced": lambda: (
            pg.reduce_scatter_tensor_coalesced([torch.empty(2)], [many]).wait()
        ),
        "pg.reduce_scatter": lambda: pg.reduce_scatter(
            [torch.empty(2)], [[torch.ones(2)] * n]
        ).wait(),
        "backend._reduce_scatter_base": lambda: backend._reduce_scatter_base(
            torch.empty(2), many
        ).wait(),
        "bound pg._reduce_scatter_base": (
            lambda f: lambda: f(torch.empty(2), many).wait()
        )(pg._reduce_scatter_base),
        "fc.reduce_scatter_single": lambda: gathered(
            fc.reduce_scatter_single(many, "sum", 0, pg)
        ),
        "fc.reduce_scatter_tensor": lambda: gathered(
            fc.reduce_scatter_tensor(many, "sum", 0, pg)
        ),
        "fc.reduce_scatter_tensor_autograd": lambda: gathered(
            fc.reduce_scatter_tensor_autograd(many, "sum", 0, pg)
        ),
        "ops._c10d_functional.reduce_scatter_tensor": lambda: gathered(
            ops._c10d_functional.reduce_scatter_tensor(many, "sum", n, name)
        ),
        "ops.c10d._reduce_scatter_base_": lambda: rs(
            torch.empty(2), many, pg.boxed(), total, False, -1
        )[1].wait(),
        "bound ops._c10d_functional.reduce_scatter_tensor": (
            lambda f: lambda: gathered(f(many, "sum", n, name))
        )(ops._c10d_functional.reduce_scatter_tensor.default),
    }


def _load_checks(exercise):
    import importlib.util

    spec = importlib.util.spec_from_file_location("checks", exercise.path("checks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A check may name a collective by its old name: it covers the new one too.
OLD_NAMES = ["all_gather_into_tensor", "reduce_scatter_tensor"]
LIST_FORMS = {
    "dist.all_gather",
    "dist.all_gather_object",
    "pg.allgather",
    "dist.reduce_scatter",
    "pg.reduce_scatter",
}


def _probe(forbid_lists):
    """On each rank: every path under each ``forbid`` list, and what was recorded.

    Returns ``{"forbid": [{path: outcome}], "recorded": {path: calls}}``; an
    outcome is the refused collective's name, "allowed" or "error: ...".
    """
    import warnings

    import torch.distributed as dist

    from _judge.spy import spy_on_dist

    # The old names are called on purpose: their FutureWarning is no failure here.
    warnings.filterwarnings("ignore", "`torch.distributed.", FutureWarning)
    n = dist.get_world_size()
    outcomes = []
    for forbid in forbid_lists:
        done, paths = {}, _paths(n)  # "bound" paths are bound here, before the spy
        for path in GATHER_SCATTER_PATHS:
            try:
                with spy_on_dist([], forbid=forbid, why="the test"):
                    paths[path]()
                done[path] = "allowed"
            except RuntimeError as e:
                words = str(e).split("torch.distributed.", 1)
                refused = "does not allow" in str(e)
                done[path] = words[1].split(":")[0] if refused else f"error: {e}"
            dist.barrier()
        outcomes.append(done)
    recorded, paths = {}, _paths(n)
    for path in GATHER_SCATTER_PATHS:
        if path.startswith(("dist.", "c10d.", "pg.", "backend.")):
            with spy_on_dist(OLD_NAMES + ["all_gather", "reduce_scatter"]) as spy:
                paths[path]()
            recorded[path] = [c[0] for c in spy.calls]
            dist.barrier()
    return {"forbid": outcomes, "recorded": recorded}


def test_fake_6_every_path_to_all_gather_and_reduce_scatter_is_refused():
    """Exercises 01 and 17 forbid all-gather and reduce-scatter: by every path.

    Ranks that call each path under the two exercises' lists, and under a
    list that names only the old names, are refused at each; the calls made
    through torch.distributed, its process group and backend are recorded
    under the collective's new name, whichever name the check used.
    """
    from _judge.ranks import run_locally

    lists = [
        list(_load_checks(RING).COLLECTIVES),
        list(_load_checks(catalog.find(EXERCISES, "17")).FORBIDDEN),
        OLD_NAMES,
    ]
    results = run_locally(_probe, 2, (lists,), busy_s=120.0)
    for rank, result in enumerate(results):
        for forbid, done in zip(lists, result["forbid"]):
            for path in GATHER_SCATTER_PATHS:
                if forbid == OLD_NAMES and path in LIST_FORMS:
                    assert done[path] == "allowed", (rank, path, done[path])
                    continue
                family = "all_gather" if "gather" in path else "reduce_scatter"
                assert done[path].startswith(family), (rank, forbid, path, done[path])
        for path, calls in result["recorded"].items():
            family = "all_gather" if "gather" in path else "reduce_scatter"
            expected = family if path in LIST_FORMS else f"{family}_single"
            if path == "dist.all_gather_object":
                assert calls and set(calls) == {expected}, (path, calls)
            else:
                assert calls == [expected], (rank, path, calls)


def test_fake_6_a_built_in_all_gather_fails_exercise_01(tmp_path):
    """Graded end to end: a sum made by an all-gather (a method, a bound operator)."""
    gather = (
        "flat = tensor.detach().reshape(-1).contiguous()\n"
        "    every = torch.empty(n * flat.numel(), dtype=flat.dtype)\n"
        "    {gather}\n"
        "    tensor.copy_(every.view(n, -1).sum(0).view_as(tensor))"
    )
    for name, call, top in (
        (
            "method",
            "c10d._get_default_group()._allgather_base(every, flat).wait()",
            "",
        ),
        (
            "bound-op",
            "every.copy_(torch.ops._c10d_functional.wait_tensor(\n"
            "        OP(flat, n, c10d._get_default_group().group_name)))",
            "OP = torch.ops._c10d_functional.all_gather_into_tensor.default\n",
        ),
    ):
        head, tail = RING_FAKE.format(call=gather.format(gather=call)).split(
            "\n\ndef ", 1
        )
        source = head + "\n" + top + "\n\ndef " + tail
        path = write(tmp_path, source, f"{name}.py")
        report = grade_file(RING, str(path))
        assert not report.passed, name
        problem = next(r for r in report.results if r["status"] != "passed")
        assert "does not allow torch.distributed.all_gather" in problem["message"], (
            name,
            problem,
        )


def test_the_manifest_is_current():
    """Whoever changes an exercise regenerates it: `make practice-manifest`."""
    with open(manifest.MANIFEST, encoding="utf-8") as f:
        assert f.read() == manifest.render(), "run `make practice-manifest`"


def test_progress_written_outside_the_judge_is_not_counted(tmp_path):
    with open(tmp_path / ".progress.json", "w") as f:
        json.dump({"version": 1, "exercises": {BUCKETS.id: {"state": "passed"}}}, f)
    out = subprocess.run(
        [sys.executable, JUDGE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    ).stdout
    assert "Progress: 0 of" in out and "changed outside the judge" in out


def test_every_check_and_rank_grades_one_snapshot(tmp_path):
    """A save during grading changes nothing: the file is read once.

    Here the file is overwritten with a broken version while it loads (it
    waits a moment at the top); every check (and every rank) still grades what
    was read.
    """
    average = catalog.find(EXERCISES, "03")
    solution = open(average.path("solution.py"), encoding="utf-8").read()
    path = tmp_path / "mine.py"
    path.write_text("import time\ntime.sleep(1.0)\n" + solution)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        graded = pool.submit(grade_file, average, str(path))
        time.sleep(0.3)
        path.write_text("def average_gradients(model):\n    raise ValueError\n")
        report = graded.result()
    assert report.passed, report.results
    assert "raise ValueError" in path.read_text()  # it did change on disk
