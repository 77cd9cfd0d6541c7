"""The cluster model (chapters 1, 6, 7): byte counts by enumeration, and the table.

The ring, tree and hierarchical schedules are checked against byte counts made
by walking every send of the schedule on small topologies (hypothesis over
nodes, GPUs per node, NICs per node); DDP's, FSDP's and HSDP's traffic per GPU
and per NIC against chapter 6's counts and hand-computed figures; the model
against the published NCCL measurements of ``mylib.models.nccl_published``.
"""

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.models import double_tree
from mylib.models.cluster import (
    ALL_GATHER,
    ALL_REDUCE,
    GB,
    PRESETS,
    REDUCE_SCATTER,
    Cluster,
    bus_factor,
    dgx_a100,
    dgx_h100,
    hierarchical_all_reduce,
    nic_each_way,
    nvlink_each_way,
    one_nic_nodes,
    ring,
    ring_alpha_beta,
    tree_all_reduce,
)
from mylib.models.costmodel import ring_all_reduce_time
from mylib.models.memory import fsdp_comm_per_step
from mylib.models.nccl_published import MEASUREMENTS, TARGET, comparison_rows
from mylib.models.step_traffic import (
    ddp_traffic,
    fsdp_traffic,
    hsdp_traffic,
    step_totals,
)

PASSES = {ALL_REDUCE: 2, REDUCE_SCATTER: 1, ALL_GATHER: 1}


def _cluster(nodes, gpus, nics, nvlink=300e9, nic=25e9):
    return Cluster("test", nodes, gpus, nvlink, nics, nic)


def _walk_ring(nodes, gpus, nics, op, nbytes, per_group=None):
    """Every send of NCCL-style rings: bytes per GPU on NVLink, per NIC, per node.

    Groups of ``per_group`` GPUs of every node (``gpus / per_group`` of them at
    once). Each group runs ``per_group * nics`` channels; channel c visits each
    node's GPUs in order starting at GPU ``c % per_group``, so that the last
    one, the node's exit, differs per channel, and its exit goes out through
    NIC ``(group * channels + c) % nics``. In each channel every rank sends
    ``passes * (n - 1)`` chunks of ``S / channels / n`` to its successor.
    """
    p = gpus if per_group is None else per_group
    channels = p * nics
    n = nodes * p
    nvlink, nic, node = Counter(), Counter(), Counter()
    for group in range(gpus // p):
        members = [group * p + i for i in range(p)]  # local GPU ids of this group
        for c in range(channels):
            order = [
                (node_, members[(c + i) % p])
                for node_ in range(nodes)
                for i in range(p)
            ]
            sent = PASSES[op] * (n - 1) * nbytes / channels / n
            for i, (node_, gpu) in enumerate(order):
                succ_node, _ = order[(i + 1) % n]
                if n == 1:
                    continue
                if succ_node == node_:
                    nvlink[node_, gpu] += sent
                else:
                    nic[node_, (group * channels + c) % nics] += sent
                    node[node_] += sent
    return nvlink, nic, node


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 5),
    gpus=st.sampled_from([1, 2, 4, 8]),
    nics=st.sampled_from([1, 2, 4, 8]),
    op=st.sampled_from([ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER]),
    shard=st.sampled_from([None, 1, 2]),
)
def test_ring_bytes_match_a_walk_of_every_send(nodes, gpus, nics, op, shard):
    if shard is not None and gpus % shard:
        shard = None
    nbytes = 3.0 * 2**20
    cost = ring(_cluster(nodes, gpus, nics), op, nbytes, shard)
    nvlink, nic, node = _walk_ring(nodes, gpus, nics, op, nbytes, shard)
    p = gpus if shard is None else shard
    n = nodes * p
    assert cost.ranks == n
    assert cost.gpu_bytes == pytest.approx(PASSES[op] * (n - 1) / n * nbytes)
    assert cost.nvlink_bytes == pytest.approx(max(nvlink.values(), default=0.0))
    assert cost.nic_bytes == pytest.approx(max(nic.values(), default=0.0))
    assert cost.node_bytes == pytest.approx(max(node.values(), default=0.0))
    # Every GPU sends alike and every NIC carries alike: the rings are balanced.
    assert len(set(round(v) for v in nvlink.values())) <= 1
    assert len(set(round(v) for v in nic.values())) <= 1
    if nodes > 1 and shard is None:
        # A node sends one rank's bytes: the same whatever its GPUs.
        assert cost.node_bytes == pytest.approx(cost.gpu_bytes)


