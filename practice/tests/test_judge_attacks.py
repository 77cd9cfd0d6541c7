"""A PASS only the checks can give: every way to one that issue 29 found, refused.

Each class of attack, tried as a determined learner would:

1. A graded file must not change what this or any later grade does: a module
   written beside the judge's (``practice/cloudpickle.py``), a forged
   ``_judge/__pycache__/*.pyc``, a rewritten ``checks.py`` and manifest, a
   ``.pth`` in ``site-packages``. Tried in a copy of ``practice/`` (the
   attacks hit the copy, never this checkout) in three ways: under Landlock
   (the kernel refuses), with the sandbox off so that only the audit hook
   stands (Python's own functions refused), and with the sandbox off and the
   writes made through the C library (the judge finds the change after the
   grade, undoes it and refuses the grade). A later grade is unaffected.
2. Accidental passes: a function that writes into its arguments, an object
   whose ``__eq__`` always says yes.
3. Rank exercises: the reader's code patching what it can reach in its own
   process (``builtins.float``, ``torch.Tensor.abs``, ``copy.deepcopy``, the
   caller's locals, the rank launcher) gets no pass: references and
   differences are computed in the judge, from the raw tensors.
4. Reading the exercise's solution, or calling the checks' reference: refused
   and reported.
5. A 5,000-level nested return: a verdict, not an internal error.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from _judge import catalog, confine, manifest
from _judge.sandbox import grade_file

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXERCISES = catalog.load_exercises()
BUCKETS = catalog.find(EXERCISES, "06")
AVERAGE = catalog.find(EXERCISES, "03")
ALPHA = catalog.find(EXERCISES, "02")
HAS_LANDLOCK = confine.landlock_abi() > 0
MODES = ["landlock", "audit hook", "C library"]
STARTER_06 = """
def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
    raise NotImplementedError("write buckets_for_parameters")
