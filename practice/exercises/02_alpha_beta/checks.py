"""Checks for exercise 1.2 (standard library only: they also run in the browser).

Every reference is computed before the reader's function is called, and the
function is given copies: a fit that writes into its arguments changes no
expected value.
"""

import random

from _judge.checking import check, expect_close, expect_raises, expect_type


def expected_seconds(nbytes, n, alpha, bw):
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bw


def least_squares(xs, ys):
    """The line's intercept (alpha) and slope (seconds per byte, 1 / beta)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def time_of(sol, nbytes, n, alpha, bw):
    shown = (
        f"ring_allreduce_seconds({nbytes!r}, {n!r}, "
        f"alpha_s={alpha!r}, bandwidth_bytes_per_s={bw!r})"
    )
    got = sol.ring_allreduce_seconds(nbytes, n, alpha, bw)
    expect_type(got, (int, float), input=shown)
    return shown, got


@check("the example: 100 MB over 4 ranks")
def example(sol):
    shown, got = time_of(sol, 100e6, 4, 10e-6, 10e9)
    expect_close(got, 0.01506, input=shown)


@check("one rank communicates nothing")
def one_rank(sol):
    shown, got = time_of(sol, 1e9, 1, 1e-3, 1e9)
    expect_close(got, 0.0, input=shown)


@check("zero bytes still pay the latency of every step")
def zero_bytes(sol):
    shown, got = time_of(sol, 0, 8, 5e-6, 1e9)
    expect_close(got, 14 * 5e-6, input=shown)


@check("a grid of sizes, ranks, latencies and bandwidths")
def grid(sol):
    for nbytes in (1, 4096, 25 * 2**20, 14e9):
        for n in (2, 3, 8, 64, 1000):
            for alpha in (0.0, 2e-6, 1e-4):
                for bw in (1e9, 50e9, 900e9):
                    shown, got = time_of(sol, nbytes, n, alpha, bw)
                    expect_close(
                        got, expected_seconds(nbytes, n, alpha, bw), input=shown
                    )


@check("bad input raises ValueError")
def bad_time_input(sol):
    for args in (
        (100, 0, 1e-6, 1e9),
        (-1, 2, 1e-6, 1e9),
        (100, 2, -1e-6, 1e9),
        (100, 2, 1e-6, 0),
    ):
        expect_raises(
            lambda: sol.ring_allreduce_seconds(*args),
            ValueError,
            input=f"ring_allreduce_seconds{args}",
        )


def fit(sol, xs, ys):
    """The reader's fit, given copies: what it does to them changes no reference."""
    shown = f"fit_alpha_beta({xs!r}, {[float(f'{y:.6g}') for y in ys]!r})"
    got = sol.fit_alpha_beta(list(xs), list(ys))
    expect_type(got, (tuple, list), input=shown)
    return shown, tuple(got)


@check("the fit recovers an exact line")
def exact_line(sol):
    xs = [1_000, 10_000, 100_000, 1_000_000, 10_000_000]
    ys = [2e-5 + x / 1e9 for x in xs]
    shown, got = fit(sol, xs, ys)
    expect_close(got, (2e-5, 1e9), input=shown, rel=1e-6)


@check("noisy measurements are fitted by least squares")
def noisy(sol):
    rng = random.Random(2)
    for _ in range(20):
        xs = sorted(
            rng.choice([2**k for k in range(8, 28)]) for _ in range(rng.randint(3, 12))
        )
        if len(set(xs)) < 2:
            xs.append(xs[0] * 2)
        alpha, beta = rng.uniform(1e-6, 1e-4), rng.uniform(1e8, 1e11)
        ys = [(alpha + x / beta) * rng.uniform(0.9, 1.1) for x in xs]
        intercept, slope = least_squares(xs, ys)  # before the reader's code runs
        if slope <= 0:  # the noise hid the bandwidth: a case for bad_fit_input
            continue
        shown, got = fit(sol, xs, ys)
        expect_close(got, (intercept, 1 / slope), input=shown, rel=1e-6, abs_tol=1e-15)


@check("the fit refuses what cannot define a line")
def bad_fit_input(sol):
    expect_raises(
        lambda: sol.fit_alpha_beta([1000, 1000], [1e-5, 2e-5]),
        ValueError,
        input="fit_alpha_beta([1000, 1000], [1e-05, 2e-05])",
    )
    expect_raises(
        lambda: sol.fit_alpha_beta([1000, 2000, 3000], [1e-5, 2e-5]),
        ValueError,
        input="fit_alpha_beta([1000, 2000, 3000], [1e-05, 2e-05])",
    )
    for times in ([3e-5, 2e-5, 1e-5], [2e-5, 2e-5, 2e-5]):  # no time per byte
        expect_raises(
            lambda times=times: sol.fit_alpha_beta([1000, 2000, 3000], list(times)),
            ValueError,
            input=f"fit_alpha_beta([1000, 2000, 3000], {times!r})",
        )