def test_ring_on_dgx_nodes_runs_at_the_nics_together():
    """The review's example: 14 GB on 64 ranks of DGX H100, about 70 ms, not 551."""
    grad = 14e9
    dgx = ring(dgx_h100(8), ALL_REDUCE, grad)
    assert dgx.bottleneck == "nic"
    assert dgx.bandwidth_s == pytest.approx(2 * 63 / 64 * grad / 400e9)
    assert dgx.peak_busbw == pytest.approx(400e9)  # 8 NICs of 50 GB/s
    one_nic = ring(one_nic_nodes(8), ALL_REDUCE, grad)
    assert one_nic.bandwidth_s == pytest.approx(0.55125)  # the chapter's old figure
    # ... which is also what nodes of one GPU give: the flat ring of chapter 1.
    flat = ring(_cluster(64, 1, 1, nic=50e9), ALL_REDUCE, grad)
    assert flat.bandwidth_s == pytest.approx(one_nic.bandwidth_s)
    assert 2 * grad / 50e9 == pytest.approx(0.56)  # the widely quoted 0.56 s


def test_ring_inside_one_node_is_nvlink_only():
    cost = ring(dgx_h100(1), ALL_REDUCE, 1e9)
    assert cost.nic_bytes == cost.node_bytes == 0.0 and cost.bottleneck == "nvlink"
    assert cost.peak_busbw == pytest.approx(nvlink_each_way(18))
    # NVLink binds across nodes only when the NICs outrun g/(g-1) x NVLink.
    fast = Cluster("fast NICs", 2, 8, 100e9, 8, 50e9)
    assert ring(fast, ALL_REDUCE, 1e9).peak_busbw == pytest.approx(100e9 * 8 / 7)


@settings(max_examples=40, deadline=None)
@given(nodes=st.integers(1, 6), gpus=st.sampled_from([1, 2, 8]), nics=st.integers(1, 8))
def test_ring_alpha_beta_is_the_ring(nodes, gpus, nics):
    cluster = Cluster("t", 1, gpus, 240e9, nics, 25e9, 3e-6, 7e-6)
    ranks = nodes * gpus
    alpha, beta = ring_alpha_beta(cluster, ranks)
    laid = cluster.for_ranks(ranks)
    for nbytes in (1e3, 1e8):
        assert ring_all_reduce_time(nbytes, ranks, alpha, beta) == pytest.approx(
            ring(laid, ALL_REDUCE, nbytes).seconds
        )


def test_latency_counts_nvlink_and_network_steps_as_nccl_does():
    cluster = Cluster("t", 4, 8, 240e9, 8, 25e9, 1e-6, 10e-6)
    cost = ring(cluster, ALL_REDUCE, 0.0)
    # 2 (n - N) NVLink steps and 2 (N - 1) network steps (NCCL's tuning.cc).
    assert cost.latency_s == pytest.approx(2 * (32 - 4) * 1e-6 + 2 * 3 * 10e-6)
    tree = tree_all_reduce(cluster, 0.0)
    assert tree.latency_s == pytest.approx(2 * (7 * 1e-6 + 2 * 10e-6))


def test_bus_factor_is_nccl_tests():
    assert bus_factor(ALL_REDUCE, 8) == 2 * 7 / 8
    assert bus_factor(REDUCE_SCATTER, 8) == bus_factor(ALL_GATHER, 8) == 7 / 8
    cost = ring(dgx_a100(1), ALL_REDUCE, 2**30)
    assert cost.algbw == pytest.approx(2**30 / cost.seconds)
    assert cost.busbw == pytest.approx(cost.algbw * 2 * 7 / 8)
    with pytest.raises(ValueError, match="op must be"):
        bus_factor("broadcast", 4)


# -- NCCL's double binary tree -------------------------------------------------


