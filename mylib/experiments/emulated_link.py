"""Chapter 3. An emulated network link: real all-reduces, delivered on a link's clock.

On a GPU cluster the bytes of an all-reduce are moved by the network cards and
NCCL's copy engines, not by the cores that compute the backward, so
communication runs beside the backward almost for free. On a CPU machine gloo
copies and adds the bytes on the very cores the backward needs, and overlap can
hardly pay. :class:`EmulatedLink` gives a CPU machine the cluster's behaviour.
It is a communication hook for ``MyDDP`` that

1. does the real all-reduce (with the hook it wraps, by default MyDDP's
   :func:`~mylib.ddp.allreduce_average_hook`), so the gradients are exactly
   those without it: the emulation changes *when* they arrive, never *what*;
2. books the bucket on one emulated link, first in first out, the link of the
   timeline model (:class:`mylib.models.timeline.Link`): bucket k starts when it
   is launched or when bucket k-1 has left the link, whichever is later, and
   takes ``Link.allreduce_s(bytes)``: ``2(n-1) alpha + 2(n-1)/n x bytes / beta``;
3. completes the bucket's future when that transfer is over (or when the real
   all-reduce is, if that is later), from a timer thread that sleeps until then:
   the wait costs no CPU.

Pick a link slower than gloo on the machine, so that the real all-reduce is done
long before the emulated one, and each bucket arrives when the link delivers it.

Usage, on every rank::

    link = EmulatedLink(dist.get_world_size(), alpha_s=2e-3, bandwidth=0.5e9)
    model = MyDDP(net)
    model.register_comm_hook(None, link)  # state: the process group, as usual

``clock`` (seconds, default ``time.perf_counter``) and ``timer`` (an object with
``call_at(when_s, fn)``, default a :class:`SleepingTimer` on that clock) can be
replaced: a test drives the link with a fake clock and fires the timers itself.
"""

import collections
import heapq
import itertools
import math
import threading
import time

import torch

from mylib import comm
from mylib.ddp import allreduce_average_hook
from mylib.models import timeline as tl

Transfer = collections.namedtuple("Transfer", "bucket nbytes launched_s start_s done_s")
Transfer.__doc__ = (
    "One bucket on the emulated link: launched, on the link from start to done."
)


def bandwidth_for(seconds, nbytes, ranks):
    """The bandwidth at which the bytes of a ring all-reduce of ``nbytes`` take
    ``seconds``.

    The inverse of the bandwidth term of ``Link.allreduce_s``, from that very
    function: the time at 1 byte/s is the number of bytes each rank sends.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return tl.Link(ranks, 0.0, 1.0).allreduce_s(nbytes) / seconds


class SleepingTimer:
    """Calls ``fn()`` at ``clock() >= when_s``, from one thread that sleeps meanwhile.

    Due calls run in order of their time. A call already due runs at once, in
    the caller's thread.
    """

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self._due = []  # heap of (when_s, sequence number, fn)
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread = None

    def call_at(self, when_s, fn):
        if when_s <= self.clock():
            fn()
            return
        with self._wake:
            heapq.heappush(self._due, (when_s, next(self._order), fn))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="emulated-link", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def _run(self):
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > self.clock():
                    wait = self._due[0][0] - self.clock() if self._due else None
                    self._wake.wait(wait)  # sleeps: no CPU until then
                _, _, fn = heapq.heappop(self._due)
            fn()


class EmulatedLink:
    """A communication hook: the real all-reduce, delivered when a FIFO link would.

    ``ranks``, ``alpha_s`` (latency per message of the ring, seconds) and
    ``bandwidth`` (bytes/s) define the link, kept as ``self.link``
    (a :class:`mylib.models.timeline.Link`, the one the timeline model plays
    out). ``inner`` is the hook that does the real work. Every bucket's
    booking is kept in ``transfers`` (the last 4096).
    """

    def __init__(
        self,
        ranks,
        alpha_s,
        bandwidth,
        *,
        inner=allreduce_average_hook,
        clock=time.perf_counter,
        timer=None,
    ):
        self.link = tl.Link(ranks, alpha_s, bandwidth)
        self.inner = inner
        self.clock = clock
        self.timer = SleepingTimer(clock) if timer is None else timer
        self.transfers = collections.deque(maxlen=4096)
        self._free_at = -math.inf  # when the link has sent everything booked
        self._lock = threading.Lock()

    def book(self, nbytes, launched_s, bucket=None):
        """Put ``nbytes`` on the link at ``launched_s``: when it starts and is done.

        It starts when launched or when the link is free, whichever is later,
        and takes ``self.link.allreduce_s(nbytes)``. Returns a :data:`Transfer`.
        """
        with self._lock:
            start = max(launched_s, self._free_at)
            done = start + self.link.allreduce_s(nbytes)
            self._free_at = done
            transfer = Transfer(bucket, nbytes, launched_s, start, done)
            self.transfers.append(transfer)
        return transfer

    def __call__(self, state, bucket):
        """MyDDP's hook interface: returns a Future of the averaged flat gradient."""
        transfer = self.book(comm.nbytes(bucket.buffer()), self.clock(), bucket.index())
        delivered = torch.futures.Future()

        def real_done(future):
            try:
                value = future.value()
            except Exception as error:  # the real all-reduce failed: say so now
                delivered.set_exception(error)
                return
            self.timer.call_at(transfer.done_s, lambda: delivered.set_result(value))

        self.inner(state, bucket).add_done_callback(real_done)
        return delivered

    def __repr__(self):
        link = self.link
        return (
            f"EmulatedLink(ranks={link.ranks}, alpha_s={link.alpha_s:g}, "
            f"bandwidth={link.bandwidth:g})"
        )
