"""Chapter 9's training run that can crash, restart and resume.

One function, :func:`train`, is the whole run. Chapter 9's torchrun scripts
call it (``notebooks/scripts/crash_resume.py``, ``elastic_train.py``); the
tests call it too, under ``torchrun`` or, for the ablations, through
``mylib.run_ranks``. It trains a small seeded MLP with dropout, data parallel
with :class:`mylib.MyDDP`, on ``ResumableSampler`` global batches, saves a
checkpoint every ``every`` steps, and resumes from the newest one it finds.
:class:`Fault` makes it fail on purpose: a process that exits, a machine
that freezes, or one busy outside any collective.

Every process appends what happened to ``out/events-rank{r}.jsonl`` (or
``events-{machine}.jsonl`` with one agent per machine): one JSON object a
line, wall-clock time ``t``: ``start`` (the process began, before torch was
imported, if the script passes ``t_start``), ``group`` (the process group is
up: which round, what size), ``model`` and ``optimizer`` (each built),
``resumed`` (the checkpoint loaded), one ``step`` per step (its loss on
the global batch and this rank's sample indices), ``saved`` (seconds, and
bytes on rank 0), ``error`` (a collective failed: its message), the
:class:`Fault` that struck (``exit``, ``freeze``, ``busy``) and
``done``. :mod:`mylib.experiments.run_events` reads them back: the chapter's
timings, lost steps and comparisons.
"""

import contextlib
import json
import os
import re
import time

import torch
import torch.distributed as dist
from torch import nn

from mylib.checkpoint import (
    ResumableSampler,
    latest_checkpoint,
    load_checkpoint,
    round_store,
    save_checkpoint,
)
from mylib.ddp import MyDDP
from mylib.experiments.faults import Fault, StopTraining

# Reading a run back lives in run_events; the chapter and the tests reach it
# through this module too (cr.read_events, cr.same_state, ...).
from mylib.experiments.run_events import (  # noqa: F401
    data_errors,
    effective_steps,
    final_state,
    max_difference,
    read_events,
    restart_timings,
    rounds,
    same_state,
    samples_seen,
)

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
    who = os.environ.get("ELASTIC_NODE") or f"rank{rank}"  # a machine, or a rank
    line = json.dumps({"event": event, "t": time.time(), **fields})
    with open(os.path.join(out, f"events-{who}.jsonl"), "a") as f:
        f.write(line + "\n")


