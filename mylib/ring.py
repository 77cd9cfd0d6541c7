"""Chapter 1. Ring all-reduce, built from point-to-point sends and receives.

Every rank holds a tensor; afterwards every rank holds the sum. The ring
does it in two phases over ``n`` ranks arranged in a circle, each rank
talking only to its two neighbours:

1. **reduce-scatter**: cut the tensor into ``n`` chunks. In each of ``n-1``
   steps every rank sends one chunk to its right neighbour and adds the
   chunk arriving from its left neighbour into its own copy. Afterwards
   rank ``r`` holds the complete sum of chunk ``(r+1) % n``.
2. **all-gather**: in ``n-1`` more steps every rank passes its finished
   chunk on to the right, and copies the finished chunk arriving from the
   left, until every rank holds every finished chunk.

Each rank sends ``2(n-1)`` chunks of ``bytes/n``: ``2(n-1)/n x bytes``,
nearly twice the tensor whatever the number of ranks. That is why the ring
is *bandwidth-optimal* (Patarasuk and Yuan, 2009), and why it is what NCCL
and gloo use for large tensors.

The transfers go through :mod:`mylib.comm`, so ``count_bytes()`` measures
what the ring really sends. The schedule (who sends which chunk to whom at
each step) is plain Python in :func:`ring_steps`; the implementation and the
pictures of chapter 1 both follow it.
"""

import torch
import torch.distributed as dist

from mylib import comm

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


