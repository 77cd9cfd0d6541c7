"""The communication timeline of one data-parallel step: a what-if model.

During the backward pass gradients become ready layer by layer, last layer
first. DDP groups them into buckets (:func:`mylib.models.buckets.assign_buckets`,
the very rule ``MyDDP`` uses) and starts a bucket's all-reduce as soon as its
last gradient is ready, so communication runs while earlier layers are still
computing. Only what is left after the backward ends is *exposed*: the step
waits for it.

The model here plays that out in time. The network is one link per rank that
carries one all-reduce at a time, first launched first served; an all-reduce
of ``b`` bytes over ``n`` ranks costs, by the alpha-beta model of a ring
(chapter 1)::

    2 (n - 1) alpha  +  2 (n - 1) / n * b / beta

(:func:`mylib.models.costmodel.ring_all_reduce_time`, the model chapter 1
fits to gloo). A bucket's all-reduce starts when its last gradient is ready
*and* the link is free. The output is a :class:`Timeline`: spans of compute
and communication and the numbers that matter (step time, exposed
communication, overlap, bucket count). ``all_at_end`` and ``per_parameter``
are the two baselines: one all-reduce after the backward (no overlap), one
all-reduce per parameter (overlap, but alpha paid per parameter).

Standard library only: the same file runs in the reader's browser (Pyodide)
behind the chapter's sliders. 1,000 layers take about a millisecond.
"""

import functools
import operator

from mylib.models.buckets import MB, assign_buckets
from mylib.models.costmodel import ring_all_reduce_time

COMPUTE, COMM = "compute", "comm"  # the two lanes of a data-parallel step


class Layer:
    """A layer in backward order: its backward time and its parameters' gradient sizes.

    ``param_bytes`` lists the gradient bytes of the layer's parameters in the
    order their gradients reach DDP (for ``nn.Linear``: bias, then weight,
    the reverse of ``parameters()``). All of them are ready when the layer's
    backward ends.
    """

    __slots__ = ("name", "backward_s", "param_bytes")

    def __init__(self, name, backward_s, param_bytes):
        if backward_s < 0:
            raise ValueError(
                f"layer {name!r}: backward_s must be >= 0, got {backward_s}"
            )
        if isinstance(param_bytes, (int, float)):
            param_bytes = (param_bytes,)
        param_bytes = tuple(map(int, param_bytes))
        if param_bytes and min(param_bytes) < 0:
            raise ValueError(
                f"layer {name!r}: gradient sizes must be >= 0 bytes, got {param_bytes}"
            )
        self.name, self.backward_s, self.param_bytes = (
            name,
            float(backward_s),
            param_bytes,
        )

    @property
    def nbytes(self):
        """All gradient bytes of the layer."""
        return sum(self.param_bytes)

    def __repr__(self):
        return (
            f"Layer({self.name!r}, backward_s={self.backward_s:g}, "
            f"param_bytes={self.param_bytes})"
        )


