"""`make bench`: speed figures measured on this machine, side by side in one run.

Benchmarks are not tests: nothing here asserts a time. Each benchmark is a
``run()`` function returning a result dict in the format the book's
benchmark page reads (see ``book/benchmarks.py``); this script prints it and
writes it to ``bench-results/<name>.json``.

This file holds the first benchmark, MyDDP against PyTorch's DDP; every other
``tests/bench_*.py`` with a ``run()`` is picked up as well.

    python tests/bench.py            # all benchmarks
    python tests/bench.py ddp        # only this one (or: timeline, ...)
"""

import datetime
import importlib
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(ROOT, "bench-results")


def machine():
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                line.split(":", 1)[1].strip()
                for line in f
                if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "os": f"{platform.system()} {platform.release()}",
        "load average (1 min)": round(os.getloadavg()[0], 2),
    }


def _ten_million_parameter_mlp():
    torch.manual_seed(0)
    width, depth = (
        1024,
        9,
    )  # 9 x (1024 x 1024 + 1024) = 9.4M parameters, 37.8 MB of fp32 gradients
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _ddp_pairs(caps_mb, warmup, pairs, batch):
    """On each rank, for each cap: alternate MyDDP and DDP steps.

    Returns the step times of each pair.
    """
    from mylib import MyDDP

    out = {}
    for cap in caps_mb:
        models = {
            "MyDDP": MyDDP(_ten_million_parameter_mlp(), bucket_cap_mb=cap),
            "DDP": nn.parallel.DistributedDataParallel(
                _ten_million_parameter_mlp(), bucket_cap_mb=cap
            ),
        }
        opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
        x = torch.randn(
            batch, 1024, generator=torch.Generator().manual_seed(dist.get_rank())
        )
        times = {k: [] for k in models}
        for i in range(warmup + pairs):
            for name, model in models.items():
                dist.barrier()  # both ranks start the step together
                t0 = time.perf_counter()
                opts[name].zero_grad(set_to_none=False)
                model(x).square().mean().backward()
                if name == "MyDDP":
                    model.finish_gradient_sync()
                opts[name].step()
                elapsed = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(
                    elapsed, op=dist.ReduceOp.MAX
                )  # a step lasts until its slowest rank is done
                if i >= warmup:
                    times[name].append(elapsed.item())
        out[cap] = times
    return out


def run_ddp(caps_mb=(1, 5, 25), warmup=3, pairs=15, batch=64):
    """MyDDP vs PyTorch DDP: median of per-pair step-time ratios, per bucket cap."""
    from mylib import run_ranks

    times = run_ranks(
        _ddp_pairs, 2, args=(caps_mb, warmup, pairs, batch), timeout_s=1800
    )[0]
    rows = []
    for cap in caps_mb:
        mine, theirs = times[cap]["MyDDP"], times[cap]["DDP"]
        ratios = [a / b for a, b in zip(mine, theirs)]
        rows.append(
            [
                cap,
                statistics.median(mine) * 1e3,
                statistics.median(theirs) * 1e3,
                statistics.median(ratios),
                min(ratios),
                max(ratios),
            ]
        )
    at_25 = next((r[3] for r in rows if r[0] == 25), None)
    return {
        "title": "MyDDP against PyTorch's DDP",
        "summary": (
            f"2 gloo ranks, a 9.4M-parameter MLP (batch {batch} per rank), {pairs} "
            f"alternating step pairs per bucket cap after {warmup} warm-up pairs. "
            f"Median ratio at 25 MB: {at_25:.3f} (target: 1.05 or less)."
        ),
        "machine": machine(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "tables": [
            {
                "title": "Step time, MyDDP / DDP (median of pairs)",
                "columns": [
                    "cap (MB)",
                    "MyDDP step (ms)",
                    "DDP step (ms)",
                    "ratio (median)",
                    "ratio (min)",
                    "ratio (max)",
                ],
                "rows": rows,
                "note": "A ratio below 1 means MyDDP was faster. Each pair runs both "
                "steps back to back, so load from other programs hits both alike.",
            }
        ],
    }


def benchmarks():
    """Name -> run function: this file's, then every bench_*.py module's ``run``."""
    found = {"ddp": run_ddp}
    sys.path.insert(0, HERE)
    for fname in sorted(os.listdir(HERE)):
        if fname.startswith("bench_") and fname.endswith(".py"):
            found[fname[len("bench_") : -3]] = importlib.import_module(fname[:-3]).run
    return found


def show(result):
    print(f"\n== {result['title']} ==\n{result.get('summary', '')}")
    for table in result.get("tables", []):
        print(f"\n{table.get('title', '')}")
        cols = table["columns"]
        cells = [
            [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
            for row in table["rows"]
        ]
        widths = [
            max(len(str(c)), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)
        ]
        print("  ".join(str(c).rjust(w) for c, w in zip(cols, widths)))
        for row in cells:
            print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
        if table.get("note"):
            print(table["note"])


def main(names):
    available = benchmarks()
    unknown = [n for n in names if n not in available]
    if unknown:
        sys.exit(f"unknown benchmark(s) {unknown}; choose from {sorted(available)}")
    os.makedirs(RESULTS, exist_ok=True)
    for name in names or available:
        result = available[name]()
        result.setdefault("machine", machine())
        result.setdefault("date", datetime.datetime.now().isoformat(timespec="seconds"))
        show(result)
        with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(
        f"\nwritten to {RESULTS}/; `make book` puts "
        "them on the benchmarks page (Appendix)."
    )


if __name__ == "__main__":
    main(sys.argv[1:])
