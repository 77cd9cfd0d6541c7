"""`make bench`: the timeline model against MyDDP steps on an emulated link, 2 ranks.

Plain gloo moves the bytes on the cores the backward needs (``bench_timeline.py``
measures that, contention and all). Here every bucket's real all-reduce is
delivered when an emulated link would have carried it
(:class:`mylib.experiments.emulated_link.EmulatedLink`), a link that, like a GPU
cluster's network, does not compute on the cores. The link keeps a real cluster's
ratios, re-derived each round from the measured backward
(:func:`mylib.experiments.emulated.cluster_ratios`: chapter 7's 7B model on 160
H100s with one 400 Gb/s NIC a node): one all-reduce's latency against one tensor's
backward, and all the gradient bytes' bandwidth time against the backward.

Reported per cap: the model's step (fed each round's calibrated layer times and
the round's link, through ``models.timeline.simulate``) and the measured step,
medians over rounds, and the median of the per-round errors; the error when the
model is fed the very step's backward instead (what is left is the model of the
link and the buckets, not the machine's drift); whether the model's best cap is
the measured best, or within 2% of its step. Targets: within 10% at every cap,
and the best cap. Nothing is asserted: this is a measurement.

    python tests/bench.py emulated
"""

from bench_timeline import cap_table

from mylib import run_ranks
from mylib.experiments.calibrate import backward_spread, cap_label
from mylib.experiments.emulated import (
    CAPS,
    compare_on_own_backward,
    emulated_experiment,
    link_summary,
    u_shape,
)

TARGET = 0.10  # model within 10% of the measured step
BEST_WITHIN = 0.02  # the model's best cap costs at most 2% over the measured best


def run(rounds=9, n_layers=8, width=512, batch_size=1024):
    """Model vs measurement per cap; the result dict of tests/bench.py."""
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
    result, ratios = out["result"], out["ratios"]
    rows, best_model, best_measured, shape = u_shape(result)
    own = compare_on_own_backward(result)
    measured = {row["cap"]: row["measured_s"] for row in rows}
    choice_cost = measured[best_model] / measured[best_measured] - 1
    within = sum(abs(row["error"]) <= TARGET for row in rows)
    worst = max(abs(row["error"]) for row in rows)
    worst_own = max(abs(row["error"]) for row in own)
    u = shape["middle_s"] < min(shape["per_parameter_s"], shape["all_at_end_s"])
    backward_s, alpha_s, bandwidth = link_summary(result)
    low, mid, high = backward_spread(result)
    link = (
        f"the link of {ratios['ranks']} ranks of {ratios['cluster']}: an all-reduce's "
        f"latency {ratios['latency']:.2f} of a tensor's backward, the bytes "
        f"{ratios['bytes']:.2f} of the backward"
    )
    return {
        "title": "The timeline model against MyDDP steps on an emulated link",
        "summary": (
            f"2 gloo ranks on an emulated link ({link}), {n_layers} x "
            f"Linear({width}, {width}) (batch {batch_size} per rank), {rounds} rounds; "
            f"backward {backward_s * 1e3:.0f} ms, latency {alpha_s * 1e3:.2f} ms per "
            f"message (medians). The model is within {TARGET:.0%} at {within} of "
            f"{len(rows)} caps (worst {worst:.0%}; {worst_own:.0%} fed the step's own "
            f"backward); best cap: model {cap_label(best_model)}, measured "
            f"{cap_label(best_measured)} ({choice_cost:.1%} apart); measured U: "
            f"{'yes' if u else 'no'}."
        ),
        "alpha (ms per message, median)": alpha_s * 1e3,
        "bandwidth (MB/s, median)": bandwidth / 1e6,
        "latency of an all-reduce / a tensor's backward": ratios["latency"],
        "all gradient bytes / the backward": ratios["bytes"],
        "backward over rounds (ms, min / median / max)": (
            f"{low * 1e3:.0f} / {mid * 1e3:.0f} / {high * 1e3:.0f}"
        ),
        f"model within {TARGET:.0%} at every cap": within == len(rows),
        "model's best cap is the measured best (or within 2%)": (
            choice_cost <= BEST_WITHIN
        ),
        "measured middle cap below both ends": u,
        "tables": [
            cap_table(
                "Model against measurement per cap, medians over rounds",
                rows,
                TARGET,
                ("error, step's own backward (%)", own),
                "error = median over rounds of (model - measured) / measured, "
                "the model fed with the same round's calibrated layer times. "
                "The last column feeds it the measured step's own backward.",
            )
        ],
    }


if __name__ == "__main__":
    import bench  # tests/bench.py: prints and saves like `make bench`

    bench.main(["emulated"])
