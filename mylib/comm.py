"""Chapter 1. Collectives that count the bytes each rank sends.

Every chapter wants to *show* communication volume, not assert it from a
formula. The functions here have the signatures of their ``torch.distributed``
namesakes and forward to them, after recording how many bytes this rank puts
on the wire:

* point-to-point ``send``/``isend``: exactly the tensor's bytes;
* collectives: what the bandwidth-optimal ring algorithm would send, per call.
  This is an assumption, since the backend does not report its traffic.
  Chapter 1 measures gloo's (``mylib.experiments.commbench.gloo_wire_bytes``):
  its all-reduce and all-gather are rings and send these bytes; its
  reduce-scatter is an all-reduce underneath and sends twice as many; its
  broadcast is a binomial tree, with the same total spread differently.

  =====================  ==============================
  all_reduce             2 (n-1)/n x bytes
  reduce_scatter_single  (n-1)/n x bytes of the input
  all_gather_single      (n-1)   x bytes of the input shard
  broadcast              bytes, except the rank just before the root
  =====================  ==============================

``reduce_scatter_single`` and ``all_gather_single`` are torch 2.13's names for
the one-flat-tensor collectives; the older ``reduce_scatter_tensor`` and
``all_gather_into_tensor`` still work but warn (``FutureWarning``) and call them.

The ring all-reduce of :mod:`mylib.ring` is built from ``send``/``recv``
here, so for it the count is measured, not modelled; chapter 1 checks that
the two agree.

Usage::

    with count_bytes() as stats:
        all_reduce(t)
    stats.bytes_sent, stats.by_op
"""

import contextlib
from collections import Counter

import torch.distributed as dist

# the CommStats being filled; nested count_bytes() blocks all see each call
_active = []


class CommStats:
    """Bytes this rank sent, in total (``bytes_sent``) and per operation (``by_op``)."""

    def __init__(self):
        self.bytes_sent = 0
        self.by_op = Counter()
        self.calls = Counter()

    def add(self, op, nbytes):
        self.bytes_sent += nbytes
        self.by_op[op] += nbytes
        self.calls[op] += 1

    def __repr__(self):
        return f"CommStats(bytes_sent={self.bytes_sent}, calls={dict(self.calls)})"


@contextlib.contextmanager
def count_bytes():
    """Count the bytes this rank sends through this module inside the block."""
    stats = CommStats()
    _active.append(stats)
    try:
        yield stats
    finally:
        _active.remove(stats)


def _record(op, nbytes):
    for stats in _active:
        stats.add(op, int(nbytes))


def _world(group):
    return dist.get_world_size(group)


def nbytes(tensor):
    """Bytes of a tensor's data: ``numel x element size``."""
    return tensor.numel() * tensor.element_size()


def send(tensor, dst, group=None, tag=0):
    """``dist.send``, counting ``tensor``'s bytes."""
    _record("send", nbytes(tensor))
    return dist.send(tensor, dst, group=group, tag=tag)


def isend(tensor, dst, group=None, tag=0):
    """``dist.isend``, counting ``tensor``'s bytes. Returns the work handle."""
    _record("send", nbytes(tensor))
    return dist.isend(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag=0):
    """``dist.recv`` (receiving sends nothing)."""
    return dist.recv(tensor, src, group=group, tag=tag)


def irecv(tensor, src=None, group=None, tag=0):
    """``dist.irecv`` (receiving sends nothing). Returns the work handle."""
    return dist.irecv(tensor, src, group=group, tag=tag)


def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """``dist.all_reduce``, counting 2 (n-1)/n x bytes.

    A ring all-reduce is a reduce-scatter, then an all-gather.
    """
    n = _world(group)
    _record("all_reduce", 2 * (n - 1) * nbytes(tensor) // n)
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def reduce_scatter_single(
    output, input, op=dist.ReduceOp.SUM, group=None, async_op=False
):
    """``dist.reduce_scatter_single``, counting (n-1)/n x the input's bytes."""
    n = _world(group)
    _record("reduce_scatter", (n - 1) * nbytes(input) // n)
    return dist.reduce_scatter_single(
        output, input, op=op, group=group, async_op=async_op
    )


def all_gather_single(output, input, group=None, async_op=False):
    """``dist.all_gather_single``, counting (n-1) x the input shard's bytes."""
    _record("all_gather", (_world(group) - 1) * nbytes(input))
    return dist.all_gather_single(output, input, group=group, async_op=async_op)


def broadcast(tensor, src, group=None, async_op=False):
    """``dist.broadcast``, counting this rank's bytes in a pipelined ring broadcast.

    Every rank forwards the tensor to its successor except the one whose
    successor is the root.
    """
    n = _world(group)
    rank = dist.get_rank(group)
    root = dist.get_group_rank(group, src) if group is not None else src
    if n > 1 and (rank + 1) % n != root:
        _record("broadcast", nbytes(tensor))
    return dist.broadcast(tensor, src, group=group, async_op=async_op)
