"""The ZeRO-3 timeline model and its figure.

The model all-gathers before each layer's forward and backward.
"""

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.figures.livefig import LiveFigure, Slider
from mylib.figures.timeline_zero3 import ZERO3_TIMELINE_SLIDERS, zero3_timeline_figure
from mylib.models import timeline as tl
from mylib.models.costmodel import ring_all_gather_time
from mylib.models.timeline_zero3 import zero3_step

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
    ddp, plain, ahead = "0", "1", "2"  # the figure's rows
    assert got[(plain, "sent_bytes")] / got[(ddp, "sent_bytes")] == pytest.approx(1.5)
    assert got[(ahead, "sent_bytes")] == got[(plain, "sent_bytes")]
    assert got[(ahead, "step_s")] <= got[(plain, "step_s")] * (1 + 1e-9)
    assert (
        got[(plain, "whole_bytes")] == 2e6 * values["params_per_layer_m"]
    )  # one bf16 layer
    assert (
        got[(ddp, "whole_bytes")]
        == 2e6 * values["params_per_layer_m"] * values["n_layers"]
    )  # all of it


def test_the_figure_can_run_in_the_browser():
    fig = LiveFigure(zero3_timeline_figure, ZERO3_TIMELINE_SLIDERS)
    assert {
        "models.timeline",
        "models.timeline_zero3",
        "figures.timeline_zero3",
        "models.costmodel",
        "models.buckets",
        "figures.svg",
    } <= set(fig.modules)
