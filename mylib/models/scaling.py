"""Scaling efficiency: what the n-th rank buys, from the timeline model.

Data parallelism splits the *samples*. At a fixed global batch ``B``, each of
``n`` ranks computes ``B / n`` samples, so its forward and backward shrink as
``1 / n``. The gradient does not shrink: every rank all-reduces all ``G``
bytes of it, and a ring all-reduce takes

    T_ring(n) = 2 (n - 1) alpha  +  2 (n - 1) / n * G / beta,

which *grows* with ``n`` towards ``2 G / beta``. While the backward of one rank
is longer than its all-reduce, buckets hide the communication behind it
(chapter 3) and the step time falls as ``1 / n``; once it is shorter, the step
is bound by communication and another rank buys almost nothing.

This module plays that out with :func:`mylib.models.timeline.simulate` (the same
model, the same bucketing rule as ``MyDDP``): the layers of a model measured or
assumed on one rank, scaled to each rank count, give the step time, the exposed
communication, the speed-up and the efficiency (speed-up / n). It also holds the
arithmetic of stragglers (a synchronous step waits for the slowest rank), the
link rates a ring can use (one direction's, not a vendor's two-way total), the
shapes of a real 7B model, and how far the global batch pays to grow (the
critical batch size of McCandlish et al.).

The link is either flat (``alpha_s`` and ``bandwidth``: every rank's ring
traffic on one link of that rate, as on nodes of one GPU) or a
:class:`mylib.models.cluster.Cluster` (``cluster=``): the ring over ``n``
ranks laid on its nodes, NVLink inside and NICs out
(:func:`mylib.models.cluster.ring_alpha_beta`).

Standard library only: it runs in the reader's browser behind the chapter's
sliders (:mod:`mylib.figures.scaling`).
"""

import functools

from mylib.models.buckets import MB
from mylib.models.cluster import ring_alpha_beta
from mylib.models.costmodel import ring_all_reduce_time
from mylib.models.timeline import Layer, Link, _assign, simulate

STRONG = "strong"  # fixed global batch: each rank computes B / n samples
WEAK = "weak"  # fixed batch per rank: the global batch grows with n

# -- links: a ring's beta is the rate of ONE direction -------------------------
#
# In each step of a ring, every rank sends a chunk to its successor while it
# receives one from its predecessor: beta is what one direction carries.
# Vendors often quote the sum of both directions.

#: NVIDIA H100 SXM, fourth-generation NVLink: "900 GB/s" per GPU (NVIDIA's H100
#: datasheet), counted over both directions ("900 GB/s bidirectional per GPU",
#: NVIDIA's Hopper architecture page): 18 links of 25 GB/s each way.
H100_NVLINK_BOTH_WAYS = 900e9
#: What a ring over NVLink can use as beta: half the quoted total.
H100_NVLINK_EACH_WAY = H100_NVLINK_BOTH_WAYS / 2
#: One 400 Gb/s network adapter per GPU (NVIDIA ConnectX-7, InfiniBand NDR, as in
#: a DGX H100), in bytes per second each way: the chapter's "50 GB/s" between nodes.
NIC_400G_EACH_WAY = 400e9 / 8


def ring_link(ranks, alpha_s, bandwidth, cluster=None):
    """``(alpha_s, bandwidth)`` of the ring over ``ranks`` ranks, flat or on a cluster.

    Give ``alpha_s`` and ``bandwidth`` (a flat link), or ``cluster`` with both
    None.
    """
    if cluster is None:
        if alpha_s is None or bandwidth is None:
            raise ValueError("give alpha_s and bandwidth, or cluster=")
        return alpha_s, bandwidth
    if alpha_s is not None or bandwidth is not None:
        raise ValueError("give alpha_s and bandwidth, or cluster=, not both")
    return ring_alpha_beta(cluster, ranks)


def fits(cluster, ranks):
    """Whether ``ranks`` GPUs fill whole nodes of ``cluster`` (or part of one)."""
    g = cluster.gpus_per_node
    return ranks < g or ranks % g == 0


