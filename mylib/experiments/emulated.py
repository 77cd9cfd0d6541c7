"""Chapter 3's lesson in real steps: MyDDP on an emulated link, against the model.

On this machine plain gloo moves the bytes on the cores the backward needs
(the comparison in :mod:`mylib.experiments.calibrate`). On a link that moves
its bytes elsewhere, as a GPU cluster's network does, the lesson of chapter 3
shows: a tiny cap pays the latency per message, one bucket at the end exposes
all the communication, a cap in the middle wins. :func:`emulated_experiment`
runs real MyDDP steps on
:class:`mylib.experiments.emulated_link.EmulatedLink` to see it, and sets them
against the model.

The link is not chosen to make the U appear: it keeps a real cluster's two
ratios (:func:`cluster_ratios`), those of chapter 7's 7B model trained at a
fixed global batch on :data:`REFERENCE_RANKS` H100s, 8 a node, with one
400 Gb/s NIC a node (:func:`mylib.models.cluster.one_nic_nodes`): the latency of
one all-reduce against the backward of one parameter tensor, and the bandwidth
time of all the gradient bytes against the whole backward. Scaled to this
machine's backward (:func:`link_for`), they give the emulated link's alpha and
beta.

It runs on every rank, in rounds, as :func:`mylib.experiments.calibrate.trace_caps`
does: each round times each layer's backward (no communication), derives the
link from that backward, so that a machine that slows down between rounds keeps
the ratios, and runs one traced MyDDP step per cap. The model's prediction is
:func:`mylib.experiments.calibrate.model_for`: :func:`mylib.models.timeline.simulate`
(or ``all_at_end``) with the round's layer times and the round's link, with no
contention (the emulated link uses no compute core). The chapter's slider
figure (:func:`mylib.figures.timeline.bucketing_timelines`) goes through the same
``simulate``. The result has the format of ``trace_caps``, so
:func:`mylib.experiments.calibrate.compare` reads it.
"""

import copy
import statistics

import torch
import torch.distributed as dist
from torch import nn

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
from mylib.experiments.emulated_link import EmulatedLink, bandwidth_for
from mylib.experiments.tracer import Tracer
from mylib.models import timeline as tl
from mylib.models.cluster import one_nic_nodes, ring_alpha_beta

# 8 x Linear(512, 512): 1 MB of fp32 weight gradient a layer (MB = 2**20 bytes)
CAPS = [0, 1, 2, 4, ALL_AT_END]

# Chapter 7's 7B model: 14 GB of bf16 gradients in 32 blocks of 7 tensors, and
# 0.8 s of backward a rank on 64 ranks (16 sequences of 1,024 tokens each, on an
# H100 at 58% of its dense bf16 peak), so 51.2 s on one rank at that global batch.
SEVEN_B = {"grad_bytes": 14e9, "tensors": 32 * 7, "backward_one_rank_s": 0.8 * 64}
REFERENCE_RANKS = 160


def cluster_ratios(ranks=REFERENCE_RANKS, cluster=None, model=SEVEN_B):
    """The two ratios of ``model`` trained on ``ranks`` GPUs of ``cluster``.

    ``cluster`` defaults to 8-GPU nodes with one 400 Gb/s NIC each. At a fixed
    global batch each rank's backward is ``backward_one_rank_s / ranks``.
    Returns ``{"latency": ..., "bytes": ..., ...}``: ``latency`` is one ring
    all-reduce's latency, ``2(n-1) alpha``, over the backward of one parameter
    tensor (the backward over the number of tensors); ``bytes`` is the bandwidth
    term of all the gradient bytes, ``2(n-1)/n G / beta``, over the backward.
    The ring's alpha and beta are :func:`mylib.models.cluster.ring_alpha_beta`'s
    (chapter 1's cluster model). The other keys hold the numbers behind them.
    """
    cluster = one_nic_nodes() if cluster is None else cluster
    alpha_s, beta = ring_alpha_beta(cluster, ranks)
    ring = tl.Link(ranks, alpha_s, beta)
    backward_s = model["backward_one_rank_s"] / ranks
    message_s = ring.allreduce_s(0)
    bytes_s = ring.allreduce_s(model["grad_bytes"]) - message_s
    return {
        "latency": message_s / (backward_s / model["tensors"]),
        "bytes": bytes_s / backward_s,
        "ranks": ranks,
        "cluster": cluster.name,
        "backward_s": backward_s,
        "message_s": message_s,
        "bytes_s": bytes_s,
        "tensors": model["tensors"],
    }


