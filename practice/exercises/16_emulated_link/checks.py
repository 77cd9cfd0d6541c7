"""Checks for exercise 3.5 (standard library only: they also run in the browser).

The reference is the booking rule of ``mylib/experiments/emulated_link.py``
(``EmulatedLink.book`` and the ``real_done`` callback), written out here;
``practice/tests/test_exercise_references.py`` proves the two agree.
"""

import random

from _judge.checking import check, expect_close, expect_raises, expect_type, fail


def reference_schedule(buckets, ranks, alpha, bandwidth):
    free_at, out = float("-inf"), []
    for launched, nbytes, real_done in buckets:
        start = max(launched, free_at)
        free_at = start + 2 * (ranks - 1) * (alpha + nbytes / ranks / bandwidth)
        out.append((start, free_at, max(free_at, real_done)))
    return out


def schedule(sol, buckets, ranks, alpha, bandwidth):
    shown = f"link_schedule({buckets!r}, {ranks!r}, {alpha!r}, {bandwidth!r})"
    expected = reference_schedule(buckets, ranks, alpha, bandwidth)  # before the call
    got = sol.link_schedule([tuple(b) for b in buckets], ranks, alpha, bandwidth)
    expect_type(got, (list, tuple), input=shown)
    if len(got) != len(buckets):
        fail(
            f"one (start_s, done_s, delivered_s) per bucket: {len(buckets)} "
            f"buckets, {len(got)} results",
            input=shown,
            got=got,
        )
    for k, (g, e) in enumerate(zip(got, expected)):
        expect_type(g, (list, tuple), input=shown, what=f"bucket {k}'s result")
        if len(g) != 3:
            fail(
                f"bucket {k}'s result should be (start_s, done_s, delivered_s), "
                f"it has {len(g)} items",
                input=shown,
                got=g,
            )
        for name, gv, ev in zip(("start_s", "done_s", "delivered_s"), g, e):
            expect_type(gv, (int, float), input=shown, what=f"bucket {k}'s {name}")
            expect_close(
                gv,
                ev,
                input=shown,
                what=f"bucket {k}'s {name}",
                rel=1e-9,
                abs_tol=1e-15,
            )
    return [tuple(g) for g in got]


def exposed(sol, sched, end):
    shown = f"exposed_seconds({sched!r}, {end!r})"
    last = max((d for _, _, d in sched), default=end)  # before the reader's code runs
    got = sol.exposed_seconds([tuple(s) for s in sched], end)
    expect_type(got, (int, float), input=shown)
    expect_close(got, max(0.0, last - end), input=shown, abs_tol=1e-15)


@check("the example of the statement")
def example(sol):
    sched = schedule(sol, [(0.0, 1e6, 0.001), (0.001, 1e6, 0.002)], 2, 1e-3, 1e9)
    exposed(sol, sched, 0.004)


@check("one rank: the link costs nothing, a bucket arrives when gloo is done")
def one_rank(sol):
    sched = schedule(sol, [(0.0, 4e6, 0.01), (0.002, 4e6, 0.005)], 1, 1e-3, 1e6)
    exposed(sol, sched, 0.003)


@check("an idle link starts a bucket at its launch")
def idle_link(sol):
    schedule(sol, [(0.0, 1000, 0.0), (1.0, 1000, 1.0), (1.0, 0, 1.0)], 4, 1e-4, 1e6)


@check("a real all-reduce slower than the link delays delivery, not the link")
def slow_real(sol):
    sched = schedule(
        sol, [(0.0, 100, 0.5), (0.0, 100, 0.6), (0.1, 100, 0.2)], 2, 0, 1e4
    )
    exposed(sol, sched, 0.05)
    exposed(sol, sched, 1.0)


@check("no bucket: an empty schedule, nothing exposed")
def no_bucket(sol):
    sched = schedule(sol, [], 8, 1e-5, 1e10)
    exposed(sol, sched, 0.25)


@check("300 random backwards follow the link's rule")
def random_backwards(sol):
    rng = random.Random(16)
    for _ in range(300):
        ranks = rng.choice([1, 2, 3, 4, 8, 64])
        alpha = rng.choice([0.0, 1e-6, 2e-3])
        bandwidth = rng.choice([1e6, 0.5e9, 12.5e9])
        t, buckets = 0.0, []
        for _ in range(rng.randint(0, 8)):
            t += rng.choice([0.0, rng.uniform(0, 0.01)])
            nbytes = rng.choice([0, 4, 2**20, rng.randint(1, 10**8)])
            buckets.append((t, nbytes, t + rng.uniform(0, 0.05)))
        sched = schedule(sol, buckets, ranks, alpha, bandwidth)
        exposed(sol, sched, t + rng.uniform(0, 0.05))


@check("bad input raises ValueError")
def bad_input(sol):
    for args in (
        ([(0.0, 10, 0.0)], 0, 1e-6, 1e9),
        ([(0.0, 10, 0.0)], 2, -1e-6, 1e9),
        ([(0.0, 10, 0.0)], 2, 1e-6, 0),
        ([(0.0, -10, 0.0)], 2, 1e-6, 1e9),
        ([(0.5, 10, 0.5), (0.1, 10, 0.5)], 2, 1e-6, 1e9),
    ):
        expect_raises(
            lambda a=args: sol.link_schedule(*a),
            ValueError,
            input=f"link_schedule{args!r}",
        )
