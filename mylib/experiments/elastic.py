"""Chapter 9's launches: torchrun agents that restart, re-form and are killed.

Every run here starts ``torchrun`` as a subprocess in a session of its own,
on a free port, with a time limit; when the limit passes, or the caller is
interrupted, the whole session (agent and workers) is killed, so no process
outlives the call. Each returns the agent's exit code and its log.

* :func:`run_restart`: one agent, ``--nproc-per-node=2 --max-restarts=1``;
  the script's rank 1 may die, and the agent restarts the group.
* :func:`run_elastic`: two agents on this machine, ``--nnodes=1:2``, one
  process each, joined by a c10d rendezvous on 127.0.0.1; the script kills
  one agent (its "machine") at a chosen step and the other carries on alone.
"""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun():
    """The ``torchrun`` of this Python (the virtual environment's)."""
    return str(pathlib.Path(sys.executable).with_name("torchrun"))


def _env(extra=None):
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": path,
        "LOGLEVEL": "INFO",
        **(extra or {}),
    }


def _start(args, log_path, extra_env=None, cwd=None):
    log = open(log_path, "w")
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(extra_env),
        cwd=cwd,
        start_new_session=True,  # its own process group: killed as one
    )
    log.close()
    return proc


def _kill(proc):
    """SIGKILL the process's whole session (the agent and its workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _wait_all(procs, timeout_s):
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise TimeoutError(
            f"torchrun did not finish within {timeout_s:g} s; every agent and "
            "worker was killed. See the logs in the output folder."
        ) from None
    finally:
        for p in procs:  # also on success: workers a dead agent left behind
            _kill(p)
    return [p.returncode for p in procs]


def run_restart(
    script, out, script_args=(), nproc=2, max_restarts=1, timeout_s=180, log="agent"
):
    """``torchrun --nproc-per-node=2 --max-restarts=1`` on a fresh c10d endpoint.

    Runs ``script out *script_args``. Returns ``(exit code, agent log text)``;
    the log is also in ``out/{log}.log``.
    """
    os.makedirs(out, exist_ok=True)
    log_path = os.path.join(out, f"{log}.log")
    args = [
        torchrun(),
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        str(script),
        str(out),
        *map(str, script_args),
    ]
    proc = _start(args, log_path)
    (code,) = _wait_all([proc], timeout_s)
    return code, pathlib.Path(log_path).read_text()


# Rendezvous settings for a quick re-form (create_handler in torch's
# torch/distributed/elastic/rendezvous/dynamic_rendezvous.py; defaults: a node
# is dead after keep_alive_max_attempt=3 missed heartbeats every
# keep_alive_interval=5 s, and a round waits last_call_timeout=30 s for
# more nodes once the minimum has joined).
QUICK_RDZV = {"last_call_timeout": 4, "keep_alive_interval": 1}
QUICK_RDZV["keep_alive_max_attempt"] = 3


def run_elastic(script, out, script_args=(), rdzv_conf=QUICK_RDZV, timeout_s=240):
    """Two agents, ``--nnodes=1:2``, one process each; node B's dies mid-run.

    Node A starts first (it hosts the rendezvous store), node B a moment
    later. The script learns its node from ``ELASTIC_NODE``. ``rdzv_conf``
    goes to ``--rdzv-conf``: how soon a silent node counts as dead, and how
    long a new round waits for more nodes once the minimum (one) has joined.
    Returns ``({"A": code, "B": code}, {"A": log, "B": log})``.
    """
    os.makedirs(out, exist_ok=True)
    port = free_port()
    procs, logs = {}, {}
    try:
        for node in ("A", "B"):
            logs[node] = os.path.join(out, f"agent-{node}.log")
            args = [
                torchrun(),
                "--nnodes=1:2",
                "--nproc-per-node=1",
                "--max-restarts=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=chapter9",
                "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in rdzv_conf.items()),
                str(script),
                str(out),
                *map(str, script_args),
            ]
            procs[node] = _start(args, logs[node], {"ELASTIC_NODE": node})
            if node == "A":
                time.sleep(1.0)
        codes = _wait_all(list(procs.values()), timeout_s)
    finally:
        for p in procs.values():
            _kill(p)
    return (
        dict(zip(procs, codes)),
        {n: pathlib.Path(p).read_text() for n, p in logs.items()},
    )
