"""Checks for exercise 6.1 (standard library only: they also run in the browser)."""

from _judge.checking import check, expect_close, expect_raises, expect_type


def reference(psi, n, stage, k=12):
    return [
        (4 + k) * psi,
        4 * psi + k * psi / n,
        2 * psi + (2 + k) * psi / n,
        (4 + k) * psi / n,
    ][stage]


def mem(sol, *args, **kwargs):
    shown = (
        "per_rank_bytes("
        + ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        + ")"
    )
    got = sol.per_rank_bytes(*args, **kwargs)
    expect_type(got, (int, float), input=shown)
    return shown, got


@check("the ZeRO paper's 7.5B model on 64 ranks")
def paper(sol):
    for stage, gb in enumerate((120.0, 31.40625, 16.640625, 1.875)):
        shown, got = mem(sol, 7.5e9, 64, stage)
        expect_close(got, gb * 1e9, input=shown, rel=1e-12)


@check("on one rank every stage holds the same")
def one_rank(sol):
    for stage in range(4):
        shown, got = mem(sol, 1000, 1, stage)
        expect_close(got, 16000, input=shown, rel=1e-12)


@check("another optimizer: K = 4 (SGD with momentum, fp32 master weights)")
def other_k(sol):
    for stage in range(4):
        shown, got = mem(sol, 1e6, 8, stage, k=4)
        expect_close(got, reference(1e6, 8, stage, 4), input=shown, rel=1e-12)


@check("a grid of models, rank counts and stages")
def grid(sol):
    for psi in (0, 1, 125e6, 7e9, 175e9):
        for n in (1, 2, 3, 8, 64, 1024):
            for stage in range(4):
                shown, got = mem(sol, psi, n, stage)
                expect_close(got, reference(psi, n, stage), input=shown, rel=1e-12)


@check("communication: 2 psi, and 3 psi for stage 3")
def communication(sol):
    for stage, factor in ((0, 2), (1, 2), (2, 2), (3, 3)):
        shown = f"comm_elements_per_step(7.5e9, {stage})"
        got = sol.comm_elements_per_step(7.5e9, stage)
        expect_type(got, (int, float), input=shown)
        expect_close(got, factor * 7.5e9, input=shown, rel=1e-12)


@check("bad input raises ValueError")
def bad_input(sol):
    for args in ((1e9, 8, 4), (1e9, 8, -1), (1e9, 0, 1), (-5, 8, 1)):
        expect_raises(
            lambda: sol.per_rank_bytes(*args), ValueError, input=f"per_rank_bytes{args}"
        )
    expect_raises(
        lambda: sol.per_rank_bytes(1e9, 8, 1, k=-1),
        ValueError,
        input="per_rank_bytes(1e9, 8, 1, k=-1)",
    )
    expect_raises(
        lambda: sol.comm_elements_per_step(1e9, 5),
        ValueError,
        input="comm_elements_per_step(1e9, 5)",
    )