def test_btree_is_nccls_illustration():
    """trees.cc draws the 14-rank tree: 0-8, 8-{4,12}, 4-{2,6}, 12-{10,13}, ..."""
    tree = {r: double_tree._btree(14, r) for r in range(14)}
    assert tree[0] == (-1, (-1, 8))
    assert tree[8] == (0, (4, 12))
    assert tree[4] == (8, (2, 6))
    assert tree[12] == (8, (10, 13))
    assert tree[2] == (4, (1, 3)) and tree[13] == (12, (-1, -1))


@given(st.integers(1, 40))
def test_double_tree_is_two_spanning_trees(nodes):
    sends = double_tree.tree_node_sends(nodes)
    for which in (0, 1):
        parents = {r: double_tree._dtree(nodes, r)[which][0] for r in range(nodes)}
        assert sum(p == -1 for p in parents.values()) == 1  # one root
        for r in range(nodes):  # parent and child agree
            for child in double_tree._dtree(nodes, r)[which][1]:
                if child >= 0:
                    assert parents[child] == r
    # each tree edge carries S/2 up and S/2 down: 2 (N - 1) x S/2 x 2 trees
    assert sum(sends) == pytest.approx(2 * (nodes - 1))
    assert max(sends) <= 2  # a node is inner in one tree at most


def test_tree_on_two_nodes_sends_half_what_the_ring_sends():
    """NVIDIA/nccl#209: on 2 nodes the tree puts less on the network, more on NVLink."""
    cluster = Cluster("t", 2, 8, 240e9, 8, 25e9)
    tree = tree_all_reduce(cluster, 1e9)
    ring_ = ring(cluster, ALL_REDUCE, 1e9)
    assert tree.node_bytes == pytest.approx(1e9)  # S per node
    assert ring_.node_bytes == pytest.approx(2 * 15 / 16 * 1e9)
    assert tree.nvlink_bytes == pytest.approx(2 * 7 / 8 * 1e9)  # the chain
    # NIC-bound on slow NICs: busbw above the NICs' rate, by 2 (n-1)/n at most.
    slow = Cluster("slow", 2, 8, 240e9, 1, 12.5e9)
    assert tree_all_reduce(slow, 1e9).peak_busbw == pytest.approx(12.5e9 * 2 * 15 / 16)
    # From 3 nodes on, the tree's busiest node sends as much as a ring's node.
    for nodes in (4, 8, 16):
        many = Cluster("t", nodes, 8, 240e9, 8, 25e9)
        assert tree_all_reduce(many, 1e9).node_bytes == pytest.approx(2e9)
        assert ring(many, ALL_REDUCE, 1e9).node_bytes < 2e9


# -- the hierarchical schedule -------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    nodes=st.integers(2, 6),
    gpus=st.sampled_from([2, 4, 8]),
    nics=st.sampled_from([1, 2, 8]),
)
def test_hierarchical_bytes_by_hand(nodes, gpus, nics):
    """Reduce-scatter in the node, rail all-reduces across, all-gather in the node."""
    nbytes = 8e6
    cost = hierarchical_all_reduce(_cluster(nodes, gpus, nics), nbytes)
    shard = nbytes / gpus
    inside = (gpus - 1) / gpus * nbytes  # each of reduce-scatter and all-gather
    across_gpu = 2 * (nodes - 1) / nodes * shard
    assert cost.nvlink_bytes == pytest.approx(2 * inside)
    assert cost.node_bytes == pytest.approx(gpus * across_gpu)
    assert cost.nic_bytes == pytest.approx(gpus * across_gpu / nics)
    assert cost.gpu_bytes == pytest.approx(2 * inside + across_gpu)
    # A node sends 2 (N-1)/N x S across; the ring 2 (n-1)/n x S, which is
    # 2 (g-1)/g x S/N more: nearly half more on 2 nodes, little on many.
    flat = ring(_cluster(nodes, gpus, nics), ALL_REDUCE, nbytes)
    assert cost.node_bytes < flat.node_bytes
    gap = 2 * (gpus - 1) / gpus * nbytes / nodes
    assert flat.node_bytes - cost.node_bytes == pytest.approx(gap)


