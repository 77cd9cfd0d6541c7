"""ZeRO's step in time: where the all-gathers go, and what waits for them.

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

On a cluster (nodes of GPUs, NVLink inside, NICs out) :func:`cluster_link`
gives the ``alpha`` and ``beta`` of NCCL's ring over ``n`` of its GPUs
(:func:`mylib.models.cluster.ring_alpha_beta`): with them these formulas are
:func:`mylib.models.cluster.ring`'s time for every collective here, so a
gather over nodes runs at the node's NICs together, inside a node at NVLink's
rate.

ZeRO-1 and ZeRO-2 send what DDP sends, yet their step is not DDP's. Two
ways to place their one all-gather:

* :func:`zero2_step`, the paper's ZeRO-2 (DeepSpeed stage 2, mylib's
  ``ShardedGradOptimizer``): the gradients are reduce-scattered bucket by
  bucket during the backward, as DDP's all-reduces are, but the parameters
  are all-gathered *after* the optimizer step, and nothing computes while
  they travel: the next forward needs them.
* :func:`zero3_step` with ``reshard_after_forward=False`` (FSDP's
  ``SHARD_GRAD_OP``, FSDP2's ``reshard_after_forward=False``): each unit is
  gathered before its forward, as in ZeRO-3, and kept whole until its
  backward is done; the backward gathers nothing. The one gather moved into
  the forward, unit by unit, where prefetching hides it behind compute.

Standard library only: the chapter's slider figure runs this file in the
reader's browser (Pyodide).
"""

from mylib.models import timeline as tl
from mylib.models.buckets import assign_buckets
from mylib.models.cluster import ring_alpha_beta
from mylib.models.costmodel import ring_all_gather_time, ring_reduce_scatter_time

COMPUTE, COMM = tl.COMPUTE, tl.COMM


def cluster_link(cluster, ranks):
    """The :class:`~mylib.models.timeline.Link` of NCCL's ring over ``ranks`` GPUs.

    ``cluster`` is a :class:`mylib.models.cluster.Cluster`; the ranks fill
    whole nodes of it, or part of one (:meth:`~mylib.models.cluster.Cluster.for_ranks`).
    The ring's all-gather, reduce-scatter and all-reduce of ``b`` bytes then
    cost what :func:`mylib.models.cluster.ring` says: ``beta`` is the ring's
    bus bandwidth (a node's NICs together, or NVLink inside one node),
    ``alpha`` its latency per step.
    """
    alpha_s, beta = ring_alpha_beta(cluster, ranks)
    return tl.Link(ranks, alpha_s, beta)


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
    layers,
    link,
    *,
    prefetch,
    reshard_after_forward=True,
    forward_ratio=0.5,
    optimizer_s=0.0,
    name=None,
):
    """The timeline of a ZeRO-3 step over ``layers``.

    ``layers`` are :class:`mylib.models.timeline.Layer`, in backward order.
    A layer's ``param_bytes`` are both what is gathered and what is
    reduce-scattered (same dtype); its forward takes ``forward_ratio`` times
    its backward. ``optimizer_s`` is the (sharded) optimizer step, after the
    last reduce-scatter. ``reshard_after_forward=False`` keeps each layer
    whole from its forward to the end of its backward, which then gathers
    nothing (FSDP2's ``reshard_after_forward=False``, ZeRO-2's traffic).
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
        if reshard_after_forward:
            whole.append((gathers[i][0], t, layer.nbytes))
    # Backward, last layer first: gather again (unless kept whole), compute,
    # reduce-scatter the gradient.
    kept = {} if reshard_after_forward else gathers
    gathers, last_reduce = dict(kept), t
    for i in reversed(range(len(layers))):
        if i not in gathers:
            gather(i, t)
        begin = max(t, gathers[i][1])
        if prefetch and i > 0 and i - 1 not in gathers:
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
        if not reshard_after_forward:
            name = "ZeRO-2 traffic, gathered in the forward"
    return Zero3Timeline(spans, name, peak)


def zero2_step(
    layers, link, cap_bytes, *, forward_ratio=0.5, optimizer_s=0.0, name=None
):
    """The timeline of the paper's ZeRO-2 step: the all-gather after the update.

    The parameters are whole through the forward and the backward. The
    gradients go in buckets of ``cap_bytes`` (the rule of
    :func:`mylib.models.buckets.assign_buckets`, as DDP's), each
    reduce-scattered once its gradients are ready and the link is free, as
    DDP's all-reduces are. After the last one, the (sharded) optimizer step,
    then an all-gather of each bucket's parameters, one after another; the
    step ends when the last one arrives, since the next forward needs them.
    ``layers`` as for :func:`zero3_step`.
    """
    layers = tl._check(layers)  # backward order
    n, alpha, bw = link.ranks, link.alpha_s, link.bandwidth
    sizes = [b for layer in layers for b in layer.param_bytes]
    buckets = assign_buckets(sizes, cap_bytes)
    bucket_bytes = [sum(sizes[i] for i in bucket) for bucket in buckets]
    last_param = {bucket[-1]: k for k, bucket in enumerate(buckets)}
    spans, link_free = [], 0.0

    def on_link(kind, ready, k, cost):
        nonlocal link_free
        start = max(ready, link_free)
        link_free = start + cost(bucket_bytes[k], n, alpha, bw)
        label = f"{'gather' if kind == 'allgather' else 'reduce-scatter'} b{k}"
        spans.append(
            tl.Span(
                COMM,
                kind,
                start,
                link_free,
                label,
                bucket=k,
                nbytes=bucket_bytes[k],
                ready_s=ready,
            )
        )

    t = 0.0
    for layer in reversed(layers):  # forward order
        start, t = t, t + layer.backward_s * forward_ratio
        spans.append(tl.Span(COMPUTE, "forward", start, t, layer.name))
    param = 0
    for layer in layers:
        start, t = t, t + layer.backward_s
        spans.append(tl.Span(COMPUTE, "backward", start, t, layer.name))
        for _ in layer.param_bytes:  # every gradient of the layer is ready
            if param in last_param:  # ... and with it, a whole bucket
                on_link("reducescatter", t, last_param[param], ring_reduce_scatter_time)
            param += 1
    t = max(t, link_free)
    if optimizer_s > 0:
        spans.append(tl.Span(COMPUTE, "optimizer", t, t + optimizer_s, "optimizer"))
        t += optimizer_s
    for k in range(len(buckets)):
        on_link("allgather", t, k, ring_all_gather_time)
    peak = sum(sizes)  # every parameter is whole all the time
    return Zero3Timeline(spans, name or "ZeRO-2, gathered after the step", peak)


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
