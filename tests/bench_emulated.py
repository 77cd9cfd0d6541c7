"""`make bench`: the timeline model against MyDDP steps on an emulated link, 2 ranks.

Plain gloo moves the bytes on the cores the backward needs (``bench_timeline.py``
measures that, contention and all). Here every bucket's real all-reduce is
delivered when an emulated link would have carried it
(:class:`mylib.emulated_link.EmulatedLink`), a link that, like a GPU cluster's
network, does not compute on the cores. The links are derived from the measured
backward: a latency per message of 1/30 of it, and bandwidths at which all the
gradient bytes take 1x and 2x the backward (:mod:`mylib.experiments.emulated`).

Reported per link and cap: the model's step (fed each round's calibrated layer
times and the link's alpha and beta, through ``models.timeline.simulate``) and
the measured step, medians over rounds, and the median of the per-round errors;
the error when the model is fed the very step's backward instead (what is left
is the model of the link and the buckets, not the machine's drift); whether the
model's best cap is the measured best, or within 2% of its step. Targets: within
10% at every cap, and the best cap. Nothing is asserted: this is a measurement.

    python tests/bench.py emulated
"""

from bench_timeline import cap_table

from mylib import run_ranks
from mylib.experiments.calibrate import backward_spread, cap_label
from mylib.experiments.emulated import (
    ALPHA_PER_BACKWARD,
    CAPS,
    compare_on_own_backward,
    emulated_experiment,
    u_shape,
)

TARGET = 0.10  # model within 10% of the measured step
BEST_WITHIN = 0.02  # the model's best cap costs at most 2% over the measured best


def run(rounds=9, n_layers=8, width=1024, batch_size=1024):
    """Model vs measurement per link and cap; the result dict of tests/bench.py."""
    out = run_ranks(
        emulated_experiment,
        2,
        kwargs=dict(
            caps_mb=CAPS,
            n_layers=n_layers,
            width=width,
            batch_size=batch_size,
            rounds=rounds,
        ),
        timeout_s=1800,
    )[0]
    tables, verdicts, found = [], [], {}
    for multiple, link in out["links"].items():
        result = link["result"]
        rows, best_model, best_measured, shape = u_shape(result)
        own = compare_on_own_backward(result)
        measured = {row["cap"]: row["measured_s"] for row in rows}
        choice_cost = measured[best_model] / measured[best_measured] - 1
        within = sum(abs(row["error"]) <= TARGET for row in rows)
        worst = max(abs(row["error"]) for row in rows)
        worst_own = max(abs(row["error"]) for row in own)
        best_ok = choice_cost <= BEST_WITHIN
        u = shape["middle_s"] < min(shape["per_parameter_s"], shape["all_at_end_s"])
        name = f"{multiple}x"
        verdicts.append(
            f"At {name} the model is within {TARGET:.0%} at {within} of {len(rows)} "
            f"caps (worst {worst:.0%}; {worst_own:.0%} fed the step's own backward); "
            f"best cap: model {cap_label(best_model)}, measured "
            f"{cap_label(best_measured)} ({choice_cost:.1%} apart); measured U: "
            f"{'yes' if u else 'no'}"
        )
        found[f"{name}: bandwidth (MB/s)"] = link["bandwidth"] / 1e6
        found[f"{name}: model within {TARGET:.0%} at every cap"] = within == len(rows)
        found[f"{name}: model's best cap is the measured best (or within 2%)"] = best_ok
        found[f"{name}: measured middle cap below both ends"] = u
        tables.append(
            cap_table(
                f"Link {name}: all gradient bytes take {multiple}x the backward "
                f"({link['bandwidth'] / 1e6:.0f} MB/s), medians over rounds",
                rows,
                TARGET,
                ("error, step's own backward (%)", own),
                "error = median over rounds of (model - measured) / measured, "
                "the model fed with the same round's calibrated layer times. "
                "The last column feeds it the measured step's own backward.",
            )
        )
    # every link's rounds share the calibration: one spread says how steady it was
    low, mid, high = backward_spread(next(iter(out["links"].values()))["result"])
    return {
        "title": "The timeline model against MyDDP steps on an emulated link",
        "summary": (
            f"2 gloo ranks on an emulated link, {n_layers} x Linear({width}, {width}) "
            f"(batch {batch_size} per rank), {rounds} rounds; backward "
            f"{out['backward_s'] * 1e3:.0f} ms, latency "
            f"{out['alpha_s'] * 1e3:.2f} ms per message. " + ". ".join(verdicts) + "."
        ),
        "alpha (ms per message)": out["alpha_s"] * 1e3,
        "alpha as a share of the backward": ALPHA_PER_BACKWARD,
        "backward when the links were chosen (ms)": out["backward_s"] * 1e3,
        "backward over rounds (ms, min / median / max)": (
            f"{low * 1e3:.0f} / {mid * 1e3:.0f} / {high * 1e3:.0f}"
        ),
        **found,
        "tables": tables,
    }


if __name__ == "__main__":
    import bench  # tests/bench.py: prints and saves like `make bench`

    bench.main(["emulated"])
