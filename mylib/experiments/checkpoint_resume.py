"""Chapter 9's training run that can crash, restart and resume.

One function, :func:`train`, is the whole run. Chapter 9's torchrun scripts
call it (``notebooks/scripts/crash_resume.py``, ``elastic_train.py``); the
tests call it too, under ``torchrun`` or, for the ablations, through
``mylib.run_ranks``. It trains a small seeded MLP with dropout, data parallel
with :class:`mylib.MyDDP`, on ``ResumableSampler`` global batches, saves a
checkpoint every ``every`` steps, and resumes from the newest one it finds.

Every rank appends what happened to ``out/events-rank{r}.jsonl`` (one JSON
object a line, wall-clock time ``t``): ``start`` (the process began, before
torch was imported, if the script passes ``t_start``), ``group`` (the process
group is up), ``resumed``, one ``step`` per step (its loss on the global
batch and this rank's sample indices), ``saved`` (seconds, and bytes on rank
0), ``crash`` and ``done``. The chapter
reads its timings and its lost steps from these lines.
"""

import collections
import contextlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn

from mylib.checkpoint import (
    ResumableSampler,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from mylib.ddp import MyDDP

DATASET, FEATURES, GLOBAL_BATCH, PARTS = 48, 8, 8, 2


def dataset(seed=3):
    """The chapter's regression data: ``DATASET`` rows of ``FEATURES`` inputs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(DATASET, FEATURES, generator=gen)
    y = torch.sin(x @ torch.randn(FEATURES, 1, generator=gen))
    return x, y


def make_model(dropout):
    """The seeded MLP (identical on every rank), dropout between its layers."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1)
    )


def log(out, event, **fields):
    """Append one event line to this rank's log in ``out``."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    line = json.dumps({"event": event, "t": time.time(), **fields})
    with open(os.path.join(out, f"events-rank{rank}.jsonl"), "a") as f:
        f.write(line + "\n")


def train(
    out,
    *,
    steps=20,
    every=5,
    dropout=0.2,
    crash_at=None,
    crash_rank=1,
    crash="exit",
    restore=("data", "rng"),
    t_start=None,
):
    """Train ``steps`` steps, resuming from ``out/ckpt`` if a checkpoint is there.

    ``crash_at``: at the end of that step (before its checkpoint), rank
    ``crash_rank`` of the first attempt dies. ``crash="exit"`` is
    ``os._exit(1)`` (a crashed process); ``"kill-agent"`` also SIGKILLs its
    parent, the torchrun agent (a lost machine); ``"stop"`` makes every rank
    return instead (a crash simulated in one process, for ``run_ranks``).
    ``restore``: which optional pieces a resume loads (see
    :func:`mylib.checkpoint.load_checkpoint`). The global batch stays
    ``GLOBAL_BATCH`` at any world size: a rank accumulates ``PARTS //
    world_size`` micro-batches. Rank 0 writes the final model and optimizer
    state to ``out/final.pt``. Returns the step it resumed from.
    """
    os.makedirs(out, exist_ok=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if t_start is not None:
        log(out, "start", t=t_start, attempt=attempt, world_size=world)
    log(out, "group", attempt=attempt, world_size=world)
    if PARTS % world:
        raise ValueError(f"world size {world} must divide {PARTS}")
    accumulation = PARTS // world
    x, y = dataset()
    model = MyDDP(make_model(dropout))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sampler = ResumableSampler(DATASET, GLOBAL_BATCH, seed=7)
    ckpt_dir = os.path.join(out, "ckpt")
    start, path = 0, latest_checkpoint(ckpt_dir)
    if path is not None:
        start = load_checkpoint(path, model, opt, sampler, restore=restore)
    log(out, "resumed", step=start, attempt=attempt, world_size=world)
    for step in range(start + 1, steps + 1):
        batch = sampler.next_batch()
        mine = ResumableSampler.share(batch, rank, world, accumulation)
        total = torch.zeros(())
        for i, idx in enumerate(mine):
            last = i == len(mine) - 1
            ctx = contextlib.nullcontext() if last else model.no_sync()
            with ctx:
                loss = nn.functional.mse_loss(model(x[idx]), y[idx])
                (loss / accumulation).backward()
            total += loss.detach() / PARTS
        model.finish_gradient_sync()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)  # the loss on the whole global batch
        log(
            out,
            "step",
            step=step,
            loss=total.item(),
            samples=torch.cat(mine).tolist(),
            attempt=attempt,
        )
        if step == crash_at and attempt == 0 and path is None:
            if crash == "stop":
                return start
            if rank == crash_rank:
                log(out, "crash", step=step, attempt=attempt)
                if crash == "kill-agent":
                    os.kill(os.getppid(), signal.SIGKILL)
                os._exit(1)
        if step % every == 0:
            t0 = time.perf_counter()
            saved = save_checkpoint(ckpt_dir, step, model, opt, sampler)
            seconds = time.perf_counter() - t0
            size = os.path.getsize(saved) if rank == 0 else 0
            log(out, "saved", step=step, seconds=seconds, bytes=size)
    if rank == 0:
        torch.save(
            {"model": model.module.state_dict(), "optimizer": opt.state_dict()},
            os.path.join(out, "final.pt"),
        )
    log(out, "done", step=steps, attempt=attempt)
    return start


def read_events(out):
    """Every rank's events from ``out``: ``{rank: [event dicts in order]}``."""
    found = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("events-rank") and name.endswith(".jsonl"):
            rank = int(name[len("events-rank") : -len(".jsonl")])
            with open(os.path.join(out, name)) as f:
                found[rank] = [json.loads(line) for line in f if line.strip()]
    return found


