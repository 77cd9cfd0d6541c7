"""Chapter 3. Recording the timeline of a real data-parallel step.

:class:`Tracer` is a callable to set as ``MyDDP.tracer``: MyDDP calls it with
``grad_ready`` (a parameter's gradient was accumulated), ``bucket_launch``,
``bucket_done`` (from the all-reduce's completion callback) and ``sync_done``
(``finish_gradient_sync`` returned), each with its ``time.perf_counter()``.
``mark("backward")`` and friends add the moments MyDDP cannot see. The events
become a :class:`mylib.models.timeline.Timeline`, the structure the model
produces, so the same code draws both (:mod:`mylib.figures.timeline`)::

    tracer = Tracer()
    ddp.tracer = tracer
    loss = loss_fn(ddp(x), y)
    tracer.mark("backward")
    loss.backward()
    ddp.finish_gradient_sync()
    measured = tracer.timeline(ddp.buckets)

:func:`time_layers` measures what the model needs as input: each layer's
backward compute time, from gradient hooks, with no communication at all.

What the host clock means depends on the device. On the CPU (gloo) a hook runs
when the gradient exists, and an all-reduce's future completes when the data
has arrived. On a GPU the host only *issues* work: a hook runs when autograd's
thread has queued the gradient's kernels, and an NCCL work's future completes
once the collective is enqueued ("For GPU work, ``fut.done()`` returns true
only whether the operation has been enqueued": the docstring of
``torch.distributed.Work.get_future``), so the host spans show when work was
issued, not when it ran. ``Tracer(device=...)`` with the model's accelerator
also records a ``torch.Event`` on that device's current stream with every
event, and ``timeline(clock="device")`` places the events by those: a hook's
event completes when the work queued before it has run; ``bucket_done``'s is
recorded in the completion callback, whose current stream waits for the
collective's kernels (``torch.futures.Future.then``), so an all-reduce span
runs from its gradients being ready on the device to the collective being
done. That path has not been run on a GPU: only its arithmetic is tested.
"""

import statistics
import threading
import time

from mylib.models import timeline as tl

MARKS = ("forward", "backward", "optimizer", "end")


class Tracer:
    """Collects ``(event, t, fields)`` from MyDDP and from :meth:`mark`; thread-safe.

    ``device``: where the model runs. On an accelerator (``"cuda"``, ...) every
    event also records a device event, for ``timeline(clock="device")``.
    """

    def __init__(self, device=None):
        self.events = []
        # bucket_done arrives from the communication thread
        self._lock = threading.Lock()
        self.device = _accelerator(device)
        self._device_events = []  # one per event, on an accelerator

    def __call__(self, event, t, **fields):
        marker = None
        if self.device is not None:
            marker = self._new_device_event()
            marker.record()  # on the device's current stream
        with self._lock:
            self.events.append((event, t, fields))
            self._device_events.append(marker)

    def _new_device_event(self):
        import torch

        return torch.Event(device=self.device, enable_timing=True)

    def mark(self, event):
        """Record a moment MyDDP does not report.

        ``event`` is ``forward``, ``backward``, ``optimizer`` or ``end``.
        """
        if event not in MARKS:
            raise ValueError(f"unknown mark {event!r}; use one of {MARKS}")
        self(event, time.perf_counter())

    def clear(self):
        """Forget every event (call it before each step you want to look at)."""
        with self._lock:
            self.events.clear()
            self._device_events.clear()

    def _clocked(self, clock):
        """The events with host times, or with the device's times on its clock."""
        if clock not in ("host", "device"):
            raise ValueError(f"clock must be 'host' or 'device', got {clock!r}")
        with self._lock:
            events, markers = list(self.events), list(self._device_events)
        if clock == "host":
            return events
        if self.device is None:
            raise ValueError(
                "clock='device' needs the device events of Tracer(device=...) with "
                "the model's accelerator, e.g. Tracer(device='cuda')"
            )
        if not events:
            return events
        for marker in markers:
            marker.synchronize()
        # device times, placed on the host clock at the first event
        t0, first = events[0][1], markers[0]
        return [
            (e, t0 + first.elapsed_time(marker) / 1e3, fields)
            for (e, _, fields), marker in zip(events, markers)
        ]

    def _wait_for_callbacks(self, timeout_s=2.0):
        # A bucket's completion callback runs on the communication thread just
        # after its future gets its value, so it can arrive a few microseconds
        # after finish_gradient_sync returned.
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            with self._lock:
                launched = sum(e == "bucket_launch" for e, _, _ in self.events)
                done = sum(e == "bucket_done" for e, _, _ in self.events)
            if done >= launched:
                return
            time.sleep(0.0005)

    def timeline(self, buckets=None, name="measured", clock="host"):
        """The recorded step as a Timeline: the model's spans, from real timestamps.

        Compute lane: ``forward`` (if marked), one ``backward`` span per
        layer (from one layer's gradients being ready to the next's; a layer
        is a module, the parameter name up to its last dot), the wait in
        ``finish_gradient_sync`` (``sync``), the ``optimizer`` (if marked).
        Comm lane: one ``allreduce`` span per bucket, launch to completion.
        ``buckets`` (``ddp.buckets``) adds each bucket's bytes. ``clock``:
        ``"host"`` (``time.perf_counter()``) or ``"device"`` (see the module's
        docstring).
        """
        self._wait_for_callbacks()
        events = sorted(self._clocked(clock), key=lambda e: e[1])
        grads = [(t, f) for e, t, f in events if e == "grad_ready"]
        if not grads:
            raise ValueError(
                "no gradient was recorded: set ddp.tracer = tracer before "
                "loss.backward()"
            )
        marks = {e: t for e, t, _ in events if e in MARKS}
        start = marks.get("backward", grads[0][0])
        spans = []
        if "forward" in marks:
            spans.append(
                tl.Span(tl.COMPUTE, "forward", marks["forward"], start, "forward")
            )
        layer_start, ready_of_bucket = start, {}
        for i, (t, fields) in enumerate(grads):
            layer = fields["name"].rsplit(".", 1)[0]
            ready_of_bucket[fields["bucket"]] = t
            next_layer = (
                grads[i + 1][1]["name"].rsplit(".", 1)[0]
                if i + 1 < len(grads)
                else None
            )
            if next_layer != layer:
                spans.append(tl.Span(tl.COMPUTE, "backward", layer_start, t, layer))
                layer_start = t
        backward_end = grads[-1][0]
        launches = {f["bucket"]: t for e, t, f in events if e == "bucket_launch"}
        done = {f["bucket"]: t for e, t, f in events if e == "bucket_done"}
        for index in sorted(launches):
            if index not in done:
                raise ValueError(
                    f"bucket {index} was launched but never finished: "
                    "record a whole step, up to finish_gradient_sync()"
                )
            nbytes = buckets[index].nbytes if buckets is not None else 0
            spans.append(
                tl.Span(
                    tl.COMM,
                    "allreduce",
                    launches[index],
                    done[index],
                    f"b{index}",
                    bucket=index,
                    nbytes=nbytes,
                    ready_s=ready_of_bucket.get(index, launches[index]),
                )
            )
        sync = [t for e, t, _ in events if e == "sync_done"]
        if sync and sync[-1] > backward_end:
            spans.append(
                tl.Span(
                    tl.COMPUTE, "sync", backward_end, sync[-1], "finish_gradient_sync"
                )
            )
        if "optimizer" in marks:
            spans.append(
                tl.Span(
                    tl.COMPUTE,
                    "optimizer",
                    marks["optimizer"],
                    marks.get("end", marks["optimizer"]),
                    "optimizer",
                )
            )
        return tl.Timeline(spans, name=name)


