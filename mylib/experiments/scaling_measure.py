"""Measuring scaling on this machine, and the model's prediction beside it.

Chapter 7 trains one model at a fixed global batch on 1, 2 and 4 gloo ranks
and sets the measured step times beside
:func:`mylib.models.scaling.scaled_step`, calibrated on the same machine:

* compute: :func:`time_compute` (:func:`time_compute_shares` for several
  shares side by side) times one rank's forward and backward on its
  share of the batch, in this process, on one thread (each rank gets one
  thread, as each rank gets one GPU on a cluster);
* communication: alpha and beta fitted to all-reduces timed inside the same run
  (:func:`mylib.experiments.commbench.time_all_reduce`,
  :func:`mylib.models.costmodel.fit_alpha_beta`);
* cores: ranks beyond the machine's cores take turns (``cores=`` of the model).

:func:`train_fixed_global_batch` is the run itself, a function for
:func:`mylib.run_ranks`: every rank takes its slice of each global batch,
trains with ``MyDDP`` and plain SGD, and returns the step times, the
all-reduce timings and the final parameters, which must equal one process
training on the whole batch (:func:`train_single_process`).
"""

import statistics
import time

import torch
import torch.distributed as dist

from mylib.models.buckets import MB
from mylib.models.costmodel import fit_alpha_beta
from mylib.models.scaling import WEAK, scaled_step
from mylib.models.timeline import Layer

# 4 KB to 8 MB: enough to separate alpha from beta
COMM_SIZES = [2**k for k in range(12, 24, 2)]


def _sgd_step(params, lr):
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-lr)
            p.grad.zero_()  # in place: with MyDDP, .grad stays a view of its bucket


def train_single_process(make_model, batches, lr):
    """Plain SGD on the whole batch in this process.

    Every data-parallel run must reproduce it.
    """
    model = make_model()
    for x, y in batches:
        torch.nn.functional.mse_loss(model(x), y).backward()
        _sgd_step(model.parameters(), lr)
    return [p.detach().clone() for p in model.parameters()]


