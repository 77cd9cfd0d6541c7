"""Model against measurement: calibrate the timeline model here, trace real MyDDP steps.

:func:`trace_caps` runs on every rank (inside :func:`mylib.run_ranks`), in
rounds. Each round first measures the model's inputs, then runs one MyDDP
step per bucket cap, so that a model and the steps it predicts are measured
within the same second (on a shared machine the speed drifts between rounds):

1. each layer's backward alone, with no communication
   (:func:`mylib.experiments.tracer.time_layers`);
2. all-reduces of the sizes the buckets can have, from 4 KB to the whole
   model, and alpha and beta fitted to them (:func:`link_sizes_for`,
   :func:`mylib.experiments.commbench.time_all_reduce`,
   :func:`mylib.models.costmodel.alpha_beta_from_ends`);
3. how much compute and communication slow each other down when they run
   together (:func:`measure_contention`);
4. one traced step (:class:`mylib.experiments.tracer.Tracer`) per cap, each cap on its
   own copy of the model wrapped in MyDDP.

:func:`compare` feeds each round's inputs to the model
(:mod:`mylib.models.timeline`) and sets its step time against that round's
measured step. Both sides are Timelines:
``draw_timelines([model, measured])`` puts one above the other.
"""

import copy
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from mylib.ddp import MyDDP
from mylib.experiments.commbench import time_all_reduce
from mylib.experiments.common import mlp
from mylib.experiments.tracer import Tracer, time_layers
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.costmodel import alpha_beta_from_ends

# a cap meaning: one bucket, launched when the backward is over
ALL_AT_END = "all at end"


def _gradient_bytes(model):
    return sum(
        p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
    )


def _ddp_for(model, cap):
    if cap == ALL_AT_END:
        total = _gradient_bytes(model) / MB
        return MyDDP(model, bucket_cap_mb=total + 1, first_bucket_cap_mb=total + 1)
    return MyDDP(model, bucket_cap_mb=cap)


def measure_contention(loss_fn, parameters, nbytes=4 * MB, repeats=3):
    """On every rank: how much a backward and all-reduces at once slow each other down.

    Runs the backward alone (``C`` seconds), ``k`` all-reduces of ``nbytes``
    queued back to back alone (``M`` seconds, ``k`` chosen so that ``M`` is
    close to ``C``), and then both at once: the same ``k`` all-reduces
    launched just before the backward. (``M`` is timed queued, as they run
    together, not taken as ``k`` times one all-reduce timed alone, which
    counts a barrier per call.) With the model's rules (compute runs
    ``compute_stretch`` times slower while communication runs, communication
    ``comm_stretch`` times slower while compute runs), the two end times
    ``Tc`` and ``Tm`` give both factors: the one that finished first was
    stretched for its whole run, the other for part of it. Returns
    ``(comm_stretch, compute_stretch)``, medians over ``repeats``, at least 1.
    """
    params = [p for p in parameters if p.requires_grad]
    tensor = torch.zeros(nbytes // 4)

    def backward_alone():
        for p in params:
            p.grad = None
        loss = loss_fn()
        start = time.perf_counter()
        loss.backward()
        return time.perf_counter() - start

    compute_s = statistics.median(backward_alone() for _ in range(repeats))
    one = time_all_reduce([nbytes], repeats=repeats, warmup=1, statistic="median")[0]
    # Every rank must launch the same number of all-reduces: agree on the largest k.
    k = torch.tensor([max(1, round(compute_s / one))])
    dist.all_reduce(k, op=dist.ReduceOp.MAX)
    k = int(k.item())

    # the same k all-reduces, queued back to back as below, with no compute
    def all_reduces_alone():
        dist.barrier()
        start = time.perf_counter()
        for work in [dist.all_reduce(tensor, async_op=True) for _ in range(k)]:
            work.wait()
        return time.perf_counter() - start

    comm_s = statistics.median(all_reduces_alone() for _ in range(repeats))
    comm_factors, compute_factors = [], []
    for _ in range(repeats):
        loss = loss_fn()
        dist.barrier()
        start = time.perf_counter()
        works = [dist.all_reduce(tensor, async_op=True) for _ in range(k)]
        loss.backward()
        compute_end = time.perf_counter() - start
        for work in works:
            work.wait()
        comm_end = time.perf_counter() - start
        if compute_end >= comm_end:  # the all-reduces ran alongside compute all along
            s = comm_end / comm_s
            # compute's time alone did that much of its work
            alone = compute_end - comm_end
            c = comm_end / (compute_s - alone) if compute_s > alone else 1.0
        else:  # compute ran alongside the all-reduces all along
            c = compute_end / compute_s
            alone = comm_end - compute_end
            s = compute_end / (comm_s - alone) if comm_s > alone else 1.0
        comm_factors.append(max(1.0, s))
        compute_factors.append(max(1.0, c))
    tensor.zero_()
    return statistics.median(comm_factors), statistics.median(compute_factors)


def slowest_rank_layers(model, forward, repeats=5):
    """Each layer's backward time on the rank that holds the step up, on every rank.

    A step waits for the slowest rank, and which rank is slowest changes from
    one step to the next. So the ranks run ``repeats`` backwards side by side
    (lined up at a barrier), each run keeps the layers of the rank whose
    backward took longest, and each layer's time is its median over those:
    a typical step's slowest rank.
    """

    def lined_up_forward():
        dist.barrier()
        return forward()

    runs = time_layers(
        model, lined_up_forward, repeats=repeats, warmup=0, statistic="runs"
    )
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, runs)
    slowest = [
        max(
            (rank_runs[i] for rank_runs in every_rank),
            key=lambda run: sum(l.backward_s for l in run),
        )
        for i in range(repeats)
    ]
    return [
        tl.Layer(
            layer.name,
            statistics.median(run[k].backward_s for run in slowest),
            layer.param_bytes,
        )
        for k, layer in enumerate(slowest[0])
    ]


