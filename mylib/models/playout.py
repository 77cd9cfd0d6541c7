"""How a step plays out in time: the engine of :mod:`mylib.models.timeline`.

Given the layers (in backward order), the buckets and the link, lay out the
compute and the all-reduces of one step (:func:`play`). Two ways, one answer:
an event loop, for links where compute and communication slow each other
down (gloo on a CPU), and, without that interference, a recurrence that
gives the same timeline faster (``tests/test_timeline.py`` compares them).

Standard library only: it runs in the reader's browser (Pyodide).
"""

import functools
from itertools import accumulate, chain
from operator import attrgetter

from mylib.models.spans import COMM, COMPUTE, Span, Timeline, _summary_of

_BACKWARD_S = attrgetter("backward_s")
_PARAM_BYTES = attrgetter("param_bytes")
_INF = float("inf")


def play(layers, buckets, link, *, launch_at_end, forward_s, optimizer_s, name):
    """Lay out compute and all-reduces in time for a given bucket assignment.

    ``layers`` are :class:`mylib.models.timeline.Layer` in backward order,
    ``buckets`` a tuple of parameter indices per bucket (as
    :func:`mylib.models.timeline.simulate` makes them), ``link`` a
    :class:`mylib.models.timeline.Link`. An event loop over two queues, the layers
    (one after another) and the buckets (in order, each once it is ready and
    the link is free). Between two events each side advances at its rate: 1,
    or 1/stretch while the other side is busy too. Without that interference
    (both stretches 1, as on GPUs) the loop reduces to a recurrence,
    :func:`_play_in_turn`, which gives the same timeline
    (``tests/test_timeline.py`` compares the two) several times faster: the
    browser plays up to 22 steps per slider move (chapter 7).
    """
    without_interference = link.compute_stretch == 1.0 and link.comm_stretch == 1.0
    played = _play_in_turn if without_interference else _play_events
    return played(
        layers,
        buckets,
        link,
        launch_at_end=launch_at_end,
        forward_s=forward_s,
        optimizer_s=optimizer_s,
        name=name,
    )


def _play_in_turn(
    layers, buckets, link, *, launch_at_end, forward_s, optimizer_s, name
):
    """:func:`play` when compute and communication do not slow each other down.

    The layers then run back to back, and bucket k's all-reduce starts at
    ``max(ready_k, end_{k-1})``: when its last gradient is ready (or the
    backward ends, with ``launch_at_end``) and the link is free. The
    all-reduces are then in time order and never overlap: the link's busy
    and hidden times add up as they are laid out (an all-reduce of 0 s adds
    0), as ``spans._busy_and_hidden`` would count them. Spans are made only
    when asked for: a figure that plots the numbers of many steps (chapter 7
    plays 22 per redraw) never makes one.
    """
    t = forward_s if forward_s > 0 else 0.0
    ends = list(accumulate(map(_BACKWARD_S, layers), initial=t))  # ends[i + 1]: layer i
    backward_end = ends[-1]
    counts = tuple(map(len, map(_PARAM_BYTES, layers)))
    sizes = tuple(chain.from_iterable(map(_PARAM_BYTES, layers)))
    layer_of_bucket, nbytes_of, distinct = _bucket_totals(counts, sizes, buckets)
    # buckets of one size take as long: one cost-model call per size
    seconds = {nbytes: link.allreduce_s(nbytes) for nbytes in distinct}
    if launch_at_end:
        ready_at = [backward_end] * len(buckets)
    else:
        ready_at = [ends[i + 1] for i in layer_of_bucket]
    durations = tuple(map(seconds.__getitem__, nbytes_of))
    link_free = backward_end if not buckets else 0.0
    busy = hidden = 0.0  # as _laid_out lays them out, without keeping them
    for ready, seconds_k in zip(ready_at, durations):
        start = ready if ready > link_free else link_free
        link_free = start + seconds_k
        busy += link_free - start
        if start < backward_end:
            hidden += (link_free if link_free < backward_end else backward_end) - start
    t = max(backward_end, link_free)

    def make_spans():
        compute = [("forward", 0.0, forward_s, "forward")] if forward_s > 0 else []
        compute += [
            ("backward", ends[i], ends[i + 1], layer.name)
            for i, layer in enumerate(layers)
        ]
        if optimizer_s > 0:
            compute.append(("optimizer", t, t + optimizer_s, "optimizer"))
        return _compute_spans(tuple(compute)) + [
            Span(COMM, "allreduce", start, end, f"b{k}", k, nbytes_of[k], ready_at[k])
            for k, (start, end) in enumerate(_laid_out(ready_at, durations))
        ]

    last_end = t + optimizer_s if optimizer_s > 0 else t
    summary = _summary_of(
        0.0, last_end, backward_end, link_free, len(buckets), busy, hidden
    )
    return Timeline.played(make_spans, summary, name=name, buckets=buckets)


