"""Checks for exercise 17: on gloo ranks, against the formulas and PyTorch's hook."""

from _judge.checking import check, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = ("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook",)
N_ROWS, N_COLS, STEPS = 12, 8, 3
FORBIDDEN = [
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "send",
    "recv",
]
_results = {}  # (world, r) -> the ranks' results, computed once for the checks


class FakeBucket:
    """What PyTorch's powerSGD_hook reads of a DDP bucket: one matrix gradient."""

    def __init__(self, buffer, shape):
        self._buffer, self._shape = buffer, shape

    def buffer(self):
        return self._buffer

    def gradients(self):
        return [self._buffer.view(self._shape)]

    def index(self):
        return 0

    def is_last(self):
        return True


def torch_step(grad, q, error, r):
    """One step of ``powerSGD_hook`` (torch 2.13) with a given Q and error."""
    import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as psgd

    state = psgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=r,
        start_powerSGD_iter=2,
        min_compression_rate=1.0,
        use_error_feedback=True,
        warm_start=True,
    )
    state.iter = state.start_powerSGD_iter  # past the plain all-reduce steps
    state.error_dict[0] = error.flatten().clone()
    state.p_memory_dict[0] = grad.new_empty(grad.shape[0] * r)
    state.q_memory_dict[0] = q.flatten().clone()
    buffer = grad.flatten().clone()
    approx = psgd.powerSGD_hook(state, FakeBucket(buffer, grad.shape)).wait()
    approx = approx[0] if isinstance(approx, (list, tuple)) else approx
    return approx.view(grad.shape), state.error_dict[0].view(grad.shape)


def worker(powersgd_step, r, seed):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)  # the same Q on every rank
    q = torch.randn(N_COLS, r)
    torch.manual_seed(seed * 100 + rank)  # each rank's own gradients
    error = torch.zeros(N_ROWS, N_COLS)
    out = {"steps": []}
    sum_approx = torch.zeros(N_ROWS, N_COLS)
    sum_mean_grad = torch.zeros(N_ROWS, N_COLS)
    for step in range(STEPS):
        grad = torch.randn(N_ROWS, N_COLS) * (1 + step)
        given = grad.clone()
        # The reference, from every rank's matrix.
        m = grad + error
        everyone = [torch.empty_like(m) for _ in range(world)]
        dist.all_gather(everyone, m)
        grads = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(grads, grad)
        sum_mean_grad += torch.stack(grads).mean(0)
        p = sum(mk @ q for mk in everyone)
        for i in range(r):
            col = p[:, i : i + 1]
            col /= col.norm()
            p[:, i + 1 :] -= (col * p[:, i + 1 :]).sum(0, keepdim=True) * col
        ref_q = sum(mk.t() @ p for mk in everyone) / world
        ref_approx = p @ ref_q.t()
        ref_error = m - ref_approx
        if step == 0:
            theirs_approx, theirs_error = torch_step(grad, q, error, r)
            out["torch_vs_ref"] = float(
                max(
                    (theirs_approx - ref_approx).abs().max(),
                    (theirs_error - ref_error).abs().max(),
                )
            )
        with spy_on_dist(
            ["all_reduce"],
            forbid=FORBIDDEN,
            reader_functions=[powersgd_step],
            why="PowerSGD sends P and Q with two all_reduce calls, nothing else",
        ) as spy:
            result = powersgd_step(grad, q.clone(), error.clone())
        s = {
            "calls": [(c[0], c[2]) for c in spy.calls],
            "grad_changed": not torch.equal(grad, given),
        }
        ok = (
            isinstance(result, (tuple, list))
            and len(result) == 3
            and all(isinstance(t, torch.Tensor) for t in result)
        )
        s["shape_problem"] = None
        if not ok:
            s["shape_problem"] = (
                "powersgd_step must return a tuple of three tensors "
                "(approx, new_q, new_error), it returned "
                + (
                    f"a {type(result).__name__} of {len(result)}"
                    if isinstance(result, (tuple, list))
                    else f"a {type(result).__name__}"
                )
            )
            out["steps"].append(s)
            break
        approx, new_q, new_error = (t.detach().float() for t in result)
        for name, t, shape in (
            ("approx", approx, (N_ROWS, N_COLS)),
            ("new_q", new_q, (N_COLS, r)),
            ("new_error", new_error, (N_ROWS, N_COLS)),
        ):
            if tuple(t.shape) != shape:
                s["shape_problem"] = (
                    f"{name} has shape {tuple(t.shape)}, expected {shape}"
                )
        if s["shape_problem"]:
            out["steps"].append(s)
            break
        s["approx"] = float((approx - ref_approx).abs().max())
        s["error"] = float((new_error - ref_error).abs().max())
        # Gram-Schmidt fixes each column up to its sign: compare with the closer one.
        s["q"] = max(
            float(
                min(
                    (new_q[:, j] - ref_q[:, j]).abs().max(),
                    (new_q[:, j] + ref_q[:, j]).abs().max(),
                )
            )
            for j in range(r)
        )
        if step == 0:
            s["torch"] = float(
                max(
                    (approx - theirs_approx).abs().max(),
                    (new_error - theirs_error).abs().max(),
                )
            )
        out["steps"].append(s)
        sum_approx += approx
        q, error = new_q.clone(), new_error.clone()
    else:
        errors = [torch.empty_like(error) for _ in range(world)]
        dist.all_gather(errors, error)
        out["lost"] = float(
            (sum_approx + torch.stack(errors).mean(0) - sum_mean_grad).abs().max()
        )
    return out