def chunk_bounds(numel, n):
    """Start and stop of each of ``n`` chunks of a flat tensor of ``numel`` elements.

    Sizes differ by at most one element: the first ``numel % n`` chunks get
    the extra element (the rule of ``torch.tensor_split``). Chunks may be
    empty when ``numel < n``.

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    if n < 1:
        raise ValueError(f"need at least one chunk, got n={n}")
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_steps(n):
    """The ring all-reduce schedule for ``n`` ranks: ``2(n-1)`` steps.

    Each step is a list of transfers ``(phase, src, dst, chunk)``: rank
    ``src`` sends its copy of chunk ``chunk`` to ``dst = (src+1) % n``. In
    the reduce-scatter phase ``dst`` adds it to its own copy; in the
    all-gather phase ``dst`` overwrites its copy with it. All transfers of
    a step happen at the same time, one per rank, so every link of the ring
    is busy.
    """
    steps = []
    for s in range(n - 1):
        # rank r sends the chunk it added into in the step before
        steps.append([(REDUCE_SCATTER, r, (r + 1) % n, (r - s) % n) for r in range(n)])
    for s in range(n - 1):
        # rank r starts with chunk r+1, which it holds complete
        steps.append([(ALL_GATHER, r, (r + 1) % n, (r + 1 - s) % n) for r in range(n)])
    return steps


def simulate_ring(n):
    """Run the schedule on paper: whose contributions each copy holds after each step.

    Returns a list of ``2(n-1) + 1`` states; ``state[r][c]`` is the frozenset
    of ranks whose chunk ``c`` has been summed into rank ``r``'s copy of chunk
    ``c``. The first state is the start (``{r}`` everywhere on rank ``r``); in
    the last every copy holds all ranks. Chapter 1 draws these states.
    """
    state = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    states = [state]
    for step in ring_steps(n):
        new = [row[:] for row in state]
        for phase, src, dst, c in step:
            if phase == REDUCE_SCATTER:
                new[dst][c] = state[dst][c] | state[src][c]
            else:
                new[dst][c] = state[src][c]
        state = new
        states.append(state)
    return states


def ring_bytes_sent(numel, element_size, n, rank):
    """Bytes ``rank`` sends in a ring all-reduce of ``numel`` elements over ``n`` ranks.

    Rank ``r`` sends every chunk but ``(r+1) % n`` in the reduce-scatter
    phase and every chunk but ``(r+2) % n`` in the all-gather phase, so it
    sends ``2 x bytes`` minus those two chunks. When ``n`` divides ``numel``
    that is exactly ``2(n-1)/n x bytes``; otherwise it is within two
    elements of it, since every chunk is within one element of ``numel/n``.
    """
    if n == 1:
        return 0
    sizes = [stop - start for start, stop in chunk_bounds(numel, n)]
    return (2 * numel - sizes[(rank + 1) % n] - sizes[(rank + 2) % n]) * element_size


def _combine(op):
    """The in-place ``a op= b`` the reduce-scatter phase applies, for a ReduceOp."""
    combines = {
        dist.ReduceOp.SUM: lambda a, b: a.add_(b),
        dist.ReduceOp.AVG: lambda a, b: a.add_(b),  # divided by n at the end
        dist.ReduceOp.PRODUCT: lambda a, b: a.mul_(b),
        dist.ReduceOp.MAX: lambda a, b: torch.maximum(a, b, out=a),
        dist.ReduceOp.MIN: lambda a, b: torch.minimum(a, b, out=a),
    }
    for known, fn in combines.items():
        if op == known:
            return fn
    raise ValueError(
        f"ring_all_reduce supports ReduceOp SUM, AVG, PRODUCT, MAX and MIN, got {op}"
    )


def _exchange(send_chunk, dst, recv_into, src, group):
    """Send one chunk right and receive one from the left at the same time.

    Both are posted before either is waited on: if every rank first did a
    blocking send, every rank could wait for its neighbour to receive, and
    the ring would stall. Empty chunks (tensors smaller than ``n``) are
    skipped on both sides, which agree because every rank computes the
    same bounds.
    """
    works = []
    if recv_into.numel():  # posted first: the chunk lands on arrival
        works.append(comm.irecv(recv_into, src, group=group))
    if send_chunk.numel():
        works.append(comm.isend(send_chunk, dst, group=group))
    for work in works:
        work.wait()


def reduce_scatter_phase(chunks, rank, n, op=dist.ReduceOp.SUM, group=None):
    """Phase 1: then ``chunks[(rank+1) % n]`` holds the full reduction."""
    combine = _combine(op)
    right, left = _peer(rank + 1, n, group), _peer(rank - 1, n, group)
    scratch = torch.empty_like(chunks[0])  # chunk 0 is the largest
    for step in ring_steps(n)[: n - 1]:
        _, _, _, send_c = step[rank]
        _, _, _, recv_c = step[(rank - 1) % n]  # from the left neighbour
        incoming = scratch[: chunks[recv_c].numel()]
        _exchange(chunks[send_c], right, incoming, left, group)
        combine(chunks[recv_c], incoming)


def all_gather_phase(chunks, rank, n, group=None):
    """Phase 2: pass the finished chunks on till every rank has them all."""
    right, left = _peer(rank + 1, n, group), _peer(rank - 1, n, group)
    for step in ring_steps(n)[n - 1 :]:
        _, _, _, send_c = step[rank]
        _, _, _, recv_c = step[(rank - 1) % n]
        _exchange(chunks[send_c], right, chunks[recv_c], left, group)


def ring_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None):
    """All-reduce ``tensor`` in place with the ring, as ``dist.all_reduce``.

    Works for any shape and size (chunks differ by at most one element when
    ``n`` does not divide the size), any world size, and the ops SUM, AVG,
    PRODUCT, MAX and MIN. Returns ``tensor``.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"ring_all_reduce needs a torch.Tensor, got {type(tensor).__name__}"
        )
    _combine(op)  # reject an unsupported op before any rank starts talking
    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if op == dist.ReduceOp.AVG and not tensor.is_floating_point():
        raise TypeError(
            f"ReduceOp.AVG needs a floating-point tensor, got "
            f"{tensor.dtype}; use SUM and divide"
        )
    if n == 1 or tensor.numel() == 0:
        return tensor
    # A contiguous tensor is reduced in its own memory, others copied once.
    if tensor.is_contiguous():
        flat = tensor.view(-1)
    else:
        flat = tensor.reshape(-1).clone()
    chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
    reduce_scatter_phase(chunks, rank, n, op, group)
    all_gather_phase(chunks, rank, n, group)
    if op == dist.ReduceOp.AVG:
        flat.div_(n)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def _peer(group_rank, n, group):
    """The global rank of ring position ``group_rank % n``.

    ``dist.isend`` wants global ranks.
    """
    group_rank %= n
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
