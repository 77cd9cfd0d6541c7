"""Checks for exercise 7.1 (standard library only: they also run in the browser)."""

import math

from _judge.checking import (
    check,
    expect_close,
    expect_equal,
    expect_raises,
    expect_type,
)

MIB = 2**20


def reference(psi, bpg, n, bw, backward, bucket_bytes=25 * MIB, alpha_s=0.0):
    bucket, alpha = bucket_bytes, alpha_s
    grad = psi * bpg
    b = math.ceil(grad / bucket)
    if b == 0:
        return {
            "grad_bytes": grad,
            "n_buckets": 0,
            "bucket_s": 0.0,
            "comm_s": 0.0,
            "exposed_s": 0.0,
            "hidden": True,
        }
    c = 2 * (n - 1) * alpha + 2 * (n - 1) / n * grad / b / bw
    surplus = b * c - backward * (b - 1) / b
    return {
        "grad_bytes": grad,
        "n_buckets": b,
        "bucket_s": c,
        "comm_s": b * c,
        "exposed_s": max(c, surplus),
        "hidden": surplus <= c,
    }


def report(sol, *args, **kwargs):
    shown = (
        "sync_report("
        + ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        + ")"
    )
    expected = reference(*args, **kwargs)  # before the reader's code runs
    got = sol.sync_report(*args, **kwargs)
    expect_type(got, dict, input=shown)
    expect_close(got, expected, input=shown, rel=1e-9, abs_tol=1e-15)
    return shown, got


@check("the 7B question: 64 ranks, 50 GB/s, 0.8 s of backward")
def seven_b(sol):
    shown, got = report(sol, 7e9, 2, 64, 50e9, 0.8)
    expect_close(got["comm_s"], 0.55125, input=shown, what="comm_s", rel=1e-9)
    expect_equal(got["hidden"], True, input=shown, what="hidden")


@check("8 ranks on H100 NVLink: 450 GB/s each way")
def eight_ranks(sol):
    # NVLink's "900 GB/s" counts both directions; a ring's bandwidth is one's.
    shown, got = report(sol, 7e9, 2, 8, 450e9, 0.8)
    expect_close(got["comm_s"], 2 * 7 / 8 * 14e9 / 450e9, input=shown, what="comm_s")


@check("a link too slow to hide the sync")
def too_slow(sol):
    shown, got = report(sol, 7e9, 2, 64, 12.5e9, 0.8)
    expect_equal(got["hidden"], False, input=shown, what="hidden")
    expect_close(
        got["exposed_s"], 2.205 - 0.8 * 534 / 535, input=shown, what="exposed_s"
    )


@check("one rank communicates nothing")
def one_rank(sol):
    shown, got = report(sol, 1e9, 4, 1, 50e9, 0.5)
    expect_close(got["exposed_s"], 0.0, input=shown, what="exposed_s")


@check("latency is paid once per bucket")
def latency(sol):
    report(sol, 1e9, 2, 16, 100e9, 0.2, bucket_bytes=4 * MIB, alpha_s=20e-6)
    report(sol, 1e9, 2, 16, 100e9, 0.2, bucket_bytes=MIB, alpha_s=200e-6)


@check("a grid of models, ranks, links and bucket sizes")
def grid(sol):
    for psi in (0, 125e6, 1.3e9, 7e9, 70e9):
        for n in (1, 2, 8, 64, 512):
            for bw in (10e9, 50e9, 900e9):
                for backward in (0.0, 0.1, 0.8, 5.0):
                    for bucket in (MIB, 25 * MIB, 1e9):
                        report(sol, psi, 2, n, bw, backward, bucket_bytes=bucket)


@check("bad input raises ValueError")
def bad_input(sol):
    for args, kwargs in (
        ((7e9, 2, 0, 50e9, 0.8), {}),
        ((7e9, 2, 8, 0, 0.8), {}),
        ((7e9, 2, 8, 50e9, -1), {}),
        ((7e9, 2, 8, 50e9, 0.8), {"bucket_bytes": 0}),
        ((-1, 2, 8, 50e9, 0.8), {}),
    ):
        expect_raises(
            lambda: sol.sync_report(*args, **kwargs),
            ValueError,
            input=f"sync_report{args}" + (f" with {kwargs}" if kwargs else ""),
        )