def compute_factor(ranks, mode=STRONG, cores=None):
    """How long one rank computes, relative to one rank on the reference batch.

    ``mode=STRONG`` (fixed global batch): ``1 / ranks``. ``mode=WEAK`` (fixed
    batch per rank): 1. ``cores``: when the ranks share a machine with fewer
    cores than ranks (this book's CPU runs), they take turns, which stretches
    their compute by ``ranks / cores``.
    """
    if int(ranks) != ranks or ranks < 1:
        raise ValueError(f"ranks must be a whole number >= 1, got {ranks}")
    if mode not in (STRONG, WEAK):
        raise ValueError(
            f"mode must be {STRONG!r} (fixed global batch) or {WEAK!r} "
            f"(fixed batch per rank), got {mode!r}"
        )
    factor = 1.0 / ranks if mode == STRONG else 1.0
    if cores is not None:
        if cores < 1:
            raise ValueError(f"cores must be >= 1, got {cores}")
        factor *= max(1.0, ranks / cores)
    return factor


def per_rank_layers(layers, ranks, mode=STRONG, cores=None):
    """``layers`` as each of ``ranks`` ranks computes them.

    ``layers`` hold the backward times on one rank for the reference batch.
    Compute is scaled by :func:`compute_factor`; gradient sizes are not:
    every rank holds and all-reduces the whole gradient.
    """
    factor = compute_factor(ranks, mode, cores)
    if factor == 1.0:  # a fixed batch per rank: the layers as given
        return list(layers)
    return [layer.scaled(factor) for layer in layers]


def scaled_step(
    layers,
    ranks,
    alpha_s,
    bandwidth,
    cap_bytes=25 * MB,
    *,
    mode=STRONG,
    forward_s=0.0,
    optimizer_s=0.0,
    cores=None,
    first_cap_bytes=None,
    cluster=None,
):
    """The timeline of one step on ``ranks`` ranks.

    Returns a :class:`mylib.models.timeline.Timeline`. ``layers`` are in
    backward order with their backward time on ONE rank for the reference
    batch (the global batch for ``mode=STRONG``); ``forward_s`` likewise. The
    optimizer step is not divided: every rank updates every parameter
    (chapter 6 shards it). The link: ``alpha_s`` and ``bandwidth``, or
    ``cluster`` (then both None; see :func:`ring_link`).
    """
    factor = compute_factor(ranks, mode, cores)
    alpha_s, bandwidth = ring_link(ranks, alpha_s, bandwidth, cluster)
    return simulate(
        per_rank_layers(layers, ranks, mode, cores),
        cap_bytes,
        Link(ranks, alpha_s, bandwidth),
        first_cap_bytes=first_cap_bytes,
        forward_s=forward_s * factor,
        optimizer_s=optimizer_s,
        name=f"{ranks} rank{'s' if ranks > 1 else ''}",
    )


def scaling_table(layers, ranks_list, alpha_s, bandwidth, cap_bytes=25 * MB, **options):
    """One row per rank count: step time, its parts, speed-up and efficiency.

    Each row is a dict with ``ranks``, ``compute_s`` (forward + backward of one
    rank), ``backward_s``, ``comm_s`` (the link busy with the buckets'
    all-reduces, overlapped or not), ``exposed_comm_s``, ``step_s``,
    ``speedup`` and ``efficiency``. Speed-up is in samples per second over one
    rank's: ``T(1) / T(n)`` at a fixed global batch, ``n T(1) / T(n)`` at a
    fixed batch per rank; efficiency is speed-up / n. ``options`` (``mode``,
    ``forward_s``, ``optimizer_s``, ``cores``, ``first_cap_bytes``,
    ``cluster``) are those of :func:`scaled_step`, which plays out each row.
    """
    mode = options.get("mode", STRONG)
    forward_s, cores = options.get("forward_s", 0.0), options.get("cores")
    ranks_list = list(ranks_list)
    if not ranks_list:
        raise ValueError("give at least one rank count, e.g. [1, 2, 4, 8]")

    def step(n):
        return scaled_step(layers, n, alpha_s, bandwidth, cap_bytes, **options)

    one = step(1)
    rows = []
    backward_one_s = sum(layer.backward_s for layer in layers)
    for n in ranks_list:
        t = one if n == 1 else step(n)
        factor = compute_factor(n, mode, cores)
        backward_s = backward_one_s * factor
        speedup = one.step_s / t.step_s * (1 if mode == STRONG else n)
        rows.append(
            {
                "ranks": n,
                "compute_s": forward_s * factor + backward_s,
                "backward_s": backward_s,
                "comm_s": t.comm_s,
                "exposed_comm_s": t.exposed_comm_s,
                "step_s": t.step_s,
                "speedup": speedup,
                "efficiency": speedup / n,
            }
        )
    return rows