def results(sol, world, r):
    shown = (
        f"{world} ranks, powersgd_step(grad, q, error) on a {N_ROWS} x {N_COLS} random "
        f"gradient per rank, rank r = {r}, {STEPS} steps, each step's new_q and "
        "new_error fed into the next"
    )
    if (world, r) not in _results:
        _results[world, r] = on_ranks(
            worker, world, sol.powersgd_step, r, world * 10 + r
        )
    return shown, _results[world, r]


def verify(sol, world, r):
    shown, ranks = results(sol, world, r)
    for rank, out in enumerate(ranks):
        for step, s in enumerate(out["steps"], 1):
            where = f"on rank {rank}, step {step}"
            if s["shape_problem"]:
                fail(f"{where}: {s['shape_problem']}", input=shown)
            if s["grad_changed"]:
                fail(
                    f"{where}, powersgd_step changed grad: add the error into "
                    "a new tensor",
                    input=shown,
                )
            for key, what in (
                ("approx", "approx differs from P Q'^T"),
                ("error", "new_error differs from M_k - approx"),
                (
                    "q",
                    "new_q differs from Q' (the all-reduced M^T P, divided by "
                    "the number of ranks)",
                ),
            ):
                if s[key] > 1e-5:
                    fail(f"{where}, {what} by up to {s[key]:.3g}", input=shown)
    return shown, ranks


@check("2 ranks, rank 1: three steps match the formulas")
def two_ranks(sol):
    verify(sol, 2, 1)


@check("3 ranks, rank 2: three steps match the formulas")
def three_ranks(sol):
    verify(sol, 3, 2)


@check(
    "nothing is lost: the approximations plus the last error add up to the gradients"
)
def nothing_lost(sol):
    for world, r in ((2, 1), (3, 2)):
        shown, ranks = verify(sol, world, r)
        for rank, out in enumerate(ranks):
            if out["lost"] > 1e-4:
                fail(
                    f"on rank {rank} the {STEPS} approximations plus the ranks' mean "
                    "final error differ from the sum of the mean gradients by "
                    f"{out['lost']:.3g}: "
                    "add the error into M before compressing, and keep M - approx",
                    input=shown,
                )


@check("two all-reduces, of n r and m r numbers, and no other collective")
def communication(sol):
    for world, r in ((2, 1), (3, 2)):
        shown, ranks = verify(sol, world, r)
        expected = [("all_reduce", N_ROWS * r), ("all_reduce", N_COLS * r)]
        for rank, out in enumerate(ranks):
            for step, s in enumerate(out["steps"], 1):
                if s["calls"] != expected:
                    fail(
                        f"on rank {rank}, step {step}, the collectives (name, numbers "
                        "sent) differ: all-reduce P, then Q', and nothing else",
                        input=shown,
                        expected=expected,
                        got=s["calls"],
                    )


@check("one step equals PyTorch's powerSGD_hook given the same Q and error")
def like_torch(sol):
    for world, r in ((2, 1), (3, 2)):
        shown, ranks = verify(sol, world, r)
        for rank, out in enumerate(ranks):
            if out["torch_vs_ref"] > 1e-5:
                fail(
                    "the checks' reference disagrees with PyTorch's powerSGD_hook by "
                    f"{out['torch_vs_ref']:.3g}: a bug of the exercise, not yours",
                    input=shown,
                )
            if out["steps"][0]["torch"] > 1e-5:
                fail(
                    f"on rank {rank} the first step differs from PyTorch's "
                    f"powerSGD_hook by up to {out['steps'][0]['torch']:.3g}",
                    input=shown + " (PyTorch's hook: warm start, error feedback)",
                )
