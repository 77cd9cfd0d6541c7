"""Checks for exercise 3.2 (standard library only: they also run in the browser)."""

import copy
import random

from _judge.checking import check, expect_close, expect_raises, expect_type

KEYS = (
    "backward_s",
    "bucket_times",
    "comm_s",
    "comm_end_s",
    "exposed_comm_s",
    "overlapped_comm_s",
    "step_s",
)


def reference(back, sizes, buckets, n, alpha, bw, forward_s=0.0, optimizer_s=0.0):
    ready = [sum(back[: i + 1]) for i in range(len(back))]
    backward = ready[-1] if ready else 0.0
    free, comm, times = 0.0, 0.0, []
    for b in buckets:
        d = 2 * (n - 1) * alpha + 2 * (n - 1) / n * sum(sizes[i] for i in b) / bw
        start = max(max(ready[i] for i in b), free)
        free = start + d
        comm += d
        times.append((start, free))
    end = times[-1][1] if times else 0.0
    exposed = max(0.0, end - backward)
    return {
        "backward_s": backward,
        "bucket_times": times,
        "comm_s": comm,
        "comm_end_s": end,
        "exposed_comm_s": exposed,
        "overlapped_comm_s": comm - exposed,
        "step_s": forward_s + backward + exposed + optimizer_s,
    }


def simulate(sol, *args, **kwargs):
    shown = (
        "simulate_backward("
        + ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        + ")"
    )
    # Copies: nothing the reader's function does to its arguments reaches ours.
    got = sol.simulate_backward(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    expect_type(got, dict, input=shown)
    return shown, got


def compare(sol, *args, **kwargs):
    expected = reference(*args, **kwargs)  # before the reader's code runs
    shown, got = simulate(sol, *args, **kwargs)
    expect_close(got, expected, input=shown, rel=1e-9, abs_tol=1e-12)
    return got


@check("the example of the statement")
def example(sol):
    shown, got = simulate(
        sol,
        [1, 1, 1, 1],
        [100] * 4,
        [[0, 1], [2, 3]],
        2,
        0.0,
        100.0,
        forward_s=1.0,
        optimizer_s=0.5,
    )
    expect_close(
        got,
        {
            "backward_s": 4.0,
            "bucket_times": [(2.0, 4.0), (4.0, 6.0)],
            "comm_s": 4.0,
            "comm_end_s": 6.0,
            "exposed_comm_s": 2.0,
            "overlapped_comm_s": 2.0,
            "step_s": 7.5,
        },
        input=shown,
    )


@check("one bucket at the end hides nothing")
def one_bucket(sol):
    got = compare(sol, [0.5, 0.25, 0.25], [1000, 2000, 1000], [[0, 1, 2]], 4, 1e-3, 1e4)
    expect_close(
        got["overlapped_comm_s"], 0.0, input="(same input)", what="overlapped_comm_s"
    )


@check("one bucket per layer on a fast link: only the last one is exposed")
def per_layer(sol):
    got = compare(sol, [1.0] * 5, [10] * 5, [[0], [1], [2], [3], [4]], 2, 0.0, 100.0)
    expect_close(
        got["exposed_comm_s"], 0.1, input="(same input)", what="exposed_comm_s"
    )


@check("a bucket waits while the link is busy")
def busy_link(sol):
    # Bucket 0 takes 3 s from t=0.1; bucket 1 is ready at 0.2 s but must wait until 3.1
    # s.
    got = compare(sol, [0.1, 0.1], [300, 100], [[0], [1]], 2, 0.0, 100.0)
    expect_close(
        got["bucket_times"],
        [(0.1, 3.1), (3.1, 4.1)],
        input="(same input)",
        what="bucket_times",
    )


@check("one rank communicates nothing")
def one_rank(sol):
    got = compare(
        sol,
        [0.2, 0.3],
        [10**6, 10**6],
        [[0, 1]],
        1,
        1e-5,
        1e9,
        forward_s=0.1,
        optimizer_s=0.05,
    )
    expect_close(got["step_s"], 0.65, input="(same input)", what="step_s")


@check("no layers at all")
def empty(sol):
    compare(sol, [], [], [], 8, 1e-5, 1e9)


@check("200 random timelines follow the rule")
def random_timelines(sol):
    rng = random.Random(7)
    for _ in range(200):
        layers = rng.randint(1, 12)
        back = [rng.choice([0.0, rng.uniform(1e-4, 0.05)]) for _ in range(layers)]
        sizes = [rng.randint(0, 50 * 2**20) for _ in range(layers)]
        cuts = (
            sorted(rng.sample(range(1, layers), rng.randint(0, layers - 1)))
            if layers > 1
            else []
        )
        bounds = [0] + cuts + [layers]
        buckets = [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
        n = rng.choice([1, 2, 4, 8, 64])
        compare(
            sol,
            back,
            sizes,
            buckets,
            n,
            rng.choice([0.0, 1e-5]),
            rng.choice([1e9, 12.5e9, 100e9]),
            forward_s=rng.uniform(0, 0.1),
            optimizer_s=rng.uniform(0, 0.01),
        )


@check("bad input raises ValueError")
def bad_input(sol):
    expect_raises(
        lambda: sol.simulate_backward([1, 1], [10], [[0, 1]], 2, 0.0, 1.0),
        ValueError,
        input="simulate_backward([1, 1], [10], [[0, 1]], 2, 0.0, 1.0)",
    )
    expect_raises(
        lambda: sol.simulate_backward([1, 1], [10, 10], [[0]], 2, 0.0, 1.0),
        ValueError,
        input="simulate_backward([1, 1], [10, 10], [[0]], 2, 0.0, 1.0)"
        "  # layer 1 in no bucket",
    )
    expect_raises(
        lambda: sol.simulate_backward([1, 1], [10, 10], [[0, 1], [1]], 2, 0.0, 1.0),
        ValueError,
        input="simulate_backward([1, 1], [10, 10], [[0, 1], [1]], 2, 0.0, 1.0)"
        "  # layer 1 twice",
    )
