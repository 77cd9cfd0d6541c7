"""How a step plays out in time: the engine of :mod:`mylib.models.timeline`.

Given the layers (in backward order), the buckets and the link, lay out the
compute and the all-reduces of one step (:func:`play`). Two ways, one answer:
an event loop, for links where compute and communication slow each other
down (gloo on a CPU), and, without that interference, a recurrence that
gives the same timeline faster (``tests/test_timeline.py`` compares them).

Standard library only: it runs in the reader's browser (Pyodide).
"""

import functools

from mylib.models.spans import COMM, COMPUTE, Span, Timeline, _summary

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
    backward ends, with ``launch_at_end``) and the link is free.
    """
    compute, t = [], 0.0  # (kind, start, end, label)
    if forward_s > 0:
        compute.append(("forward", 0.0, forward_s, "forward"))
        t = forward_s
    ready_of_param = []  # when each gradient is ready: its layer's end
    for layer in layers:
        start, t = t, t + layer.backward_s
        compute.append(("backward", start, t, layer.name))
        ready_of_param.extend([t] * len(layer.param_bytes))
    backward_end = t
    sizes = tuple(b for layer in layers for b in layer.param_bytes)
    last_params, nbytes_of = _bucket_totals(sizes, buckets)
    seconds = {}  # buckets of one size take as long: one cost-model call per size
    comm, ready_at = [], []  # each all-reduce's (start, end); when it was ready
    link_free = t if not buckets else 0.0
    for k, nbytes in enumerate(nbytes_of):
        ready = backward_end if launch_at_end else ready_of_param[last_params[k]]
        if nbytes not in seconds:
            seconds[nbytes] = link.allreduce_s(nbytes)
        start = ready if ready > link_free else link_free
        link_free = start + seconds[nbytes]
        comm.append((start, link_free))
        ready_at.append(ready)
    t = max(backward_end, link_free)
    if optimizer_s > 0:
        compute.append(("optimizer", t, t + optimizer_s, "optimizer"))

    def make_spans():
        return _compute_spans(tuple(compute)) + [
            Span(COMM, "allreduce", start, end, f"b{k}", k, nbytes_of[k], ready_at[k])
            for k, (start, end) in enumerate(comm)
        ]

    # in bucket order the all-reduces are in time order and never overlap
    last_end = t + optimizer_s if optimizer_s > 0 else t
    summary = _summary(0.0, last_end, backward_end, link_free, comm)
    return Timeline.played(make_spans, summary, name=name, buckets=buckets)


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
def _bucket_totals(sizes, buckets):
    """Each bucket's last gradient (the one it waits for) and its bytes.

    Remembered, as the buckets are (``timeline._assign``): the steps of one
    figure share them.
    """
    return (
        tuple(max(bucket) for bucket in buckets),
        tuple(sum(map(sizes.__getitem__, bucket)) for bucket in buckets),
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
