"""Checks for exercise 3.1 (standard library only: they also run in the browser)."""

import copy
import random

from _judge.checking import check, expect_equal, expect_raises, expect_type, fail

MB = 1024 * 1024


def call(sol, *args, **kwargs):
    shown = ", ".join(
        [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    )
    # Copies: the rule is checked against the sizes as given, whatever the
    # reader's function does to its arguments.
    return f"buckets_for_parameters({shown})", sol.buckets_for_parameters(
        *copy.deepcopy(args), **copy.deepcopy(kwargs)
    )


def as_lists(shown, got):
    expect_type(got, list, input=shown)
    for bucket in got:
        expect_type(bucket, (list, tuple), input=shown, what="each bucket")
    return [list(b) for b in got]


@check("the first example of the statement")
def example_one(sol):
    shown, got = call(sol, [4, 4, 4, 4], cap_bytes=8, first_cap_bytes=8)
    expect_equal(as_lists(shown, got), [[3, 2], [1, 0]], input=shown)


@check("a parameter larger than the cap closes its bucket")
def example_two(sol):
    shown, got = call(sol, [1, 100, 1], cap_bytes=10, first_cap_bytes=10)
    expect_equal(as_lists(shown, got), [[2, 1], [0]], input=shown)


@check("the first bucket is small by default (1 MiB)")
def default_first_bucket(sol):
    # Six gradients of 0.5 MiB, cap 2 MiB: the first bucket closes at 1 MiB.
    shown, got = call(sol, [MB // 2] * 6, cap_bytes=2 * MB)
    expect_equal(as_lists(shown, got), [[5, 4], [3, 2, 1, 0]], input=shown)
    shown, got = call(
        sol, [100] * 3, cap_bytes=200
    )  # a cap under 1 MiB caps the first bucket too
    expect_equal(as_lists(shown, got), [[2, 1], [0]], input=shown)


@check("a cap of 0 gives one bucket per parameter")
def cap_zero(sol):
    shown, got = call(sol, [8, 16, 4], cap_bytes=0)
    expect_equal(as_lists(shown, got), [[2], [1], [0]], input=shown)


@check("no parameters, no buckets")
def empty(sol):
    shown, got = call(sol, [], cap_bytes=25 * MB)
    expect_equal(as_lists(shown, got), [], input=shown)


@check("the last bucket may stay under its cap")
def open_last_bucket(sol):
    shown, got = call(sol, [3, 5, 5, 5], cap_bytes=10, first_cap_bytes=10)
    expect_equal(as_lists(shown, got), [[3, 2], [1, 0]], input=shown)
    shown, got = call(sol, [2, 5, 5, 5], cap_bytes=10, first_cap_bytes=5)
    expect_equal(as_lists(shown, got), [[3], [2, 1], [0]], input=shown)


@check("300 random models follow the rule")
def random_models(sol):
    rng = random.Random(6)
    for _ in range(300):
        n = rng.randint(0, 30)
        sizes = [
            rng.choice([0, 1, 4, 64, 1000, rng.randint(0, 5000)]) for _ in range(n)
        ]
        cap = rng.choice([0, 1, 100, 1000, 4096, 10**6])
        first = rng.choice([None, 0, 50, 2000])
        shown, got = call(sol, sizes, cap_bytes=cap, first_cap_bytes=first)
        problem = rule_broken(sizes, cap, first, as_lists(shown, got))
        if problem:
            fail(f"the buckets break the rule: {problem}", input=shown, got=got)


def rule_broken(sizes, cap, first, buckets):
    """What is wrong with ``buckets`` for this input, or ''.

    The rule determines a single answer.
    """
    first = min(cap, MB) if first is None else first
    flat = [i for b in buckets for i in b]
    if sorted(flat) != list(range(len(sizes))):
        return "every parameter must be in exactly one bucket"
    if flat != list(reversed(range(len(sizes)))):
        return "parameters must be added in backward order (last parameter first)"
    if any(not b for b in buckets):
        return "a bucket is empty"
    for k, b in enumerate(buckets):
        bucket_cap = first if k == 0 else cap
        total = sum(sizes[i] for i in b)
        if k < len(buckets) - 1 and total < bucket_cap:
            return (
                f"bucket {k} ({total} bytes) was closed before "
                f"it reached its cap ({bucket_cap} bytes)"
            )
        if len(b) > 1 and total - sizes[b[-1]] >= bucket_cap:
            return (
                f"bucket {k} reached its cap ({bucket_cap} bytes) before its "
                f"last parameter {b[-1]}: it should have been closed earlier"
            )
    return ""


@check("bad input raises ValueError")
def bad_input(sol):
    expect_raises(
        lambda: sol.buckets_for_parameters([4, -1], cap_bytes=8),
        ValueError,
        input="buckets_for_parameters([4, -1], cap_bytes=8)",
    )
    expect_raises(
        lambda: sol.buckets_for_parameters([4, 4], cap_bytes=-1),
        ValueError,
        input="buckets_for_parameters([4, 4], cap_bytes=-1)",
    )