def _laid_out(ready_at, durations):
    """Each all-reduce's ``(start, end)``: when it is ready and the link is free.

    The loop of :func:`_play_in_turn`, which adds up the same times.
    """
    comm, link_free = [], 0.0
    for ready, seconds_k in zip(ready_at, durations):
        start = ready if ready > link_free else link_free
        link_free = start + seconds_k
        comm.append((start, link_free))
    return comm


@functools.lru_cache(maxsize=8)
def _compute_spans(compute):
    """The compute lane's spans: one list for steps that compute alike.

    The steps of one figure often differ only in their communication (the
    baselines and the buckets of chapter 3); sharing the spans lets a drawing
    lay out that lane once (``mylib.figures.timeline``). Spans are not changed
    once made.
    """
    return [Span(COMPUTE, *span) for span in compute]


@functools.lru_cache(maxsize=64)
def _bucket_totals(counts, sizes, buckets):
    """Each bucket's last layer (the one it waits for), its bytes, and their sizes.

    ``counts``: each layer's number of gradients; ``sizes``: their bytes.
    Remembered, as the buckets are (``timeline._assign``): the steps of one
    figure, and of one figure's redraws, share them.
    """
    layer_of_param = [i for i, count in enumerate(counts) for _ in range(count)]
    nbytes_of = tuple(sum(map(sizes.__getitem__, bucket)) for bucket in buckets)
    return (
        tuple(layer_of_param[max(bucket)] for bucket in buckets),
        nbytes_of,
        tuple(dict.fromkeys(nbytes_of)),
    )


def _play_events(layers, buckets, link, *, launch_at_end, forward_s, optimizer_s, name):
    """:func:`play` as an event loop, for any stretch factors."""
    spans, t = [], 0.0
    if forward_s > 0:
        spans.append(Span(COMPUTE, "forward", 0.0, forward_s, "forward"))
        t = forward_s
    bucket_of = {i: k for k, bucket in enumerate(buckets) for i in bucket}
    # each side's rate while the other is busy too
    slow_compute, slow_comm = 1.0 / link.compute_stretch, 1.0 / link.comm_stretch
    # gradients each bucket still waits for
    missing = [len(bucket) for bucket in buckets]
    sizes = [b for layer in layers for b in layer.param_bytes]
    nbytes_of = [sum(map(sizes.__getitem__, bucket)) for bucket in buckets]
    # buckets of one size take as long: one cost-model call per size
    seconds = {b: link.allreduce_s(b) for b in set(nbytes_of)}
    ready_at = [None] * len(buckets)
    layer, layer_start, work_left = 0, t, (layers[0].backward_s if layers else 0.0)
    param, n_layers, n_buckets = 0, len(layers), len(buckets)
    # next bucket to send; when the one on the link started
    bucket, comm_start, comm_left = 0, None, 0.0
    while layer < n_layers or bucket < n_buckets:
        computing, sending = layer < n_layers, comm_start is not None
        if not sending and bucket < n_buckets and ready_at[bucket] is not None:
            comm_start, sending = t, True
            comm_left = seconds[nbytes_of[bucket]]
        compute_rate = slow_compute if sending else 1.0
        comm_rate = slow_comm if computing else 1.0
        dt_compute = work_left / compute_rate if computing else _INF
        dt_comm = comm_left / comm_rate if sending else _INF
        dt = dt_comm if dt_comm < dt_compute else dt_compute
        if dt == _INF:
            # a bug, not bad input
            raise AssertionError(
                "timeline model stalled: a bucket can never become ready"
            )
        t += dt
        if computing:
            work_left -= dt * compute_rate
        if sending:
            comm_left -= dt * comm_rate
        if computing and dt == dt_compute:  # the layer is done: its gradients are ready
            spans.append(Span(COMPUTE, "backward", layer_start, t, layers[layer].name))
            for _ in layers[layer].param_bytes:
                k = bucket_of[param]
                missing[k] -= 1
                if missing[k] == 0 and not launch_at_end:
                    ready_at[k] = t
                param += 1
            layer += 1
            layer_start, work_left = (
                t,
                (layers[layer].backward_s if layer < n_layers else 0.0),
            )
            if layer == n_layers and launch_at_end:
                ready_at = [t] * len(buckets)
        if sending and dt == dt_comm:
            spans.append(
                Span(
                    COMM,
                    "allreduce",
                    comm_start,
                    t,
                    f"b{bucket}",
                    bucket=bucket,
                    nbytes=nbytes_of[bucket],
                    ready_s=ready_at[bucket],
                )
            )
            bucket, comm_start = bucket + 1, None
    if optimizer_s > 0:
        spans.append(Span(COMPUTE, "optimizer", t, t + optimizer_s, "optimizer"))
    return Timeline(spans, name=name, buckets=buckets)