def link_sizes_for(model):
    """Link calibration sizes: powers of two from 4 KB to the model's gradient bytes.

    A bucket holds anything from one bias to the whole model, so the link is
    measured over that whole range, and no further: on a CPU the time per byte
    changes with size (small buffers stay in cache), and a line fitted to sizes
    the step never sends would be wrong where the step spends its time.
    """
    # at least two sizes, to fit two constants
    return [2**k for k in range(12, max(14, _gradient_bytes(model).bit_length()))]


def _average(tensor):
    """MyDDP's default hook on a bucket: divide by the world size, then all-reduce."""
    tensor.div_(dist.get_world_size())
    dist.all_reduce(tensor)


def calibration_round(model, forward, link_sizes=None):
    """The model's inputs, measured now on every rank: layers, alpha, beta, contention.

    Every quantity is the median of a few runs: a typical run, as the traced
    steps are (on an idle machine it is also the fastest). A step waits for
    the slowest rank, so the layers are those of the rank whose backward took
    longest (:func:`slowest_rank_layers`). The link is timed as MyDDP uses
    it (divide, then all-reduce) on ``link_sizes`` (default
    :func:`link_sizes_for`); alpha is read off the smallest sizes and beta
    off the largest (:func:`mylib.models.costmodel.alpha_beta_from_ends`),
    because on a CPU no one line fits them all and the step's time goes to
    the big buckets; the timings themselves are kept too (``link_sizes``,
    ``link_seconds``), to plot or re-fit. The rest are rank 0's values.
    """
    link_sizes = link_sizes_for(model) if link_sizes is None else link_sizes
    layers = slowest_rank_layers(model, forward, repeats=5)
    seconds = time_all_reduce(
        link_sizes, repeats=3, warmup=0, statistic="median", all_reduce=_average
    )
    fit = alpha_beta_from_ends(link_sizes, seconds, world_size=dist.get_world_size())
    bucket_like = max(layer.nbytes for layer in layers) // 4 * 4
    comm_stretch, compute_stretch = measure_contention(
        forward, model.parameters(), bucket_like, repeats=3
    )
    return {
        "layers": layers,
        "alpha_s": fit.alpha,
        "bandwidth": fit.beta,
        "fit_error": fit.median_relative_error,
        "link_sizes": list(link_sizes),
        "link_seconds": list(seconds),
        "comm_stretch": comm_stretch,
        "compute_stretch": compute_stretch,
        "world_size": dist.get_world_size(),
    }


def traced_step(ddp, forward, tracer, name):
    """One MyDDP step and its measured Timeline, from backward start.

    The step is forward, backward, finish_gradient_sync.
    """
    for p in ddp.parameters():
        if p.grad is not None:
            p.grad.zero_()  # in place: .grad stays a view of its bucket
    loss = forward()
    # the ranks start the backward together, as in a steady training loop
    dist.barrier()
    tracer.clear()
    tracer.mark("backward")
    loss.backward()
    ddp.finish_gradient_sync()
    return tracer.timeline(ddp.buckets, name=name)


