"""Chapter 9: a checkpoint that resumes exactly, and what each piece is for.

* The pieces: the data position survives a save and load at any world size,
  the shares of a global batch are disjoint and complete, generator states
  round-trip, a save is atomic (an interrupted one leaves the old file).
* Under ``torchrun --max-restarts=1``: rank 1 dies at step 13, the agent
  restarts the group, it resumes from step 10's checkpoint and ends
  bit-identical (model and optimizer) to a run that never crashed.
* Without the data position the resumed run repeats and skips samples;
  without the generator states dropout draws other masks and the weights
  differ: each measured against the uninterrupted run.
"""

import os
import pathlib
import random

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.checkpoint import (
    ResumableSampler,
    atomic_save,
    checkpoint_path,
    latest_checkpoint,
    rng_state,
    set_rng_state,
)
from mylib.experiments import checkpoint_resume as cr
from mylib.experiments.elastic import run_restart

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "notebooks/scripts"


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 40),
    g=st.integers(1, 12),
    k=st.integers(0, 15),
    world=st.sampled_from([1, 2, 4]),
)
@example(n=48, g=8, k=10, world=2)
def test_the_data_position_resumes_the_same_batches(n, g, k, world):
    if g > n:
        with pytest.raises(ValueError, match="lower global_batch"):
            ResumableSampler(n, g)
        return
    a = ResumableSampler(n, g, seed=3)
    for _ in range(k):
        a.next_batch()
    b = ResumableSampler(n, g, seed=3)
    b.load_state_dict(a.state_dict())
    for _ in range(5):
        batch = a.next_batch()
        assert torch.equal(batch, b.next_batch())
        assert len(batch) == g and len(set(batch.tolist())) == g
        if g % world == 0:  # the shares are disjoint and make up the batch
            shares = [ResumableSampler.share(batch, r, world)[0] for r in range(world)]
            assert sorted(torch.cat(shares).tolist()) == sorted(batch.tolist())


def test_shares_keep_the_global_batch_when_the_world_shrinks():
    batch = torch.arange(8)
    two = [ResumableSampler.share(batch, r, 2) for r in range(2)]
    one = ResumableSampler.share(batch, 0, 1, accumulation=2)
    assert [t.tolist() for t in one] == [two[0][0].tolist(), two[1][0].tolist()]
    with pytest.raises(ValueError, match="world_size \\* accumulation"):
        ResumableSampler.share(torch.arange(6), 0, 4)


def test_generator_states_round_trip():
    import numpy

    saved = rng_state()
    a = (torch.rand(3), random.random(), numpy.random.rand())
    set_rng_state(saved)
    assert (torch.rand(3), random.random(), numpy.random.rand())[1:] == a[1:]
    set_rng_state(saved)
    assert torch.equal(torch.rand(3), a[0])


def test_an_interrupted_save_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = checkpoint_path(tmp_path, 5)
    atomic_save({"step": 5}, path)

    def dies_midway(obj, f):
        f.write(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"step": 5, "more": 1}, path)
    monkeypatch.undo()
    assert torch.load(path) == {"step": 5}
    assert latest_checkpoint(tmp_path) == path  # the .tmp file is ignored
    assert latest_checkpoint(tmp_path / "nothing") is None


def _reference_and_ablations(root):
    cr.train(os.path.join(root, "reference"))
    for name, restore in (
        ("all", ("data", "rng")),
        ("no-data", ("rng",)),
        ("no-rng", ("data",)),
    ):
        cr.crash_then_resume(os.path.join(root, name), restore)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("runs"))
    run_ranks(_reference_and_ablations, 2, args=(root,), timeout_s=180)
    return root


def test_crashed_rank_restarted_by_torchrun_resumes_bit_exactly(runs, tmp_path):
    code, log = run_restart(SCRIPT / "crash_resume.py", tmp_path, ["--crash-at", 13])
    assert code == 0, log[-3000:]
    assert "Worker group FAILED" in log or "failed (exitcode: 1)" in log
    resumed = cr.final_state(tmp_path)
    reference = cr.final_state(os.path.join(runs, "reference"))
    assert cr.same_state(resumed, reference)  # model and Adam state, bit for bit
    timings = cr.restart_timings(cr.read_events(tmp_path)[1])
    assert (timings["crash_step"], timings["resumed_step"]) == (13, 10)
    assert timings["lost_steps"] == 3
    assert 0 < timings["detect_restart_s"] < timings["total_s"]
    # the resume in its parts: the model, the optimizer, the load
    parts = timings["model_s"] + timings["optimizer_s"] + timings["load_s"]
    assert abs(parts - timings["resume_s"]) < 1e-6
    assert min(timings["model_s"], timings["optimizer_s"], timings["load_s"]) >= 0
    events = cr.read_events(tmp_path)
    attempts = {e["attempt"] for e in events[0] if e["event"] == "group"}
    assert attempts == {0, 1}  # the group was started twice


def test_a_simulated_crash_with_everything_restored_is_bit_exact(runs):
    a = cr.final_state(os.path.join(runs, "all"))
    assert cr.same_state(a, cr.final_state(os.path.join(runs, "reference")))
    assert cr.data_errors(
        cr.read_events(os.path.join(runs, "all")),
        cr.read_events(os.path.join(runs, "reference")),
    ) == (0, 0)


def test_without_the_data_position_samples_repeat_and_go_missing(runs):
    reference = cr.read_events(os.path.join(runs, "reference"))
    run = cr.read_events(os.path.join(runs, "no-data"))
    repeated, skipped = cr.data_errors(run, reference)
    assert repeated > 0 and skipped > 0 and repeated == skipped  # same step count
    final = cr.final_state(os.path.join(runs, "no-data"))
    assert cr.max_difference(final, cr.final_state(os.path.join(runs, "reference")))


def test_without_the_generator_states_dropout_differs(runs):
    reference = cr.read_events(os.path.join(runs, "reference"))
    run = cr.read_events(os.path.join(runs, "no-rng"))
    assert cr.data_errors(run, reference) == (0, 0)  # the same samples ...
    final = cr.final_state(os.path.join(runs, "no-rng"))
    ref = cr.final_state(os.path.join(runs, "reference"))
    assert cr.max_difference(final, ref) > 1e-4  # ... yet other weights


def test_load_refuses_unknown_pieces(tmp_path):
    with pytest.raises(ValueError, match="restore takes"):
        from mylib.checkpoint import load_checkpoint

        load_checkpoint(tmp_path / "x.pt", None, None, None, restore=("optimizer",))


def test_init_for_restarts_says_how_to_start_the_script(monkeypatch):
    from mylib.checkpoint import init_for_restarts

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="--max-restarts"):
        init_for_restarts()
