"""Checks for exercise 2.3 (standard library only: they also run in the browser)."""

import math
import random

from _judge.checking import check, expect_equal, expect_raises, expect_type, fail


def reference(n, world, rank, epoch=0, seed=0, shuffle=True, drop_last=False):
    order = list(range(n))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    per_rank = n // world if drop_last else math.ceil(n / world)
    total = per_rank * world
    while len(order) < total:
        order += order[: total - len(order)]
    return order[rank:total:world]


def shards(sol, n, world, **kw):
    shown = (
        f"[shard_indices({n}, {world}, "
        f"r{''.join(f', {k}={v!r}' for k, v in kw.items())}) for r in range({world})]"
    )
    out = []
    for r in range(world):
        got = sol.shard_indices(n, world, r, **kw)
        expect_type(
            got, list, input=shown.replace(" for r in", f" with r={r}, for r in")
        )
        out.append(got)
    return shown, out


@check("the examples of the statement")
def examples(sol):
    shown, got = shards(sol, 10, 3, shuffle=False)
    expect_equal(got, [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]], input=shown)
    shown, got = shards(sol, 10, 3, shuffle=False, drop_last=True)
    expect_equal(got, [[0, 3, 6], [1, 4, 7], [2, 5, 8]], input=shown)


@check("equal shares that cover the dataset")
def equal_and_complete(sol):
    for n in (1, 7, 16, 33, 100):
        for world in (1, 2, 3, 4, 8):
            shown, got = shards(sol, n, world, epoch=1, seed=5)
            if len({len(s) for s in got}) != 1:
                fail(
                    "every rank must get the same number of indices",
                    input=shown,
                    got=[len(s) for s in got],
                )
            if set().union(*map(set, got)) != set(range(n)):
                fail(
                    "together the ranks must cover every index of the dataset",
                    input=shown,
                    got=got,
                )
            expect_equal(
                len(got[0]),
                math.ceil(n / world),
                input=shown,
                what="the length of each share",
            )


@check("disjoint shares when nothing needs padding")
def disjoint(sol):
    for n, world in ((12, 3), (16, 4), (10, 2), (9, 3)):
        shown, got = shards(sol, n, world, seed=3)
        flat = [i for s in got for i in s]
        if sorted(flat) != list(range(n)):
            fail("each index must be on exactly one rank", input=shown, got=got)


@check("shuffled shares follow the rule (same seed on every rank)")
def shuffled(sol):
    for n, world, epoch, seed in (
        (10, 2, 0, 0),
        (17, 4, 3, 42),
        (50, 3, 1, 7),
        (5, 8, 2, 1),
    ):
        shown, got = shards(sol, n, world, epoch=epoch, seed=seed)
        expect_equal(
            got,
            [reference(n, world, r, epoch, seed) for r in range(world)],
            input=shown,
        )


@check("a new epoch gives a new permutation")
def new_epoch(sol):
    _, first = shards(sol, 40, 2, epoch=0, seed=0)
    shown, second = shards(sol, 40, 2, epoch=1, seed=0)
    if first == second:
        fail(
            "epoch 1 must shuffle differently from epoch 0 "
            "(seed the shuffle with seed + epoch)",
            input=shown,
            got=second,
        )


@check("drop_last trims instead of padding")
def drop_last(sol):
    for n, world in ((10, 3), (7, 4), (3, 8), (0, 2)):
        shown, got = shards(sol, n, world, seed=1, drop_last=True)
        expect_equal(
            got,
            [reference(n, world, r, 0, 1, True, True) for r in range(world)],
            input=shown,
        )


@check("fewer examples than ranks, and an empty dataset")
def small(sol):
    shown, got = shards(sol, 3, 8, shuffle=False)
    expect_equal(got, [[0], [1], [2], [0], [1], [2], [0], [1]], input=shown)
    shown, got = shards(sol, 0, 4, shuffle=False)
    expect_equal(got, [[], [], [], []], input=shown)


@check("bad input raises ValueError")
def bad_input(sol):
    for args in ((10, 2, 2), (10, 2, -1), (10, 0, 0), (-1, 2, 0)):
        expect_raises(
            lambda: sol.shard_indices(*args), ValueError, input=f"shard_indices{args}"
        )
