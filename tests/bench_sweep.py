"""`make bench`'s sweep: MyDDP against PyTorch's DDP as parameter tensors multiply.

MyDDP's work per gradient is Python (a hook call, its bookkeeping, the bucket
it fills); DDP's is C++. A model with few big tensors hides that cost behind
the compute, a model with hundreds of small ones does not. So the sweep times
both wrappers on models of 16, 200 and 800 parameter tensors (MLPs: Linear
layers, a weight and a bias each) and on a decoder shaped like Llama 3 8B's
block stack, every width divided by 32 (``mylib.models.transformer``'s
"Llama 3 8B": 32 blocks of 9 tensors, 291 tensors in all).

Measured as ``tests/bench.py``'s DDP benchmark is: 2 gloo ranks, one thread
each, a 25 MB cap (the first bucket's cap too, for both: DDP's rule when
``bucket_cap_mb`` is given), steps alternating between the two wrappers (which
goes first alternates too), the median of the pairs' ratios after warm-up pairs.
Both wrappers wrap copies of one model, so they do the same arithmetic, and the
ranks flush subnormal floats to zero. Both matter at 200 tensors: 100 layers of
width 128 shrink the gradient layer by layer until, near the input, most of its
entries underflow, and some 6% of all gradient entries are subnormal. x86 CPUs
compute on subnormals several times slower, so there the backward took six times
as long as with them flushed, and two models made one after the other (different
weights, different subnormals) differed by about 13% in backward time, the MLP
made first, MyDDP's until then, being the slower: a ratio of the models, not of
the wrappers (CPU time ratio 1.06 to 1.08 with two models, 0.97 with one).
Beside each ratio, the ratio of the CPU time the two steps used (which the
load of other programs does not stretch), and MyDDP's Python cost per gradient:
the median time of one call of its gradient hook (filing the gradient, the
checks, the launch loop; the communication hook, which divides and launches
as DDP's does, left out), timed in separate steps so that the timer costs the
ratios nothing.

    python tests/bench.py sweep
"""

import copy
import dataclasses
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mylib.models import transformer as tf

CAP_MB = 25
# Llama 3 8B's shapes with every width divided by 32; 4 heads of 32 share one
# key/value head, as its 32 heads of 128 share 8.
LLAMA_SMALL = dataclasses.replace(
    tf.MODELS["Llama 3 8B"],
    name="Llama 3 8B / 32",
    hidden=4096 // 32,
    heads=4,
    kv_heads=1,
    ffn=14336 // 32,
    vocab=128256 // 32,
    seq=64,
)


