"""The emulated link: what each bucket waits for (a fake clock), and that it changes
when the gradients arrive, never what they are."""

import threading
import time

import pytest
import torch

from mylib import run_ranks
from mylib.experiments.calibrate import ALL_AT_END, model_for
from mylib.experiments.emulated import (
    CAPS,
    REFERENCE_RANKS,
    cluster_ratios,
    compare_on_own_backward,
    emulated_equals_plain,
    link_for,
    link_summary,
    u_shape,
)
from mylib.experiments.emulated_link import EmulatedLink, SleepingTimer, bandwidth_for
from mylib.figures.emulated_link import cap_sweep_figure
from mylib.figures.timeline import bucketing_timelines
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.cluster import dgx_h100


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeTimer:
    """Holds every call until the test moves the clock past its time."""

    def __init__(self, clock):
        self.clock, self.pending = clock, []

    def call_at(self, when_s, fn):
        if when_s <= self.clock():
            fn()
        else:
            self.pending.append((when_s, fn))

    def advance_to(self, t):
        self.clock.now = t
        due = sorted((p for p in self.pending if p[0] <= t), key=lambda p: p[0])
        self.pending = [p for p in self.pending if p[0] > t]
        for _, fn in due:
            fn()


class FakeBucket:
    def __init__(self, index, numel):
        self._index, self.flat = index, torch.full((numel,), float(index))

    def buffer(self):
        return self.flat

    def index(self):
        return self._index


