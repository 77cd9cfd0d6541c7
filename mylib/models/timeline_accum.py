"""The timeline of gradient accumulation: m micro-steps, communication on the last.

Chapter 3's model (:mod:`mylib.models.timeline`) plays out one data-parallel
step: the backward pass on the compute lane, the buckets' all-reduces on the
link, overlapped. With gradient accumulation an optimizer step is ``m``
micro-steps, each a forward and a backward on one micro-batch:

* with ``no_sync()`` the first ``m - 1`` backward passes send nothing, and
  the last one all-reduces the buckets (which hold the sum of all ``m``
  micro-steps), overlapped with its backward exactly as in chapter 3;
* without it every micro-step all-reduces every bucket, and waits for the
  last one before the next micro-step (``MyDDP.finish_gradient_sync``;
  PyTorch's DDP waits inside ``backward()``), so each micro-step pays its
  own exposed tail and the link carries ``m`` times the bytes.

:func:`accumulation_step` builds either from chapter 3's :func:`simulate`;
:mod:`mylib.figures.timeline_accum` draws both. Standard library only: the
figure runs in the reader's browser (Pyodide).
"""

from mylib.models import timeline as tl


class AccumulationTimeline:
    """One optimizer step of m micro-steps: spans, and the numbers that matter.

    ``step_s``: start to end; ``compute_s``: time computing;
    ``exposed_comm_s``: time the compute lane waits for the link, summed
    over the micro-steps; ``n_allreduces``; ``bytes_sent``: what one rank
    sends (ring: ``2 (n-1)/n`` x bucket bytes per all-reduce);
    ``micro_starts_s``: when each micro-step begins.
    """

    lanes = (tl.COMPUTE, tl.COMM)
    start_s = 0.0

    def __init__(self, spans, name, micro_starts_s, exposed_comm_s, ranks):
        self.spans = sorted(spans, key=lambda s: (s.start_s, s.end_s))
        self.name, self.micro_starts_s, self.micro_steps = (
            name,
            list(micro_starts_s),
            len(micro_starts_s),
        )
        self.step_s = max(s.end_s for s in self.spans)
        self.compute_s = sum(s.duration_s for s in self.spans if s.lane == tl.COMPUTE)
        self.comm_s = sum(s.duration_s for s in self.spans if s.lane == tl.COMM)
        self.exposed_comm_s = exposed_comm_s
        allreduces = [s for s in self.spans if s.kind == "allreduce"]
        self.n_allreduces = len(allreduces)
        self.bytes_sent = sum(2 * (ranks - 1) * s.nbytes // ranks for s in allreduces)

    def metrics(self):
        """The panel's numbers, as a dict."""
        return {
            key: getattr(self, key)
            for key in (
                "step_s",
                "compute_s",
                "exposed_comm_s",
                "n_allreduces",
                "bytes_sent",
            )
        }

    def __repr__(self):
        return (
            f"AccumulationTimeline({self.name!r}: {self.micro_steps} micro-steps, "
            f"step {self.step_s * 1e3:.3f} ms, "
            f"exposed comm {self.exposed_comm_s * 1e3:.3f} ms, "
            f"{self.n_allreduces} all-reduces)"
        )


def _shifted(span, offset):
    return tl.Span(
        span.lane,
        span.kind,
        span.start_s + offset,
        span.end_s + offset,
        span.label,
        span.bucket,
        span.nbytes,
        span.ready_s + offset,
    )


def _compute_only(layers, forward_s, t0):
    """A micro-step inside no_sync(): forward, then backward, nothing on the link."""
    spans, t = [], t0
    if forward_s > 0:
        spans.append(tl.Span(tl.COMPUTE, "forward", t, t + forward_s, "forward"))
        t += forward_s
    for layer in layers:
        spans.append(
            tl.Span(tl.COMPUTE, "backward", t, t + layer.backward_s, layer.name)
        )
        t += layer.backward_s
    return spans, t


def accumulation_step(
    layers,
    cap_bytes,
    link,
    micro_steps,
    *,
    no_sync=True,
    forward_s=0.0,
    first_cap_bytes=None,
    name=None,
):
    """One optimizer step of ``micro_steps`` micro-steps, with or without ``no_sync()``.

    ``layers`` (backward order), ``cap_bytes``, ``link`` and
    ``first_cap_bytes`` are those of :func:`mylib.models.timeline.simulate`;
    ``forward_s`` is each micro-step's forward.
    """
    if int(micro_steps) != micro_steps or micro_steps < 1:
        raise ValueError(f"micro_steps must be a whole number >= 1, got {micro_steps}")
    layers = tl._check(layers)
    spans, starts, t, exposed = [], [], 0.0, 0.0
    for k in range(int(micro_steps)):
        starts.append(t)
        if no_sync and k < micro_steps - 1:
            more, t = _compute_only(layers, forward_s, t)
            spans += more
            continue
        step = tl.simulate(
            layers,
            cap_bytes,
            link,
            first_cap_bytes=first_cap_bytes,
            forward_s=forward_s,
        )
        spans += [_shifted(s, t) for s in step.spans]
        exposed += step.exposed_comm_s
        t += step.step_s
    if name is None:
        name = (
            "no_sync() on the first m - 1 micro-steps"
            if no_sync
            else "all-reduce after every micro-step"
        )
    return AccumulationTimeline(spans, name, starts, exposed, link.ranks)
