"""NCCL's double binary tree, ported: who sends what to whom across nodes.

A binary tree all-reduce sends everything up to the root and back down: a
leaf sends its data once (up), an inner node three times (up, and down to
each of two children). NCCL
builds two trees over the nodes, the second the first mirrored (an even
number of nodes) or shifted by one rank (an odd number), so that a node
that is a leaf in one tree is inner in the other, and each tree carries
half the data (NCCL 2.4's double binary trees, in NVIDIA's post on them).
This file ports ``ncclGetBtree`` and ``ncclGetDtree`` from NCCL's
``src/graph/trees.cc`` line for line, to count each node's network sends
(:func:`tree_node_sends`, used by :func:`mylib.models.cluster.tree_all_reduce`).

Standard library only.
"""


def tree_node_sends(nodes):
    """Each node's network sends in a tree all-reduce, in units of the buffer S.

    NCCL's double binary tree (``ncclGetDtree`` in ``src/graph/trees.cc``,
    ported here): two trees over the nodes, each carrying S/2; the second
    is the first mirrored (even N) or shifted by one (odd N). A node sends
    S/2 up to its parent (the reduction) and S/2 down to each child (the
    broadcast), in each tree it has them.
    """
    if not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be an int >= 1, got {nodes!r}")
    sends = [0.0] * nodes
    for rank in range(nodes):
        for parent, children in _dtree(nodes, rank):
            sends[rank] += 0.5 * ((parent >= 0) + sum(c >= 0 for c in children))
    return sends


def _btree(n, rank):
    """``(parent, (child0, child1))`` in NCCL's binary tree of ``n`` ranks, root 0."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, (-1, bit >> 1 if n > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    down0 = -1 if low == 0 else rank - low
    down1 = -1 if low == 0 else rank + low
    while down1 >= n:
        down1 = -1 if low == 0 else rank + low
        low >>= 1
    return up, (down0, down1)


def _dtree(n, rank):
    """Both trees of NCCL's double binary tree, as ``_btree`` pairs for ``rank``."""
    first = _btree(n, rank)
    if n % 2:  # shift by one rank

        def move(r):
            return -1 if r == -1 else (r + 1) % n

        up, down = _btree(n, (rank - 1) % n)
    else:  # mirror

        def move(r):
            return -1 if r == -1 else n - 1 - r

        up, down = _btree(n, n - 1 - rank)
    return first, (move(up), tuple(move(d) for d in down))
