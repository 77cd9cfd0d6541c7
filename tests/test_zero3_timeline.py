"""The ZeRO timeline models and their figure.

ZeRO-3 all-gathers before each layer's forward and backward; ZeRO-2 once,
after the step (the paper's) or in the forward (FSDP's
``reshard_after_forward=False``).
"""

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.figures.livefig import LiveFigure, Slider
from mylib.figures.timeline_zero3 import (
    ROWS,
    ZERO3_TIMELINE_SLIDERS,
    layer_gather,
    slider_cluster,
    zero3_timeline_figure,
)
from mylib.models import timeline as tl
from mylib.models.cluster import (
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
    STEP_LATENCY_S,
    Cluster,
    ring,
)
from mylib.models.costmodel import ring_all_gather_time
from mylib.models.timeline_zero3 import cluster_link, zero2_step, zero3_step

layer_counts = st.integers(1, 30)
byte_sizes = st.integers(1_000, 10**9)
seconds = st.floats(1e-5, 0.05)
links = st.builds(
    tl.Link,
    st.sampled_from([2, 4, 8, 64, 512]),
    st.floats(0, 1e-4),
    st.floats(1e8, 1e12),
)


@settings(max_examples=150, deadline=None)
@given(n=layer_counts, nbytes=byte_sizes, backward_s=seconds, link=links)
def test_prefetch_is_never_slower_and_every_layer_is_gathered_twice(
    n, nbytes, backward_s, link
):
    layers = tl.uniform_layers(n, nbytes, backward_s)
    plain, ahead = (
        zero3_step(layers, link, prefetch=False),
        zero3_step(layers, link, prefetch=True),
    )
    assert ahead.step_s <= plain.step_s * (1 + 1e-9)
    for t in (plain, ahead):
        assert (
            t.n_gathers == 2 * n
            and sum(s.kind == "reducescatter" for s in t.spans) == n
        )
        assert t.compute_s == pytest.approx(
            1.5 * n * backward_s
        )  # forward is half the backward
        assert t.waiting_s >= -1e-12
        spans = sorted(
            (s for s in t.spans if s.lane == tl.COMM), key=lambda s: s.start_s
        )
        assert all(
            a.end_s <= b.start_s + 1e-12 for a, b in zip(spans, spans[1:])
        )  # one link, one thing at a time
    # Without prefetch every gather is on the critical path: compute waits for all 2n of
    # them.
    gather = ring_all_gather_time(nbytes, link.ranks, link.alpha_s, link.bandwidth)
    assert plain.waiting_s >= 2 * n * gather * (1 - 1e-9)
    assert plain.peak_gathered_bytes == nbytes
    assert (
        ahead.peak_gathered_bytes == (2 if n > 1 else 1) * nbytes
    )  # at most two layers whole


