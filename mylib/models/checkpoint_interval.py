"""How often to checkpoint: the time a failure costs against the time saving costs.

A job checkpoints every ``interval`` seconds of work; a checkpoint takes
``cost`` seconds. Failures strike at random, on average once every ``mtbf``
seconds (the job's mean time between failures: a cluster of ``nodes`` nodes,
each failing once per ``node_mtbf`` on average, fails ``nodes`` times as
often). Each failure costs the restart (``restart`` seconds: detect, start
again, load) plus the work since the last checkpoint, on average half an
interval. To first order the time lost per second of work is::

    waste(T) = cost / T + (restart + T / 2) / mtbf

The first term falls with T, the second grows; setting the derivative
``-cost / T**2 + 1 / (2 mtbf)`` to zero gives Young's interval,
T = sqrt(2 cost mtbf) (Young 1974). Daly (2006) refined it with the
higher-order terms (failures during a checkpoint or a restart, more than one
failure per interval) that matter once the cost is not small against mtbf:
T = sqrt(2 cost mtbf) (1 + sqrt(cost / (2 mtbf)) / 3 + cost / (18 mtbf)) - cost
when cost < 2 mtbf, else T = mtbf.

Standard library only: the chapter's slider figure runs it in the browser
(:mod:`mylib.figures.checkpoint_interval`). One source for the formula: the
practice exercises grade against it.
"""

import math

DAY_S = 86400.0


def job_mtbf(node_mtbf, nodes):
    """A job's mean time between failures on ``nodes`` nodes (same unit as given).

    Independent failures add their rates: ``node_mtbf / nodes``.
    """
    if node_mtbf <= 0 or nodes < 1:
        raise ValueError(
            f"need node_mtbf > 0 and nodes >= 1, got {node_mtbf!r} and {nodes!r}"
        )
    return node_mtbf / nodes


def young_interval(cost, mtbf):
    """Young's optimum interval between checkpoints: ``sqrt(2 cost mtbf)``."""
    _check(cost, mtbf)
    return math.sqrt(2.0 * cost * mtbf)


def daly_interval(cost, mtbf):
    """Daly's higher-order optimum interval (Daly 2006, equation for tau_opt).

    ``sqrt(2 c M) (1 + sqrt(c / 2M) / 3 + (c / 2M) / 9) - c`` for ``c < 2M``,
    else ``M``: a checkpoint that costs as much as two failures' worth of
    time is taken once per mean time between failures.
    """
    _check(cost, mtbf)
    if cost >= 2.0 * mtbf:
        return mtbf
    r = cost / (2.0 * mtbf)
    return math.sqrt(2.0 * cost * mtbf) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - cost


def waste_fraction(interval, cost, mtbf, restart=0.0):
    """First-order time lost per second of work: ``cost / T + (restart + T/2) / mtbf``.

    ``cost / T`` goes to saving; a failure (``1 / mtbf`` of them per second)
    loses the restart plus half an interval on average. Capped at 1: past
    that the first-order model means the job makes no progress.
    """
    _check(cost, mtbf)
    if interval <= 0 or restart < 0:
        raise ValueError(
            f"need interval > 0 and restart >= 0, got {interval!r} and {restart!r}"
        )
    return min(1.0, _waste(interval, cost, mtbf, restart))


def _waste(interval, cost, mtbf, restart):
    return cost / interval + (restart + interval / 2.0) / mtbf


def lost_per_day(interval, cost, mtbf, restart=0.0):
    """Seconds lost per day: ``waste_fraction * 86400``."""
    return DAY_S * waste_fraction(interval, cost, mtbf, restart)


def best_interval_numeric(cost, mtbf, restart=0.0, lo=None, hi=None, points=4000):
    """The interval that minimises :func:`waste_fraction`, found by a log-spaced scan.

    A check on the closed form: Young's interval is the exact minimum of the
    first-order waste, whatever the restart time.
    """
    _check(cost, mtbf)
    lo = lo or max(1e-3, cost / 100.0)
    hi = hi or 10.0 * mtbf
    best = None
    for i in range(points + 1):
        t = lo * (hi / lo) ** (i / points)
        w = _waste(t, cost, mtbf, restart)  # uncapped: a slope everywhere
        if best is None or w < best[1]:
            best = (t, w)
    return best[0]


def _check(cost, mtbf):
    if cost <= 0 or mtbf <= 0:
        raise ValueError(
            f"need cost > 0 and mtbf > 0 (seconds), got cost={cost!r}, mtbf={mtbf!r}"
        )
