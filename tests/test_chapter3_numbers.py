"""The numbers chapter 3 states in words, from the model.

The numbers of the self-test, the "things to try" and the exercises' key points.

The chapter's code cells compute and assert what they print; these are the
figures its Markdown states, so a change to the model or the figure's layers
that makes the prose wrong fails here.
"""

import pytest

from mylib.figures.svg import format_seconds
from mylib.figures.timeline import BUCKETING_SLIDERS, bucketing_timelines
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.layers import BLOCK, BLOCK_BYTES, transformer_blocks

DEFAULTS = {s["name"]: s["default"] for s in BUCKETING_SLIDERS}
CAPS_OFFERED = [cap for _, cap in BUCKETING_SLIDERS[1]["options"]]


def offered(name):
    spec = next(s for s in BUCKETING_SLIDERS if s["name"] == name)
    if "options" in spec:
        return [value for _, value in spec["options"]]
    return [
        spec["min"] + k * spec["step"]
        for k in range(int((spec["max"] - spec["min"]) / spec["step"]) + 1)
    ]


def test_the_prose_describes_the_figure_defaults():
    # "a stack of GPT-2-style transformer blocks ...: 12 parameter tensors and 48 MiB
    # of fp32 gradients per block" (50.4 million bytes: MiB, not MB)
    assert sum(len(sizes) for _, sizes in BLOCK) == 12
    assert round(BLOCK_BYTES / MB) == 48 and round(BLOCK_BYTES / 1e6, 1) == 50.4
    assert DEFAULTS == {
        "n_layers": 24,
        "bucket_cap_mb": 25.0,
        "bandwidth_gb_s": 25.0,
        "latency_us": 50.0,
        "backward_ms_per_layer": 10.0,
        "ranks": 8,
    }


def test_every_slider_position_the_text_names_is_offered():
    # Things to try (200 µs, 400 MB, 5 GB/s, 4 ms, 256 ranks) and exercise ex-3-best-cap
    # (8 ranks, 1 GB/s, 200 µs).
    assert 200.0 in offered("latency_us") and 400.0 in offered("bucket_cap_mb")
    assert 5.0 in offered("bandwidth_gb_s") and 1.0 in offered("bandwidth_gb_s")
    assert (
        4.0 in offered("backward_ms_per_layer")
        and 256 in offered("ranks")
        and 8 in offered("ranks")
    )


def test_exercise_best_cap_key_points():
    layers = transformer_blocks(24, 10.0)
    link = tl.Link(8, 200e-6, 1e9)
    # "every all-reduce now pays 2 * 7 * 200 µs = 2.8 ms ... 288 of them ... about 0.8
    # s"
    assert link.allreduce_s(0) == pytest.approx(2.8e-3)
    assert len(layers) * 2 == 288 and 288 * link.allreduce_s(0) == pytest.approx(
        0.8, abs=0.01
    )
    # "one block's 48 MB (50.4 million bytes) need ... about 88 ms"
    assert link.allreduce_s(BLOCK_BYTES) - link.allreduce_s(0) == pytest.approx(
        88e-3, abs=0.5e-3
    )
    best, timelines = tl.best_cap(layers, [cap * MB for cap in CAPS_OFFERED], link)
    step = {cap: timelines[cap * MB].step_s for cap in CAPS_OFFERED}
    # "the best is 200 MiB (2.150 s, against 2.153 s at 100 MiB, 2.93 s per parameter
    # and 2.22 s at 25 MiB); 400 MiB ... (2.18 s)": the figure's readout prints
    # four digits, so the reader sees 100 and 200 MiB apart
    assert best == 200 * MB
    assert (
        round(step[200.0], 2),
        round(step[0.0], 2),
        round(step[25.0], 2),
        round(step[400.0], 2),
    ) == (2.15, 2.93, 2.22, 2.18)
    assert format_seconds(step[200.0], 4) == "2.150 s"
    assert format_seconds(step[100.0], 4) == "2.153 s"
    # "100 and 200 MiB are 3 ms apart"
    assert round((step[100.0] - step[200.0]) * 1e3) == 3
    # "the step shrinks as the cap grows": never longer from one offered cap to the
    # next, up to the best
    upto = [step[c] for c in CAPS_OFFERED if c <= 200.0]
    assert all(b <= a for a, b in zip(upto, upto[1:]))


def test_exercise_first_bucket_key_points():
    layers = transformer_blocks(24, 10.0)
    link = tl.Link(8, 50e-6, 25e9)
    small, large = (
        tl.simulate(layers, 25 * MB, link, first_cap_bytes=cap * MB) for cap in (1, 25)
    )
    first_start = [
        next(s for s in t.spans if s.kind == "allreduce").start_s
        for t in (small, large)
    ]
    # "3.3 ms instead of 6.7 ms": after mlp.c_proj, then also mlp.c_fc, each a third of
    # a block
    assert [round(t * 1e3, 1) for t in first_start] == [3.3, 6.7]
    last_small, last_large = (
        [s for s in t.spans if s.kind == "allreduce"][-1] for t in (small, large)
    )
    # "a 16 MB last bucket, whose all-reduce is all that is exposed (1.9 ms)"
    assert round(last_small.nbytes / MB) == 16
    assert small.exposed_comm_s == pytest.approx(last_small.duration_s)
    assert round(small.exposed_comm_s * 1e3, 1) == 1.9
    # "a last bucket of 8 KB but a large one before it ... runs past the backward: 3.8
    # ms exposed"
    assert last_large.nbytes == 8 * 1024
    assert large.exposed_comm_s > 2 * last_large.duration_s
    assert round(large.exposed_comm_s * 1e3, 1) == 3.8
    # "When the link is the bottleneck (1 GB/s), the 3.3 ms the link lost at the start
    # land on the exposed tail"
    slow = tl.Link(8, 50e-6, 1e9)
    small, large = (
        tl.simulate(layers, 25 * MB, slow, first_cap_bytes=cap * MB) for cap in (1, 25)
    )
    assert (large.exposed_comm_s - small.exposed_comm_s) == pytest.approx(
        first_start[1] - first_start[0], rel=0.01
    )


def test_first_bucket_makes_no_difference_when_the_last_layer_fills_both_caps():
    # "zero when both caps close the first bucket at the same gradient (a last layer of
    # 25 MB or more)"
    layers = [tl.Layer(f"l{i}", 1e-3, (26 * MB,)) for i in range(4)]
    link = tl.Link(8, 50e-6, 25e9)
    small, large = (
        tl.simulate(layers, 25 * MB, link, first_cap_bytes=cap * MB) for cap in (1, 25)
    )
    assert small.buckets == large.buckets and small.step_s == large.step_s


def test_things_to_try_per_parameter_pays_latency_per_tensor():
    end, per_param, buckets = bucketing_timelines()
    assert per_param.n_buckets == 288 and buckets.n_buckets == 37
    assert buckets.step_s < per_param.step_s < end.step_s
