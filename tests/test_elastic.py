"""Chapter 9: two torchrun agents on this machine stand for two machines.

Each agent (``--nproc-per-node=1``) runs ``notebooks/scripts/elastic_train.py``
and meets the others through a c10d rendezvous on 127.0.0.1, each round of
rendezvous in a store of its own (``FRESH_STORE_ENV``).

* ``--nnodes=2``: machine B's worker crashes after step 13 while machine A's
  is busy outside any collective, so A's agent restarts for the membership
  change and does not count it: the new round's workers see restart counts
  0 and 1. They still meet, in a new store, and the run ends bit-identical
  (model and Adam state, dropout on) to an uninterrupted two-rank run.
* ``--nnodes=1:2``: B freezes after step 7 (SIGSTOP of its agent and
  worker): A's worker waits for the process group's timeout, A re-forms
  alone at world size 1 and resumes from step 5; C joins after step 12 and
  the group grows back to two, resuming from step 10. Every round's store
  is new (no key of an earlier round in it), and the run ends bit-identical
  to the uninterrupted two-rank run (two micro-batches per step at world
  size 1 keep the global batch).
* With the agents' shared store and several agents, ``init_for_restarts``
  refuses, naming the fix.

On the 2-core machine the book is built on, shared with other work, the two
runs took 30 to 71 s and 57 to over 100 s at load averages of 5 to 23 (with the
reference runs, 95 to 105 s together at loads of 4 to 8): most of it is
starting processes, each importing torch and, with its first optimizer,
torch._dynamo. Each run is bounded by a deadline after which every process is
killed, and each checks that none is left behind.
"""

import os

import pytest

from mylib import run_ranks
from mylib.checkpoint import round_store
from mylib.experiments import checkpoint_resume as cr
from mylib.experiments.elastic import Agents, agent_log_lines
from mylib.experiments.faults import Fault

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "notebooks/scripts/elastic_train.py",
)


# then every agent and worker is killed; under pytest's own 300 s per test, and
# above the 100 s the membership run took at a load average of 23 on 2 cores
LIMIT = dict(timeout_s=180)


def _uninterrupted(root):
    for dropout in (0.0, 0.2):
        cr.train(os.path.join(root, f"dropout{dropout}"), dropout=dropout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted two-rank runs' final states, by dropout (one launch)."""
    root = str(tmp_path_factory.mktemp("reference"))
    run_ranks(_uninterrupted, 2, args=(root,), timeout_s=120)
    return {p: cr.final_state(os.path.join(root, f"dropout{p}")) for p in (0.0, 0.2)}


def _group(round_events):
    return next(e for e in round_events if e["event"] == "group")


def _left_behind(out):
    """Processes still running with ``out`` on their command line."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(out).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_a_crashed_worker_rejoins_while_the_survivor_is_busy(tmp_path, reference):
    out = tmp_path / "run"
    faults = ["--fault", "13:B:exit", "--fault", "13:A:busy"]
    with Agents(
        SCRIPT, out, [*faults, "--dropout", 0.2], nnodes="2", **LIMIT
    ) as agents:
        agents.start("A")
        agents.start("B")
        codes = agents.wait()
        logs = agents.logs()
    assert _left_behind(out) == []
    assert codes == {"A": 0, "B": 0}, logs["A"][-3000:] + logs["B"][-3000:]
    events = cr.read_events(out)
    a, b = cr.rounds(events["A"]), cr.rounds(events["B"])
    assert len(a) == len(b) == 2  # one re-formed group, no wasted round
    # A's worker never failed: its agent stopped it, busy, when B rejoined
    assert [e["event"] for e in a[0] if e["event"] in ("busy", "error")] == ["busy"]
    # the agents counted differently, 0 and 1 ...
    assert [_group(a[1])["attempt"], _group(b[1])["attempt"]] == [0, 1]
    # ... and met anyway, in a new store of the second round
    ports = [[_group(r)["master_port"] for r in rs] for rs in (a, b)]
    assert ports[0] == ports[1] and ports[0][0] != ports[0][1]
    assert all(_group(r)["fresh"] for r in a + b)
    assert [e["step"] for r in (a[1], b[1]) for e in r if e["event"] == "resumed"] == [
        10,
        10,
    ]
    assert cr.same_state(cr.final_state(out), reference[0.2])


@pytest.mark.slow
def test_membership_shrinks_and_grows_and_every_round_starts_clean(tmp_path, reference):
    out = tmp_path / "run"
    faults = ["--fault", "7:B:freeze", "--fault", "12:A:busy", "--timeout-s", 5]

    def struck(node, action):
        return lambda ev: any(e["event"] == action for e in ev.get(node, []))

    with Agents(SCRIPT, out, faults, nnodes="1:2", **LIMIT) as agents:
        agents.start("A")  # hosts the rendezvous store: B, frozen, must not
        agents.start("B")
        agents.wait_for(struck("B", "freeze"), "machine B reaching step 7")
        agents.freeze("B")  # B stops answering; nothing tells A
        agents.wait_for(struck("A", "busy"), "machine A reaching step 12")
        agents.start("C")  # a machine joins while A is busy
        codes = agents.wait(["A", "C"])
        logs = agents.logs()
    assert _left_behind(out) == []
    assert codes == {"A": 0, "C": 0}, logs["A"][-3000:] + logs["C"][-3000:]
    events = cr.read_events(out)
    a, c = cr.rounds(events["A"]), cr.rounds(events["C"])
    assert [_group(r)["world_size"] for r in a] == [2, 1, 2]
    assert [e["step"] for r in a for e in r if e["event"] == "resumed"] == [0, 5, 10]
    # A's worker saw nothing of B's freeze until its collective timed out
    (error,) = [e["message"] for e in a[0] if e["event"] == "error"]
    assert "Timed out waiting 5000ms" in error
    # the last round: A's agent had counted one restart, C's none
    assert [_group(a[2])["attempt"], _group(c[0])["attempt"]] == [1, 0]
    ports = [_group(r)["master_port"] for r in a]
    assert len(set(ports)) == 3 and ports[2] == _group(c[0])["master_port"]
    assert all(_group(r)["fresh"] for r in a + c)
    assert cr.same_state(cr.final_state(out), reference[0.0])


def test_several_agents_sharing_one_store_are_refused_with_the_fix(monkeypatch):
    env = dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    env.update(TORCHELASTIC_USE_AGENT_STORE="True", GROUP_WORLD_SIZE="2")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        round_store(timeout_s=1)


def test_a_fault_names_a_known_action():
    fault = Fault.parse("13:B:freeze")
    assert (fault.step, fault.node, fault.action) == (13, "B", "freeze")
    with pytest.raises(ValueError, match="action must be one of"):
        Fault(3, "explode")


def test_agent_log_lines_print_no_path_of_this_machine():
    venv = "/home/someone/book/.venv"
    log = (
        f"E1202 22:40:12.260123 6380 {venv}/lib/python3.11/site-packages/torch/"
        "distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
        f"local_rank: 1 (pid: 6381) of binary: {venv}/bin/python\n"
        "I1202 22:40:12.661000 6380 x/api.py:553]   restart_count=1\n"
        "a line nobody asked for\n"
    )
    assert agent_log_lines(log, ("failed (exitcode", "restart_count=")) == [
        "22:40:12.260 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 6381) "
        "of binary: python",
        "22:40:12.661 api.py:553]   restart_count=1",
    ]
