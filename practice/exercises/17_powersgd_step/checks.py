"""Checks for exercise 5.2: on gloo ranks, against the formulas and PyTorch's hook.

The ranks send back what the reader's steps returned; the formulas are
evaluated here, in the judge, from every rank's inputs, and PyTorch's own
powerSGD_hook runs on ranks that run none of the reader's code.
"""

from _judge.checking import check, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = ("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook",)
N_ROWS, N_COLS, STEPS = 12, 8, 3
FORBIDDEN = [
    "all_gather",
    "all_gather_single",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
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


def initial_q(seed, r):
    import torch

    torch.manual_seed(seed)  # the same Q on every rank
    return torch.randn(N_COLS, r)


def rank_grads(seed, rank):
    """Rank ``rank``'s gradient at each step: the same wherever they are drawn."""
    import torch

    g = torch.Generator().manual_seed(seed * 100 + rank)
    return [torch.randn(N_ROWS, N_COLS, generator=g) * (1 + s) for s in range(STEPS)]


def worker(powersgd_step, r, seed):
    """The reader's steps, each fed its own new_q and new_error: raw tensors back."""
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    q = initial_q(seed, r)
    error = torch.zeros(N_ROWS, N_COLS)
    out = {"steps": []}
    for grad in rank_grads(seed, dist.get_rank()):
        given = grad.clone()
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
            "q_in": q,
            "error_in": error,
        }
        ok = (
            isinstance(result, (tuple, list))
            and len(result) == 3
            and all(isinstance(t, torch.Tensor) for t in result)
        )
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
        s["approx"], s["new_q"], s["new_error"] = (
            t.detach().float().clone() for t in result
        )
        out["steps"].append(s)
        q, error = s["new_q"].clone(), s["new_error"].clone()
    return out


def reference_step(ms, q, r, world):
    """One PowerSGD step from every rank's M = grad + error: (Q', approx)."""
    p = sum(m @ q for m in ms)
    for i in range(r):
        col = p[:, i : i + 1]
        col /= col.norm()
        p[:, i + 1 :] -= (col * p[:, i + 1 :]).sum(0, keepdim=True) * col
    new_q = sum(m.t() @ p for m in ms) / world
    return new_q, p @ new_q.t()


def torch_worker(r, seed):
    """PyTorch's powerSGD_hook, first step, on ranks that run none of the reader's
    code: its approximation and error for this rank."""
    import torch
    import torch.distributed as dist

    grad = rank_grads(seed, dist.get_rank())[0]
    approx, error = torch_step(grad, initial_q(seed, r), torch.zeros_like(grad), r)
    return {"approx": approx, "error": error}


def results(sol, world, r):
    from _judge.ranks import reference_on_ranks

    shown = (
        f"{world} ranks, powersgd_step(grad, q, error) on a {N_ROWS} x {N_COLS} random "
        f"gradient per rank, rank r = {r}, {STEPS} steps, each step's new_q and "
        "new_error fed into the next"
    )
    if (world, r) not in _results:
        seed = world * 10 + r
        theirs = reference_on_ranks(torch_worker, world, r, seed)
        _results[world, r] = (
            on_ranks(worker, world, sol.powersgd_step, r, seed),
            theirs,
            [rank_grads(seed, k) for k in range(world)],
        )
    return shown, _results[world, r]