class _Block(nn.Module):
    """A Llama block: attention with grouped keys and values, then a SwiGLU MLP."""

    def __init__(self, m):
        super().__init__()
        h, kv = m.hidden, m.kv_width
        self.heads, self.kv_heads = m.heads, m.kv_heads
        self.q, self.k = nn.Linear(h, h, bias=False), nn.Linear(h, kv, bias=False)
        self.v, self.o = nn.Linear(h, kv, bias=False), nn.Linear(h, h, bias=False)
        self.gate = nn.Linear(h, m.ffn, bias=False)
        self.up = nn.Linear(h, m.ffn, bias=False)
        self.down = nn.Linear(m.ffn, h, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(h), nn.RMSNorm(h)

    def forward(self, x):
        b, s, h = x.shape

        def heads(t, n):
            return t.view(b, s, n, -1).transpose(1, 2)

        y = self.norm1(x)
        q, k = heads(self.q(y), self.heads), heads(self.k(y), self.kv_heads)
        v = heads(self.v(y), self.kv_heads)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class _Decoder(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.embedding = nn.Embedding(m.vocab, m.hidden)
        self.blocks = nn.Sequential(*(_Block(m) for _ in range(m.layers)))
        self.norm = nn.RMSNorm(m.hidden)
        self.output = nn.Linear(m.hidden, m.vocab, bias=False)

    def forward(self, tokens):
        return self.output(self.norm(self.blocks(self.embedding(tokens))))


def _mlp(tensors, width):
    layers = []
    for _ in range(tensors // 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _points(batch, sequences):
    """(label, make the model, its input, the loss of its output): the sweep."""
    rank = torch.Generator().manual_seed(dist.get_rank())
    points = []
    for tensors, width in ((16, 512), (200, 128), (800, 64)):
        x = torch.randn(batch, width, generator=rank)
        points.append(
            (
                f"MLP, width {width}",
                lambda t=tensors, w=width: _mlp(t, w),
                x,
                lambda out: out.square().mean(),
            )
        )
    m = LLAMA_SMALL
    tokens = torch.randint(m.vocab, (sequences, m.seq + 1), generator=rank)
    points.append(
        (
            m.name,
            lambda: _Decoder(m),
            tokens[:, :-1],
            lambda out: F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten()),
        )
    )
    return points


def _hook_timer():
    """A MyDDP that times each call of its gradient hook, its comm hook excluded.

    The communication hook (divide the bucket, launch its all-reduce) is the
    work DDP does too; what is left is the Python that files a gradient.
    """
    from mylib import MyDDP
    from mylib.ddp import allreduce_average_hook

    class TimedHooks(MyDDP):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls, self.comm_s = [], 0.0
            self.register_comm_hook(self.process_group, self._timed_comm_hook)

        def _timed_comm_hook(self, state, bucket):
            t0 = time.perf_counter()
            future = allreduce_average_hook(state, bucket)
            self.comm_s += time.perf_counter() - t0
            return future

        def _on_grad_ready(self, index, param):
            comm_s, t0 = self.comm_s, time.perf_counter()
            super()._on_grad_ready(index, param)
            self.calls.append(time.perf_counter() - t0 - (self.comm_s - comm_s))

    return TimedHooks


def _step(model, opt, x, loss_fn, mine):
    opt.zero_grad(set_to_none=False)
    loss_fn(model(x)).backward()
    if mine:
        model.finish_gradient_sync()
    opt.step()


def _over_ranks(seconds, op):
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=op)
    return t.item()


def _sweep(warmup, pairs, hook_steps, batch, sequences, flush_denormal):
    from mylib import MyDDP

    torch.set_num_threads(1)
    torch.set_flush_denormal(flush_denormal)  # subnormals: see the docstring
    out = []
    for label, make, x, loss_fn in _points(batch, sequences):
        torch.manual_seed(0)
        # One model, two copies: the same weights give both wrappers the same
        # arithmetic. Two models made one after the other differ, and at 200
        # tensors the step time depends on the weights (see the docstring).
        mine = make()
        theirs = copy.deepcopy(mine)
        models = {
            # DDP's buckets: an explicit bucket_cap_mb caps DDP's first bucket too
            # (mylib.models.buckets), where MyDDP's default first cap is 1 MB.
            "MyDDP": MyDDP(mine, bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB),
            "DDP": nn.parallel.DistributedDataParallel(theirs, bucket_cap_mb=CAP_MB),
        }
        opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
        wall = {k: [] for k in models}
        cpu = {k: [] for k in models}
        for i in range(warmup + pairs):
            order = list(models) if i % 2 == 0 else list(models)[::-1]
            for name in order:
                dist.barrier()  # both ranks start the step together
                t0, c0 = time.perf_counter(), time.process_time()
                _step(models[name], opts[name], x, loss_fn, name == "MyDDP")
                t1, c1 = time.perf_counter(), time.process_time()
                # A step lasts until its slowest rank is done; its CPU time
                # (gloo's threads included) is both ranks'.
                elapsed = _over_ranks(t1 - t0, dist.ReduceOp.MAX)
                used = _over_ranks(c1 - c0, dist.ReduceOp.SUM)
                if i >= warmup:
                    wall[name].append(elapsed)
                    cpu[name].append(used)
        tensors = len(list(models["DDP"].parameters()))
        numel = sum(p.numel() for p in models["DDP"].parameters())
        del models, opts
        timed = _hook_timer()(make(), bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB)
        opt = torch.optim.SGD(timed.parameters(), lr=1e-4)
        for i in range(warmup + hook_steps):
            if i == warmup:
                timed.calls.clear()
            _step(timed, opt, x, loss_fn, True)
        hook = _over_ranks(statistics.median(timed.calls), dist.ReduceOp.MAX)
        out.append((label, tensors, numel, wall, cpu, hook))
    return out


def run(warmup=3, pairs=20, hook_steps=10, batch=64, sequences=2, flush_denormal=True):
    """MyDDP / DDP per sweep point: median of per-pair ratios, and the hook's cost."""
    from mylib import run_ranks

    load_before = round(os.getloadavg()[0], 2)
    points = run_ranks(
        _sweep,
        2,
        args=(warmup, pairs, hook_steps, batch, sequences, flush_denormal),
        timeout_s=3600,
    )[0]
    rows = []
    for label, tensors, numel, wall, cpu, hook in points:
        mine, theirs = wall["MyDDP"], wall["DDP"]
        ratios = [a / b for a, b in zip(mine, theirs)]
        quartiles = statistics.quantiles(ratios, n=4)
        cpu_ratios = [a / b for a, b in zip(cpu["MyDDP"], cpu["DDP"])]
        rows.append(
            [
                label,
                tensors,
                round(numel / 1e6, 2),
                statistics.median(mine) * 1e3,
                statistics.median(theirs) * 1e3,
                statistics.median(ratios),
                f"{quartiles[0]:.2f} to {quartiles[2]:.2f}",
                statistics.median(cpu_ratios),
                hook * 1e6,
            ]
        )
    worst = max(rows, key=lambda r: r[5])
    return {
        "title": "MyDDP against PyTorch's DDP, from 16 to 800 parameter tensors",
        "summary": (
            f"2 gloo ranks, one thread each, {CAP_MB} MB cap, {pairs} alternating "
            f"step pairs per model after {warmup} warm-up pairs (MLPs on batch "
            f"{batch} per rank, the decoder on {sequences} sequences of "
            f"{LLAMA_SMALL.seq} tokens per rank), both wrappers on copies of one "
            "model, subnormal floats "
            f"{'flushed to zero' if flush_denormal else 'not flushed'}. "
            "Highest median ratio: "
            f"{worst[5]:.3f}, {worst[0]} ({worst[1]} tensors); target: 1.00 or less "
            "at every point."
        ),
        "load average (1 min) before": load_before,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "tables": [
            {
                "title": "Step time, MyDDP / DDP (median of pairs), and MyDDP's hook",
                "columns": [
                    "model",
                    "parameter tensors",
                    "parameters (M)",
                    "MyDDP step (ms)",
                    "DDP step (ms)",
                    "ratio (median)",
                    "ratio (middle half)",
                    "CPU time ratio (median)",
                    "MyDDP hook call (us)",
                ],
                "rows": rows,
                "note": "A ratio below 1 means MyDDP was faster; each pair runs both "
                "steps back to back, in turn first, so load from other programs "
                "hits both alike. The middle half of the pairs' ratios lies in the "
                "range given. The CPU time ratio compares the CPU time both ranks "
                "spent in the step (gloo's threads included): the work each "
                "wrapper costs, which other programs' load does not stretch. The "
                "hook column is the median time of one call of MyDDP's gradient "
                "hook, its communication hook (the division and the all-reduce's "
                "launch, which DDP does too) left out, timed in separate steps on "
                "the slower rank; autograd's call into Python is not in it.",
            }
        ],
    }


if __name__ == "__main__":
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import main

    main(["sweep"])