def trace_caps(model, batch, caps_mb, rounds=5, warmup=1, link_sizes=None):
    """On every rank: ``rounds`` x (calibrate the model, trace one MyDDP step per cap).

    ``model`` is the same module on every rank and ``batch`` this rank's
    ``(x, y)`` for a mean-squared-error loss. Returns ``{"caps": caps_mb,
    "rounds": [{"calibration": ..., "measured": {cap: Timeline}}, ...]}``.
    The results are rank 0's.
    """
    x, y = batch
    loss_fn = nn.MSELoss()
    wrapped = {cap: _ddp_for(copy.deepcopy(model), cap) for cap in caps_mb}
    tracer = Tracer()
    for ddp in wrapped.values():
        ddp.tracer = tracer
    results = []
    for r in range(warmup + rounds):
        calibration = calibration_round(model, lambda: loss_fn(model(x), y), link_sizes)
        measured = {
            cap: traced_step(
                ddp,
                lambda ddp=ddp: loss_fn(ddp(x), y),
                tracer,
                f"measured, cap {cap_label(cap)}",
            )
            for cap, ddp in wrapped.items()
        }
        if r >= warmup:
            results.append({"calibration": calibration, "measured": measured})
    return {"caps": list(caps_mb), "rounds": results}


def cap_label(cap):
    """``"25 MB"``, ``"0 MB (per parameter)"`` or ``"all at end"``."""
    if cap == ALL_AT_END:
        return ALL_AT_END
    return f"{cap:g} MB" + (" (per parameter)" if cap == 0 else "")


def model_for(calibration, cap, contention=True):
    """The model's Timeline for ``cap`` from one round's calibration.

    With ``contention=False`` both stretches are 1.
    """
    stretch = (
        (calibration["comm_stretch"], calibration["compute_stretch"])
        if contention
        else (1.0, 1.0)
    )
    link = tl.Link(
        calibration["world_size"],
        calibration["alpha_s"],
        calibration["bandwidth"],
        *stretch,
    )
    name = f"model, cap {cap_label(cap)}" + ("" if contention else ", no contention")
    if cap == ALL_AT_END:
        return tl.all_at_end(calibration["layers"], link, name=name)
    return tl.simulate(calibration["layers"], cap * MB, link, name=name)


def median_row(cap, model_s, measured_s):
    """One cap's row: median modelled and measured step over rounds, median error.

    The error is taken per round, (model - measured) / measured, then the median.
    """
    errors = [(m - s) / s for m, s in zip(model_s, measured_s)]
    return {
        "cap": cap,
        "model_s": statistics.median(model_s),
        "measured_s": statistics.median(measured_s),
        "error": statistics.median(errors),
    }


def compare(result, contention=True):
    """Per cap, medians over rounds: model step, measured step, relative error.

    Also returns each side's best cap. The error of a round is
    (model - measured) / measured, the model fed with that round's own
    calibration.
    """
    rows = []
    for cap in result["caps"]:
        model_s = [
            model_for(r["calibration"], cap, contention).step_s
            for r in result["rounds"]
        ]
        measured_s = [r["measured"][cap].step_s for r in result["rounds"]]
        rows.append(median_row(cap, model_s, measured_s))
    best_model = min(rows, key=lambda r: r["model_s"])["cap"]
    best_measured = min(rows, key=lambda r: r["measured_s"])["cap"]
    return rows, best_model, best_measured


def cost_of_model_choice(rows, best_model, best_measured):
    """What the model's choice of cap costs in measured step time.

    How much longer the measured step is at the model's best cap than at the
    measured best (0: same cap). When several caps are within noise of each
    other, the two best caps can differ while the model's choice costs next to
    nothing: this says which.
    """
    measured = {row["cap"]: row["measured_s"] for row in rows}
    return measured[best_model] / measured[best_measured] - 1


def backward_spread(result):
    """``(min, median, max)`` of the calibrated backward time over rounds.

    It shows how steady the machine was.
    """
    totals = sorted(
        sum(layer.backward_s for layer in r["calibration"]["layers"])
        for r in result["rounds"]
    )
    return totals[0], statistics.median(totals), totals[-1]


def typical_round(result):
    """The round whose total measured time is the median: the one to draw."""
    totals = sorted(
        range(len(result["rounds"])),
        key=lambda i: sum(t.step_s for t in result["rounds"][i]["measured"].values()),
    )
    return result["rounds"][totals[len(totals) // 2]]


def experiment(caps_mb, n_layers=8, width=1024, batch_size=64, rounds=5, warmup=1):
    """The chapter's and the benchmark's run, on every rank.

    It builds an MLP and this rank's batch, then runs :func:`trace_caps`.
    """
    model = mlp([width] * (n_layers + 1))
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    x = torch.randn(batch_size, width, generator=generator)
    y = torch.randn(batch_size, width, generator=generator)
    return trace_caps(model, (x, y), caps_mb, rounds=rounds, warmup=warmup)
