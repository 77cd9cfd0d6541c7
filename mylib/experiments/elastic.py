"""Chapter 9's launches: torchrun agents that restart, re-form and fail.

Every agent runs as a subprocess in a session of its own, on a free port,
with a time limit. :class:`Agents` stands for a cluster on this machine: one
``torchrun`` agent per "machine", each with its own workers, that the caller
can start late or freeze (SIGSTOP of the agent and its workers: a machine
that stops answering, as a hung or cut-off host does). When the block
ends, on success, timeout or interrupt, every agent and every worker it
started is killed, so no process outlives the call. The workers run in
sessions of their own (torchrun starts them so), and are tracked by pid.

* :func:`run_restart`: one agent, ``--nproc-per-node=2 --max-restarts=1``;
  the script's rank 1 may die, and the agent restarts the group.
* :class:`Agents`: several agents, one worker each, joined by a c10d
  rendezvous on 127.0.0.1, each round in a store of its own
  (``mylib.checkpoint.FRESH_STORE_ENV``).
"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import time

from mylib.checkpoint import FRESH_STORE_ENV
from mylib.experiments.run_events import read_events
from mylib.experiments.torchrun import (
    descendants,
    runs,
    send,
    torchrun_path,
    worker_env,
)

# Rendezvous settings for a quick re-form (``--rdzv-conf``). The defaults: a
# machine is dead after keep_alive_max_attempt=3 missed heartbeats sent every
# keep_alive_interval=5 s; a round waits last_call_timeout=30 s for more
# machines once the minimum has joined; joining gives up after
# join_timeout=600 s.
QUICK_RDZV = {"last_call_timeout": 4, "keep_alive_interval": 1}
QUICK_RDZV.update(keep_alive_max_attempt=3, join_timeout=60)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agents:
    """torchrun agents on this machine, one per machine of a cluster.

    ``with Agents(script, out, ["--fault", "13:B:exit"], nnodes="2") as c:
    c.start("A"); c.start("B"); codes = c.wait()``. Each agent runs
    ``torchrun --nnodes=NNODES --nproc-per-node=NPROC --max-restarts=K
    --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT script out *args``
    with ``ELASTIC_NODE`` naming its machine (when it runs one worker); its
    log goes to ``out/agent-{node}.log``. ``fresh_store`` starts the agents with
    ``FRESH_STORE_ENV`` (a store per round); ``rdzv_conf`` goes to
    ``--rdzv-conf``. The rendezvous keeps its state in one TCP store, served
    by one agent: ``store_host`` names it (``is_host`` in its
    ``--rdzv-conf``, and ``is_host=false`` in the others'). A machine that
    must survive the others has to be that one. ``timeout_s`` bounds the
    whole block.
    """

    def __init__(
        self,
        script,
        out,
        script_args=(),
        nnodes="2",
        nproc=1,
        max_restarts=1,
        rdzv_conf=QUICK_RDZV,
        fresh_store=True,
        store_host="A",
        timeout_s=240,
    ):
        os.makedirs(out, exist_ok=True)
        self.script, self.out, self.script_args = str(script), str(out), script_args
        self.nnodes, self.nproc, self.max_restarts = nnodes, nproc, max_restarts
        self.rdzv_conf, self.fresh_store = rdzv_conf, fresh_store
        self.store_host = store_host
        self.port, self.deadline = free_port(), time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.agents, self.seen = {}, set()  # node -> Popen; every pid started

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self, node):
        """Start the agent of machine ``node`` (its workers follow)."""
        args = [
            torchrun_path(),
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={self.nproc}",
            f"--max-restarts={self.max_restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=chapter9",
        ]
        conf = dict(self.rdzv_conf or {})
        if self.store_host is not None:
            conf["is_host"] = str(node == self.store_host).lower()
        if conf:
            args.append("--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items()))
        args += [self.script, self.out, *map(str, self.script_args)]
        env = worker_env(
            **(FRESH_STORE_ENV if self.fresh_store else {}),
            **({"ELASTIC_NODE": node} if self.nproc == 1 else {}),
            LOGLEVEL="INFO",
        )
        with open(self.log_path(node), "w") as log:
            self.agents[node] = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own session: signalled as one
            )
        self.seen.add(self.agents[node].pid)

    def log_path(self, node):
        return os.path.join(self.out, f"agent-{node}.log")

    def logs(self):
        """``{node: the agent's log}``."""
        return {n: pathlib.Path(self.log_path(n)).read_text() for n in self.agents}

    def processes(self, node):
        """Pids of ``node``'s agent and of every process it started, alive now."""
        pids = [self.agents[node].pid]
        pids += descendants(pids[0])
        self.seen.update(pids)
        return pids

    def freeze(self, node):
        """SIGSTOP the agent and workers of ``node``; returns the time (``time.time``).

        The machine stops answering: its sockets stay open, its heartbeats
        stop, nothing tells its peers.
        """
        pids = self.processes(node)
        for pid in pids:
            send(pid, signal.SIGSTOP)
        return time.time()

    def wait_for(self, found, what, poll_s=0.1):
        """Wait until ``found(read_events(out))`` is true; returns its value.

        Raises ``TimeoutError`` naming ``what`` when the block's time is up.
        """
        while time.monotonic() < self.deadline:
            for node in self.agents:
                self.processes(node)  # remember the workers while they live
            value = found(read_events(self.out))
            if value:
                return value
            time.sleep(poll_s)
        raise TimeoutError(
            f"{what} did not happen within {self.timeout_s:g} s; every agent and "
            f"worker is killed. The logs are in {self.out}."
        )

    def wait(self, nodes=None):
        """Wait for the agents of ``nodes`` (default: all) to exit; their codes."""
        nodes = list(self.agents) if nodes is None else nodes

        def exited(_):
            for node in self.agents:
                self.processes(node)
            return all(self.agents[n].poll() is not None for n in nodes)

        self.wait_for(exited, f"the exit of agents {nodes}")
        return {n: self.agents[n].returncode for n in nodes}

    def close(self):
        """Kill every agent and every worker seen, alive or stopped."""
        for node in self.agents:
            self.processes(node)
        for pid in sorted(self.seen):
            if runs(pid, self.script) or pid in _agent_pids(self.agents):
                send(pid, signal.SIGKILL)
        for proc in self.agents.values():
            proc.wait()


def run_restart(
    script, out, script_args=(), nproc=2, max_restarts=1, timeout_s=180, log="agent"
):
    """``torchrun --nproc-per-node=2 --max-restarts=1``: one agent on this machine.

    Runs ``script out *script_args``; the agent keeps one store for all its
    rounds (torchrun's default). Returns ``(exit code, agent log text)``; the
    log is also in ``out/agent-{log}.log``.
    """
    with Agents(
        script,
        out,
        script_args,
        nnodes="1",
        nproc=nproc,
        max_restarts=max_restarts,
        rdzv_conf=None,
        fresh_store=False,
        store_host=None,
        timeout_s=timeout_s,
    ) as agents:
        agents.start(log)
        code = agents.wait()[log]
        return code, agents.logs()[log]


def agent_log_lines(text, wanted):
    """The lines of an agent's log that contain one of ``wanted``, shortened.

    The time of day and the source file stay, the path before it goes:
    ``21:35:09.742 api.py:942] [default] Worker group FAILED. ...``; gloo's
    C++ source locations in a worker's error go, and so does the folder of
    the worker's Python (``of binary: python``): what is printed depends on
    neither the machine nor the checkout.
    """
    head = re.compile(
        r"^[IWE]\d{4} (\d\d:\d\d:\d\d\.\d{3})\d* \d+ \S*?([^/\s]+\.py:\d+)\] "
    )
    lines = []
    for line in text.splitlines():
        if any(w in line for w in wanted):
            match = head.match(line)
            if match:
                line = f"{match[1]} {match[2]}] {line[match.end() :]}"
            line = re.sub(r"(of binary: )\S*/", r"\1", line)
            lines.append(re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\] ", "", line))
    return lines


def _agent_pids(agents):
    return {p.pid for p in agents.values() if p.poll() is None}
