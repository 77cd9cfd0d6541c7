"""The timeline model, its drawing and chapter 3's figures.

mylib.models.timeline, mylib.figures.timeline and mylib.figures.ddp.
"""

import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.figures import ddp as of
from mylib.figures import timeline as ts
from mylib.models import playout
from mylib.models import timeline as tl
from mylib.models.buckets import MB, assign_buckets
from mylib.models.costmodel import ring_all_reduce_time
from mylib.models.layers import transformer_blocks

SVG_NS = "{http://www.w3.org/2000/svg}"


def comm_spans(timeline):
    return [s for s in timeline.spans if s.kind == "allreduce"]


def test_hand_computed_timeline():
    # Three layers of 1 ms each; alpha 0, 2 ranks at 1000 bytes/s: an all-reduce of b
    # bytes takes b/1000 s.
    layers = [
        tl.Layer("c", 1e-3, (1,)),
        tl.Layer("b", 1e-3, (2,)),
        tl.Layer("a", 1e-3, (3,)),
    ]
    link = tl.Link(2, 0.0, 1000.0)
    t = tl.simulate(layers, cap_bytes=0, link=link)
    # bucket 0: ready at 1 ms, 1 ms long; bucket 1: ready at 2 ms, 2 ms long; bucket 2:
    # ready at 3 ms,
    # waits for the link until 4 ms, 3 ms long: ends at 7 ms.
    assert [x for s in comm_spans(t) for x in (s.start_s, s.end_s)] == pytest.approx(
        [1e-3, 2e-3, 2e-3, 4e-3, 4e-3, 7e-3]
    )
    assert [s.ready_s for s in comm_spans(t)] == pytest.approx([1e-3, 2e-3, 3e-3])
    assert t.backward_end_s == pytest.approx(3e-3)
    assert t.step_s == pytest.approx(7e-3)
    assert t.exposed_comm_s == pytest.approx(4e-3)
    assert t.comm_s == pytest.approx(6e-3)
    assert t.overlap == pytest.approx(2 / 6)
    assert t.n_buckets == 3


def test_contention_stretches_overlapping_compute_and_communication():
    # While both run, compute goes 1.5x slower and the all-reduce 2x slower (CPU cores
    # shared, as with gloo).
    layers = [tl.Layer("b", 1e-3, (1,)), tl.Layer("a", 1e-3, (1,))]
    link = tl.Link(2, 0.0, 1000.0, comm_stretch=2.0, compute_stretch=1.5)
    t = tl.simulate(layers, 0, link)
    # 0-1 ms: layer b alone. At 1 ms bucket 0 (1 ms of work) starts; layer a (1 ms of
    # work) now takes
    # 1.5 ms: done at 2.5 ms, when bucket 0 has done 0.75 ms of work. It finishes alone
    # at 2.75 ms;
    # bucket 1 then runs alone until 3.75 ms.
    compute = [s for s in t.spans if s.kind == "backward"]
    assert [x for s in compute for x in (s.start_s, s.end_s)] == pytest.approx(
        [0, 1e-3, 1e-3, 2.5e-3]
    )
    assert [x for s in comm_spans(t) for x in (s.start_s, s.end_s)] == pytest.approx(
        [1e-3, 2.75e-3, 2.75e-3, 3.75e-3]
    )
    assert t.exposed_comm_s == pytest.approx(1.25e-3)
    # No overlap, nothing to stretch: the all-at-end baseline is the same on any
    # machine.
    plain = tl.Link(2, 0.0, 1000.0)
    assert tl.all_at_end(layers, link).step_s == pytest.approx(
        tl.all_at_end(layers, plain).step_s
    )
    with pytest.raises(ValueError, match="must be >= 1"):
        tl.Link(2, 0.0, 1000.0, comm_stretch=0.5)


def test_baselines():
    layers = tl.uniform_layers(4, (8, 1000), 2e-3)
    link = tl.Link(4, 10e-6, 1e6)
    end = tl.all_at_end(layers, link)
    total = sum(layer.nbytes for layer in layers)
    assert end.n_buckets == 1 and end.overlap == 0.0
    assert end.exposed_comm_s == pytest.approx(
        ring_all_reduce_time(total, 4, 10e-6, 1e6)
    )
    assert end.step_s == pytest.approx(8e-3 + end.exposed_comm_s)
    per = tl.per_parameter(layers, link)
    assert per.n_buckets == 8
    assert [s.nbytes for s in comm_spans(per)] == [8, 1000] * 4


