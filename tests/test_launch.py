"""The rank launcher: results in rank order, failures and hangs reported.

Nothing is left behind.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
import torch.distributed as dist

from mylib import RankError, RankTimeout, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rank_and_sum():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_results_come_back_in_rank_order(world):
    total = world * (world + 1) / 2
    assert run_ranks(_rank_and_sum, world) == [(r, world, total) for r in range(world)]


def test_args_kwargs_and_prints_in_rank_order(capsys):
    def greet(greeting, *, punct):
        print(f"{greeting} from {dist.get_rank()}{punct}")
        return greeting

    assert run_ranks(greet, 3, args=("hi",), kwargs={"punct": "!"}) == ["hi"] * 3
    assert (
        capsys.readouterr().out
        == "[rank 0] hi from 0!\n[rank 1] hi from 1!\n[rank 2] hi from 2!\n"
    )


def _pid_then(action, pid_dir):
    with open(os.path.join(pid_dir, str(dist.get_rank())), "w") as f:
        f.write(str(os.getpid()))
    if dist.get_rank() == 1:
        if action == "raise":
            raise ValueError("rank one is unhappy")
        if action == "exit":
            sys.exit(3)
        if action == "os_exit":
            os._exit(7)
        if action == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()  # the healthy ranks wait here for rank 1, which never comes


def _all_dead(pid_dir, grace_s=10.0):
    pids = [int(open(os.path.join(pid_dir, f)).read()) for f in os.listdir(pid_dir)]
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has finished
    except FileNotFoundError:
        return False


# timeout_s=300 is far above the test's own limit (pytest-timeout, 60 s): the
# error must come from the failing rank, not from the launcher's timeout.
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "action,message",
    [
        ("raise", "ValueError: rank one is unhappy"),
        ("exit", "SystemExit: 3"),
        ("os_exit", "exited with code 7"),
        ("segfault", "killed by SIGSEGV"),
    ],
)
def test_a_failing_rank_is_named_and_the_others_are_stopped(tmp_path, action, message):
    with pytest.raises(RankError) as info:
        run_ranks(_pid_then, 3, args=(action, str(tmp_path)), timeout_s=300)
    assert info.value.rank == 1
    assert message in str(info.value)
    assert _all_dead(str(tmp_path)), "a rank outlived run_ranks"


def _mismatched_collectives():
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
        dist.barrier()


def test_a_hang_becomes_a_timeout_that_shows_where_each_rank_was():
    with pytest.raises(RankTimeout) as info:
        run_ranks(_mismatched_collectives, 2, timeout_s=3)
    assert sorted(info.value.stuck) == [0, 1]
    assert (
        "in all_reduce" in info.value.stuck[0]
        and "_mismatched_collectives" in info.value.stuck[0]
    )
    assert "in broadcast" in info.value.stuck[1]


def _deprecated_collective():
    shard = torch.ones(2)
    dist.all_gather_into_tensor(torch.empty(2 * dist.get_world_size()), shard)
    return "no error"


def test_torchs_future_warnings_fail_in_the_test_and_in_its_ranks():
    # pyproject.toml's filterwarnings: here, and in every rank run_ranks starts
    with pytest.raises(FutureWarning, match="use `torch.distributed.all_gather_single"):
        dist.all_gather_into_tensor(torch.empty(2), torch.empty(1))
    with pytest.raises(RankError, match="all_gather_single") as info:
        run_ranks(_deprecated_collective, 2, show_output=False)
    assert "FutureWarning" in info.value.rank_traceback
    # The ranks take the caller's filters at the call: ignored there, ignored here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert run_ranks(_deprecated_collective, 2) == ["no error"] * 2


def _rank():
    return dist.get_rank()


def test_launches_back_to_back_never_collide_on_a_port():
    # Each launch's store takes a port the OS picks (port 0) and holds it until its
    # ranks are done, while the sockets of the launches before are still closing.
    # 30 in a row (a launch costs a third of a CPU-second; 100 took 33 CPU-s).
    for _ in range(30):
        assert run_ranks(_rank, 2, timeout_s=30) == [0, 1]


def test_bad_arguments_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        run_ranks(_rank, 0)
    with pytest.raises(ValueError, match="backend must be"):
        run_ranks(_rank, 2, backend="mpi")
    with pytest.raises(TypeError, match="needs a function"):
        run_ranks("not a function", 2)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="one GPU per rank"):
            run_ranks(_rank, 2, backend="nccl")


def _run_script(tmp_path, body, timeout=120, env=None):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": ROOT} if env is None else env
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )


def test_a_script_without_main_guard_and_a_function_defined_in_it(tmp_path):
    # Like a notebook cell: fn lives in __main__, and nothing guards the launch.
    out = _run_script(
        tmp_path,
        """
        import torch.distributed as dist
        from mylib import run_ranks
        def square_of_rank():
            return dist.get_rank() ** 2
        print(run_ranks(square_of_rank, 3))
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1, 4]"


def test_ranks_die_with_a_killed_caller(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import os, time
        from mylib import run_ranks
        def sleep_forever(pid_dir):
            open(os.path.join(pid_dir, str(os.getpid())), "w").write(str(os.getpid()))
            time.sleep(3600)
        run_ranks(sleep_forever, 2, args=({str(tmp_path)!r},), timeout_s=3600)
    """),
        ],
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(os.listdir(tmp_path)) == 2, "the ranks never started"
    proc.kill()
    proc.wait()
    assert _all_dead(str(tmp_path))


def test_torchrun_runs_the_same_code(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        import torch, torch.distributed as dist
        from mylib import MyDDP, init_from_env
        rank, world, device = init_from_env(timeout_s=60)
        torch.manual_seed(rank)
        model = MyDDP(torch.nn.Linear(4, 2).to(device))
        model(torch.ones(3, 4, device=device) * (rank + 1)).sum().backward()
        model.finish_gradient_sync()
        print(f"rank {rank}/{world} grad {model.module.weight.grad[0, 0].item():.2f}")
        dist.destroy_process_group()
    """)
    )
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node=2", str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # Two processes share one stdout: their lines can come in either order.
    assert sorted(re.findall(r"rank \d/\d grad [\d.]+", out.stdout)) == [
        "rank 0/2 grad 4.50",
        "rank 1/2 grad 4.50",
    ]


def test_init_from_env_outside_torchrun_says_how_to_start(tmp_path):
    out = _run_script(
        tmp_path,
        """
        from mylib import init_from_env
        init_from_env()
    """,
        env={
            k: v
            for k, v in {**os.environ, "PYTHONPATH": ROOT}.items()
            if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        },
    )
    assert out.returncode != 0 and "--nproc-per-node=N" in out.stderr
