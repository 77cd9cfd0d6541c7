"""What a step's timeline is: spans on two lanes, and the numbers they add up to.

A :class:`Span` is something that occupied a lane (compute or comm) from one
time to another; a :class:`Timeline` holds a step's spans and what they add
up to (:func:`summarize`): step time, backward end, time the link was busy,
exposed communication, overlap. One definition serves the model
(:mod:`mylib.models.timeline` and the figures built on it) and a measured run
(:class:`mylib.experiments.tracer.Tracer`), so the two can be drawn and compared alike.

Standard library only: it runs in the reader's browser (Pyodide).
"""

import operator

COMPUTE, COMM = "compute", "comm"  # the two lanes of a data-parallel step


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
    return _summary_of(
        start, last_end, backward_end, comm_end, len(comm), comm_s, hidden
    )


def _summary_of(start, last_end, backward_end, comm_end, n_comm, comm_s, hidden):
    """:func:`_summary` once the link's busy and hidden times are known.

    The model adds those up as it plays (``playout._play_in_turn``).
    """
    return {
        "start_s": start,
        "step_s": last_end - start,
        "backward_end_s": backward_end - start,
        "comm_end_s": comm_end - start,
        "comm_s": comm_s,
        "exposed_comm_s": max(0.0, comm_end - backward_end),
        "overlap": hidden / comm_s if comm_s > 0 else 0.0,
        "n_buckets": n_comm,
    }
