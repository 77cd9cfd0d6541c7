"""`make bench`: scaling at a fixed global batch on 1, 2 and 4 gloo ranks (chapter 7).

The chapter's experiment, with more steps: an MLP trained with ``MyDDP`` at a
fixed global batch on 1, 2 and 4 ranks (one thread each), the typical step time
of each, and the timeline model's step calibrated on this machine (one rank's
compute at its share of the batch, alpha and beta fitted to all-reduces timed in
the same run, ranks beyond the cores taking turns). Efficiency = speed-up over
one rank / ranks. Nothing is asserted: this is a measurement, not a test.

    python tests/bench.py scaling
"""

import os

import torch

from mylib import run_ranks
from mylib.experiments import scaling_measure as sm
from mylib.experiments.common import global_batches, mlp

RANKS = (1, 2, 4)


def run(width=512, depth=8, global_batch=64, steps=30, lr=0.01):
    """Measured and predicted step time and efficiency per rank count.

    In tests/bench.py's result format.
    """

    def make_model():
        return mlp([width] * (depth + 1))

    batches = global_batches(steps, global_batch, [width])
    runs = {
        n: run_ranks(
            sm.train_fixed_global_batch,
            n,
            args=(make_model, batches, lr),
            timeout_s=1800,
            show_output=False,
        )[0]
        for n in RANKS
    }
    reference = sm.train_single_process(make_model, batches, lr)
    probe, cores = make_model(), os.cpu_count()
    rows, base = [], {}
    for n in RANKS:
        step_s, allreduce_s, params = runs[n]
        forward_s, backward_s = sm.time_compute(probe, global_batch // n, width)
        timeline, fit = sm.predicted_step(
            probe, n, forward_s, backward_s, allreduce_s, cores=cores
        )
        measured = sm.typical(step_s)
        base.setdefault("measured", measured)
        base.setdefault("model", timeline.step_s)
        diff = max((p - r).abs().max().item() for p, r in zip(params, reference))
        rows.append(
            [
                n,
                measured * 1e3,
                min(step_s) * 1e3,
                timeline.step_s * 1e3,
                (timeline.step_s - measured) / measured * 100,
                base["measured"] / measured / n,
                base["model"] / timeline.step_s / n,
                fit.alpha * 1e6 if fit else None,
                fit.beta / 1e9 if fit else None,
                diff,
            ]
        )
    n_params = sum(p.numel() for p in probe.parameters())
    return {
        "title": "Scaling at a fixed global batch: measured and modelled (chapter 7)",
        "summary": (
            f"An MLP of {depth} x Linear({width}, {width}) ({n_params / 1e6:.1f}M "
            f"parameters, {n_params * 4 / 2**20:.1f} MB of fp32 gradients), "
            f"global batch {global_batch}, {steps} steps of MyDDP + SGD on 1, "
            f"2 and 4 gloo ranks with one thread each, on {cores} cores. Efficiency "
            f"at 4 ranks: measured {rows[-1][5]:.0%}, model {rows[-1][6]:.0%}."
        ),
        "tables": [
            {
                "title": "Step time per rank count (median after 2 warm-up steps)",
                "columns": [
                    "ranks",
                    "measured (ms)",
                    "fastest (ms)",
                    "model (ms)",
                    "error (%)",
                    "efficiency measured",
                    "efficiency model",
                    "alpha fitted (µs)",
                    "beta fitted (GB/s)",
                    "max |diff| vs 1 process",
                ],
                "rows": rows,
                "note": (
                    "The model: one rank's compute timed at its share "
                    "of the batch, stretched when ranks outnumber cores, "
                    "plus the exposed communication of the timeline model "
                    "with the alpha and beta fitted in the same run. "
                    "The last column checks that every rank count trained to "
                    "the same parameters as one process on the whole batch."
                ),
            }
        ],
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    import json

    print(json.dumps(run(steps=6), indent=1, default=str))
