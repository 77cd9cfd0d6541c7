"""`make bench`: the timeline model against measured MyDDP steps, on 2 gloo ranks.

For bucket caps 0 (one all-reduce per parameter), 1, 5 and 25 MB and one bucket at the
end, each round calibrates the model on this machine (layer backward times, alpha and
beta, contention between compute and communication; see
:mod:`mylib.experiments.calibrate`) and then traces one real step per cap. Reported per
cap: the model's and the measured step (medians over rounds), the median of the
per-round errors, and whether the model picks the same best cap as the measurement.
Target: within 15% at every cap. Nothing is asserted: this is a measurement, not a test.
On a machine shared with other programs the same backward pass can take several times
longer from one second to the next; the result reports the spread of the calibrated
backward time over the rounds, which says how far the figures can be trusted.
``bench_emulated.py`` sweeps the caps on an emulated link, whose transfers leave the
cores to the backward.

    python tests/bench.py timeline
"""

import statistics

from mylib import run_ranks
from mylib.experiments.calibrate import (
    ALL_AT_END,
    backward_spread,
    cap_label,
    compare,
    cost_of_model_choice,
    experiment,
)

CAPS = [0, 1, 5, 25, ALL_AT_END]
TARGET = 0.15


def run(rounds=9, n_layers=8, width=1024, batch_size=64):
    """Model vs measurement per cap; the result dict of tests/bench.py's format."""
    result = run_ranks(
        experiment,
        2,
        args=(CAPS,),
        kwargs=dict(
            n_layers=n_layers, width=width, batch_size=batch_size, rounds=rounds
        ),
        timeout_s=1800,
    )[0]
    rows, best_model, best_measured = compare(result)
    plain_rows, _, _ = compare(result, contention=False)
    calibrations = [r["calibration"] for r in result["rounds"]]
    low, mid, high = backward_spread(result)
    worst = max(abs(row["error"]) for row in rows)
    within = sum(abs(row["error"]) <= TARGET for row in rows)
    choice_cost = cost_of_model_choice(rows, best_model, best_measured)
    return {
        "title": "The timeline model against measured MyDDP steps",
        "summary": (
            f"2 gloo ranks, {n_layers} x Linear({width}, {width}) (batch "
            f"{batch_size} per rank), {rounds} rounds of calibrate-then-trace. "
            f"Model within {TARGET:.0%} of the measurement at {within} "
            f"of {len(rows)} caps (worst error {worst:.0%}); best cap: "
            f"model {cap_label(best_model)}, measured {cap_label(best_measured)} "
            f"({'same' if best_model == best_measured else 'different'}); "
            "the measured step at the model's best cap is "
            f"{choice_cost:.1%} longer than at the measured best."
        ),
        "model picks the measured best cap": best_model == best_measured,
        "measured step at the model's best cap / at the measured best": 1 + choice_cost,
        "backward time over rounds (ms, min / median / max)": (
            f"{low * 1e3:.0f} / {mid * 1e3:.0f} / {high * 1e3:.0f}"
        ),
        "alpha (us, median of rounds)": statistics.median(
            c["alpha_s"] for c in calibrations
        )
        * 1e6,
        "beta (GB/s, median of rounds)": statistics.median(
            c["bandwidth"] for c in calibrations
        )
        / 1e9,
        "comm stretch while computing (median)": statistics.median(
            c["comm_stretch"] for c in calibrations
        ),
        "compute stretch while communicating (median)": statistics.median(
            c["compute_stretch"] for c in calibrations
        ),
        "tables": [
            cap_table(
                "Step time (backward start to "
                "finish_gradient_sync done), medians over rounds",
                rows,
                TARGET,
                ("error without contention (%)", plain_rows),
                "error = median over rounds of (model - measured) / measured, "
                "the model fed with the same round's calibration. "
                "The last column drops the contention factors (stretch 1): "
                "the plain alpha-beta overlap model.",
            )
        ],
    }


def cap_table(title, rows, target, other, note):
    """The benchmarks page's table of one cap sweep: model against measurement.

    ``rows`` are :func:`mylib.experiments.calibrate.compare`'s; ``other`` is a
    last column, ``(label, rows)``, whose rows give another error per cap.
    """
    label, other_rows = other
    return {
        "title": title,
        "columns": [
            "cap",
            "model (ms)",
            "measured (ms)",
            "error (%)",
            f"within {target:.0%}",
            label,
        ],
        "rows": [
            [
                cap_label(row["cap"]),
                row["model_s"] * 1e3,
                row["measured_s"] * 1e3,
                row["error"] * 100,
                abs(row["error"]) <= target,
                more["error"] * 100,
            ]
            for row, more in zip(rows, other_rows)
        ],
        "note": note,
    }


if __name__ == "__main__":
    import bench  # tests/bench.py: prints and saves like `make bench`

    bench.main(["timeline"])
