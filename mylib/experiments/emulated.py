"""Chapter 3's lesson in real steps: MyDDP on an emulated link, against the model.

On this machine plain gloo moves the bytes on the cores the backward needs,
so overlap hardly pays and the best cap is decided by noise (the comparison
in :mod:`mylib.experiments.calibrate`). On a link that moves its bytes
elsewhere, as a GPU cluster's network does, the lesson of chapter 3 shows:
a tiny cap pays the latency per message, one bucket at the end exposes all the
communication, a cap in the middle wins. :func:`emulated_experiment` runs
real MyDDP steps on :class:`mylib.emulated_link.EmulatedLink` to see it, and
sets them against the model.

It runs on every rank. It first times the backward (no communication) and
derives the links from it, the same on every rank: a latency per message of
:data:`ALPHA_PER_BACKWARD` of the backward, large enough that one all-reduce
per parameter loses, and bandwidths at which all the gradient bytes take
``multiple`` times the backward (1x and 2x: communication comparable to the
compute it can hide behind). Then, in rounds, as in
:func:`mylib.experiments.calibrate.trace_caps`: each layer's backward time,
and one traced MyDDP step per link and cap.

The model's prediction is :func:`mylib.experiments.calibrate.model_for`:
:func:`mylib.models.timeline.simulate` (or ``all_at_end``) with the round's
layer times and the emulated link's alpha and beta, with no contention
(the emulated link uses no compute core). The chapter's slider figure
(:func:`mylib.figures.timeline.bucketing_timelines`) goes through the same
``simulate``. Each link's part of the result has the format of ``trace_caps``,
so :func:`mylib.experiments.calibrate.compare` reads it.
"""

import copy

import torch
import torch.distributed as dist
from torch import nn

from mylib.emulated_link import EmulatedLink, bandwidth_for
from mylib.experiments.calibrate import (
    ALL_AT_END,
    _ddp_for,
    _gradient_bytes,
    cap_label,
    compare,
    median_row,
    model_for,
    slowest_rank_layers,
    traced_step,
)
from mylib.experiments.common import global_batches, mlp
from mylib.models import timeline as tl
from mylib.tracer import Tracer

CAPS = [0, 1, 5, 25, ALL_AT_END]
MULTIPLES = (1, 2)  # all gradient bytes take 1x and 2x the backward
ALPHA_PER_BACKWARD = 1 / 30  # the latency of one message, as a share of the backward


def links_for(backward_s, nbytes, ranks, multiples=MULTIPLES):
    """The emulated links of the experiment, for a backward of ``backward_s``.

    ``{multiple: EmulatedLink}``: latency per message
    ``ALPHA_PER_BACKWARD x backward_s``, and a bandwidth at which a ring
    all-reduce of all ``nbytes`` of gradients spends ``multiple x backward_s``
    sending bytes.
    """
    alpha_s = ALPHA_PER_BACKWARD * backward_s
    return {
        m: EmulatedLink(ranks, alpha_s, bandwidth_for(m * backward_s, nbytes, ranks))
        for m in multiples
    }


def emulated_experiment(
    caps_mb=CAPS,
    multiples=MULTIPLES,
    n_layers=8,
    width=1024,
    batch_size=1024,
    rounds=5,
    warmup=1,
):
    """On every rank: MyDDP steps per cap on emulated links, with the model's inputs.

    The model is ``n_layers`` x ``Linear(width, width)``, this rank's batch
    ``batch_size`` rows (a large batch makes the backward long next to the
    real all-reduce, which still runs on the cores). Returns rank 0's
    ``{"backward_s", "alpha_s", "gradient_bytes", "links": {multiple:
    {"bandwidth", "result"}}}``, each ``result`` as ``trace_caps`` returns.
    """
    model = mlp([width] * (n_layers + 1))
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    x = torch.randn(batch_size, width, generator=generator)
    y = torch.randn(batch_size, width, generator=generator)
    loss_fn = nn.MSELoss()

    def forward():
        return loss_fn(model(x), y)

    # the links come from one first measurement, the same on every rank
    for _ in range(2):  # warm-up: the first backwards allocate their buffers
        forward().backward()
    layers = slowest_rank_layers(model, forward, repeats=7)
    backward_s = sum(layer.backward_s for layer in layers)
    world = dist.get_world_size()
    nbytes = _gradient_bytes(model)
    links = links_for(backward_s, nbytes, world, multiples)
    wrapped = {cap: _ddp_for(copy.deepcopy(model), cap) for cap in caps_mb}
    tracer = Tracer()
    for ddp in wrapped.values():
        ddp.tracer = tracer
    rounds_of = {m: [] for m in multiples}
    for r in range(warmup + rounds):
        layers = slowest_rank_layers(model, forward, repeats=3)
        for m, link in links.items():
            measured = {}
            for cap, ddp in wrapped.items():
                ddp.register_comm_hook(None, link)
                mine = traced_step(
                    ddp,
                    lambda ddp=ddp: loss_fn(ddp(x), y),
                    tracer,
                    f"measured, cap {cap_label(cap)}",
                )
                measured[cap] = slowest_rank_step(mine)
            calibration = {
                "layers": layers,
                "alpha_s": link.link.alpha_s,
                "bandwidth": link.link.bandwidth,
                "world_size": world,
                "comm_stretch": 1.0,  # the emulated link uses no core
                "compute_stretch": 1.0,
            }
            if r >= warmup:
                rounds_of[m].append({"calibration": calibration, "measured": measured})
    return {
        "backward_s": backward_s,
        "alpha_s": links[multiples[0]].link.alpha_s,
        "gradient_bytes": nbytes,
        "links": {
            m: {
                "bandwidth": links[m].link.bandwidth,
                "result": {"caps": list(caps_mb), "rounds": rounds_of[m]},
            }
            for m in multiples
        },
    }