def _accelerator(device):
    """``device`` as a ``torch.device`` if it is an accelerator, else None."""
    if device is None:
        return None
    import torch

    device = torch.device(device)
    return None if device.type == "cpu" else device


def time_layers(module, loss_fn, repeats=5, warmup=2, statistic="median"):
    """Each layer's backward compute time, in backward order.

    Returns :class:`mylib.models.timeline.Layer` objects. ``loss_fn()`` runs the
    forward and returns the loss; only its ``backward()`` is timed. A hook on
    every parameter notes when its gradient was accumulated; a layer's time runs
    from the previous layer's gradients to its own (the first from the start of
    backward), which is exactly what the model's compute lane means.
    ``statistic="median"``: each layer's median over ``repeats`` runs;
    ``"min"``: the layers of the fastest run (the one least disturbed by other
    programs on the machine); ``"runs"``: every run's layers, a list per run.
    """
    if statistic not in ("median", "min", "runs"):
        raise ValueError(
            f"statistic must be 'median', 'min' or 'runs', got {statistic!r}"
        )
    names = {p: n for n, p in module.named_parameters() if p.requires_grad}
    if not names:
        raise ValueError("the module has no parameter that requires grad")
    events = []
    hooks = [
        p.register_post_accumulate_grad_hook(
            lambda p: events.append((names[p], time.perf_counter()))
        )
        for p in names
    ]
    runs = []
    try:
        for i in range(warmup + repeats):
            module.zero_grad(set_to_none=False)
            loss = loss_fn()
            events.clear()
            start = time.perf_counter()
            loss.backward()
            if i >= warmup:
                runs.append((start, list(events)))
    finally:
        for hook in hooks:
            hook.remove()
    sizes = {n: p.numel() * p.element_size() for p, n in names.items()}
    layers_of_run = [_layers_from_events(start, evs, sizes) for start, evs in runs]
    shapes = {tuple((name, b) for name, _, b in run) for run in layers_of_run}
    if len(shapes) != 1:
        raise RuntimeError(
            "the gradients arrived in a different order in different runs; "
            "time_layers needs a model whose backward order does not change"
        )
    if statistic == "runs":
        return [[tl.Layer(*layer) for layer in run] for run in layers_of_run]
    if statistic == "min":
        fastest = min(
            layers_of_run, key=lambda run: sum(seconds for _, seconds, _ in run)
        )
        return [
            tl.Layer(name, seconds, param_bytes)
            for name, seconds, param_bytes in fastest
        ]
    return [
        tl.Layer(
            name, statistics.median(run[k][1] for run in layers_of_run), param_bytes
        )
        for k, (name, _, param_bytes) in enumerate(layers_of_run[0])
    ]


def _layers_from_events(start, events, sizes):
    """Group ``(param name, t)`` events into ``(layer, seconds, param_bytes)``.

    The layers keep the order in which their gradients arrived.
    """
    layers, previous = [], start
    previous_start = start  # where the current layer began
    for name, t in events:
        layer = name.rsplit(".", 1)[0]
        if layers and layers[-1][0] == layer:
            layers[-1] = (layer, t - previous_start, layers[-1][2] + (sizes[name],))
        else:
            previous_start = previous
            layers.append((layer, t - previous_start, (sizes[name],)))
        previous = t
    return layers
