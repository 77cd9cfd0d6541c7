"""Chapter 9: two torchrun agents, one killed; the survivor carries on alone.

Agents A and B (``--nnodes=1:2``, one process each, c10d rendezvous on
127.0.0.1). After step 13 node B's process kills its agent and itself.
Agent A's process fails in its next collective, the agent re-forms the group
with A alone (world size 1), and training resumes from step 10's checkpoint
with two micro-batches accumulated per step, so the global batch (and, up to
rounding, every step) stays that of the uninterrupted two-rank run.
"""

import os
import pathlib

from mylib import run_ranks
from mylib.experiments import checkpoint_resume as cr
from mylib.experiments.elastic import run_elastic

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "notebooks/scripts"


def _uninterrupted(out):
    cr.train(out, dropout=0.0)


def test_the_survivor_reforms_at_world_size_one_and_continues(tmp_path):
    codes, logs = run_elastic(
        SCRIPT / "elastic_train.py", tmp_path / "elastic", ["--kill-at", 13]
    )
    assert codes["A"] == 0, logs["A"][-3000:]
    assert codes["B"] != 0  # killed
    events = cr.read_events(tmp_path / "elastic")
    survivor = events[0] if any(e["event"] == "done" for e in events[0]) else events[1]
    worlds = [e["world_size"] for e in survivor if e["event"] == "group"]
    assert worlds == [2, 1]
    resumed = [e["step"] for e in survivor if e["event"] == "resumed"]
    assert resumed == [0, 10]
    run_ranks(_uninterrupted, 2, args=(str(tmp_path / "reference"),), timeout_s=120)
    reference = cr.final_state(tmp_path / "reference")
    final = cr.final_state(tmp_path / "elastic")
    assert cr.max_difference(final, reference) < 1e-5  # rounding only
    ref_loss = {
        e["step"]: e["loss"]
        for e in cr.read_events(tmp_path / "reference")[0]
        if e["event"] == "step"
    }
    steps = cr.effective_steps(survivor)
    assert sorted(steps) == list(range(1, 21))
    assert max(abs(steps[s]["loss"] - ref_loss[s]) for s in steps) < 1e-5
    assert not os.path.exists(tmp_path / "elastic" / "ckpt" / "step00000015.pt.tmp")
