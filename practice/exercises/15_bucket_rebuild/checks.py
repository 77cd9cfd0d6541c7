"""Checks for exercise 3.4 (standard library only: they also run in the browser).

The reference below follows PyTorch's rule (``compute_bucket_assignment_by_size``
in torch/csrc/distributed/c10d/reducer.cpp, the rebuild in
torch/nn/parallel/distributed.py); ``practice/tests/test_exercise_references.py``
proves it equal to ``mylib.models.buckets`` and to torch's own function.
"""

import random

from _judge.checking import check, expect_raises, expect_type, fail

MiB = 1024 * 1024


def reference_fill(sizes, cap, first_cap, keys):
    first_cap = min(cap, MiB) if first_cap is None else first_cap
    closed, open_ = [], {}
    for i, (size, key) in enumerate(zip(sizes, keys)):
        bucket = open_.setdefault(key, [[], 0, 0])
        bucket[0].append(i)
        bucket[1] += size
        if bucket[1] >= (first_cap if bucket[2] == 0 else cap):
            closed.append(bucket[0])
            open_[key] = [[], 0, bucket[2] + 1]
    return closed + [b[0] for b in reversed(open_.values()) if b[0]]


def reference_rebuilt(sizes, order, cap, first_cap=None, dtypes=None):
    dtypes = [None] * len(sizes) if dtypes is None else dtypes
    buckets = reference_fill(
        [sizes[i] for i in order], cap, first_cap, [dtypes[i] for i in order]
    )
    return [[order[k] for k in b] for b in buckets]


def reference_first(sizes, cap, first_cap=None, dtypes=None):
    dtypes = [None] * len(sizes) if dtypes is None else dtypes
    buckets = reference_fill(sizes, cap, first_cap, dtypes)
    return [b[::-1] for b in sorted(buckets, key=min, reverse=True)]


def shown_call(name, args, kwargs):
    text = [repr(a) for a in args] + [
        f"{k}={v!r}" for k, v in kwargs.items() if v is not None
    ]
    return f"{name}({', '.join(text)})"


def compare(got, expected, shown):
    expect_type(got, (list, tuple), input=shown)
    for bucket in got:
        expect_type(bucket, (list, tuple), input=shown, what="each bucket")
    got = [list(b) for b in got]
    if got == expected:
        return
    flat_got = sorted(i for b in got for i in b)
    flat_expected = sorted(i for b in expected for i in b)
    if flat_got != flat_expected:
        problem = "every parameter must be in exactly one bucket"
    elif len(got) != len(expected):
        problem = f"expected {len(expected)} buckets, got {len(got)}"
    else:
        k = next(k for k, (g, e) in enumerate(zip(got, expected)) if g != e)
        if sorted(got[k]) == sorted(expected[k]):
            problem = f"bucket {k} holds the right parameters in the wrong order"
        elif sorted(i for b in got for i in b) == flat_expected and sorted(
            map(sorted, got)
        ) == sorted(map(sorted, expected)):
            problem = "the right buckets in the wrong launch order"
        else:
            problem = f"bucket {k} should be {expected[k]}, not {got[k]}"
    fail(f"wrong buckets: {problem}", input=shown, expected=expected, got=got)


def rebuilt(sol, sizes, order, cap, first_cap=None, dtypes=None):
    kwargs = {"first_cap_bytes": first_cap, "dtypes": dtypes}
    shown = shown_call("rebuilt_buckets", (sizes, order), {"cap_bytes": cap, **kwargs})
    got = sol.rebuilt_buckets(
        list(sizes), list(order), cap, first_cap_bytes=first_cap, dtypes=dtypes
    )
    compare(got, reference_rebuilt(sizes, order, cap, first_cap, dtypes), shown)


def first(sol, sizes, cap, first_cap=None, dtypes=None):
    kwargs = {"first_cap_bytes": first_cap, "dtypes": dtypes}
    shown = shown_call(
        "first_iteration_buckets", (sizes,), {"cap_bytes": cap, **kwargs}
    )
    got = sol.first_iteration_buckets(
        list(sizes), cap, first_cap_bytes=first_cap, dtypes=dtypes
    )
    compare(got, reference_first(sizes, cap, first_cap, dtypes), shown)


@check("the examples of the statement")
def examples(sol):
    first(sol, [8, 1, 8, 1], 9)
    rebuilt(sol, [4, 1] * 4, [5, 4, 1, 0, 7, 6, 3, 2], 5)
    rebuilt(sol, [4, 2, 4, 2], [3, 2, 1, 0], 8, dtypes=["bf16", "fp32"] * 2)
    rebuilt(sol, [4, 2, 4, 2], [3, 2, 1, 0], 100, dtypes=["bf16", "fp32"] * 2)