class Link:
    """Communication as the model sees it: an alpha-beta ring over ``ranks`` ranks.

    ``alpha_s`` is the latency per message (seconds), ``bandwidth`` the link
    bandwidth in bytes/s. The two stretch factors say how communication and
    compute share the machine, slowing each other down while both run: an
    all-reduce takes ``comm_stretch`` times longer while the backward is
    computing, and the backward ``compute_stretch`` times longer while an
    all-reduce runs. On GPUs with NCCL both are close to 1 (communication
    has its own engines, though its kernels take a few SMs); with gloo on a
    CPU, communication copies and sums bytes on the very cores that compute,
    and both stretch.
    """

    __slots__ = ("ranks", "alpha_s", "bandwidth", "comm_stretch", "compute_stretch")

    def __init__(
        self, ranks, alpha_s, bandwidth, comm_stretch=1.0, compute_stretch=1.0
    ):
        if int(ranks) != ranks or ranks < 1:
            raise ValueError(f"ranks must be a whole number >= 1, got {ranks}")
        if alpha_s < 0:
            raise ValueError(
                f"alpha_s (latency per message, seconds) must be >= 0, got {alpha_s}"
            )
        if bandwidth <= 0:
            raise ValueError(
                f"bandwidth must be > 0 bytes/s, got {bandwidth}; e.g. 10e9 for 10 GB/s"
            )
        if comm_stretch < 1 or compute_stretch < 1:
            raise ValueError(
                "stretch factors are slowdowns and must be >= 1 (1: no interference), "
                f"got comm_stretch={comm_stretch}, compute_stretch={compute_stretch}"
            )
        self.ranks, self.alpha_s, self.bandwidth = (
            int(ranks),
            float(alpha_s),
            float(bandwidth),
        )
        self.comm_stretch, self.compute_stretch = (
            float(comm_stretch),
            float(compute_stretch),
        )

    def allreduce_s(self, nbytes):
        """Seconds for a ring all-reduce of ``nbytes`` on an idle machine.

        That is 2(n-1) alpha + 2(n-1)/n x bytes / bandwidth.
        """
        return ring_all_reduce_time(nbytes, self.ranks, self.alpha_s, self.bandwidth)

    def __repr__(self):
        stretch = (
            f", comm_stretch={self.comm_stretch:g}"
            f", compute_stretch={self.compute_stretch:g}"
            if (self.comm_stretch, self.compute_stretch) != (1.0, 1.0)
            else ""
        )
        return (
            f"Link(ranks={self.ranks}, alpha_s={self.alpha_s:g}, "
            f"bandwidth={self.bandwidth:g}{stretch})"
        )


class Span:
    """Something that occupied a lane from ``start_s`` to ``end_s``.

    ``kind`` is ``forward``, ``backward``, ``optimizer`` (compute lane) or
    ``allreduce`` (comm lane); ``bucket``, ``nbytes`` and ``ready_s`` (when
    its last gradient was ready; it may wait for the link after that)
    describe an all-reduce.
    """

    __slots__ = (
        "lane",
        "kind",
        "start_s",
        "end_s",
        "label",
        "bucket",
        "nbytes",
        "ready_s",
    )

    def __init__(
        self, lane, kind, start_s, end_s, label="", bucket=None, nbytes=0, ready_s=None
    ):
        self.lane, self.kind, self.label = lane, kind, label
        self.start_s, self.end_s = float(start_s), float(end_s)
        self.bucket, self.nbytes = bucket, nbytes
        self.ready_s = self.start_s if ready_s is None else float(ready_s)

    @property
    def duration_s(self):
        return self.end_s - self.start_s

    def __repr__(self):
        return (
            f"Span({self.lane!r}, {self.kind!r}, {self.start_s:.6g}, "
            f"{self.end_s:.6g}, {self.label!r})"
        )


_START_END = operator.attrgetter("start_s", "end_s")


class Timeline:
    """A step as spans on lanes, and what they add up to.

    Attributes computed from the spans by :func:`summarize` (the same
    definitions for the model and for a measured run):

    * ``step_s``: first span start to last span end;
    * ``backward_end_s``: when the last gradient was computed;
    * ``comm_s``: time the link was busy (union of all-reduce spans);
    * ``exposed_comm_s``: how long the step waits after the backward for
      communication: last all-reduce end minus backward end (0 if earlier);
    * ``overlap``: the fraction of ``comm_s`` hidden behind the backward;
    * ``n_buckets``: number of all-reduces.
    """

    def __init__(self, spans, name="", lanes=(COMPUTE, COMM), buckets=None):
        self.name = name
        self.lanes = tuple(lanes)
        self.buckets = buckets  # parameter indices per bucket (model only): tuples
        self._spans = sorted(spans, key=_START_END)
        for key, value in summarize(self._spans).items():
            setattr(self, key, value)

    @classmethod
    def played(cls, make_spans, summary, name="", buckets=None):
        """The model's timeline: its numbers now, its spans when first asked.

        ``summary`` is what :func:`summarize` gives for the spans that
        ``make_spans()`` returns (``tests/test_timeline.py`` checks it). A
        figure that plots only the numbers of many steps never makes a span.
        """
        timeline = cls.__new__(cls)
        timeline.name, timeline.lanes, timeline.buckets = name, (COMPUTE, COMM), buckets
        timeline._spans, timeline._make_spans = None, make_spans
        for key, value in summary.items():
            setattr(timeline, key, value)
        return timeline

    @property
    def spans(self):
        """The spans, by start (then end) time."""
        if self._spans is None:
            self._spans = sorted(self._make_spans(), key=_START_END)
        return self._spans

    def metrics(self):
        """The numbers of the panel, as a dict (seconds, a fraction and a count)."""
        return {key: getattr(self, key) for key in METRIC_KEYS}

    def __repr__(self):
        return (
            f"Timeline({self.name!r}: step {self.step_s * 1e3:.3f} ms, exposed comm "
            f"{self.exposed_comm_s * 1e3:.3f} ms, overlap {self.overlap:.0%}, "
            f"{self.n_buckets} buckets)"
        )


