"""The alpha-beta model, its fit and the slider figure.

And the gloo measurements the model is fitted to.
"""

import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.experiments.commbench import ping_pong, time_all_reduce
from mylib.figures import browser
from mylib.figures.costmodel import allreduce_cost_figure
from mylib.models.costmodel import (
    alpha_beta_from_ends,
    bus_bandwidth,
    crossover_bytes,
    fit_alpha_beta,
    message_time,
    ring_all_gather_time,
    ring_all_reduce_terms,
    ring_all_reduce_time,
    ring_reduce_scatter_time,
)
from mylib.ring import ring_all_reduce

alphas = st.floats(1e-7, 1e-3)
betas = st.floats(1e6, 1e12)
worlds = st.integers(2, 1024)
sizes = st.integers(0, 2**34)

# ---- the model
# ---------------------------------------------------------------------------


@given(b=sizes, n=worlds, alpha=alphas, beta=betas)
def test_ring_all_reduce_is_2_n_minus_1_messages_of_b_over_n(b, n, alpha, beta):
    t = ring_all_reduce_time(b, n, alpha, beta)
    assert math.isclose(
        t, 2 * (n - 1) * message_time(b / n, alpha, beta), rel_tol=1e-12
    )
    lat, bw = ring_all_reduce_terms(b, n, alpha, beta)
    assert math.isclose(lat, 2 * (n - 1) * alpha) and math.isclose(
        bw, 2 * (n - 1) / n * b / beta
    )
    # reduce-scatter then all-gather is the all-reduce
    assert math.isclose(
        ring_reduce_scatter_time(b, n, alpha, beta)
        + ring_all_gather_time(b, n, alpha, beta),
        t,
        rel_tol=1e-12,
    )


@given(n=worlds, alpha=alphas, beta=betas)
def test_terms_are_equal_at_the_crossover(n, alpha, beta):
    cross = crossover_bytes(n, alpha, beta)
    lat, bw = ring_all_reduce_terms(cross, n, alpha, beta)
    assert math.isclose(lat, bw, rel_tol=1e-9)
    assert (
        ring_all_reduce_terms(cross / 2, n, alpha, beta)[0]
        > ring_all_reduce_terms(cross / 2, n, alpha, beta)[1]
    )


@given(b=st.integers(1, 2**34), n=worlds, beta=betas)
def test_bus_bandwidth_recovers_the_link_bandwidth(b, n, beta):
    assert math.isclose(
        bus_bandwidth(b, n, ring_all_reduce_time(b, n, 0.0, beta)), beta, rel_tol=1e-9
    )


def test_chapter_1_worked_answers():
    # The self-test answers and the tree exercise's solution, in chapter 1's prose.
    mb, gb = 10**6, 2**30
    assert (
        2 * 7 / 8 * 100 * mb == 175 * mb
    )  # Q1: bytes each of 8 ranks sends for 100 MB
    alpha, beta, n = 10e-6, 10e9, 64
    latency, bandwidth = ring_all_reduce_terms(4096, n, alpha, beta)  # Q3 at 4 KB
    assert latency == pytest.approx(1.26e-3) and bandwidth == pytest.approx(
        0.8e-6, rel=0.01
    )
    latency, bandwidth = ring_all_reduce_terms(gb, n, alpha, beta)  # Q3 at 1 GB
    assert round(bandwidth, 2) == 0.21 and bandwidth > 100 * latency
    # Q4: twice the ranks barely changes 1 GB, nearly doubles 1 KB
    assert (
        ring_all_reduce_time(gb, 128, alpha, beta)
        / ring_all_reduce_time(gb, 64, alpha, beta)
        < 1.02
    )
    ratio = ring_all_reduce_time(1024, 128, alpha, beta) / ring_all_reduce_time(
        1024, 64, alpha, beta
    )
    assert ratio == pytest.approx(2, rel=0.02)
    # ...and the factor 2(n-1)/n of 1 GB's bandwidth term: 1 at 2 ranks, times 1.5 at 4
    assert ring_all_reduce_terms(gb, 2, alpha, beta)[1] == pytest.approx(gb / beta)
    assert ring_all_reduce_terms(gb, 4, alpha, beta)[1] / ring_all_reduce_terms(
        gb, 2, alpha, beta
    )[1] == pytest.approx(1.5)
    # Below the figure: 1 GB from 2 to 1024 ranks takes about 2.2 times as long (not 512
    # times, nor "barely" longer); 4 KB nearly 1023 times, the latency term's growth
    grow = {
        size: ring_all_reduce_time(size, 1024, alpha, beta)
        / ring_all_reduce_time(size, 2, alpha, beta)
        for size in (gb, 4096)
    }
    assert round(grow[gb], 1) == 2.2
    assert 0.95 * 1023 < grow[4096] < 1023
    # Exercise ch1-tree: a tree 2 log2(n) (alpha + b/beta) beats the ring below about 14
    # MB at n = 1024
    n, alpha, beta = 1024, 5e-6, 25e9

    def tree(b):
        return 2 * math.log2(n) * message_time(b, alpha, beta)

    crossing = 1013 * alpha * beta / (10 - 1023 / 1024)
    assert round(crossing / mb) == 14
    assert tree(0.9 * crossing) < ring_all_reduce_time(0.9 * crossing, n, alpha, beta)
    assert tree(1.1 * crossing) > ring_all_reduce_time(1.1 * crossing, n, alpha, beta)