def test_hierarchical_against_the_ring_as_chapter_1_says():
    """8 GB on nodes of 8: bytes per node, and which is faster on which nodes."""
    size = 8e9

    def both(cluster):
        return ring(cluster, ALL_REDUCE, size), hierarchical_all_reduce(cluster, size)

    ring2, hier2 = both(dgx_h100(2))
    ring8, hier8 = both(dgx_h100(8))
    assert (ring2.node_bytes, hier2.node_bytes) == pytest.approx((15e9, 8e9))
    assert (ring8.node_bytes, hier8.node_bytes) == pytest.approx((15.75e9, 14e9))
    # DGX H100: eight NICs outrun NVLink, so the two NVLink phases make it slower.
    assert hier2.seconds > ring2.seconds and hier8.seconds > ring8.seconds
    # One NIC a node: the saved bytes win on 2 nodes; on 8 the two are even.
    ring2, hier2 = both(one_nic_nodes(2))
    ring8, hier8 = both(one_nic_nodes(8))
    assert hier2.seconds < ring2.seconds
    assert hier8.seconds == pytest.approx(ring8.seconds, rel=0.02)


# -- DDP, FSDP and HSDP on the cluster -----------------------------------------


def test_fsdp_and_hsdp_per_gpu_bytes_are_chapter_6s():
    psi, nodes, g = 7.5e9, 4, 8
    cluster = dgx_h100(nodes)
    flat = fsdp_traffic(cluster, psi)
    for name, (ranks, nbytes) in fsdp_comm_per_step(psi, nodes * g).items():
        assert flat[name].gpu_bytes == pytest.approx(nbytes)
        assert flat[name].ranks == ranks
    hsdp = hsdp_traffic(cluster, psi)
    for name, (ranks, nbytes) in fsdp_comm_per_step(psi, g, replicas=nodes).items():
        assert hsdp[name].gpu_bytes == pytest.approx(nbytes)
        assert hsdp[name].ranks == ranks
    hpz = fsdp_traffic(cluster, psi, reshard_to=g)
    back = fsdp_comm_per_step(psi, nodes * g, reshard_to=g)["backward all-gather"]
    assert hpz["backward all-gather"].gpu_bytes == pytest.approx(back[1])
    assert hpz["backward all-gather"].nic_bytes == 0.0


def test_hsdp_saves_a_third_per_nic_not_tenfold():
    """7.5B on 4 nodes of 8: per NIC 7.27 GB (flat FSDP) against 5.63 GB (HSDP)."""
    psi = 7.5e9
    for cluster, flat_nic, hsdp_nic in (
        (dgx_h100(4), 7.265625e9, 5.625e9),  # one NIC per GPU
        (one_nic_nodes(4), 58.125e9, 45e9),  # one NIC per node
    ):
        flat = step_totals(fsdp_traffic(cluster, psi))
        hsdp = step_totals(hsdp_traffic(cluster, psi))
        assert flat["nic_bytes"] == pytest.approx(flat_nic)
        assert hsdp["nic_bytes"] == pytest.approx(hsdp_nic)
        assert flat["nic_bytes"] / hsdp["nic_bytes"] == pytest.approx(7.75 / 6)
        # Per GPU both send the same bytes; HSDP's stay on NVLink.
        assert flat["gpu_bytes"] == pytest.approx(hsdp["gpu_bytes"])
    # The review's "10.3x" counted per GPU every byte of a node-spanning group:
    per_gpu_flat = sum(b for _, b in fsdp_comm_per_step(psi, 32).values())
    per_gpu_across_hsdp = fsdp_comm_per_step(psi, 8, replicas=4)["all-reduce"][1]
    assert per_gpu_flat / per_gpu_across_hsdp == pytest.approx(10.33, abs=0.01)