METRIC_KEYS = (
    "step_s",
    "backward_end_s",
    "comm_s",
    "exposed_comm_s",
    "overlap",
    "n_buckets",
)


_INF = float("inf")


def _busy_and_hidden(intervals, until):
    """Length covered by ``(start, end)`` intervals: in all, and before ``until``."""
    busy = hidden = 0.0
    reach = -_INF
    for start, end in sorted(intervals):
        if reach > start:  # overlaps what is already counted
            start = reach
        if end > start:
            busy += end - start
            if start < until:
                hidden += (end if end < until else until) - start
        if end > reach:
            reach = end
    return busy, hidden


def summarize(spans):
    """Step time, backward end, busy, exposed and hidden communication of ``spans``."""
    if not spans:
        raise ValueError("a timeline needs at least one span")
    comm, start, last_end, backward_end = [], _INF, -_INF, None
    for s in spans:  # one pass: the browser summarizes many steps per redraw
        if s.kind == "allreduce":
            comm.append((s.start_s, s.end_s))
        elif s.kind == "backward" and (backward_end is None or s.end_s > backward_end):
            backward_end = s.end_s
        if s.start_s < start:
            start = s.start_s
        if s.end_s > last_end:
            last_end = s.end_s
    if backward_end is None:
        backward_end = start
    comm_end = max((end for _, end in comm), default=backward_end)
    return _summary(start, last_end, backward_end, comm_end, comm)


def _summary(start, last_end, backward_end, comm_end, comm):
    """:func:`summarize` from the times it needs and each all-reduce's (start, end)."""
    comm_s, hidden = _busy_and_hidden(comm, backward_end)
    return {
        "start_s": start,
        "step_s": last_end - start,
        "backward_end_s": backward_end - start,
        "comm_end_s": comm_end - start,
        "comm_s": comm_s,
        "exposed_comm_s": max(0.0, comm_end - backward_end),
        "overlap": hidden / comm_s if comm_s > 0 else 0.0,
        "n_buckets": len(comm),
    }


