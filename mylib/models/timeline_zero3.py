"""A ZeRO-3 step's timeline: an all-gather before each layer's forward and backward.

Chapter 3's model (:mod:`mylib.models.timeline`) plays out a DDP step: compute
on one lane, bucketed all-reduces on the link. Under ZeRO-3 the link carries
more, and some of it blocks compute: a layer cannot run its forward, nor its
backward, until its parameters are gathered. Per layer of ``b`` bytes:

* forward: all-gather (b bytes out), then the layer's forward;
* backward: all-gather again, the layer's backward, then a reduce-scatter
  of its gradient (which nothing waits for but the optimizer step).

Without prefetching a layer's all-gather starts only when the layer is
reached, so compute waits for every gather. With prefetching the gather of the
*next* layer is issued as soon as the current one starts computing (FSDP's
forward and backward prefetch), so it hides behind that compute; at most two
layers are whole at a time. The link is one FIFO queue, as in chapter 3, with
the ring costs of :mod:`mylib.models.costmodel`: a reduce-scatter or an
all-gather costs ``(n-1)(alpha + b / (n beta))``, half an all-reduce.

Standard library only: the chapter's slider figure runs this file in the
reader's browser (Pyodide).
"""

from mylib.models import timeline as tl
from mylib.models.costmodel import ring_all_gather_time, ring_reduce_scatter_time

COMPUTE, COMM = tl.COMPUTE, tl.COMM


class Zero3Timeline:
    """A ZeRO-3 step as spans on a compute and a comm lane, and what they add up to.

    ``step_s``: first start to last end; ``compute_s``: time computing;
    ``waiting_s``: time the compute lane waits for communication
    (``step_s - compute_s``); ``comm_s``: time the link is busy;
    ``backward_end_s``; ``n_gathers``; ``peak_gathered_bytes``: the most
    parameter bytes whole at once (one layer without prefetch, two with).
    """

    def __init__(self, spans, name, peak_gathered_bytes):
        self.spans = sorted(spans, key=lambda s: (s.start_s, s.end_s))
        self.name, self.lanes, self.start_s = name, (COMPUTE, COMM), 0.0
        compute = [s for s in self.spans if s.lane == COMPUTE]
        self.step_s = max(s.end_s for s in self.spans)
        self.compute_s = sum(s.duration_s for s in compute)
        self.waiting_s = self.step_s - self.compute_s
        self.comm_s = sum(s.duration_s for s in self.spans if s.lane == COMM)
        self.backward_end_s = max(s.end_s for s in compute if s.kind == "backward")
        self.n_gathers = sum(s.kind == "allgather" for s in self.spans)
        self.peak_gathered_bytes = peak_gathered_bytes

    def __repr__(self):
        return (
            f"Zero3Timeline({self.name!r}: step {self.step_s * 1e3:.3f} ms, "
            f"waiting for communication {self.waiting_s * 1e3:.3f} ms)"
        )


def zero3_step(
    layers, link, *, prefetch, forward_ratio=0.5, optimizer_s=0.0, name=None
):
    """The timeline of a ZeRO-3 step over ``layers``.

    ``layers`` are :class:`mylib.models.timeline.Layer`, in backward order.
    A layer's ``param_bytes`` are both what is gathered and what is
    reduce-scattered (same dtype); its forward takes ``forward_ratio`` times
    its backward. ``optimizer_s`` is the (sharded) optimizer step, after the
    last reduce-scatter.
    """
    layers = list(reversed(tl._check(layers)))  # forward order
    n, alpha, bw = link.ranks, link.alpha_s, link.bandwidth
    # whole: (from, to, bytes) while a layer's parameters are whole
    spans, link_free, whole = [], 0.0, []

    def on_link(kind, ready, nbytes, label, cost):
        nonlocal link_free
        start = max(ready, link_free)
        link_free = start + cost(nbytes, n, alpha, bw)
        spans.append(
            tl.Span(COMM, kind, start, link_free, label, nbytes=nbytes, ready_s=ready)
        )
        return start, link_free

    def compute(kind, start, seconds, label):
        spans.append(tl.Span(COMPUTE, kind, start, start + seconds, label))
        return start + seconds

    def gather(i, ready):
        gathers[i] = on_link(
            "allgather",
            ready,
            layers[i].nbytes,
            f"gather {layers[i].name}",
            ring_all_gather_time,
        )

    # Forward: gather, compute, free. With prefetch, layer i+1's gather is
    # issued when layer i starts computing (its own gather done, layer i-1
    # freed): at most two layers whole.
    t, gathers = 0.0, {}  # layer -> (start, end) of its gather in this pass
    for i, layer in enumerate(layers):
        if i not in gathers:
            gather(i, t)
        begin = max(t, gathers[i][1])
        if prefetch and i + 1 < len(layers):
            gather(i + 1, begin)
        t = compute("forward", begin, layer.backward_s * forward_ratio, layer.name)
        whole.append((gathers[i][0], t, layer.nbytes))
    # Backward, last layer first: gather again, compute, reduce-scatter the gradient.
    gathers, last_reduce = {}, t
    for i in reversed(range(len(layers))):
        if i not in gathers:
            gather(i, t)
        begin = max(t, gathers[i][1])
        if prefetch and i > 0:
            gather(i - 1, begin)
        t = compute("backward", begin, layers[i].backward_s, layers[i].name)
        whole.append((gathers[i][0], t, layers[i].nbytes))
        _, last_reduce = on_link(
            "reducescatter",
            t,
            layers[i].nbytes,
            f"reduce-scatter {layers[i].name}",
            ring_reduce_scatter_time,
        )
    if optimizer_s > 0:
        compute("optimizer", max(t, last_reduce), optimizer_s, "optimizer")
    peak = _peak(whole)
    if name is None:
        name = "ZeRO-3, prefetch" if prefetch else "ZeRO-3, no prefetch"
    return Zero3Timeline(spans, name, peak)


def _peak(whole):
    """Most bytes whole at once, from ``(from, to, bytes)`` intervals.

    A layer is whole from its gather's start.
    """
    events = sorted(
        [(start, nbytes) for start, _, nbytes in whole]
        + [(end, -nbytes) for _, end, nbytes in whole]
    )
    peak = current = 0
    for _, delta in events:  # at equal times a free (negative) sorts before a gather
        current += delta
        peak = max(peak, current)
    return peak