def test_buckets_come_from_the_shared_rule():
    layers = tl.uniform_layers(10, (4096, 3 * MB), 1e-3)
    sizes = [b for layer in layers for b in layer.param_bytes]
    for cap in (0, MB, 5 * MB, 25 * MB):
        t = tl.simulate(layers, cap, tl.Link(2, 1e-5, 1e9))
        assert list(map(list, t.buckets)) == assign_buckets(sizes, cap)
        assert [s.nbytes for s in comm_spans(t)] == [
            sum(sizes[i] for i in b) for b in t.buckets
        ]
    t = tl.simulate(layers, 25 * MB, tl.Link(2, 1e-5, 1e9), first_cap_bytes=7 * MB)
    assert list(map(list, t.buckets)) == assign_buckets(sizes, 25 * MB, 7 * MB)


def test_forward_and_optimizer_frame_the_step():
    layers = tl.uniform_layers(3, (MB,), 1e-3)
    link = tl.Link(2, 0.0, 1e9)
    bare = tl.simulate(layers, MB, link)
    full = tl.simulate(layers, MB, link, forward_s=5e-3, optimizer_s=2e-3)
    assert full.step_s == pytest.approx(bare.step_s + 7e-3)
    assert full.exposed_comm_s == pytest.approx(bare.exposed_comm_s)
    assert [s.kind for s in full.spans][0] == "forward" and full.spans[
        -1
    ].kind == "optimizer"


def test_infinitely_fast_network_and_one_rank_hide_nothing():
    layers = tl.uniform_layers(5, (100, 10_000), 1e-3)
    for link in (tl.Link(8, 0.0, 1e30), tl.Link(1, 1e-3, 1.0)):
        t = tl.simulate(layers, 0, link)
        assert t.step_s == pytest.approx(5e-3)
        assert t.exposed_comm_s == pytest.approx(0.0, abs=1e-12)


def test_best_cap_trades_latency_against_the_exposed_tail():
    # Slow per-message latency punishes tiny buckets; one huge bucket exposes
    # everything.
    layers = tl.uniform_layers(32, (4 * 2048, 16 * MB), 3e-3)
    link = tl.Link(8, 200e-6, 10e9)
    best, timelines = tl.best_cap(layers, [0, MB, 25 * MB, 10_000 * MB], link)
    assert best == 25 * MB
    assert (
        timelines[0].step_s > timelines[25 * MB].step_s < timelines[10_000 * MB].step_s
    )


@pytest.mark.parametrize(
    "bad, fix",
    [
        (lambda: tl.Link(0, 1e-6, 1e9), "ranks"),
        (lambda: tl.Link(2, -1, 1e9), "alpha_s"),
        (lambda: tl.Link(2, 1e-6, 0), "bandwidth"),
        (lambda: tl.Layer("x", -1, 10), "backward_s"),
        (lambda: tl.Layer("x", 1e-3, (-5,)), "gradient sizes"),
        (lambda: tl.simulate([], MB, tl.Link(2, 0, 1e9)), "at least one layer"),
        (lambda: tl.simulate([(1e-3, 10)], MB, tl.Link(2, 0, 1e9)), "Layer objects"),
        (lambda: tl.uniform_layers(0, 10, 1e-3), "n_layers"),
    ],
)
def test_bad_input_names_the_fix(bad, fix):
    with pytest.raises((ValueError, TypeError), match=fix):
        bad()