def test_one_rank_costs_nothing_and_bad_constants_are_named():
    assert ring_all_reduce_time(10**6, 1, 1e-5, 1e9) == 0
    with pytest.raises(ValueError, match="alpha is a latency"):
        message_time(1, -1.0, 1e9)
    with pytest.raises(ValueError, match="beta is a bandwidth"):
        ring_all_reduce_time(1, 2, 1e-6, 0)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        ring_all_reduce_time(1, 0, 1e-6, 1e9)


# ---- the fit
# -----------------------------------------------------------------------------

SIZES = [2**k for k in range(2, 26)]


@given(
    alpha=alphas, beta=st.floats(1e7, 1e11), n=st.one_of(st.none(), st.integers(2, 8))
)
def test_fit_recovers_the_constants_of_exact_model_data(alpha, beta, n):
    times = [
        message_time(b, alpha, beta)
        if n is None
        else ring_all_reduce_time(b, n, alpha, beta)
        for b in SIZES
    ]
    fit = fit_alpha_beta(SIZES, times, world_size=n)
    assert math.isclose(fit.alpha, alpha, rel_tol=1e-6)
    assert math.isclose(fit.beta, beta, rel_tol=1e-6)
    assert fit.max_relative_error < 1e-9
    assert fit.world_size == n and math.isclose(
        fit.predict(SIZES[3]), times[3], rel_tol=1e-9
    )


@settings(max_examples=30)
@given(seed=st.integers(0, 10**6), noise=st.floats(0.0, 0.2))
def test_fit_error_stays_within_the_noise(seed, noise):
    rng = random.Random(seed)
    alpha, beta = 50e-6, 2e9
    times = [
        message_time(b, alpha, beta) * (1 + rng.uniform(-noise, noise)) for b in SIZES
    ]
    fit = fit_alpha_beta(SIZES, times)
    # The fitted curve is never further from a point than the noise plus the noise's
    # effect on the fit.
    assert fit.max_relative_error <= 3 * noise + 1e-9
    assert 0.5 * alpha < fit.alpha < 2 * alpha and 0.5 * beta < fit.beta < 2 * beta
    errors = sorted(fit.relative_errors)
    assert fit.median_relative_error == (errors[11] + errors[12]) / 2


@settings(max_examples=40)
@given(
    alpha=alphas, beta=st.floats(1e7, 1e11), n=st.one_of(st.none(), st.integers(2, 8))
)
def test_ends_recover_the_constants_of_exact_model_data(alpha, beta, n):
    times = [
        message_time(b, alpha, beta)
        if n is None
        else ring_all_reduce_time(b, n, alpha, beta)
        for b in SIZES
    ]
    fit = alpha_beta_from_ends(SIZES, times, world_size=n)
    lat_coef, bw_coef = (1, 1) if n is None else (2 * (n - 1), 2 * (n - 1) / n)
    # alpha is the median time of the three smallest sizes, the second-smallest's, its
    # few bytes included.
    assert math.isclose(
        fit.alpha, alpha + bw_coef * SIZES[1] / beta / lat_coef, rel_tol=1e-9
    )
    assert math.isclose(fit.beta, beta, rel_tol=1e-6)


def test_ends_get_the_large_sizes_right_when_no_line_fits():
    # Twice as fast per byte below 1 MB (in cache) as above: no straight line fits both.
    # The least-squares
    # fit splits the difference; the ends get the per-byte cost of the large sizes and
    # the small ones' latency.
    times = [20e-6 + b / (2e9 if b < 2**20 else 1e9) for b in SIZES]
    line = fit_alpha_beta(SIZES, times)
    ends = alpha_beta_from_ends(SIZES, times)
    assert math.isclose(ends.beta, 1e9, rel_tol=1e-9)
    assert (
        abs(ends.predict(SIZES[-1]) / times[-1] - 1)
        < 0.01
        < abs(line.predict(SIZES[-1]) / times[-1] - 1)
    )
    assert math.isclose(ends.alpha, times[1], rel_tol=1e-9)