def train(
    out,
    *,
    steps=20,
    every=5,
    dropout=0.2,
    restore=("data", "rng"),
    faults=(),
    t_start=None,
):
    """Train ``steps`` steps, resuming from the newest checkpoint in ``out/ckpt``.

    Every rank runs it; every restarted process runs it again from the top.
    ``faults`` (:class:`Fault`) strike after the step they name, once.
    ``restore``: which optional pieces a resume loads (see
    :func:`mylib.checkpoint.load_checkpoint`). The global batch stays
    ``GLOBAL_BATCH`` at any world size: a rank accumulates ``PARTS //
    world_size`` micro-batches. Rank 0 writes the final model and optimizer
    state to ``out/final.pt``. Returns the step it resumed from.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    log_group(out, t_start)
    x, y = dataset()
    model = MyDDP(make_model(dropout))
    log(out, "model")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    log(out, "optimizer")  # a process's first optimizer imports torch._dynamo
    sampler = ResumableSampler(DATASET, GLOBAL_BATCH, seed=7)
    ckpt_dir = os.path.join(out, "ckpt")
    start, path = 0, latest_checkpoint(ckpt_dir)
    if path is not None:
        start = load_checkpoint(path, model, opt, sampler, restore=restore)
    log(out, "resumed", step=start, world_size=world)
    for step in range(start + 1, steps + 1):
        mine = ResumableSampler.share(sampler.next_batch(), rank, world, PARTS // world)
        loss = train_step(model, opt, x, y, mine, out)
        log(out, "step", step=step, loss=loss, samples=torch.cat(mine).tolist())
        for fault in faults:
            fault.strike(out, step, log)
        if step % every == 0:
            timed_save(out, ckpt_dir, step, model, opt, sampler)
    if rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": opt.state_dict()}
        torch.save(state, os.path.join(out, "final.pt"))
    log(out, "done", step=steps)
    return start


def train_step(model, opt, x, y, micro_batches, out):
    """One step on this rank's micro-batches; the loss on the whole global batch.

    A collective that fails (a peer died or went silent) is logged with the
    first line of its error, then raised: the process exits and its agent
    acts.
    """
    try:
        total = torch.zeros(())
        for i, idx in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with contextlib.nullcontext() if last else model.no_sync():
                loss = nn.functional.mse_loss(model(x[idx]), y[idx])
                (loss / len(micro_batches)).backward()
            total += loss.detach() / PARTS
        model.finish_gradient_sync()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)  # the loss on the whole global batch
    except RuntimeError as error:  # gloo's errors are RuntimeErrors
        log(out, "error", message=error_text(error))
        raise
    return total.item()


def error_text(error):
    """A collective's error without gloo's source locations, on one line."""
    text = str(error).split("\nAt:")[0]  # drop the Python frames gloo appends
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\] ", "", text)
    return " ".join(text.split())[:400]


def timed_save(out, ckpt_dir, step, model, opt, sampler):
    """:func:`mylib.checkpoint.save_checkpoint`, logged with its seconds and bytes."""
    t0 = time.perf_counter()
    saved = save_checkpoint(ckpt_dir, step, model, opt, sampler)
    seconds = time.perf_counter() - t0
    size = os.path.getsize(saved) if dist.get_rank() == 0 else 0
    log(out, "saved", step=step, seconds=seconds, bytes=size)


def log_group(out, t_start=None):
    """Log that this process joined a group: when, in which round, at what size.

    ``start`` (the process began, before torch was imported, if the script
    passes ``t_start``) and ``group``: the agent's restart count, the world
    size, the round's ``MASTER_PORT``, this rank's machine
    (``ELASTIC_NODE``), and whether the round's store was fresh (held no key
    an earlier round wrote, :func:`store_was_fresh`).
    """
    os.makedirs(out, exist_ok=True)
    if PARTS % dist.get_world_size():
        raise ValueError(f"world size {dist.get_world_size()} must divide {PARTS}")
    env = os.environ.get
    who = dict(attempt=int(env("TORCHELASTIC_RESTART_COUNT", "0")), pid=os.getpid())
    who.update(node=env("ELASTIC_NODE", ""), world_size=dist.get_world_size())
    if t_start is not None:
        log(out, "start", t=t_start, **who)
    fresh = store_was_fresh() if "TORCHELASTIC_RUN_ID" in os.environ else None
    log(out, "group", master_port=int(env("MASTER_PORT", "0")), fresh=fresh, **who)


ROUND_KEY = "chapter9/joined"


def store_was_fresh(timeout_s=60.0):
    """True when this round's store held no key an earlier round wrote.

    Every rank looks for ``ROUND_KEY`` before any rank of this round writes
    it (a barrier between), so the key can only come from an earlier group.
    """
    store = round_store(timeout_s, host=False)
    fresh = not store.check([ROUND_KEY])
    dist.barrier()
    store.set(ROUND_KEY, str(os.getpid()))
    return fresh


def crash_then_resume(out, restore, crash_at=13, **kwargs):
    """On every rank: train until ``crash_at``, stop, then resume as a fresh run.

    The crash simulated in one process (for ``mylib.run_ranks``): the second
    :func:`train` builds everything anew and reseeds as a new process would,
    and loads only the pieces named in ``restore`` from the newest checkpoint.
    """
    try:
        train(out, faults=[Fault(crash_at, "stop")], **kwargs)
    except StopTraining:
        pass
    return train(out, restore=restore, **kwargs)
