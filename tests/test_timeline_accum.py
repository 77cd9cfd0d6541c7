"""The accumulation timeline (chapter 4's figure).

With no_sync, communication happens only on the last micro-step.
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.figures.livefig import LiveFigure
from mylib.figures.timeline_accum import (
    ACCUMULATION_SLIDERS,
    accumulation_figure,
    accumulation_timelines,
)
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.timeline_accum import accumulation_step

LINK = tl.Link(8, 20e-6, 5e9)


def layers(n=6):
    return tl.uniform_layers(n, (4096, 4 * MB), 2e-3)


def test_no_sync_communicates_only_in_the_last_micro_step():
    m = 4
    step = accumulation_step(layers(), 8 * MB, LINK, m, forward_s=3e-3)
    last_start = step.micro_starts_s[-1]
    comm = [s for s in step.spans if s.lane == tl.COMM]
    assert comm and all(s.start_s >= last_start for s in comm)
    # The last micro-step is chapter 3's step, shifted; the others are forward +
    # backward only.
    alone = tl.simulate(layers(), 8 * MB, LINK, forward_s=3e-3)
    assert step.n_allreduces == alone.n_buckets
    assert step.step_s == pytest.approx(last_start + alone.step_s)
    assert last_start == pytest.approx((m - 1) * (3e-3 + 6 * 2e-3))
    assert step.exposed_comm_s == pytest.approx(alone.exposed_comm_s)


def test_without_no_sync_every_micro_step_pays():
    m = 3
    every = accumulation_step(layers(), 8 * MB, LINK, m, no_sync=False, forward_s=3e-3)
    alone = tl.simulate(layers(), 8 * MB, LINK, forward_s=3e-3)
    assert every.n_allreduces == m * alone.n_buckets
    assert every.step_s == pytest.approx(m * alone.step_s)
    assert every.exposed_comm_s == pytest.approx(m * alone.exposed_comm_s)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 12),
    m=st.integers(1, 8),
    cap_mb=st.sampled_from([0.0, 1.0, 8.0, 100.0]),
    ranks=st.sampled_from([1, 2, 8, 64]),
    gbs=st.floats(0.1, 500.0),
    fwd=st.floats(0.0, 0.01),
)
def test_invariants(n, m, cap_mb, ranks, gbs, fwd):
    link = tl.Link(ranks, 10e-6, gbs * 1e9)
    with_ = accumulation_step(layers(n), cap_mb * MB, link, m, forward_s=fwd)
    without = accumulation_step(
        layers(n), cap_mb * MB, link, m, no_sync=False, forward_s=fwd
    )
    assert (
        with_.compute_s
        == pytest.approx(without.compute_s)
        == pytest.approx(m * (fwd + n * 2e-3))
    )
    assert without.n_allreduces == m * with_.n_allreduces
    assert without.bytes_sent == m * with_.bytes_sent
    assert with_.step_s <= without.step_s + 1e-12
    assert with_.exposed_comm_s <= without.exposed_comm_s + 1e-12
    assert with_.step_s == pytest.approx(
        with_.compute_s + with_.exposed_comm_s
    )  # compute waits only for comm
    if m == 1:
        assert with_.step_s == pytest.approx(without.step_s)
    if ranks == 1:
        assert with_.bytes_sent == 0


def test_bytes_are_the_ring_all_reduce_of_every_gradient():
    step = accumulation_step(layers(4), 8 * MB, LINK, 5)
    assert step.bytes_sent == 2 * 7 * sum(l.nbytes for l in layers(4)) // 8


def test_figure_carries_its_numbers():
    svg = accumulation_figure(micro_steps=3)
    rows = accumulation_timelines(micro_steps=3)
    for k, row in enumerate(rows):
        for key in (
            "step_s",
            "exposed_comm_s",
            "n_allreduces",
            "bytes_sent",
        ):  # the panel's lines
            value = row.metrics()[key]
            found = re.search(
                f'data-timeline="{k}" data-metric="{key}" data-value="([^"]+)"', svg
            )
            assert found and float(found.group(1)) == pytest.approx(value), key
    assert svg.count("micro-step") >= 3


def test_figure_runs_in_the_browser():
    fig = LiveFigure(accumulation_figure, ACCUMULATION_SLIDERS)
    assert (
        fig.modules
        and "models.timeline_accum" in fig.modules
        and "ddp" not in fig.modules
    )
    assert "<svg" in fig.static_html()


@pytest.mark.parametrize("bad", [0, 2.5, -1])
def test_bad_micro_steps_names_the_fix(bad):
    with pytest.raises(ValueError, match="micro_steps must be a whole number >= 1"):
        accumulation_step(layers(), 0, LINK, bad)