def done_hook(state, bucket):
    """A real all-reduce that is over at once: its future is already complete."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def fake_link(ranks=2, alpha_s=1e-3, bandwidth=1e6, inner=done_hook):
    clock = FakeClock()
    timer = FakeTimer(clock)
    return EmulatedLink(
        ranks, alpha_s, bandwidth, inner=inner, clock=clock, timer=timer
    ), timer


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_transfer_takes_the_ring_time_of_the_model(ranks):
    link, _ = fake_link(ranks)
    t = link.book(1_000_000, launched_s=0.0)
    # 2(n-1) messages of alpha, and 2(n-1)/n x the bytes at beta
    by_hand = 2 * (ranks - 1) * 1e-3 + 2 * (ranks - 1) / ranks * 1_000_000 / 1e6
    assert (t.start_s, t.done_s) == (0.0, pytest.approx(by_hand))
    assert t.done_s == tl.Link(ranks, 1e-3, 1e6).allreduce_s(1_000_000)
    # latency alone, for an empty bucket
    assert link.book(0, launched_s=10.0).done_s == pytest.approx(
        10.0 + 0.002 * (ranks - 1)
    )


def test_the_link_is_first_in_first_out():
    link, _ = fake_link()  # 2 ranks: a transfer takes 2 ms + bytes / 1 MB/s
    first = link.book(1_000_000, launched_s=0.0)  # on the link 0 to 1.002 s
    second = link.book(500_000, launched_s=0.5)  # launched while the first is on
    third = link.book(0, launched_s=0.6)
    later = link.book(0, launched_s=5.0)  # the link is idle by then
    assert second.start_s == first.done_s and second.done_s == pytest.approx(
        first.done_s + 0.502
    )
    assert third.start_s == second.done_s
    assert third.done_s == pytest.approx(second.done_s + 0.002)
    assert (later.start_s, later.done_s) == (5.0, pytest.approx(5.002))
    assert list(link.transfers) == [first, second, third, later]


def test_each_bucket_is_delivered_when_the_link_has_carried_it():
    link, timer = fake_link()
    a, b = FakeBucket(0, 250_000), FakeBucket(1, 125_000)  # 1 MB and 0.5 MB of fp32
    timer.clock.now = 1.0
    fa = link(None, a)
    timer.clock.now = 1.1
    fb = link(None, b)  # waits for a's transfer, then its own
    assert [t.bucket for t in link.transfers] == [0, 1]
    done_a, done_b = (t.done_s for t in link.transfers)
    assert done_a == pytest.approx(1.0 + 0.002 + 1.0)
    assert done_b == pytest.approx(done_a + 0.002 + 0.5)
    timer.advance_to(done_a - 1e-9)
    assert not fa.done() and not fb.done()  # the real all-reduce is over; not the link
    timer.advance_to(done_a)
    assert fa.done() and not fb.done()
    timer.advance_to(done_b)
    assert fb.done()
    # what arrives is what the real all-reduce returned, untouched
    assert fa.value() is a.flat and fb.value() is b.flat


def test_a_real_all_reduce_slower_than_the_link_is_waited_for():
    real = torch.futures.Future()
    link, timer = fake_link(inner=lambda state, bucket: real)
    bucket = FakeBucket(0, 10)
    delivered = link(None, bucket)
    timer.advance_to(link.transfers[0].done_s + 1.0)
    assert not delivered.done()  # the link is done; the gradients are not there yet
    real.set_result(bucket.flat)
    assert delivered.done() and delivered.value() is bucket.flat


def test_a_failed_all_reduce_fails_the_bucket():
    real = torch.futures.Future()
    link, _ = fake_link(inner=lambda state, bucket: real)
    delivered = link(None, FakeBucket(0, 10))
    real.set_exception(RuntimeError("connection reset"))
    with pytest.raises(RuntimeError, match="connection reset"):
        delivered.wait()


def test_bandwidth_for_inverts_the_bandwidth_term():
    for ranks in (2, 3, 8):
        beta = bandwidth_for(0.25, 32_000_000, ranks)
        link = tl.Link(ranks, 0.0, beta)
        assert link.allreduce_s(32_000_000) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="> 0"):
        bandwidth_for(0, 1, 2)


def test_the_sleeping_timer_calls_in_time_order_never_early_and_sleeps_meanwhile():
    timer, calls, finished = SleepingTimer(), [], threading.Event()
    now = time.perf_counter()

    def note(name, when):
        calls.append((name, time.perf_counter() >= when))
        if len(calls) == 3:
            finished.set()

    timer.call_at(now + 0.3, lambda: note("late", now + 0.3))
    timer.call_at(now + 0.2, lambda: note("soon", now + 0.2))
    cpu = time.process_time()
    timer.call_at(now - 1.0, lambda: note("due", now - 1.0))  # runs at once, here
    assert calls == [("due", True)]
    assert finished.wait(timeout=30)
    # no call before its time, in time order; the waiting thread slept (a busy loop
    # would have burnt the 0.3 s on a core)
    assert calls == [("due", True), ("soon", True), ("late", True)]
    assert time.process_time() - cpu < 0.1


@pytest.mark.parametrize("world", [2, 3])
def test_myddp_on_the_emulated_link_trains_bit_for_bit_as_without(world):
    for cap_mb in (0, 1e-3, 25):
        out = run_ranks(emulated_equals_plain, world, args=(cap_mb,))
        for rank in out:
            assert rank["booked"] > 0  # the link carried the buckets
            for name, (emulated, plain) in rank["params"].items():
                assert torch.equal(emulated, plain), (world, cap_mb, name)


def test_the_link_keeps_the_ratios_of_chapter_7s_7b_model_on_a_cluster():
    # 7B: 14 GB of bf16 gradients in 224 tensors; 0.8 s of backward a rank on 64
    # ranks, 51.2 s on one. One 400 Gb/s NIC (50 GB/s) a node, 5 µs a ring step.
    for n in (64, 128, 160, 256):
        r = cluster_ratios(n)
        backward = 51.2 / n
        latency = 2 * (n - 1) * 5e-6
        assert r["latency"] == pytest.approx(latency / (backward / 224))
        assert r["bytes"] == pytest.approx(2 * (n - 1) / n * 14e9 / 50e9 / backward)
    # chapter 7's two cases at 128 ranks: one NIC a node, and DGX H100 (8 NICs)
    assert cluster_ratios(128)["bytes"] > 1 > cluster_ratios(128, dgx_h100())["bytes"]
    # the reference: more latency per message than a tensor's backward, and more
    # bandwidth time than the whole backward
    reference = cluster_ratios()
    assert reference["ranks"] == REFERENCE_RANKS
    assert reference["latency"] > 1 and reference["bytes"] > 1


@pytest.mark.parametrize("backward_s", [0.05, 0.4])
def test_the_emulated_link_scales_the_ratios_to_this_machines_backward(backward_s):
    ratios = cluster_ratios()
    nbytes, tensors = 8 * (2048 + MB), 16
    link = link_for(backward_s, nbytes, tensors, 2, ratios).link
    assert link.allreduce_s(0) == pytest.approx(
        ratios["latency"] * backward_s / tensors
    )
    bytes_s = link.allreduce_s(nbytes) - link.allreduce_s(0)
    assert bytes_s == pytest.approx(ratios["bytes"] * backward_s)


def model_round(backward_s=0.1):
    """A round of the experiment whose "measured" steps are the model's own."""
    layers = [tl.Layer(f"{i}", backward_s / 8, (2048, MB)) for i in range(8)]
    nbytes = sum(layer.nbytes for layer in layers)
    link = link_for(backward_s, nbytes, 16, 2, cluster_ratios()).link
    calibration = {
        "layers": layers,
        "alpha_s": link.alpha_s,
        "bandwidth": link.bandwidth,
        "world_size": 2,
        "comm_stretch": 1.0,
        "compute_stretch": 1.0,
    }
    measured = {cap: model_for(calibration, cap, contention=False) for cap in CAPS}
    return {"calibration": calibration, "measured": measured}


