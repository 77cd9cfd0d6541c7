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
*and* the link is free (:mod:`mylib.models.playout` lays that out). The output
is a :class:`~mylib.models.spans.Timeline`: spans of compute and
communication and the numbers that matter (step time, exposed
communication, overlap, bucket count). ``all_at_end`` and ``per_parameter``
are the two baselines: one all-reduce after the backward (no overlap), one
all-reduce per parameter (overlap, but alpha paid per parameter).

Standard library only: the same file runs in the reader's browser (Pyodide)
behind the chapter's sliders. 1,000 layers take about a millisecond.
"""

import functools
from itertools import chain, repeat
from operator import attrgetter

from mylib.models.buckets import MB, assign_buckets
from mylib.models.costmodel import ring_all_reduce_time
from mylib.models.playout import play

# What a timeline is, shared with measured runs; re-exported: tl.Span, tl.Timeline
from mylib.models.spans import (  # noqa: F401
    COMM,
    COMPUTE,
    METRIC_KEYS,
    Span,
    Timeline,
    _summary,
    summarize,
)

_PARAM_BYTES = attrgetter("param_bytes")


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

    def scaled(self, factor):
        """This layer with its backward ``factor`` (>= 0) times as long.

        Made without the checks of ``__init__``: the sizes are already checked
        ints, and a figure scales hundreds of layers per redraw (chapter 7).
        """
        layer = Layer.__new__(Layer)
        layer.name, layer.param_bytes = self.name, self.param_bytes
        layer.backward_s = float(self.backward_s * factor)
        return layer

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


def _check(layers):
    layers = list(layers)
    if not layers:
        raise ValueError("the model needs at least one layer")
    if not all(map(isinstance, layers, repeat(Layer))):
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
    sizes = tuple(chain.from_iterable(map(_PARAM_BYTES, layers)))
    buckets = _assign(sizes, cap_bytes, first_cap_bytes)
    if name is None:
        name = (
            "one all-reduce per parameter"
            if cap_bytes == 0
            else f"buckets of {cap_bytes / MB:g} MB"
        )
    return play(
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
    return play(
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