"""


def copy_practice(tmp_path):
    """A copy of practice/ with exercise 06 only: the attacks' target."""
    root = tmp_path / "practice"
    root.mkdir()
    shutil.copy(os.path.join(PRACTICE_DIR, "judge.py"), root)
    shutil.copytree(
        os.path.join(PRACTICE_DIR, "_judge"),
        root / "_judge",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (root / "exercises").mkdir()
    shutil.copytree(BUCKETS.dir, root / "exercises" / os.path.basename(BUCKETS.dir))
    shutil.copy(
        os.path.join(catalog.EXERCISES_DIR, "chapters.toml"), root / "exercises"
    )
    manifest.write(str(root / "exercises"))
    return root


def run_judge(root, home, *args, mode="landlock"):
    env = {**os.environ, "JUDGE_HOME": str(home), "JUDGE_SERVER_IDLE_S": "0"}
    if mode != "landlock":
        env["JUDGE_SANDBOX"] = "none"
    out = subprocess.run(
        [sys.executable, str(root / "judge.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    return out


def writer(mode):
    """Source of a function ``put(path, data)`` that writes the way ``mode`` says."""
    if mode == "C library":  # past Python's audit hook: only the after-check sees it
        return textwrap.dedent(
            """\
            import ctypes, os
            def put(path, data, append=False):
                libc = ctypes.CDLL(None, use_errno=True)
                end = os.O_APPEND if append else os.O_TRUNC
                flags = os.O_WRONLY | os.O_CREAT | end
                fd = libc.open(os.fsencode(path), flags, 0o644)
                if fd >= 0:
                    libc.write(fd, data, len(data))
                    libc.close(fd)
            """
        )
    return textwrap.dedent(
        """\
        def put(path, data, append=False):
            try:
                with open(path, "ab" if append else "wb") as f:
                    f.write(data)
            except OSError as e:
                print("refused:", e)
        """
    )


def attack(tmp_path, mode, body):
    path = tmp_path / "evil.py"
    path.write_text(writer(mode) + textwrap.dedent(body) + STARTER_06)
    return path


def check_mode(mode):
    if mode == "landlock" and not HAS_LANDLOCK:
        pytest.skip("this kernel has no Landlock")


@pytest.mark.parametrize("mode", MODES)
def test_a_module_beside_the_judge_is_never_imported(tmp_path, mode):
    check_mode(mode)
    root, marker = copy_practice(tmp_path), tmp_path / "imported"
    shadow = f"open({str(marker)!r}, 'w').close()\nfrom pickle import *\n".encode()
    evil = attack(
        tmp_path,
        mode,
        f"""\
        for name in ("cloudpickle.py", "rich.py", "_judge/cloudpickle.py"):
            put({str(root)!r} + "/" + name, {shadow!r})
        """,
    )
    first = run_judge(root, tmp_path, "06", "--file", str(evil), mode=mode)
    assert first.returncode == 1, first.stdout
    for name in ("cloudpickle.py", "rich.py", "_judge/cloudpickle.py"):
        assert not (root / name).exists(), f"{name} survived the grade ({mode})"
    if mode == "C library":
        assert "changed files outside its work folder" in first.stdout
    else:
        assert "tried to write outside its work folder" in first.stdout
    later = run_judge(root, tmp_path, "06", "--starters", mode=mode)
    assert later.returncode == 1 and "TODO" in later.stdout
    assert not marker.exists(), "a module the graded file wrote was imported"


def forged_pyc(root, module):
    """The bytes of a pyc of ``module`` whose every check passes, stamped with its
    source's time and size so that Python's import system would load it."""
    import importlib._bootstrap_external as external
    import marshal

    source = root / "_judge" / f"{module}.py"
    forged = source.read_text() + (
        "\n\ndef overall(results):\n    return 'passed', 'forged'\n"
        "\n\ndef run_one(fn, solution, path, guard=None):\n"
        "    return {'name': fn.check_name, 'status': 'passed'}\n"
    )
    st = source.stat()
    code = compile(forged, str(source), "exec")
    data = bytearray(external.MAGIC_NUMBER)
    data += (0).to_bytes(4, "little")
    data += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    data += (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    return bytes(data + marshal.dumps(code))


@pytest.mark.parametrize("mode", MODES)
def test_a_forged_pyc_never_runs(tmp_path, mode):
    check_mode(mode)
    root = copy_practice(tmp_path)
    cache = root / "_judge" / "__pycache__"
    tag = sys.implementation.cache_tag
    target = cache / f"running.{tag}.pyc"
    evil = attack(
        tmp_path,
        mode,
        f"""\
        import os
        try:
            os.makedirs({str(cache)!r}, exist_ok=True)
        except OSError:
            pass
        put({str(target)!r}, {forged_pyc(root, "running")!r})
        """,
    )
    first = run_judge(root, tmp_path, "06", "--file", str(evil), mode=mode)
    assert first.returncode == 1 and "PASSED" not in first.stdout, first.stdout
    assert not target.exists(), f"the forged pyc survived the grade ({mode})"
    # Even a pyc planted by other means (here by the test) is never read: the
    # judge compiles its modules from their source.
    cache.mkdir(exist_ok=True)
    target.write_bytes(forged_pyc(root, "running"))
    later = run_judge(root, tmp_path, "06", "--starters", mode=mode)
    assert later.returncode == 1 and "PASSED" not in later.stdout, later.stdout


@pytest.mark.parametrize("mode", MODES)
def test_rewritten_checks_and_manifest_grade_nothing(tmp_path, mode):
    check_mode(mode)
    root = copy_practice(tmp_path)
    folder = root / "exercises" / os.path.basename(BUCKETS.dir)
    checks = b"from _judge.checking import check\n@check('x')\ndef x(sol):\n    pass\n"
    lines = (root / "exercises" / "MANIFEST.sha256").read_text().splitlines()
    entry = f"{os.path.basename(BUCKETS.dir)}/checks.py"
    forged = "".join(
        f"{manifest.digest(checks)}  {entry}\n" if line.endswith(entry) else line + "\n"
        for line in lines
    ).encode()
    evil = attack(
        tmp_path,
        mode,
        f"""\
        put({str(folder / "checks.py")!r}, {checks!r})
        put({str(root / "exercises" / "MANIFEST.sha256")!r}, {forged!r})
        """,
    )
    before = (folder / "checks.py").read_bytes()
    first = run_judge(root, tmp_path, "06", "--file", str(evil), mode=mode)
    assert first.returncode == 1 and "PASSED" not in first.stdout, first.stdout
    assert (folder / "checks.py").read_bytes() == before
    later = run_judge(root, tmp_path, "06", "--starters", mode=mode)
    assert later.returncode == 1 and "TODO" in later.stdout, later.stdout


@pytest.mark.skipif(not HAS_LANDLOCK, reason="this kernel has no Landlock")
def test_nothing_is_written_into_site_packages_or_by_a_program(tmp_path):
    """Under Landlock, not a .pth file Python would run at start-up, and not by a
    program the graded code starts (the audit hook cannot follow one)."""
    site = sysconfig.get_paths()["purelib"]
    pth = os.path.join(site, "judge-attack-test.pth")
    shadow = os.path.join(PRACTICE_DIR, "judge_attack_shell.py")
    path = tmp_path / "evil.py"
    path.write_text(
        textwrap.dedent(
            f"""\
            import subprocess
            try:
                open({pth!r}, "w").write("import os\\n")
            except OSError:
                pass
            subprocess.run(["sh", "-c", "echo x > {shadow}"])
            """
        )
        + STARTER_06
    )
    report = grade_file(BUCKETS, str(path))
    assert not os.path.exists(pth) and not os.path.exists(shadow)
    assert report.verdict == "refused" and "outside its work folder" in report.message


# ----------------------------------------------------------------------------
# 2. Accidental passes
# ----------------------------------------------------------------------------


def test_a_fit_that_writes_its_line_into_the_data_fails(tmp_path):
    """Exercise 02: a wrong fit that overwrites ``seconds`` with its own line."""
    path = tmp_path / "mine.py"
    path.write_text(
        open(ALPHA.path("solution.py")).read()
        + textwrap.dedent(
            """\

            def fit_alpha_beta(nbytes, seconds):
                alpha, beta = 1e-5, 1e9  # not a fit at all
                seconds[:] = [alpha + x / beta for x in nbytes]
                return alpha, beta
            """
        )
    )
    report = grade_file(ALPHA, str(path))
    assert not report.passed
    noisy = next(r for r in report.results if r["name"].startswith("noisy"))
    assert noisy["status"] == "failed", noisy


def test_a_timeline_that_rewrites_its_arguments_fails(tmp_path):
    """Exercise 07: a simulation that empties the layers it was given."""
    exercise = catalog.find(EXERCISES, "07")
    path = tmp_path / "mine.py"
    path.write_text(
        textwrap.dedent(
            """\
            def simulate_backward(backward_s, sizes, buckets, n, alpha, bw,
                                  forward_s=0.0, optimizer_s=0.0):
                backward_s[:], sizes[:], buckets[:] = [], [], []
                return {"backward_s": 0.0, "bucket_times": [], "comm_s": 0.0,
                        "comm_end_s": 0.0, "exposed_comm_s": 0.0,
                        "overlapped_comm_s": 0.0,
                        "step_s": forward_s + optimizer_s}
            """
        )
    )
    report = grade_file(exercise, str(path))
    assert not report.passed
    assert report.results[0]["status"] == "failed", report.results[0]


def test_an_object_that_equals_everything_equals_nothing(tmp_path):
    """Exercise 12 compares a bool: ``got: True`` of the reader's making fails."""
    exercise = catalog.find(EXERCISES, "12")
    path = tmp_path / "mine.py"
    path.write_text(
        open(exercise.path("solution.py")).read()
        + textwrap.dedent(
            """\

            class Yes:
                def __eq__(self, other):
                    return True
                __hash__ = object.__hash__
                def __bool__(self):
                    return True
                def __repr__(self):
                    return "True"

            _real = sync_report

            def sync_report(*args, **kwargs):
                return {**_real(*args, **kwargs), "hidden": Yes()}  # hidden: wrong
            """
        )
    )
    report = grade_file(exercise, str(path))
    assert not report.passed
    first = report.results[0]
    assert first["status"] == "failed" and "hidden" in first["message"], first


# ----------------------------------------------------------------------------
# 3. Rank exercises: what the reader's process can reach decides nothing
# ----------------------------------------------------------------------------

SUM_NOT_MEAN = """
import torch.distributed as dist


def average_gradients(model):
    for p in model.parameters():  # a sum, not a mean: wrong
        if p.grad is not None:
            dist.all_reduce(p.grad)
"""
RANK_ATTACKS = {
    "float": "import builtins\nbuiltins.float = lambda *a: 0.0\n",
    "abs": "import torch\ntorch.Tensor.abs = lambda self: self * 0\n",
    "deepcopy": "import copy\ncopy.deepcopy = lambda x, memo=None: x\n",
    "locals": """
import sys
_wrong = average_gradients


def average_gradients(model):
    _wrong(model)
    frame = sys._getframe(1)
    while frame is not None:  # whatever the callers hold as a reference: ours
        for name in ("whole", "reference", "expected", "diff", "grad_diff"):
            if name in frame.f_locals:
                frame.f_locals[name] = model if name in ("whole",) else 0.0
        frame = frame.f_back
""",
    "launcher": """
import _judge.forkranks as forkranks
import _judge.ranks as ranks


def fake(worker, world_size, args, **kwargs):
    return [{"grads": [], "params": []} for _ in range(world_size)]


forkranks.run_forked = ranks.run_locally = fake
""",
}


@pytest.mark.parametrize("attack_name", sorted(RANK_ATTACKS))
def test_patching_the_rank_side_fakes_nothing(tmp_path, attack_name):
    code = RANK_ATTACKS[attack_name]
    placed_after = attack_name == "locals"
    path = tmp_path / f"{attack_name}.py"
    path.write_text(SUM_NOT_MEAN + code if placed_after else code + SUM_NOT_MEAN)
    report = grade_file(AVERAGE, str(path))
    assert not report.passed, (attack_name, report.results)
    assert report.results[0]["status"] != "passed", report.results[0]


# Exercise 22 unfixed, with DDP's hook registration patched: the hook the
# checks once counted with sees one all-reduce per step, while every micro-step
# still all-reduces. Which micro-steps all-reduced is now told in the judge
# from the gradients the ranks send back, so the patch changes nothing.
COMM_HOOK_FAKE = """
from torch.nn.parallel import DistributedDataParallel as _DDP

_LAST = [True]
_register = _DDP.register_comm_hook


def _patched(self, state, hook):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
    )

    def chooser(st, bucket):
        return hook(st, bucket) if _LAST[0] else allreduce_hook(st, bucket)

    return _register(self, state, chooser)


_DDP.register_comm_hook = _patched
"""


def test_a_patched_comm_hook_registration_fakes_nothing_in_22(tmp_path):
    exercise = catalog.find(EXERCISES, "22")
    starter = open(exercise.path("starter.py"), encoding="utf-8").read()
    loop = "    for i, (x, y) in enumerate(micro_batches):\n"
    marked = starter.replace(loop, loop + "        _LAST[0] = i == k - 1\n")
    assert marked != starter
    path = tmp_path / "fake22.py"
    path.write_text(COMM_HOOK_FAKE + marked)
    report = grade_file(exercise, str(path))
    assert not report.passed, report.results
    problem = next(r for r in report.results if r["status"] != "passed")
    assert "every micro-step all-reduced" in problem["message"], problem


# ----------------------------------------------------------------------------
# 4. The exercise's own solution and the checks' reference
# ----------------------------------------------------------------------------


def test_importing_the_solution_is_refused_and_reported(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        textwrap.dedent(
            f"""\
            import importlib.util
            spec = importlib.util.spec_from_file_location(
                "answer", {BUCKETS.path("solution.py")!r})
            answer = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(answer)
                buckets_for_parameters = answer.buckets_for_parameters
            except OSError:
                pass
            """
        )
        + STARTER_06.replace("def buckets", "def _unused")
    )
    report = grade_file(BUCKETS, str(path))
    assert report.verdict == "refused", report
    assert "opened the exercise's own files" in report.message
    assert "06_assign_buckets/solution.py" in report.message


def test_calling_the_checks_reference_is_reported(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        open(ALPHA.path("solution.py")).read()
        + textwrap.dedent(
            """\

            import sys


            def fit_alpha_beta(nbytes, seconds):
                checks = next(m for n, m in sys.modules.items()
                              if n.startswith("checks_"))
                return checks.least_squares(nbytes, seconds)
            """
        )
    )
    report = grade_file(ALPHA, str(path))
    assert report.verdict == "refused", report
    assert "called the checks' own least_squares()" in report.message


# ----------------------------------------------------------------------------
# 5. A value nested too deep
# ----------------------------------------------------------------------------


def test_a_deeply_nested_return_is_a_verdict(tmp_path):
    path = tmp_path / "deep.py"
    path.write_text(
        textwrap.dedent(
            """\
            import sys
            sys.setrecursionlimit(100000)


            def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
                x = []
                for _ in range(5000):
                    x = [x]
                return x
            """
        )
    )
    out = subprocess.run(
        [sys.executable, os.path.join(PRACTICE_DIR, "judge.py"), "06", "--file", path],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "nested more than 100 levels deep" in out.stdout
    assert "internal error" not in out.stdout