def transformer_like_layers(grad_bytes, backward_s, n_layers=32, tensors_per_layer=7):
    """What-if layers in backward order: ``n_layers`` blocks of equal weight matrices.

    ``grad_bytes`` in all and ``backward_s`` of backward compute in all, spread
    evenly; 7 tensors a block is a transformer block's query, key, value,
    output and three MLP matrices. For a model you can run, measure instead
    (:mod:`mylib.experiments.tracer`). With the defaults and 14 GB, each tensor holds
    62.5 MB, more than a 25 MiB bucket cap: DDP's rule gives each its own
    bucket, 224 in all (:func:`llama_like_layers` has real shapes).
    """
    if n_layers < 1 or tensors_per_layer < 1:
        raise ValueError(
            "need n_layers >= 1 and tensors_per_layer >= 1, "
            f"got {n_layers} and {tensors_per_layer}"
        )
    tensor_bytes = grad_bytes / (n_layers * tensors_per_layer)
    return [
        Layer(f"block{i}", backward_s / n_layers, [tensor_bytes] * tensors_per_layer)
        for i in reversed(range(n_layers))
    ]


def llama_like_layers(
    backward_s,
    hidden=4096,
    intermediate=11008,
    n_layers=32,
    vocab=32000,
    bytes_per_number=2,
):
    """A Llama-style decoder's gradients in backward order, as timeline layers.

    The defaults are Llama 2 7B's shapes (the ``config.json`` of Hugging Face's
    ``meta-llama/Llama-2-7b-hf``: hidden 4096, MLP 11008, 32 layers, vocabulary
    32000, no biases, an output layer not tied to the embedding), 6.74 B
    parameters, with bf16 gradients. Gradients become ready in the reverse
    order of the forward: the output layer and the final norm, then each block
    from the last (MLP down, up and gate; the norm before it; attention output,
    value, key, query; the block's first norm), the embedding last.
    ``backward_s`` is shared by the matrix multiplications in proportion to
    their parameters; the norms and the embedding (a lookup) get none.
    """
    if min(hidden, intermediate, n_layers, vocab, bytes_per_number) < 1:
        raise ValueError("every shape and bytes_per_number must be >= 1")
    b, h, m = bytes_per_number, hidden, intermediate
    norm, output = b * h, b * vocab * h
    block = [b * h * m] * 3 + [norm] + [b * h * h] * 4 + [norm]
    block_matmul = b * (3 * h * m + 4 * h * h)
    per_byte = backward_s / (n_layers * block_matmul + output)
    return (
        [Layer("output", per_byte * output, [output, norm])]
        + [
            Layer(f"block{i}", per_byte * block_matmul, list(block))
            for i in reversed(range(n_layers))
        ]
        + [Layer("embedding", 0.0, [output])]
    )


def ring_limit_s(grad_bytes, bandwidth):
    """What a ring all-reduce of ``grad_bytes`` tends to as ranks grow: ``2 G / beta``.

    The bandwidth term alone: the latency is not counted.
    """
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    return 2.0 * grad_bytes / bandwidth


def bucket_bytes(layers, cap_bytes=25 * MB, first_cap_bytes=None):
    """Bytes of each bucket ``MyDDP`` (and DDP) would build for these layers."""
    sizes = tuple(b for layer in layers for b in layer.param_bytes)
    return [
        sum(sizes[i] for i in bucket)
        # assign_buckets, remembered: chapter 7 asks at every redraw
        for bucket in _assign(sizes, cap_bytes, first_cap_bytes)
    ]


def bucketed_comm_s(
    layers,
    ranks,
    alpha_s,
    bandwidth,
    cap_bytes=25 * MB,
    first_cap_bytes=None,
    cluster=None,
):
    """Seconds the link is busy per step: one ring all-reduce per bucket.

    ``n_b`` buckets of ``G`` bytes in all cost
    ``2(n-1) n_b alpha + 2(n-1)/n G / beta``: the bandwidth term is the one of
    a single all-reduce, but every bucket pays the latency again. The link as
    for :func:`scaled_step`.
    """
    alpha_s, bandwidth = ring_link(ranks, alpha_s, bandwidth, cluster)
    buckets = bucket_bytes(layers, cap_bytes, first_cap_bytes)
    return sum(ring_all_reduce_time(b, ranks, alpha_s, bandwidth) for b in buckets)


