"""Checks for exercise 9.2 (standard library only: they also run in the browser).

The formulas are written here from the papers (Young 1974, Daly 2006), not
imported from mylib, so the exercise stands on its own.
"""

import math
import random

from _judge.checking import check, expect_close, expect_raises, expect_type, fail

DAY_S = 86400.0


def ref_young(c, m):
    return math.sqrt(2 * c * m)


def ref_daly(c, m):
    if c >= 2 * m:
        return float(m)
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def ref_lost(t, c, m, r=0.0):
    w = c / t + (t / 2 + r) / m  # seconds lost per second of work
    return DAY_S * w / (1 + w)


def call(sol, name, *args, **kwargs):
    text = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    shown = f"{name}({', '.join(text)})"
    got = getattr(sol, name)(*args, **kwargs)
    expect_type(got, (int, float), input=shown)
    return shown, got


@check("the examples of the statement")
def examples(sol):
    shown, got = call(sol, "young_interval", 60, 86400)
    expect_close(got, ref_young(60, 86400), input=shown)
    shown, got = call(sol, "daly_interval", 60, 86400)
    expect_close(got, ref_daly(60, 86400), input=shown)
    shown, got = call(sol, "cluster_mtbf", 5 * 365 * 86400, 1000)
    expect_close(got, 157680.0, input=shown)
    shown, got = call(sol, "lost_seconds_per_day", 3600, 60, 86400, restart_s=300)
    expect_close(got, 86400 * 59 / 1499, input=shown)  # w = 59/1440


@check("Daly's interval: near Young's for a cheap checkpoint, M from C = 2M on")
def daly_limits(sol):
    shown, got = call(sol, "daly_interval", 1, 10**8)
    expect_close(got, ref_daly(1, 10**8), input=shown)
    if abs(got / ref_young(1, 10**8) - 1) > 1e-3:
        fail(
            "with C a hundred-millionth of M, Daly's interval should be within 0.1 % "
            "of Young's",
            input=shown,
            expected=ref_young(1, 10**8),
            got=got,
        )
    for c, m in ((200, 100), (100, 50), (1000, 10)):
        shown, got = call(sol, "daly_interval", c, m)
        expect_close(got, float(m), input=shown, what="the interval when C >= 2M")
    shown, got = call(sol, "daly_interval", 199, 100)
    expect_close(
        got, ref_daly(199, 100), input=shown, what="the interval just under C = 2M"
    )


@check("the lost time is smallest at Young's interval")
def optimum(sol):
    for c, m, r in ((60, 86400, 0), (600, 3600 * 6, 120), (5, 1e6, 30)):
        t = ref_young(c, m)
        _, at = call(sol, "lost_seconds_per_day", t, c, m, restart_s=r)
        for factor in (0.95, 1.05):
            shown, near = call(
                sol, "lost_seconds_per_day", t * factor, c, m, restart_s=r
            )
            if not near > at:
                fail(
                    f"an interval {factor:g} times Young's should lose more time than "
                    f"Young's own ({at!r} s a day)",
                    input=shown,
                    expected=ref_lost(t * factor, c, m, r),
                    got=near,
                )
            expect_close(near, ref_lost(t * factor, c, m, r), input=shown)


@check("the lost time is a share of the wall clock, not of the work")
def share_of_the_day(sol):
    # 600 s to save every second of work: w = 600, the day loses 600/601 of itself
    shown, got = call(sol, "lost_seconds_per_day", 1, 600, 3600)
    expect_close(got, ref_lost(1, 600, 3600), input=shown)
    if got >= DAY_S:
        fail("a day cannot lose more than itself", input=shown, got=got)
    # w = 0.5 (half a second lost per second of work): a third of the day
    shown, got = call(sol, "lost_seconds_per_day", 240, 120, 1e15)
    if abs(got - DAY_S / 3) > 1e-6 * DAY_S:
        fail(
            "with 0.5 s lost per second of work, 1.5 s of wall clock give 1 s of "
            "work: a third of the day is lost, not half",
            input=shown,
            expected=DAY_S / 3,
            got=got,
        )


@check("a grid of costs, failure rates, cluster sizes and intervals")
def grid(sol):
    rng = random.Random(21)
    for _ in range(200):
        c = rng.choice([1.0, 30.0, 60.0, 600.0, rng.uniform(0.1, 5000)])
        node = rng.choice([86400.0, 30 * 86400.0, 5 * 365 * 86400.0])
        nodes = rng.choice([1, 8, 128, 1000, 16384])
        shown, m = call(sol, "cluster_mtbf", node, nodes)
        expect_close(m, node / nodes, input=shown)
        m = node / nodes
        shown, got = call(sol, "young_interval", c, m)
        expect_close(got, ref_young(c, m), input=shown)
        shown, got = call(sol, "daly_interval", c, m)
        expect_close(got, ref_daly(c, m), input=shown)
        t = rng.choice([ref_young(c, m), rng.uniform(1, 20000)])
        r = rng.choice([0.0, 60.0, rng.uniform(0, 900)])
        shown, got = call(sol, "lost_seconds_per_day", t, c, m, restart_s=r)
        expect_close(got, ref_lost(t, c, m, r), input=shown)


@check("bad input raises ValueError")
def bad_input(sol):
    for name, args in (
        ("young_interval", (0, 86400)),
        ("young_interval", (60, -1)),
        ("daly_interval", (-60, 86400)),
        ("daly_interval", (60, 0)),
        ("cluster_mtbf", (86400, 0)),
        ("cluster_mtbf", (86400, 2.5)),
        ("cluster_mtbf", (0, 8)),
        ("lost_seconds_per_day", (0, 60, 86400)),
        ("lost_seconds_per_day", (3600, 0, 86400)),
        ("lost_seconds_per_day", (3600, 60, 0)),
        ("lost_seconds_per_day", (3600, 60, 86400, -1)),
    ):
        expect_raises(
            lambda n=name, a=args: getattr(sol, n)(*a),
            ValueError,
            input=f"{name}{args!r}",
        )