@given(n=st.integers(2, 30), backward_s=seconds, link=links)
def test_prefetch_hides_all_but_three_transfers_when_the_link_keeps_up(
    n, backward_s, link
):
    """If two transfers fit in one layer's forward, only the first gather of each pass
    and the last reduce-scatter are exposed."""
    nbytes = 1000
    gather = ring_all_gather_time(nbytes, link.ranks, link.alpha_s, link.bandwidth)
    if 2 * gather > 0.5 * backward_s:
        return
    t = zero3_step(tl.uniform_layers(n, nbytes, backward_s), link, prefetch=True)
    assert t.waiting_s == pytest.approx(3 * gather, rel=1e-9, abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(n=layer_counts, nbytes=byte_sizes, backward_s=seconds, link=links)
def test_zero2_gathers_once_after_the_step_or_in_the_forward(
    n, nbytes, backward_s, link
):
    """Both send what DDP sends. After the step, every gather waits.

    Moved into the forward and prefetched, the step is no longer than ZeRO-3's
    with prefetch, and no longer than with the gathers after the step when
    both send as many (one bucket per layer); with many small layers in one
    bucket, one gather per layer pays the latency more often.
    """
    layers = tl.uniform_layers(n, nbytes, backward_s)
    cap = 25 * 2**20
    after = zero2_step(layers, link, cap)
    forward = zero3_step(layers, link, prefetch=True, reshard_after_forward=False)
    zero3 = zero3_step(layers, link, prefetch=True)
    n_buckets = sum(s.kind == "reducescatter" for s in after.spans)
    assert after.n_gathers == n_buckets  # one gather per bucket, after the step
    assert forward.n_gathers == n  # once per layer, before its forward
    for t in (after, forward):
        assert t.compute_s == pytest.approx(1.5 * n * backward_s)
        sent = [s.nbytes for s in t.spans if s.lane == tl.COMM]
        assert sum(sent) == 2 * n * nbytes  # reduce-scatter + all-gather: DDP's
        assert t.peak_gathered_bytes == n * nbytes  # the whole model, whole
    gather = ring_all_gather_time(nbytes, link.ranks, link.alpha_s, link.bandwidth)
    # every gather after the step is exposed (they are per bucket here, the
    # buckets' sizes add up to the model's)
    gathers = [s for s in after.spans if s.kind == "allgather"]
    assert min(s.start_s for s in gathers) >= after.backward_end_s
    assert after.step_s >= after.compute_s + sum(s.duration_s for s in gathers) * (
        1 - 1e-9
    )
    if n_buckets == n:  # as many gathers either way: in the forward, some hide
        assert forward.step_s <= after.step_s * (1 + 1e-9)
    assert forward.step_s <= zero3.step_s * (1 + 1e-9)
    assert forward.waiting_s >= gather * (1 - 1e-9)  # the first gather waits


def test_with_no_communication_cost_zero3_is_pure_compute():
    layers = tl.uniform_layers(8, 1.0, 1e-3)
    t = zero3_step(layers, tl.Link(8, 0.0, 1e30), prefetch=False)
    assert t.step_s == pytest.approx(8 * 1.5e-3) and t.waiting_s == pytest.approx(
        0, abs=1e-12
    )


def metrics(svg):
    root = ET.fromstring(svg)
    return {
        (e.get("data-row"), e.get("data-metric")): float(e.get("data-value"))
        for e in root.iter()
        if e.get("data-metric")
    }


@settings(max_examples=30, deadline=None)
@given(
    positions=st.fixed_dictionaries(
        {s["name"]: st.integers(0, 48) for s in ZERO3_TIMELINE_SLIDERS}
    )
)
def test_figure_zero3_sends_one_and_a_half_times_ddp_and_prefetch_helps(positions):
    values = {
        s.name: s.value_at(positions[s.name])
        for s in (Slider(**d) for d in ZERO3_TIMELINE_SLIDERS)
    }
    got = metrics(zero3_timeline_figure(**values))
    ddp, after, forward, plain, ahead = map(str, range(len(ROWS)))
    assert got[(plain, "sent_bytes")] / got[(ddp, "sent_bytes")] == pytest.approx(1.5)
    assert got[(ahead, "sent_bytes")] == got[(plain, "sent_bytes")]
    assert got[(ahead, "step_s")] <= got[(plain, "step_s")] * (1 + 1e-9)
    model_bytes = 2e6 * values["params_per_layer_m"] * values["n_layers"]
    assert got[(plain, "whole_bytes")] == 2e6 * values["params_per_layer_m"]
    for row in (ddp, after, forward):  # the whole model, whole
        assert got[(row, "whole_bytes")] == model_bytes
    for row in (after, forward):  # ZeRO-2 sends what DDP sends
        assert got[(row, "sent_bytes")] == pytest.approx(got[(ddp, "sent_bytes")])
    # the gather after the step waits, all of it; in the forward it can hide
    assert got[(after, "step_s")] >= got[(ddp, "step_s")] * (1 - 1e-9)
    assert got[(forward, "step_s")] <= got[(ahead, "step_s")] * (1 + 1e-9)


def test_the_figure_can_run_in_the_browser():
    fig = LiveFigure(zero3_timeline_figure, ZERO3_TIMELINE_SLIDERS)
    assert {
        "models.timeline",
        "models.timeline_zero3",
        "figures.timeline_zero3",
        "models.costmodel",
        "models.cluster",
        "models.double_tree",
        "models.buckets",
        "figures.svg",
    } <= set(fig.modules)


# -- on a cluster: nodes of GPUs, NVLink inside, NICs out ---------------------------

S = 1e9  # bytes of one layer, for the hand computations
STEP = STEP_LATENCY_S  # 5 µs per ring step, NVLink or network


@pytest.mark.parametrize(
    "nodes, gpus, nics, nic_bw, nvlink_bw, by_hand",
    [
        # 2 nodes of 2 GPUs, one 10 GB/s NIC each: every rank sends 3/4 S; a node
        # sends one rank's bytes into the network, through its one NIC (75 ms);
        # NVLink carries half a rank's bytes (3.75 ms). 2 NVLink + 1 network steps.
        (2, 2, 1, 10e9, 100e9, 0.75 * S / 10e9 + 3 * STEP),
        # the same with two NICs a node: they share the node's bytes
        (2, 2, 2, 10e9, 100e9, 0.75 * S / 20e9 + 3 * STEP),
        # one node of 4 GPUs: NVLink only, 3 steps
        (1, 4, 1, 10e9, 100e9, 0.75 * S / 100e9 + 3 * STEP),
        # 4 nodes of one GPU: chapter 1's flat link, 3 network steps
        (4, 1, 1, 10e9, 100e9, 0.75 * S / 10e9 + 3 * STEP),
        # 2 nodes of 4 GPUs, 4 NICs of 10 GB/s, slow NVLink (20 GB/s): a node's
        # NICs carry 7/8 S in 21.9 ms, but NVLink 3/4 of 7/8 S in 32.8 ms: it
        # binds. 6 NVLink + 1 network steps.
        (2, 4, 4, 10e9, 20e9, 0.75 * 0.875 * S / 20e9 + 7 * STEP),
    ],
)
def test_a_layers_collectives_on_a_cluster_by_hand(
    nodes, gpus, nics, nic_bw, nvlink_bw, by_hand
):
    cluster = Cluster("hand", nodes, gpus, nvlink_bw, nics, nic_bw)
    ranks = nodes * gpus
    link = cluster_link(cluster, ranks)
    layers = tl.uniform_layers(1, S, 1.0)
    t = zero3_step(layers, link, prefetch=False)
    gathers = [s.duration_s for s in t.spans if s.kind == "allgather"]
    (scatter,) = [s.duration_s for s in t.spans if s.kind == "reducescatter"]
    assert gathers == pytest.approx([by_hand, by_hand], rel=1e-12)
    assert scatter == pytest.approx(by_hand, rel=1e-12)
    # the same as the cluster model's own ring, which the chapter's numbers use
    for op in (ALL_GATHER, REDUCE_SCATTER):
        assert ring(cluster, op, S).seconds == pytest.approx(by_hand, rel=1e-12)
    # DDP's all-reduce on the same link: the two halves
    ddp = tl.simulate(layers, 25 * 2**20, link)
    (all_reduce,) = [s.duration_s for s in ddp.spans if s.kind == "allreduce"]
    assert all_reduce == pytest.approx(2 * by_hand, rel=1e-12)
    assert all_reduce == pytest.approx(ring(cluster, ALL_REDUCE, S).seconds)


def figure_values(**changes):
    return {**{s["name"]: s["default"] for s in ZERO3_TIMELINE_SLIDERS}, **changes}


def test_the_figures_default_is_four_nodes_of_eight_with_one_nic_each():
    """32 ranks, 8 GPUs and one 50 GB/s NIC a node: a 100M-parameter bf16 layer."""
    values = figure_values()
    got = metrics(zero3_timeline_figure(**values))
    gather = 31 / 32 * 200e6 / 50e9 + (28 + 3) * STEP  # 28 NVLink, 3 network steps
    assert got[(None, "gather_s")] == pytest.approx(gather, rel=1e-12)
    cluster = slider_cluster(8, 1, 50, 360)
    assert layer_gather(32, 100, cluster).seconds == pytest.approx(gather)
    assert gather < 5e-3  # a gather (4.03 ms) fits in a layer's forward (5 ms)
    ddp, _, _, plain, ahead = map(str, range(len(ROWS)))
    assert got[(ddp, "sent_bytes")] == pytest.approx(2 * 31 / 32 * 12 * 200e6)
    assert got[(ahead, "waiting_s")] < got[(plain, "waiting_s")] / 5


@pytest.mark.parametrize(
    "changes, faster",
    [
        ({"nics_per_node": 8}, 8),  # DGX H100: a NIC per GPU, 8 times the bytes/s
        ({"nic_gb_s": 12.5}, 1 / 4),  # a 100 Gb/s NIC
        ({"gpus_per_node": 1}, 1),  # one GPU a node: the NIC carries one rank
    ],
)
def test_the_nic_sliders_change_a_gathers_bandwidth_term(changes, faster):
    base = layer_gather(32, 100, slider_cluster(8, 1, 50, 360))
    values = figure_values(**changes)
    cluster = slider_cluster(
        values["gpus_per_node"],
        values["nics_per_node"],
        values["nic_gb_s"],
        values["nvlink_gb_s"],
    )
    moved = layer_gather(32, 100, cluster)
    assert base.bandwidth_s / moved.bandwidth_s == pytest.approx(faster)
    got = metrics(zero3_timeline_figure(**values))
    assert got[(None, "gather_s")] == pytest.approx(moved.seconds, rel=1e-12)


def test_inside_one_node_only_nvlink_matters():
    one_node = [
        metrics(zero3_timeline_figure(**figure_values(ranks=8, **change)))
        for change in ({}, {"nics_per_node": 8}, {"nic_gb_s": 12.5})
    ]
    assert one_node[0] == one_node[1] == one_node[2]
    faster = metrics(zero3_timeline_figure(**figure_values(ranks=8, nvlink_gb_s=720)))
    assert faster[(None, "gather_s")] < one_node[0][(None, "gather_s")]


def test_one_gpu_and_one_nic_a_node_is_chapter_1s_flat_link():
    values = figure_values(gpus_per_node=1, nics_per_node=1, nic_gb_s=25)
    link = cluster_link(slider_cluster(1, 1, 25, 360), values["ranks"])
    assert (link.alpha_s, link.bandwidth) == pytest.approx((STEP, 25e9))
    flat = tl.Link(values["ranks"], STEP, 25e9)
    layers = tl.uniform_layers(4, 200e6, 0.01)
    for prefetch in (False, True):
        a = zero3_step(layers, link, prefetch=prefetch)
        b = zero3_step(layers, flat, prefetch=prefetch)
        assert a.step_s == pytest.approx(b.step_s, rel=1e-12)
