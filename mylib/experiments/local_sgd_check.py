"""Chapter 7's two ways to wait less: stale gradients and local SGD, measured.

One small regression task serves both: every rank learns the same function,
``y = tanh(x @ TRUE_W)``, from its own seeded stream of inputs, with a small
seeded MLP. Everything is seeded, so the numbers the chapter prints (and
asserts) are the same on every run, however busy the machine.

* :func:`staleness_tails`: asynchronous SGD as the parameters see it
  (:func:`mylib.local_sgd.stale_gradient_sgd`), one process, the mean loss
  over the last steps for each (staleness, learning rate);
* :func:`local_sgd_tradeoff`: run on every rank, local SGD for several
  periods ``H`` on data alike or differing per rank: held-out loss and bytes
  sent per step; and two equivalences, ``H = 1`` against gradient averaging
  and :class:`mylib.local_sgd.LocalSGD` against PyTorch's
  ``PeriodicModelAverager``.
"""

import torch
import torch.distributed as dist

INPUTS = 10
TRUE_W = torch.randn(INPUTS, 1, generator=torch.Generator().manual_seed(0))


def regression_batches(steps, batch=32, seed=1, shift=0.0):
    """``steps`` batches ``(x, tanh(x @ TRUE_W))``; the seed picks the inputs.

    ``shift`` moves every input by the same amount: a rank whose data differ.
    """
    gen = torch.Generator().manual_seed(seed)
    return [
        (x, torch.tanh(x @ TRUE_W))
        for x in (
            torch.randn(batch, INPUTS, generator=gen) + shift for _ in range(steps)
        )
    ]


def small_mlp():
    """The same seeded ``Linear(10, 32), Tanh, Linear(32, 1)`` on every call."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
    )


def staleness_tails(runs, steps=200, tail=50):
    """Mean loss over the last ``tail`` of ``steps`` steps, per ``(delay, lr)``.

    ``runs`` lists ``(delay, lr)`` pairs; returns ``{(delay, lr): loss}``. A
    diverged run gives a huge number, ``inf`` or ``nan``.
    """
    from mylib.local_sgd import stale_gradient_sgd

    torch.set_num_threads(1)
    tails = {}
    for delay, lr in runs:
        losses = stale_gradient_sgd(
            small_mlp(),
            regression_batches(steps),
            lr,
            delay,
            torch.nn.functional.mse_loss,
        )
        tails[delay, lr] = sum(losses[-tail:]) / tail
    return tails


def _held_out_loss(model, spread, n):
    """Mean loss on 256 held-out samples from every rank's distribution."""
    held_out = [
        regression_batches(
            1, batch=256, seed=999 + r, shift=spread * (r - (n - 1) / 2)
        )[0]
        for r in range(n)
    ]
    with torch.no_grad():
        return (
            sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in held_out)
            / n
        )


def local_sgd_tradeoff(periods, steps, spreads, lr=0.1):
    """Run on every rank: local SGD for each period and data spread.

    Rank ``r``'s inputs are shifted by ``spread * (r - (n - 1) / 2)`` (0: data
    alike). Returns ``(report, diff_sync, diff_torch)``: ``report[spread,
    period]`` is ``(held-out loss after a final average, bytes this rank sent
    per step)``; ``diff_sync`` the largest difference between ``LocalSGD``
    with ``H = 1`` and SGD on all-reduced gradients, ``diff_torch`` between
    ``LocalSGD(H=4)`` and PyTorch's ``PeriodicModelAverager(period=4,
    warmup_steps=3)``.
    """
    from torch.distributed.algorithms.model_averaging.averagers import (
        PeriodicModelAverager,
    )

    from mylib.comm import count_bytes
    from mylib.local_sgd import LocalSGD

    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    mse = torch.nn.functional.mse_loss
    report = {}
    for spread in spreads:
        shift = spread * (rank - (n - 1) / 2)
        data = regression_batches(steps, seed=100 + rank, shift=shift)  # its own
        for period in periods:
            model = small_mlp()
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            local = LocalSGD(model, opt, sync_every=period)
            with count_bytes() as stats:
                for x, y in data:
                    mse(model(x), y).backward()
                    local.step()
                    opt.zero_grad()
            local.average_parameters()  # end on the average
            report[spread, period] = (
                _held_out_loss(model, spread, n),
                stats.bytes_sent / steps,
            )
    data = regression_batches(16, seed=100 + rank)
    # Equivalence 1: H = 1 is synchronous SGD on averaged gradients.
    a, b = small_mlp(), small_mlp()
    opt_a = torch.optim.SGD(a.parameters(), lr=lr)
    local = LocalSGD(a, opt_a, sync_every=1)
    for x, y in data[:8]:
        mse(a(x), y).backward()
        local.step()
        opt_a.zero_grad()
        mse(b(x), y).backward()
        with torch.no_grad():
            for p in b.parameters():
                dist.all_reduce(p.grad)
                p.add_(p.grad, alpha=-lr / n)
                p.grad = None
    diff_sync = max(
        (p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters())
    )
    # Equivalence 2: LocalSGD(H=4) and PeriodicModelAverager(period=4, warmup=3).
    c, d = small_mlp(), small_mlp()
    opt_c = torch.optim.SGD(c.parameters(), lr=lr)
    opt_d = torch.optim.SGD(d.parameters(), lr=lr)
    local = LocalSGD(c, opt_c, sync_every=4)
    averager = PeriodicModelAverager(period=4, warmup_steps=3)
    for x, y in data:
        for model in (c, d):
            mse(model(x), y).backward()
        local.step()
        opt_d.step()
        averager.average_parameters(d.parameters())
        opt_c.zero_grad()
        opt_d.zero_grad()
    diff_torch = max(
        (p - q).abs().max().item() for p, q in zip(c.parameters(), d.parameters())
    )
    return report, diff_sync, diff_torch
