"""Measuring communication on this machine: the data that alpha and beta are fitted to.

Two measurements, both run on every rank of a group (call them inside a
function given to :func:`mylib.run_ranks`):

* :func:`ping_pong`: ranks 0 and 1 bounce a message back and forth; half a
  round trip is the time of one message, the quantity ``alpha + b/beta``
  of :func:`mylib.models.costmodel.message_time`.
* :func:`time_all_reduce`: every rank all-reduces a tensor, with gloo's
  ``dist.all_reduce`` or any function of the same signature (such as
  :func:`mylib.ring.ring_all_reduce`); compare with
  :func:`mylib.models.costmodel.ring_all_reduce_time`.

Each size is run a few times after a warm-up. By default the *fastest* run
is kept: other programs on the machine can only add time to a run (a rank
that waits for a message may be put to sleep and woken late), so the
fastest run is the best estimate of what the communication itself costs.
``statistic="median"`` keeps the typical run instead. Times are
``time.perf_counter`` seconds.

A third measurement is of bytes, not time: :func:`gloo_wire_bytes` reads
how many bytes each collective made gloo write to its sockets (Linux's
``/proc/self/io``), next to what :mod:`mylib.comm`'s counter assumes.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

# 4 bytes to 32 MB, in factors of 2: from the latency-bound end to the
# bandwidth-bound end.
DEFAULT_SIZES = [2**k for k in range(2, 26)]

_STATISTICS = {"min": min, "median": statistics.median}


def ping_pong(sizes_bytes=DEFAULT_SIZES, repeats=5, warmup=2, statistic="min"):
    """One-way message time (half a round trip) between ranks 0 and 1, for each size.

    Every rank of the group must call it; ranks other than 0 and 1 just wait.
    All ranks return the same list of seconds, one per size.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        raise ValueError(
            "ping_pong needs at least 2 ranks: run it with run_ranks(fn, world_size=2)"
        )
    reduce = _statistic(statistic)
    _check_sizes(sizes_bytes, 1)
    results = []
    for size in sizes_bytes:
        buf = torch.zeros(size, dtype=torch.uint8)
        times = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            if rank == 0:
                reply = dist.irecv(buf, 1)  # posted before the reply can arrive
                dist.send(buf, 1)
                reply.wait()
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i >= warmup:
                times.append((time.perf_counter() - start) / 2)
        results.append(reduce(times) if rank == 0 else 0.0)
    return _from_rank0(results)


def time_all_reduce(
    sizes_bytes=DEFAULT_SIZES, repeats=5, warmup=2, all_reduce=None, statistic="min"
):
    """Seconds of an all-reduce of a float32 tensor of each size.

    Every rank of the group calls it. ``all_reduce(tensor)`` defaults to
    ``dist.all_reduce``. Ranks line up at a barrier before each run, and a
    run lasts until the slowest rank is done (the maximum over ranks), as in
    training, where a step waits for the last rank. All ranks return the
    same list.
    """
    all_reduce = all_reduce or dist.all_reduce
    reduce = _statistic(statistic)
    _check_sizes(sizes_bytes, 4)
    results = []
    for size in sizes_bytes:
        tensor = torch.ones(size // 4, dtype=torch.float32)
        times = []
        for i in range(warmup + repeats):
            dist.barrier()
            start = time.perf_counter()
            all_reduce(tensor)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i >= warmup:
                times.append(elapsed.item())
            # keep the values small: repeated sums would overflow to inf
            tensor.fill_(1.0)
        results.append(reduce(times))
    return results


PROC_IO = "/proc/self/io"


def wire_bytes_measurable():
    """Whether this machine counts each process's written bytes (/proc/self/io)."""
    return os.path.exists(PROC_IO)


def bytes_written():
    """Bytes this process has handed to ``write``-like calls so far, sockets included.

    The ``wchar`` line of Linux's ``/proc/self/io``; gloo's TCP transport
    writes every message it sends through such calls, from its own threads,
    which this process-wide count includes.
    """
    if not wire_bytes_measurable():
        raise RuntimeError(
            f"{PROC_IO} does not exist: counting written bytes needs Linux"
        )
    with open(PROC_IO) as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError(f"{PROC_IO} has no wchar line")


def four_collectives(api, numel):
    """Calls of all-reduce, reduce-scatter, all-gather and broadcast, by name.

    Each works on float32 tensors of ``numel`` elements (divisible by the
    number of ranks) through ``api``: ``torch.distributed`` or ``mylib.comm``
    (same names, and mylib counts the bytes).
    """
    n = dist.get_world_size()
    if numel % n:
        raise ValueError(f"numel must be divisible by the {n} ranks, got {numel}")
    x, shard, full = torch.ones(numel), torch.empty(numel // n), torch.empty(numel)
    return {
        "all-reduce": lambda: api.all_reduce(x),
        "reduce-scatter": lambda: api.reduce_scatter_single(shard, x),
        "all-gather": lambda: api.all_gather_single(full, shard),
        "broadcast": lambda: api.broadcast(x, src=0),
    }


def gloo_wire_bytes(numel, repeats=3):
    """What each gloo collective writes to the wire, and what ``mylib.comm`` counts.

    Every rank calls it, with a float32 tensor of ``numel`` elements
    (``numel`` divisible by the number of ranks): all-reduce, reduce-scatter
    of it, all-gather back into it, broadcast from rank 0. Returns this
    rank's ``{collective: (bytes counted by mylib.comm, bytes written)}``.
    The written bytes are the fewest over ``repeats`` runs, each between two
    barriers, so that nothing else this process writes is counted.
    """
    from mylib import comm

    out = {}
    for name, call in four_collectives(comm, numel).items():
        written = []
        for _ in range(repeats):
            dist.barrier()
            with comm.count_bytes() as stats:
                before = bytes_written()
                call()
                after = bytes_written()
            written.append(after - before)
        dist.barrier()
        out[name] = (stats.bytes_sent, min(written))
    return out


def gloo_ops_recorded(numel):
    """The gloo operation ``torch.profiler`` records for each collective, on every rank.

    Returns ``{collective: sorted names of the profiler's gloo events}`` for an
    all-reduce, reduce-scatter, all-gather and broadcast of a float32 tensor
    of ``numel`` elements (divisible by the number of ranks).
    """
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, call in four_collectives(dist, numel).items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            call()
        out[name] = sorted({e.name for e in prof.events() if e.name.startswith("gloo")})
    return out


def _from_rank0(values):
    """Rank 0's list, on every rank (so every rank returns the same result)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.broadcast(tensor, 0)
    return tensor.tolist()


def _statistic(name):
    if name not in _STATISTICS:
        raise ValueError(
            f"statistic must be one of {sorted(_STATISTICS)}, got {name!r}"
        )
    return _STATISTICS[name]


def _check_sizes(sizes_bytes, multiple):
    if not sizes_bytes:
        raise ValueError("give at least one message size")
    for size in sizes_bytes:
        if not isinstance(size, int) or size < multiple or size % multiple:
            raise ValueError(
                f"sizes must be positive ints, multiples of {multiple} bytes; "
                f"got {size!r}"
            )