def test_ddp_traffic_and_tensor_parallel_beside_it():
    grad = 14e9
    for cluster in (dgx_h100(8), one_nic_nodes(8)):
        dp64 = ddp_traffic(cluster, grad)["all-reduce"]
        # TP 8 in the node, DP 8 across: GPU r all-reduces its 1/8 with GPU r of
        # every node, 8 such rings at once on the node's NICs.
        dp8 = ring(cluster, ALL_REDUCE, grad / 8, 1)
        ratio = dp64.bandwidth_s / dp8.bandwidth_s
        assert ratio == pytest.approx((63 / 64) / (7 / 8))  # 1.125, not 9
    assert ddp_traffic(dgx_h100(2), grad, "tree")["all-reduce"].algorithm == "tree"
    with pytest.raises(ValueError, match="'ring' or 'tree'"):
        ddp_traffic(dgx_h100(2), grad, "nvls")


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="nodes must be an int"):
        Cluster("x", 0, 8, 1e9, 1, 1e9)
    with pytest.raises(ValueError, match="bytes/s each way"):
        Cluster("x", 1, 8, 0.0, 1, 1e9)
    with pytest.raises(ValueError, match="do not fill nodes"):
        dgx_h100().for_ranks(12)
    with pytest.raises(ValueError, match="gpus_per_group must divide"):
        ring(dgx_h100(2), ALL_REDUCE, 1e9, 3)
    with pytest.raises(ValueError, match="reshard_to must divide"):
        fsdp_traffic(dgx_h100(2), 1e9, reshard_to=3)
    assert dgx_h100().for_ranks(4).gpus_per_node == 4
    assert dgx_h100().for_ranks(32).nodes == 4


# -- the published measurements ------------------------------------------------


def test_presets_are_the_vendors_numbers():
    assert nic_each_way(400) == 50e9 and nic_each_way(200) == 25e9
    assert nvlink_each_way(12) == 240e9  # A100: 12 links x 25 GB/s x 0.8
    assert nvlink_each_way(18) == 360e9  # H100: 18 links
    assert dgx_a100().nics_per_node == dgx_h100().nics_per_node == 8
    for name, make in PRESETS.items():
        assert make(3).name == name and make(3).ranks == 24


def test_the_model_against_published_measurements():
    rows = comparison_rows()
    assert len(rows) >= 8
    matched = [r for r in rows if r["matches"]]
    assert len(matched) >= 8
    for row in matched:
        assert abs(row["error"]) <= TARGET, row
    for row in rows:
        assert row["url"].startswith("https://github.com/NVIDIA/nccl")
        assert row["hardware"] and row["says"]
        assert row["matches"] or row["why"]  # where it cannot match, it says why
        assert row["kind"] in ("measured", "expected")
    # Most matched rows are runs, not an engineer's expectation.
    measured = [r for r in matched if r["kind"] == "measured"]
    assert len(measured) >= 7 and len(measured) > len(matched) / 2
    # Across nodes every figure sits a little below the NICs' rated speed.
    for row in matched:
        if row["nodes"] > 1:
            assert 0.9 < row["measured_gb_s"] / row["predicted_gb_s"] < 1, row
    # Rows whose thread names no algorithm are priced as a ring, and say so.
    unstated = [r for r in rows if not r["stated"]]
    assert unstated and all(r["algorithm"] == "ring" for r in unstated)
    assert all("algorithm" in r["says"] for r in unstated)
    # Where it cannot match, the direction is as explained:
    by = {(m.source, m.algorithm): m for m in MEASUREMENTS}
    nvls = by["NVIDIA/nccl-tests#212", "nvls"]
    assert nvls.measured > nvls.predicted  # the switch adds; no ring can show it
    assert nvls.measured > nvls.cluster.nvlink_bw  # busbw above NVLink's own rate
    two_nodes = by["NVIDIA/nccl#837", "tree"]
    ring_bound = two_nodes.cluster.node_nic_bw
    assert ring_bound < two_nodes.measured < two_nodes.predicted
    five = by["NVIDIA/nccl#1368", "tree"]
    assert five.measured < by["NVIDIA/nccl#1368", "ring"].measured
    assert five.predicted <= by["NVIDIA/nccl#1368", "ring"].predicted


def test_predictions_do_not_depend_on_the_node_count_of_a_ring():
    """Across nodes a ring's busbw is the node's NICs: the row's node count is moot."""
    for nodes in (2, 3, 12, 64):
        assert ring(dgx_a100(nodes), ALL_REDUCE, 2**33).peak_busbw == pytest.approx(
            200e9
        )
    assert math.isinf(ring(dgx_a100(1), ALL_REDUCE, 0.0).peak_busbw)
    assert GB == 1e9