def _play(layers, buckets, link, *, launch_at_end, forward_s, optimizer_s, name):
    """Lay out compute and all-reduces in time for a given bucket assignment.

    ``buckets`` holds a tuple of parameter indices per bucket (as
    :func:`_assign` gives them). An event loop over two queues, the layers
    (one after another) and the buckets (in order, each once it is ready and
    the link is free). Between two events each side advances at its rate: 1,
    or 1/stretch while the other side is busy too. Without that interference
    (both stretches 1, as on GPUs) the loop reduces to a recurrence,
    :func:`_play_in_turn`, which gives the same timeline
    (``tests/test_timeline.py`` compares the two) several times faster: the
    browser replays up to 23 steps per slider move.
    """
    if link.compute_stretch == 1.0 and link.comm_stretch == 1.0:
        return _play_in_turn(
            layers,
            buckets,
            link,
            launch_at_end=launch_at_end,
            forward_s=forward_s,
            optimizer_s=optimizer_s,
            name=name,
        )
    return _play_events(
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
    """:func:`_play` when compute and communication do not slow each other down.

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

    Remembered, as :func:`_assign` is: the steps of one figure share them.
    """
    return (
        tuple(max(bucket) for bucket in buckets),
        tuple(sum(map(sizes.__getitem__, bucket)) for bucket in buckets),
    )


def _play_events(layers, buckets, link, *, launch_at_end, forward_s, optimizer_s, name):
    """:func:`_play` as an event loop, for any stretch factors."""
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


def _check(layers):
    layers = list(layers)
    if not layers:
        raise ValueError("the model needs at least one layer")
    if not all(isinstance(layer, Layer) for layer in layers):
        raise TypeError(
            "layers must be mylib.models.timeline.Layer objects, "
            "in backward order (last layer first)"
        )
    return layers


@functools.lru_cache(maxsize=64)
def _assign(sizes, cap_bytes, first_cap_bytes):
    """:func:`assign_buckets`, remembered: scaling a step to n ranks keeps its sizes."""
    return tuple(map(tuple, assign_buckets(sizes, cap_bytes, first_cap_bytes)))


def simulate(
    layers,
    cap_bytes,
    link,
    *,
    first_cap_bytes=None,
    forward_s=0.0,
    optimizer_s=0.0,
    name=None,
):
    """The timeline of a DDP step with buckets of ``cap_bytes`` (0: one per parameter).

    ``layers`` are in backward order; ``first_cap_bytes`` is the small first
    bucket (default ``min(cap, 1 MB)``, as in PyTorch). ``forward_s`` and
    ``optimizer_s`` add the forward before and the optimizer step after.
    """
    layers = _check(layers)
    sizes = tuple(b for layer in layers for b in layer.param_bytes)
    buckets = _assign(sizes, cap_bytes, first_cap_bytes)
    if name is None:
        name = (
            "one all-reduce per parameter"
            if cap_bytes == 0
            else f"buckets of {cap_bytes / MB:g} MB"
        )
    return _play(
        layers,
        buckets,
        link,
        launch_at_end=False,
        forward_s=forward_s,
        optimizer_s=optimizer_s,
        name=name,
    )


def per_parameter(layers, link, **kwargs):
    """Baseline: every gradient all-reduced alone, launched when it is ready.

    It pays alpha once per parameter.
    """
    kwargs.setdefault("name", "one all-reduce per parameter")
    return simulate(layers, 0, link, **kwargs)


def all_at_end(
    layers,
    link,
    *,
    forward_s=0.0,
    optimizer_s=0.0,
    name="one all-reduce after backward",
):
    """Baseline: one all-reduce of every gradient after the backward ends.

    Communication does not overlap the backward at all.
    """
    layers = _check(layers)
    n_params = sum(len(layer.param_bytes) for layer in layers)
    return _play(
        layers,
        (tuple(range(n_params)),),
        link,
        launch_at_end=True,
        forward_s=forward_s,
        optimizer_s=optimizer_s,
        name=name,
    )


def best_cap(layers, caps_bytes, link, **kwargs):
    """The cap among ``caps_bytes`` with the shortest step, and every cap's timeline.

    Returns ``(best cap, {cap: timeline})``.
    """
    timelines = {cap: simulate(layers, cap, link, **kwargs) for cap in caps_bytes}
    return min(timelines, key=lambda cap: (timelines[cap].step_s, cap)), timelines


def uniform_layers(n_layers, param_bytes, backward_s, prefix="layer"):
    """``n_layers`` identical layers in backward order.

    They are named from the last (``layer{n-1}``) to ``layer0``.
    """
    if int(n_layers) != n_layers or n_layers < 1:
        raise ValueError(f"n_layers must be a whole number >= 1, got {n_layers}")
    return [
        Layer(f"{prefix}{i}", backward_s, param_bytes)
        for i in reversed(range(int(n_layers)))
    ]
