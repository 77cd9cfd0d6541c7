"""Reading chapter 9's runs back from the events their processes logged.

Every process of :func:`mylib.experiments.checkpoint_resume.train` appends
one JSON line per event to ``out/events-{rank or machine}.jsonl``. These
functions read them (:func:`read_events`), cut one process's into rounds
(:func:`rounds`), and say what the run did: the steps that made the final
model, the samples read too often or too rarely against a reference run,
how long a restart took and where, and whether two final states are equal.
"""

import collections
import json
import os

import torch


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