@check("before any backward: the first cap holds the first parameters, sent last")
def first_iteration(sol):
    first(sol, [MiB // 2] * 6, 2 * MiB)  # default first cap: 1 MiB
    first(sol, [4, 4, 4, 4], 8, first_cap=4)
    first(sol, [3, 5, 5, 5, 1], 10)
    first(sol, [4, 4, 4], 0)
    first(sol, [], 25 * MiB)


@check("the rebuild follows the ready order, with the small first bucket")
def rebuild_order(sol):
    # 4 layers of 600 x 600 used in the order 3rd, 1st, 4th, 2nd (chapter 3's case)
    weight, bias = 600 * 600 * 4, 600 * 4
    sizes = [weight, bias] * 4
    order = [5, 4, 1, 0, 7, 6, 3, 2]
    rebuilt(sol, sizes, order, 25 * MiB)
    rebuilt(sol, sizes, order, 2 * MiB)
    rebuilt(sol, sizes, order, 0)
    rebuilt(sol, [], [], 25 * MiB)


@check("ready in reverse registration order: exercise 3.1's buckets")
def reverse_order(sol):
    for sizes, cap, first_cap in (
        ([4, 4, 4, 4], 8, 8),
        ([1, 100, 1], 10, 10),
        ([3, 5, 5, 5], 10, 10),
        ([2, 5, 5, 5], 10, 5),
    ):
        rebuilt(sol, sizes, list(reversed(range(len(sizes)))), cap, first_cap)


@check("one open bucket per dtype, each with its own first cap")
def dtypes(sol):
    rebuilt(sol, [4, 2, 4, 2, 4, 2], [5, 4, 3, 2, 1, 0], 6, dtypes=["bf16", "fp32"] * 3)
    rebuilt(sol, [2, 2, 8, 2], [0, 1, 2, 3], 4, dtypes=["a", "b", "c", "a"])
    first(sol, [4, 2, 4, 2, 4, 2], 6, dtypes=["bf16", "fp32"] * 3)
    first(sol, [8, 8, 1, 1], 100, dtypes=["x", "y", "z", "x"])


@check("400 random models, caps, dtypes and ready orders")
def grid(sol):
    rng = random.Random(15)
    for _ in range(400):
        n = rng.randint(0, 16)
        sizes = [
            rng.choice([0, 1, 4, 64, 1000, rng.randint(0, 3000)]) for _ in range(n)
        ]
        cap = rng.choice([0, 1, 100, 1000, 4096, 10**6])
        first_cap = rng.choice([None, None, 0, 50, 2000])
        kinds = rng.choice([None, ["f32"], ["f32", "bf16"], ["f32", "bf16", "f16"]])
        dtypes = None if kinds is None else [rng.choice(kinds) for _ in range(n)]
        order = list(range(n))
        rng.shuffle(order)
        rebuilt(sol, sizes, order, cap, first_cap, dtypes)
        first(sol, sizes, cap, first_cap, dtypes)


@check("bad input raises ValueError")
def bad_input(sol):
    for args, kwargs, shown in (
        (([4, 4], [1]), {"cap_bytes": 8}, "rebuilt_buckets([4, 4], [1], cap_bytes=8)"),
        (
            ([4, 4], [1, 1]),
            {"cap_bytes": 8},
            "rebuilt_buckets([4, 4], [1, 1], cap_bytes=8)",
        ),
        (
            ([4, 4], [0, 2]),
            {"cap_bytes": 8},
            "rebuilt_buckets([4, 4], [0, 2], cap_bytes=8)",
        ),
        (
            ([4, -1], [1, 0]),
            {"cap_bytes": 8},
            "rebuilt_buckets([4, -1], [1, 0], cap_bytes=8)",
        ),
        (
            ([4, 4], [1, 0]),
            {"cap_bytes": -1},
            "rebuilt_buckets([4, 4], [1, 0], cap_bytes=-1)",
        ),
        (
            ([4, 4], [1, 0]),
            {"cap_bytes": 8, "dtypes": ["f32"]},
            "rebuilt_buckets([4, 4], [1, 0], cap_bytes=8, dtypes=['f32'])",
        ),
    ):
        expect_raises(
            lambda a=args, k=kwargs: sol.rebuilt_buckets(*a, **k),
            ValueError,
            input=shown,
        )
    expect_raises(
        lambda: sol.first_iteration_buckets([4, -1], cap_bytes=8),
        ValueError,
        input="first_iteration_buckets([4, -1], cap_bytes=8)",
    )