def comm_bound_ranks(
    layers,
    alpha_s,
    bandwidth,
    cap_bytes=25 * MB,
    *,
    mode=STRONG,
    cores=None,
    max_ranks=1 << 16,
    cluster=None,
):
    """The smallest rank count at which one rank's backward is shorter than its comm.

    ``layers`` and the link as for :func:`scaled_step`; on a ``cluster``, only
    rank counts that fill whole nodes (or part of one) are tried. From that
    rank count on, no bucketing can hide the communication: at least the
    difference is exposed. Returns None if it does not happen up to
    ``max_ranks``.
    """
    sizes = tuple(bucket_bytes(layers, cap_bytes))
    backward_s = sum(layer.backward_s for layer in layers)
    for n, comm_s in _comm_s_from_2_ranks(
        sizes, alpha_s, bandwidth, cluster, max_ranks
    ):
        if backward_s * compute_factor(n, mode, cores) < comm_s:
            return n
    return None


def _comm_s_from_2_ranks(sizes, alpha_s, bandwidth, cluster, max_ranks):
    """``(n, comm_s)`` for n = 2, 3, ... ``max_ranks``, in remembered blocks."""
    low = 2
    while low <= max_ranks:
        high = min(2 * low - 1, int(max_ranks))
        yield from _comm_s_by_ranks(sizes, alpha_s, bandwidth, cluster, low, high)
        low = high + 1


@functools.lru_cache(maxsize=64)
def _comm_s_by_ranks(sizes, alpha_s, bandwidth, cluster, low, high):
    """``(n, comm_s)`` for the rank counts ``low`` to ``high`` that fit the cluster.

    ``comm_s``: the buckets of ``sizes`` bytes all-reduced one after another.
    It does not depend on the compute: remembered, in blocks of rank counts
    (2-3, 4-7, 8-15, ...), for the redraws of chapter 7's figure that change
    only the backward.
    """
    distinct = set(sizes)  # buckets of one size cost the same: one call per size
    rows = []
    for n in range(low, high + 1):
        if cluster is not None and not fits(cluster, n):
            continue
        alpha, beta = ring_link(n, alpha_s, bandwidth, cluster)
        per_size = {b: ring_all_reduce_time(b, n, alpha, beta) for b in distinct}
        rows.append((n, sum(per_size[b] for b in sizes)))
    return tuple(rows)


# -- stragglers: a synchronous step waits for the slowest rank ---------------


def synchronous_step_s(compute_s_per_rank, comm_s=0.0):
    """Synchronous step time: the slowest rank's compute, then the communication."""
    compute_s_per_rank = list(compute_s_per_rank)
    if not compute_s_per_rank:
        raise ValueError("give one compute time per rank")
    return max(compute_s_per_rank) + comm_s


def harmonic_number(n):
    """``H_n = 1 + 1/2 + ... + 1/n``."""
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a whole number >= 1, got {n}")
    return sum(1.0 / k for k in range(1, int(n) + 1))


def expected_slowest_delay_s(ranks, mean_delay_s):
    """Expected delay of the slowest of ``ranks`` ranks, each delayed by Exp(mean).

    The maximum of n independent exponential delays of mean ``m`` has mean
    ``m * H_n`` (1.5 m for 2 ranks, 2.08 m for 4, 5.2 m for 100): random
    hiccups that cost one rank little on average cost a synchronous job more
    with every rank added.
    """
    if mean_delay_s < 0:
        raise ValueError(f"mean_delay_s must be >= 0, got {mean_delay_s}")
    return mean_delay_s * harmonic_number(ranks)


# -- how large a global batch pays: the critical batch size -------------------


def steps_to_target(batch, critical_batch):
    """Optimizer steps to reach a given loss at global batch ``batch``: ``S / S_min``.

    McCandlish et al. (2018) found, across many tasks, that the steps ``S`` and
    the samples ``E = B S`` needed to reach a given loss trade off as
    ``(S / S_min - 1)(E / E_min - 1) = 1``; the critical batch size is
    ``B_crit = E_min / S_min``. Solved for the steps: ``1 + B_crit / B``. Far
    below ``B_crit``, doubling the batch halves the steps; far above it, the
    steps stay near ``S_min`` whatever the batch.
    """
    _check_batches(batch, critical_batch)
    return 1.0 + critical_batch / batch


def samples_to_target(batch, critical_batch):
    """Samples (compute) to reach the same loss at batch ``batch``: ``E / E_min``.

    ``1 + B / B_crit`` (see :func:`steps_to_target`): above ``B_crit`` every
    doubling of the batch nearly doubles the compute spent on the same result.
    """
    _check_batches(batch, critical_batch)
    return 1.0 + batch / critical_batch


def _check_batches(batch, critical_batch):
    if batch <= 0 or critical_batch <= 0:
        raise ValueError(
            f"batch and critical_batch must be > 0, got {batch} and {critical_batch}"
        )
