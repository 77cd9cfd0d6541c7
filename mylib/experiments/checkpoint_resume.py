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
``done``. The chapter reads its timings and its lost steps from these lines.
"""

import collections
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


def read_events(out):
    """Every process's events from ``out``: ``{rank or machine: [event dicts]}``.

    Keys are ranks (ints) for one agent's workers, machine names (``"A"``)
    for runs with one agent per machine, whose ranks change between rounds.
    """
    found = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("events-") and name.endswith(".jsonl"):
            who = name[len("events-") : -len(".jsonl")]
            key = int(who[4:]) if who.startswith("rank") else who
            with open(os.path.join(out, name)) as f:
                found[key] = [json.loads(line) for line in f if line.strip()]
    return found


def rounds(events):
    """One process's events cut into rounds, each from its ``start`` (or ``group``)."""
    cut = []
    for i, e in enumerate(events):
        opens = e["event"] == "start" or (
            e["event"] == "group" and (i == 0 or events[i - 1]["event"] != "start")
        )
        if opens or not cut:
            cut.append([])
        cut[-1].append(e)
    return cut


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
    try:
        train(out, faults=[Fault(crash_at, "stop")], **kwargs)
    except StopTraining:
        pass
    return train(out, restore=restore, **kwargs)


FAILURES = ("exit", "freeze")


def restart_timings(events):
    """From one process's events: the failure, and how long the restart took.

    ``detect_restart_s``: from the failure to the restarted process starting
    (torchrun noticing it, stopping the group, starting it again);
    ``startup_s``: from then to the process group being up (importing torch,
    rendezvous); ``resume_s``: from then to the checkpoint loaded, in three
    parts: ``model_s`` (the model built and rank 0's weights broadcast),
    ``optimizer_s`` (the optimizer built) and ``load_s`` (the checkpoint read
    and put back); ``lost_steps``: steps computed before the failure and done
    again.
    """
    failure = next(e for e in events if e["event"] in FAILURES)
    after = [e for e in events if e["t"] > failure["t"]]
    start = next(e for e in after if e["event"] in ("start", "group"))
    group = next(e for e in after if e["event"] == "group")
    model = next(e for e in after if e["event"] == "model")
    optimizer = next(e for e in after if e["event"] == "optimizer")
    resumed = next(e for e in after if e["event"] == "resumed")
    return {
        "crash_step": failure["step"],
        "resumed_step": resumed["step"],
        "lost_steps": failure["step"] - resumed["step"],
        "detect_restart_s": start["t"] - failure["t"],
        "startup_s": group["t"] - start["t"],
        "resume_s": resumed["t"] - group["t"],
        "model_s": model["t"] - group["t"],
        "optimizer_s": optimizer["t"] - model["t"],
        "load_s": resumed["t"] - optimizer["t"],
        "total_s": resumed["t"] - failure["t"],
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