def train_fixed_global_batch(
    make_model,
    batches,
    lr,
    bucket_cap_mb=25.0,
    comm_sizes=COMM_SIZES,
    threads=1,
    use_torch_ddp=False,
):
    """Run on every rank: train on its slice of each global batch; time each step.

    Returns ``(step_s, allreduce_s, params)``: each step's time on the slowest
    rank (a synchronous step ends when the last rank is done), the all-reduce
    times of ``comm_sizes`` measured first in the same group (None on one
    rank), and the final parameters. ``use_torch_ddp`` trains with PyTorch's
    ``DistributedDataParallel`` instead of ``MyDDP``.
    """
    from mylib.ddp import MyDDP
    from mylib.experiments.commbench import time_all_reduce

    torch.set_num_threads(threads)
    rank, n = dist.get_rank(), dist.get_world_size()
    global_batch = batches[0][0].shape[0]
    if global_batch % n:
        raise ValueError(
            f"the global batch ({global_batch}) must split evenly over {n} ranks"
        )
    allreduce_s = time_all_reduce(comm_sizes, repeats=3, warmup=1) if n > 1 else None
    wrap = torch.nn.parallel.DistributedDataParallel if use_torch_ddp else MyDDP
    model = wrap(make_model(), bucket_cap_mb=bucket_cap_mb)
    step_s = []
    for x, y in batches:
        x, y = x.chunk(n)[rank], y.chunk(n)[rank]
        dist.barrier()  # every rank starts the step together
        start = time.perf_counter()
        # The mean over this rank's rows...
        torch.nn.functional.mse_loss(model(x), y).backward()
        if not use_torch_ddp:
            # ...averaged over ranks: the mean over the global batch.
            model.finish_gradient_sync()
        _sgd_step(model.parameters(), lr)
        step_s.append(time.perf_counter() - start)
    slowest = torch.tensor(step_s, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    params = [p.detach().clone() for p in model.module.parameters()]
    return slowest.tolist(), allreduce_s, params


def time_compute(model, batch, width, repeats=15, threads=1):
    """Fastest forward and backward seconds of ``model`` on ``batch`` rows.

    Runs on ``threads`` threads. The fastest run is the best estimate of the
    compute itself: other programs on the machine can only add time. Runs are
    short (milliseconds), so 15 of them make it unlikely that every one falls
    in a busy moment of a shared machine.
    """
    return time_compute_shares(model, [batch], width, repeats, threads)[batch]


def time_compute_shares(model, batches, width, repeats=15, threads=1):
    """:func:`time_compute` for several batch sizes, side by side.

    Returns ``{batch: (forward_s, backward_s)}``. Each repeat times every size
    in turn, so a busy moment of a shared machine slows them alike: compared
    with each other (a rank's share of the batch against the whole), the
    fastest of each is the same machine's, not a quiet moment's against a
    busy one's.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    times = {batch: ([], []) for batch in batches}
    data = {b: (torch.randn(b, width), torch.randn(b, width)) for b in batches}
    try:
        for _ in range(repeats):
            for batch, (x, y) in data.items():
                t0 = time.perf_counter()
                loss = torch.nn.functional.mse_loss(model(x), y)
                t1 = time.perf_counter()
                loss.backward()
                times[batch][0].append(t1 - t0)
                times[batch][1].append(time.perf_counter() - t1)
                model.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(saved)
    return {batch: (min(f), min(b)) for batch, (f, b) in times.items()}


def linear_layers(model, backward_s):
    """The model's Linear layers, in backward order, as timeline layers.

    They share ``backward_s`` evenly.
    """
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][::-1]
    return [
        Layer(
            f"linear{len(linears) - 1 - i}",
            backward_s / len(linears),
            [p.numel() * p.element_size() for p in (m.bias, m.weight) if p is not None],
        )
        for i, m in enumerate(linears)
    ]


def predicted_step(
    model,
    ranks,
    forward_s,
    backward_s,
    allreduce_s=None,
    comm_sizes=COMM_SIZES,
    cores=None,
    bucket_cap_mb=25.0,
):
    """The timeline model's step for one rank of ``ranks``, from this machine's timings.

    ``forward_s``/``backward_s``: one rank's compute on its share of the batch
    (:func:`time_compute` at ``global_batch / ranks``). ``allreduce_s``: times
    of ``comm_sizes`` all-reduces on ``ranks`` ranks, to fit alpha and beta.
    Returns ``(timeline, fit)``; ``fit`` is None for one rank.
    """
    fit = (
        fit_alpha_beta(comm_sizes, allreduce_s, world_size=ranks) if ranks > 1 else None
    )
    alpha, beta = (fit.alpha, fit.beta) if fit else (0.0, 1.0)
    # The compute was measured at this rank count's batch share: scale it only
    # for shared cores.
    layers = linear_layers(model, backward_s)
    return scaled_step(
        layers,
        ranks,
        alpha,
        beta,
        bucket_cap_mb * MB,
        mode=WEAK,
        forward_s=forward_s,
        cores=cores,
    ), fit


def typical(values, skip=2):
    """Median of ``values`` after the first ``skip`` (warm-up) ones."""
    return statistics.median(values[skip:] if len(values) > skip else values)


def straggler_steps(
    compute_s,
    extra_s_by_rank=None,
    steps=20,
    jitter_mean_s=0.0,
    grad_numel=256 * 1024,
    seed=0,
):
    """Run on every rank: ``steps`` steps of simulated compute, then an all-reduce.

    Each rank "computes" by sleeping ``compute_s``, plus its entry of
    ``extra_s_by_rank`` (a permanently slow rank), plus, with
    ``jitter_mean_s``, a random hiccup drawn from an exponential distribution
    (seeded per rank). Sleeping needs no core, so many ranks can share a
    small machine without disturbing the timing. Returns
    ``(own_s, step_s, delays_s)``: this rank's compute time, its step time
    (compute plus the all-reduce, which waits for the slowest rank) and its
    random delays, per step.
    """
    import random

    rank = dist.get_rank()
    extra = 0.0 if extra_s_by_rank is None else extra_s_by_rank[rank]
    rng = random.Random(seed * 1000 + rank)
    grad = torch.zeros(grad_numel)
    own_s, step_s, delays_s = [], [], []
    for _ in range(steps):
        delay = rng.expovariate(1.0 / jitter_mean_s) if jitter_mean_s > 0 else 0.0
        dist.barrier()
        start = time.perf_counter()
        time.sleep(compute_s + extra + delay)
        computed = time.perf_counter()
        dist.all_reduce(grad)
        own_s.append(computed - start)
        step_s.append(time.perf_counter() - start)
        delays_s.append(delay)
    return own_s, step_s, delays_s


def slowest_delays(results):
    """Per step, the largest random delay any rank drew: what the step waited for.

    ``results`` are :func:`straggler_steps`' returns, one per rank. Rank ``r``
    draws from its own seeded generator, the same sequence whatever the rank
    count, so the slowest of ``n`` ranks is never below the slowest of fewer.
    """
    return [max(step) for step in zip(*(delays for _, _, delays in results))]