def compared(sol, world, r):
    """Each rank's steps against the formulas, computed here from every rank's
    inputs (the q and error each step was given)."""
    import torch

    shown, (ranks, theirs, grads) = results(sol, world, r)
    for rank, out in enumerate(ranks):
        for step, s in enumerate(out["steps"], 1):
            where = f"on rank {rank}, step {step}"
            if s.get("shape_problem"):
                fail(f"{where}: {s['shape_problem']}", input=shown)
            for name, shape in (
                ("approx", (N_ROWS, N_COLS)),
                ("new_q", (N_COLS, r)),
                ("new_error", (N_ROWS, N_COLS)),
            ):
                if tuple(s[name].shape) != shape:
                    fail(
                        f"{where}: {name} has shape {tuple(s[name].shape)}, "
                        f"expected {shape}",
                        input=shown,
                    )
            if s["grad_changed"]:
                fail(
                    f"{where}, powersgd_step changed grad: add the error into "
                    "a new tensor",
                    input=shown,
                )
    found = [[] for _ in ranks]
    steps = min(len(out["steps"]) for out in ranks)
    for step in range(steps):
        ms = [
            grads[k][step] + ranks[k]["steps"][step]["error_in"] for k in range(world)
        ]
        q = ranks[0]["steps"][step]["q_in"]
        ref_q, ref_approx = reference_step(ms, q.clone(), r, world)
        for k in range(world):
            s = ranks[k]["steps"][step]
            # Gram-Schmidt fixes each column up to its sign: compare with the closer.
            q_diff = max(
                float(
                    min(
                        (s["new_q"][:, j] - ref_q[:, j]).abs().max(),
                        (s["new_q"][:, j] + ref_q[:, j]).abs().max(),
                    )
                )
                for j in range(r)
            )
            found[k].append(
                {
                    "approx": float((s["approx"] - ref_approx).abs().max()),
                    "error": float((s["new_error"] - (ms[k] - ref_approx)).abs().max()),
                    "q": q_diff,
                    "ref_approx": ref_approx,
                    "ref_error": ms[k] - ref_approx,
                }
            )
    for rank, steps_found in enumerate(found):
        for step, f in enumerate(steps_found, 1):
            where = f"on rank {rank}, step {step}"
            for key, what in (
                ("approx", "approx differs from P Q'^T"),
                ("error", "new_error differs from M_k - approx"),
                (
                    "q",
                    "new_q differs from Q' (the all-reduced M^T P, divided by "
                    "the number of ranks)",
                ),
            ):
                if f[key] > 1e-5:
                    fail(f"{where}, {what} by up to {f[key]:.3g}", input=shown)
    lost = []
    for rank, out in enumerate(ranks):
        total_approx = sum(s["approx"] for s in out["steps"])
        mean_grads = sum(
            torch.stack([g[s] for g in grads]).mean(0) for s in range(STEPS)
        )
        final_error = torch.stack([o["steps"][-1]["new_error"] for o in ranks]).mean(0)
        lost.append(float((total_approx + final_error - mean_grads).abs().max()))
    return shown, ranks, theirs, found, lost


@check("2 ranks, rank 1: three steps match the formulas")
def two_ranks(sol):
    compared(sol, 2, 1)


@check("3 ranks, rank 2: three steps match the formulas")
def three_ranks(sol):
    compared(sol, 3, 2)


@check(
    "nothing is lost: the approximations plus the last error add up to the gradients"
)
def nothing_lost(sol):
    for world, r in ((2, 1), (3, 2)):
        shown, _, _, _, lost = compared(sol, world, r)
        for rank, value in enumerate(lost):
            if value > 1e-4:
                fail(
                    f"on rank {rank} the {STEPS} approximations plus the ranks' mean "
                    "final error differ from the sum of the mean gradients by "
                    f"{value:.3g}: "
                    "add the error into M before compressing, and keep M - approx",
                    input=shown,
                )


@check("two all-reduces, of n r and m r numbers, and no other collective")
def communication(sol):
    for world, r in ((2, 1), (3, 2)):
        shown, ranks, _, _, _ = compared(sol, world, r)
        expected = [("all_reduce", N_ROWS * r), ("all_reduce", N_COLS * r)]
        for rank, out in enumerate(ranks):
            for step, s in enumerate(out["steps"], 1):
                if [tuple(c) for c in s["calls"]] != expected:
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
        shown, ranks, theirs, found, _ = compared(sol, world, r)
        for rank, out in enumerate(ranks):
            ref = found[rank][0]
            torch_vs_ref = float(
                max(
                    (theirs[rank]["approx"] - ref["ref_approx"]).abs().max(),
                    (theirs[rank]["error"] - ref["ref_error"]).abs().max(),
                )
            )
            if torch_vs_ref > 1e-5:
                fail(
                    "the checks' reference disagrees with PyTorch's powerSGD_hook by "
                    f"{torch_vs_ref:.3g}: a bug of the exercise, not yours",
                    input=shown,
                )
            first = out["steps"][0]
            diff = float(
                max(
                    (first["approx"] - theirs[rank]["approx"]).abs().max(),
                    (first["new_error"] - theirs[rank]["error"]).abs().max(),
                )
            )
            if diff > 1e-5:
                fail(
                    f"on rank {rank} the first step differs from PyTorch's "
                    f"powerSGD_hook by up to {diff:.3g}",
                    input=shown + " (PyTorch's hook: warm start, error feedback)",
                )