def test_the_experiments_link_makes_the_model_a_u():
    result = {"caps": CAPS, "rounds": [model_round(0.1), model_round(0.3)] * 2}
    rows, best_model, best_measured, shape = u_shape(result)
    assert best_model == best_measured and shape["model_best_in_middle"]
    # both ends at least a fifth above the middle: room for a measurement's noise
    assert 1.2 * shape["middle_s"] < min(
        shape["per_parameter_s"], shape["all_at_end_s"]
    )
    assert all(row["error"] == 0 for row in rows)
    # fed a step's own backward, the model gives that step back
    own = compare_on_own_backward(result)
    assert [row["error"] for row in own] == pytest.approx([0.0] * len(CAPS), abs=1e-12)
    # the links of the rounds, summarised by their medians
    backward_s, alpha_s, _ = link_summary(result)
    assert backward_s == pytest.approx(0.2)
    assert alpha_s == pytest.approx(cluster_ratios()["latency"] * 0.2 / 16 / 2)


def test_the_slider_figure_and_the_experiment_share_the_model_code_path(monkeypatch):
    seen, simulate = [], tl.simulate

    def spy(*args, **kwargs):
        seen.append(kwargs.get("name"))
        return simulate(*args, **kwargs)

    monkeypatch.setattr(tl, "simulate", spy)
    bucketing_timelines()  # the defaults of chapter 3's sliders
    from_sliders = len(seen)
    model_round()  # the experiment's model, one timeline per cap
    assert from_sliders >= 1
    assert len(seen) - from_sliders == len([c for c in CAPS if c != ALL_AT_END])


def test_the_figure_shows_every_measured_and_modelled_step():
    rows = [
        {"cap": cap, "measured_s": 0.1 * (i + 1), "model_s": 0.11 * (i + 1)}
        for i, cap in enumerate(CAPS)
    ]
    svg = cap_sweep_figure([("a", rows), ("b", rows)], title="t")
    for row in rows:
        for key in ("measured_s", "model_s"):
            assert svg.count(f'data-value="{row[key]!r}"') == 2
    with pytest.raises(ValueError, match="at least one panel"):
        cap_sweep_figure([])