layer_st = st.builds(
    lambda t, sizes: (t, tuple(sizes)),
    st.floats(0, 5e-3),
    st.lists(st.integers(0, 8 * MB), min_size=1, max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(
    raw_layers=st.lists(layer_st, min_size=1, max_size=40),
    cap=st.sampled_from([0, 1, 1000, MB, 5 * MB, 25 * MB]),
    ranks=st.integers(1, 64),
    alpha=st.floats(0, 1e-3),
    bandwidth=st.floats(1e6, 1e12),
)
def test_timeline_invariants(raw_layers, cap, ranks, alpha, bandwidth):
    layers = [tl.Layer(f"l{i}", t, sizes) for i, (t, sizes) in enumerate(raw_layers)]
    link = tl.Link(ranks, alpha, bandwidth)
    t = tl.simulate(layers, cap, link)
    backward = sum(layer.backward_s for layer in layers)
    comm = comm_spans(t)
    eps = 1e-12 * max(1.0, t.step_s)
    # The link carries one all-reduce at a time, in launch order, each after its bucket
    # is ready.
    for a, b in zip(comm, comm[1:]):
        assert b.start_s >= a.end_s - eps
    for span in comm:
        assert span.start_s >= span.ready_s - eps
        assert span.duration_s == pytest.approx(link.allreduce_s(span.nbytes))
    assert t.backward_end_s == pytest.approx(backward)
    assert t.step_s == pytest.approx(max(backward, comm[-1].end_s))
    assert 0.0 <= t.exposed_comm_s <= t.comm_s + eps
    assert 0.0 <= t.overlap <= 1.0 + 1e-9
    # The last bucket holds the first layer's gradients: it cannot start before the
    # backward ends.
    assert t.exposed_comm_s >= comm[-1].duration_s - eps
    # Never worse than sending the same buckets one after another after the backward.
    assert t.step_s <= backward + sum(s.duration_s for s in comm) + eps
    end = tl.all_at_end(layers, link)
    assert end.step_s == pytest.approx(
        backward + link.allreduce_s(sum(layer.nbytes for layer in layers))
    )


def _lanes(timeline):
    """Each lane's spans, in order, as plain tuples."""
    return {
        lane: [
            (s.kind, s.label, s.start_s, s.end_s, s.ready_s, s.bucket, s.nbytes)
            for s in timeline.spans
            if s.lane == lane
        ]
        for lane in (tl.COMPUTE, tl.COMM)
    }


@settings(max_examples=150, deadline=None)
@given(
    raw_layers=st.lists(layer_st, min_size=1, max_size=30),
    cap=st.sampled_from([0, 1, 1000, MB, 5 * MB, 25 * MB]),
    ranks=st.integers(1, 64),
    alpha=st.sampled_from([0.0, 1e-6, 5e-5]),
    bandwidth=st.floats(1e6, 1e12),
    forward_s=st.sampled_from([0.0, 3e-3]),
    optimizer_s=st.sampled_from([0.0, 2e-3]),
    launch_at_end=st.booleans(),
)
def test_the_recurrence_plays_the_event_loop_step(
    raw_layers, cap, ranks, alpha, bandwidth, forward_s, optimizer_s, launch_at_end
):
    """Without interference, _play_in_turn gives the event loop's timeline.

    The same spans on each lane, to rounding (the event loop adds a layer's
    time in pieces), and numbers that are summarize() of those spans exactly.
    """
    layers = [tl.Layer(f"l{i}", t, sizes) for i, (t, sizes) in enumerate(raw_layers)]
    link = tl.Link(ranks, alpha, bandwidth)
    sizes = tuple(b for layer in layers for b in layer.param_bytes)
    buckets = (
        (tuple(range(len(sizes))),) if launch_at_end else tl._assign(sizes, cap, None)
    )
    kwargs = dict(
        launch_at_end=launch_at_end,
        forward_s=forward_s,
        optimizer_s=optimizer_s,
        name="x",
    )
    fast = playout._play_in_turn(layers, buckets, link, **kwargs)
    loop = playout._play_events(layers, buckets, link, **kwargs)
    fast_lanes, loop_lanes = _lanes(fast), _lanes(loop)
    for lane in (tl.COMPUTE, tl.COMM):
        assert len(fast_lanes[lane]) == len(loop_lanes[lane])
        for a, b in zip(fast_lanes[lane], loop_lanes[lane]):
            assert a[:2] == b[:2] and a[5:] == b[5:]
            assert a[2:5] == pytest.approx(b[2:5], rel=1e-12, abs=1e-15)
    for key, value in tl.summarize(fast.spans).items():
        assert getattr(fast, key) == value, key  # the numbers are the spans' own
    for key in tl.METRIC_KEYS:
        assert getattr(fast, key) == pytest.approx(getattr(loop, key), abs=1e-12)


def test_timelines_that_compute_alike_share_their_compute_spans():
    layers = transformer_blocks(4, 2.0)
    link = tl.Link(8, 5e-6, 25e9)
    buckets, alone = tl.simulate(layers, 25 * MB, link), tl.all_at_end(layers, link)
    compute = [[s for s in t.spans if s.lane == tl.COMPUTE] for t in (buckets, alone)]
    assert all(a is b for a, b in zip(*compute))
    # and the drawing lays the lane out once, with the same result as apart
    copies = [
        tl.Timeline(
            [
                tl.Span(
                    s.lane,
                    s.kind,
                    s.start_s,
                    s.end_s,
                    s.label,
                    s.bucket,
                    s.nbytes,
                    s.ready_s,
                )
                for s in t.spans
            ],
            name=t.name,
        )
        for t in (buckets, alone)
    ]
    assert ts.draw_timelines([buckets, alone]) == ts.draw_timelines(copies)


def metrics_in_svg(svg):
    root = ET.fromstring(svg)
    found = {}
    for el in root.iter(f"{SVG_NS}text"):
        if "data-metric" in el.attrib:
            found[(int(el.attrib["data-timeline"]), el.attrib["data-metric"])] = float(
                el.attrib["data-value"]
            )
    return found


def test_drawing_carries_every_number_exactly():
    layers = transformer_blocks(12, 2.0)
    link = tl.Link(8, 20e-6, 10e9)
    rows = [tl.all_at_end(layers, link), tl.simulate(layers, 25 * MB, link)]
    svg = ts.draw_timelines(rows, title="a <test> & title")
    found = metrics_in_svg(
        svg
    )  # also proves the SVG is well-formed XML (title escaped)
    for k, t in enumerate(rows):
        for key in ("step_s", "exposed_comm_s", "overlap", "n_buckets"):
            assert found[(k, key)] == getattr(t, key)
    assert "a &lt;test&gt; &amp; title" in svg


def test_bucketing_figure_matches_the_model():
    values = dict(
        n_layers=10,
        bucket_cap_mb=5.0,
        bandwidth_gb_s=25.0,
        latency_us=50.0,
        backward_ms_per_layer=1.5,
        ranks=16,
    )
    found = metrics_in_svg(ts.bucketing_figure(**values))
    drawn = ts.bucketing_timelines(**values)
    layers = transformer_blocks(10, 1.5)
    link = tl.Link(16, 50e-6, 25e9)
    expected = [
        tl.all_at_end(layers, link),
        tl.per_parameter(layers, link),
        tl.simulate(layers, 5 * MB, link),
    ]
    for k, (d, t) in enumerate(zip(drawn, expected)):
        for key in ("step_s", "exposed_comm_s", "overlap", "n_buckets"):
            assert found[(k, key)] == getattr(d, key)
            assert getattr(d, key) == pytest.approx(getattr(t, key))


def test_step_strip_shows_six_moments_in_order():
    t = tl.simulate(
        transformer_blocks(8, 3.0),
        25 * MB,
        tl.Link(8, 20e-6, 10e9),
        forward_s=10e-3,
        optimizer_s=4e-3,
    )
    moments = of.strip_moments(t)
    assert moments == sorted(moments) and 0 < moments[0] and moments[-1] < t.step_s
    states = [of.bucket_states(t, m) for m in moments]
    assert set(states[0]) == {"filling"} and set(states[-1]) == {"averaged"}
    assert "all-reducing" in states[2]
    assert (
        "filling" not in states[4]
    )  # waiting after the backward: every bucket is full
    svg = of.ddp_step_strip(t)
    ET.fromstring(svg)
    for caption in of.STRIP_CAPTIONS:
        assert caption in svg
    with pytest.raises(ValueError, match="optimizer"):
        of.strip_moments(
            tl.simulate(transformer_blocks(8, 3.0), 25 * MB, tl.Link(8, 20e-6, 10e9))
        )


def test_default_figure_has_the_chapter_story():
    # The chapter's default slider position must show what the text says: buckets beat
    # both baselines.
    found = metrics_in_svg(ts.bucketing_figure())
    end, per, buckets = (found[(k, "step_s")] for k in range(3))
    assert buckets < per < end
    assert found[(2, "overlap")] > 0.8 and not math.isnan(found[(2, "overlap")])
    # ... and that with the default buckets only the last bucket is exposed.
    bucketed = ts.bucketing_timelines()[2]
    assert bucketed.exposed_comm_s == pytest.approx(comm_spans(bucketed)[-1].duration_s)
    assert ts.bucketing_timelines()[1].exposed_comm_s > 10 * bucketed.exposed_comm_s


def test_remembered_number_texts_are_the_computed_ones():
    """The SVG module remembers number texts (redraw speed); no text changes."""
    from mylib.figures import svg

    values = [0.0, -0.0, 1e-7, -0.0123, 0.5, 1.0, 12.345, 1e-6, 3, 2.675]
    for v in values * 2:  # the second pass reads what the first remembered
        for digits in (2, 3):
            assert svg.format_seconds(v, digits) == svg._format(v, digits)
        assert svg._num(v) == svg._num.__wrapped__(v)
    assert (svg.format_seconds(0.0), svg.format_seconds(-0.0)) == ("0 µs", "-0 µs")


def legend_labels(svg):
    """The labels of a timeline figure's legend: the texts on its last line."""
    root = ET.fromstring(svg)
    texts = [el for el in root.iter(f"{SVG_NS}text")]
    bottom = max(float(el.attrib["y"]) for el in texts)
    return [el.text for el in texts if float(el.attrib["y"]) == bottom]


def test_the_legend_lists_only_what_the_figure_draws():
    # chapter 3's figure: backward and all-reduces, no forward, no optimizer
    labels = legend_labels(ts.bucketing_figure())
    assert labels == [
        "backward, per layer",
        "all-reduce, per bucket",
        "exposed communication",
        "backward ends",
    ]
    assert ts.PALETTE["forward"] not in ts.bucketing_figure()
    # a step with a forward and an optimizer lists both
    layers = transformer_blocks(2, 3.0)
    full = tl.simulate(
        layers, 25 * MB, tl.Link(8, 20e-6, 10e9), forward_s=5e-3, optimizer_s=2e-3
    )
    labels = legend_labels(ts.draw_timelines([full]))
    assert labels[:2] == ["forward", "backward, per layer"] and "optimizer" in labels
    # nothing exposed, no red frame in the legend either
    alone = tl.Timeline([tl.Span(tl.COMPUTE, "backward", 0.0, 1e-3, "layer")])
    assert alone.exposed_comm_s == 0
    labels = legend_labels(ts.draw_timelines([alone]))
    assert labels == ["backward, per layer", "backward ends"]


def test_the_readout_tells_apart_steps_a_thousandth_apart():
    # chapter 3's exercise: 100 MB and 200 MB caps at 8 ranks, 1 GB/s, 200 µs
    steps = {
        cap: ts.bucketing_timelines(
            bandwidth_gb_s=1.0, latency_us=200.0, bucket_cap_mb=cap
        )[2].step_s
        for cap in (100.0, 200.0)
    }
    texts = {
        cap: next(
            el.text
            for el in ET.fromstring(
                ts.bucketing_figure(
                    bandwidth_gb_s=1.0, latency_us=200.0, bucket_cap_mb=cap
                )
            ).iter(f"{SVG_NS}text")
            if el.attrib.get("data-metric") == "step_s"
            and el.attrib.get("data-timeline") == "2"
        )
        for cap in steps
    }
    assert steps[200.0] < steps[100.0] < 1.002 * steps[200.0]
    assert texts == {100.0: "step: 2.153 s", 200.0: "step: 2.150 s"}


def test_the_strips_legend_shows_only_the_states_drawn():
    link_keeps_up = tl.Link(8, 50e-6, 25e9)  # chapter 3's strip: nothing queues
    t = tl.simulate(
        transformer_blocks(8, 10.0),
        25 * MB,
        link_keeps_up,
        forward_s=40e-3,
        optimizer_s=10e-3,
    )
    drawn = {s for m in of.strip_moments(t) for s in of.bucket_states(t, m)}
    assert "queued" not in drawn
    svg = of.ddp_step_strip(t)
    assert of.BUCKET_STATES["queued"] not in svg
    # on a slow link buckets queue, and the legend says so
    slow = tl.simulate(
        transformer_blocks(8, 10.0),
        25 * MB,
        tl.Link(8, 50e-6, 2e9),
        forward_s=40e-3,
        optimizer_s=10e-3,
    )
    assert any("queued" in of.bucket_states(slow, m) for m in of.strip_moments(slow))
    assert of.BUCKET_STATES["queued"] in of.ddp_step_strip(slow)