def test_ends_reject_data_they_cannot_use():
    with pytest.raises(ValueError, match="one time per size"):
        alpha_beta_from_ends([1, 2], [1.0])
    with pytest.raises(ValueError, match="positive"):
        alpha_beta_from_ends([1, 2], [1.0, 0.0])
    with pytest.raises(ValueError, match="a quarter of the largest"):
        alpha_beta_from_ends([1024, 2048, 4096], [1e-4, 2e-4, 3e-4])
    with pytest.raises(ValueError, match="one rank sends nothing"):
        alpha_beta_from_ends(SIZES, [1e-3] * len(SIZES), world_size=1)
    flat = alpha_beta_from_ends(
        SIZES, [1e-3] * len(SIZES)
    )  # no time per byte: infinite bandwidth
    assert flat.beta == math.inf and math.isclose(flat.alpha, 1e-3)


def test_fit_never_returns_a_negative_latency():
    # Data with no latency at all and a slightly concave shape pushes plain least
    # squares below zero.
    times = [b / 1e9 * (1.2 if b < 1000 else 1.0) for b in SIZES]
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha >= 0 and fit.beta > 0
    flat = fit_alpha_beta(
        SIZES, [1e-3] * len(SIZES)
    )  # pure latency: infinite bandwidth
    assert math.isclose(flat.alpha, 1e-3) and flat.beta == math.inf


def test_fit_rejects_data_it_cannot_use():
    with pytest.raises(ValueError, match="one time per size"):
        fit_alpha_beta([1, 2], [1.0])
    with pytest.raises(ValueError, match="at least two different sizes"):
        fit_alpha_beta([8, 8], [1.0, 1.1])
    with pytest.raises(ValueError, match="positive"):
        fit_alpha_beta([1, 2], [1.0, 0.0])
    with pytest.raises(ValueError, match="world_size >= 2"):
        fit_alpha_beta([1, 2], [1.0, 2.0], world_size=1)


# ---- the slider figure
# -----------------------------------------------------------------------


def _metric(svg, name):
    return re.search(rf'data-metric="{name}"[^>]*>([^<]*)<', svg).group(1)


@settings(max_examples=25)
@given(
    k=st.integers(0, 32),
    n=st.sampled_from([2, 3, 4, 8, 64, 1024]),
    alpha_us=st.floats(1, 500),
    beta_gbps=st.floats(0.1, 900),
)
def test_figure_prints_the_model_numbers(k, n, alpha_us, beta_gbps):
    from mylib.figures.svg import format_seconds

    svg = allreduce_cost_figure(
        nbytes=2**k, world_size=n, alpha_us=alpha_us, beta_gbps=beta_gbps
    )
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    total = ring_all_reduce_time(2**k, n, alpha_us * 1e-6, beta_gbps * 1e9)
    assert format_seconds(total) in _metric(svg, "total_s")
    regime = (
        "latency-bound"
        if 2**k < crossover_bytes(n, alpha_us * 1e-6, beta_gbps * 1e9)
        else "bandwidth-bound"
    )
    assert _metric(svg, "regime").startswith(regime)


def test_figure_changes_with_the_sliders_and_rejects_bad_values():
    assert allreduce_cost_figure(world_size=2) != allreduce_cost_figure(world_size=8)
    with pytest.raises(ValueError, match="world_size >= 2"):
        allreduce_cost_figure(world_size=1)


def test_model_and_figure_run_in_the_browser():
    # Pyodide has the standard library only: these modules must import nothing else.
    assert {"models.costmodel", "figures.costmodel"} <= set(browser.browser_modules())


# ---- measuring gloo (values depend on the machine: only their shape is tested)
# --------------


def _measure():
    sizes = [4, 4096, 65536]
    return (
        ping_pong(sizes, repeats=2, warmup=1),
        time_all_reduce(sizes, repeats=2, warmup=1),
        time_all_reduce(
            sizes, repeats=2, warmup=1, all_reduce=ring_all_reduce, statistic="median"
        ),
    )


def test_measurements_have_one_positive_time_per_size_and_agree_across_ranks():
    results = run_ranks(_measure, 3)
    assert results[0] == results[1] == results[2]
    for times in results[0]:
        assert len(times) == 3 and all(t > 0 for t in times)


def _bad_measurements():
    errors = []
    for call in (
        lambda: ping_pong([8]),
        lambda: time_all_reduce([6]),
        lambda: time_all_reduce([8], statistic="mean"),
        lambda: time_all_reduce([]),
    ):
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_bad_measurement_requests_are_named():
    errors = run_ranks(_bad_measurements, 1)[0]
    assert "at least 2 ranks" in errors[0]
    assert "multiples of 4 bytes" in errors[1]
    assert "statistic must be one of" in errors[2]
    assert "at least one message size" in errors[3]