def slowest_rank_step(timeline):
    """On every rank: the step's Timeline on the rank that finished it last.

    A step lasts until its slowest rank is done (the next one starts with all
    of them), and each rank's link starts a bucket when that rank launches it.
    """
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, timeline)
    return max(every_rank, key=lambda t: t.step_s)


def step_layers(timeline, layers):
    """The layers of a measured step: ``layers`` with the step's own backward times.

    ``timeline`` is a traced step, ``layers`` the calibrated ones (for their
    names and gradient sizes). Fed to the model, they leave out how the
    backward's speed drifts between calibration and step: what is left is the
    model of the link and the buckets.
    """
    seconds = {
        span.label: span.duration_s
        for span in timeline.spans
        if span.kind == "backward"
    }
    return [tl.Layer(l.name, seconds[l.name], l.param_bytes) for l in layers]


def compare_on_own_backward(result):
    """:func:`~mylib.experiments.calibrate.compare`, the model fed each step's backward.

    Per cap, medians over rounds: ``model_s`` from :func:`step_layers` of the
    very step it is set against, ``measured_s``, and ``error``. The error left
    is the model's of the link and the buckets, not the machine's drift.
    """
    rows = []
    for cap in result["caps"]:
        model_s, measured_s = [], []
        for r in result["rounds"]:
            step = r["measured"][cap]
            own = dict(
                r["calibration"], layers=step_layers(step, r["calibration"]["layers"])
            )
            model_s.append(model_for(own, cap, contention=False).step_s)
            measured_s.append(step.step_s)
        rows.append(median_row(cap, model_s, measured_s))
    return rows


def u_shape(result):
    """The U in one link's result: the ends against the best cap in between.

    Returns ``(rows, best_model, best_measured, shape)`` where the first three
    are :func:`mylib.experiments.calibrate.compare`'s (medians over rounds) and
    ``shape`` holds the measured steps of cap 0 (``per_parameter_s``), of all
    at end (``all_at_end_s``), and of the best cap in between (``middle``,
    ``middle_s``), and whether the model's best cap is one in between
    (``model_best_in_middle``).
    """
    rows, best_model, best_measured = compare(result, contention=False)
    measured = {row["cap"]: row["measured_s"] for row in rows}
    middle_caps = [cap for cap in measured if cap not in (0, ALL_AT_END)]
    middle = min(middle_caps, key=measured.get)
    shape = {
        "per_parameter_s": measured[0],
        "all_at_end_s": measured[ALL_AT_END],
        "middle": middle,
        "middle_s": measured[middle],
        "model_best_in_middle": best_model in middle_caps,
    }
    return rows, best_model, best_measured, shape


def emulated_equals_plain(cap_mb, steps=3, sizes=(16, 32, 32, 8), rows=12):
    """On every rank: MyDDP trained on an emulated link and without it.

    Both start from the same weights and take ``steps`` SGD steps on the
    same batches (each rank its share). Returns ``{"params": {name: (with
    link, without)}, "booked": buckets the link carried}``, to compare bit for
    bit.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    link = EmulatedLink(world, alpha_s=1e-4, bandwidth=1e8)
    models = {}
    for name in ("emulated", "plain"):
        ddp = _ddp_for(mlp(list(sizes)), cap_mb)
        if name == "emulated":
            ddp.register_comm_hook(None, link)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for x, y in global_batches(steps, rows * world, list(sizes)):
            mine = slice(rank * rows, (rank + 1) * rows)
            opt.zero_grad(set_to_none=False)
            nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
            ddp.finish_gradient_sync()
            opt.step()
        models[name] = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}
    pairs = {n: (models["emulated"][n], models["plain"][n]) for n in models["plain"]}
    return {"params": pairs, "booked": len(link.transfers)}