def link_for(backward_s, nbytes, tensors, ranks, ratios):
    """The emulated link that keeps ``ratios`` (:func:`cluster_ratios`) here.

    ``backward_s`` is this machine's backward, ``nbytes`` its gradient bytes in
    ``tensors`` parameter tensors, ``ranks`` the ranks of the ring here. The
    latency of one all-reduce, ``2(n-1) alpha``, is ``ratios["latency"]`` times
    one tensor's share of the backward; all ``nbytes`` take ``ratios["bytes"]``
    times the backward at the link's bandwidth.
    """
    message_s = ratios["latency"] * backward_s / tensors
    alpha_s = message_s / (2 * (ranks - 1))
    bandwidth = bandwidth_for(ratios["bytes"] * backward_s, nbytes, ranks)
    return EmulatedLink(ranks, alpha_s, bandwidth)


def emulated_experiment(
    caps_mb=CAPS,
    ratios=None,
    n_layers=8,
    width=512,
    batch_size=512,
    rounds=5,
    warmup=1,
):
    """On every rank: MyDDP steps per cap on an emulated link, with the model's inputs.

    The model is ``n_layers`` x ``Linear(width, width)``, this rank's batch
    ``batch_size`` rows (a large batch makes the backward long next to the
    real all-reduce, which still runs on the cores). ``ratios`` default to
    :func:`cluster_ratios`'s. ``warmup`` untimed steps per cap come first, on
    plain gloo (MyDDP's first step rebuilds its buckets). Each round the caps run
    in turn, in the opposite order every other round, so that a drift within a
    round favours none.
    Returns rank 0's ``{"ratios", "gradient_bytes", "tensors", "result"}``,
    ``result`` as ``trace_caps`` returns it (each round's calibration holds
    that round's link: ``alpha_s``, ``bandwidth``).
    """
    ratios = cluster_ratios() if ratios is None else ratios
    model = mlp([width] * (n_layers + 1))
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    x = torch.randn(batch_size, width, generator=generator)
    y = torch.randn(batch_size, width, generator=generator)
    loss_fn = nn.MSELoss()

    def forward():
        return loss_fn(model(x), y)

    for _ in range(2):  # warm-up: the first backwards allocate their buffers
        forward().backward()
    world = dist.get_world_size()
    nbytes = _gradient_bytes(model)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    wrapped = {cap: _ddp_for(copy.deepcopy(model), cap) for cap in caps_mb}
    tracer = Tracer()
    for ddp in wrapped.values():
        ddp.tracer = tracer
        # warm-up, on plain gloo: the first step builds the buckets it rebuilds
        for _ in range(warmup):
            traced_step(ddp, lambda ddp=ddp: loss_fn(ddp(x), y), tracer, "warm-up")
    kept = []
    for r in range(rounds):
        layers = slowest_rank_layers(model, forward, repeats=3)
        backward_s = sum(layer.backward_s for layer in layers)
        link = link_for(backward_s, nbytes, tensors, world, ratios)
        measured = {}
        for cap in caps_mb if r % 2 == 0 else caps_mb[::-1]:
            ddp = wrapped[cap]
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
        kept.append({"calibration": calibration, "measured": measured})
    return {
        "ratios": ratios,
        "gradient_bytes": nbytes,
        "tensors": tensors,
        "result": {"caps": list(caps_mb), "rounds": kept},
    }


def link_summary(result):
    """Medians over rounds: ``(backward_s, alpha_s, bandwidth)`` of the links used."""
    rounds = result["rounds"]
    return tuple(
        statistics.median(value(r["calibration"]) for r in rounds)
        for value in (
            lambda c: sum(layer.backward_s for layer in c["layers"]),
            lambda c: c["alpha_s"],
            lambda c: c["bandwidth"],
        )
    )


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