def effective_steps(events):
    """The steps that made the final model: ``{step: event}`` from every attempt.

    A step redone after a restart replaces the lost one (the later attempt wins).
    """
    kept = {}
    for e in events:
        if e["event"] == "resumed":  # steps after the resumed one are redone
            kept = {s: v for s, v in kept.items() if s <= e["step"]}
        elif e["event"] == "step":
            kept[e["step"]] = e
    return kept


def samples_seen(events_by_rank):
    """How often each sample went into the final model: a ``Counter`` over ranks."""
    seen = collections.Counter()
    for events in events_by_rank.values():
        for e in effective_steps(events).values():
            seen.update(e["samples"])
    return seen


def data_errors(run, reference):
    """Samples a run read more often (repeated) and less often (skipped) than
    the reference did: ``(repeated, skipped)``, counted with multiplicity."""
    a, b = samples_seen(run), samples_seen(reference)
    return sum((a - b).values()), sum((b - a).values())


def crash_then_resume(out, restore, crash_at=13, **kwargs):
    """On every rank: train until ``crash_at``, stop, then resume as a fresh run.

    The crash simulated in one process (for ``mylib.run_ranks``): the second
    :func:`train` builds everything anew and reseeds as a new process would,
    and loads only the pieces named in ``restore`` from the newest checkpoint.
    """
    train(out, crash_at=crash_at, crash="stop", **kwargs)
    return train(out, restore=restore, **kwargs)


def restart_timings(events):
    """From one rank's events: the crash, and how long each part of the restart took.

    ``detect_restart_s``: from the crash to the restarted process starting
    (torchrun noticing the failure, stopping the group, starting it again);
    ``startup_s``: from then to the process group being up (importing torch,
    rendezvous); ``resume_s``: to the checkpoint loaded;
    ``lost_steps``: steps computed before the crash and done again.
    """
    crash = next(e for e in events if e["event"] == "crash")
    after = [e for e in events if e["t"] > crash["t"]]
    start = next(e for e in after if e["event"] in ("start", "group"))
    group = next(e for e in after if e["event"] == "group")
    resumed = next(e for e in after if e["event"] == "resumed")
    return {
        "crash_step": crash["step"],
        "resumed_step": resumed["step"],
        "lost_steps": crash["step"] - resumed["step"],
        "detect_restart_s": start["t"] - crash["t"],
        "startup_s": group["t"] - start["t"],
        "resume_s": resumed["t"] - group["t"],
        "total_s": resumed["t"] - crash["t"],
    }


def final_state(out):
    """What rank 0 wrote at the end: ``{"model": ..., "optimizer": ...}``."""
    return torch.load(os.path.join(out, "final.pt"), weights_only=False)


def same_state(a, b):
    """True when two final states are bit-identical (``torch.equal`` everywhere)."""
    return _equal(a, b)


def max_difference(a, b):
    """The largest absolute difference between two final models' parameters."""
    return max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(u, v) for u, v in zip(a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b
