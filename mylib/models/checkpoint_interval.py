"""How often to checkpoint: the time a failure costs against the time saving costs.

A job checkpoints after every ``interval`` seconds of work; a checkpoint takes
``cost`` seconds. Failures strike at random, on average once every ``mtbf``
seconds (the job's mean time between failures: a cluster of ``nodes`` nodes,
each failing once per ``node_mtbf`` on average, fails ``nodes`` times as
often). Each failure costs the restart (``restart`` seconds: detect, start
again, load) plus the work since the last checkpoint, on average half an
interval. To first order the time lost per second of *work* is::

    w(T) = cost / T + (restart + T / 2) / mtbf

The first term falls with T, the second grows; setting the derivative
``-cost / T**2 + 1 / (2 mtbf)`` to zero gives Young's interval,
T = sqrt(2 cost mtbf) (Young 1974). A second of work takes ``1 + w`` seconds
of wall clock, so the fraction of the wall clock lost is ``w / (1 + w)``.

First order means at most one failure per interval and none during a save or
a restart: it holds while ``cost``, ``restart`` and T are small against
``mtbf``. Daly (2006) models failures as a Poisson process, striking during
saves and restarts too: a second of work then costs
``mtbf * exp(restart / mtbf) * (exp((T + cost) / mtbf) - 1) / T`` seconds of
wall clock, and his higher-order interval,
T = sqrt(2 cost mtbf) (1 + sqrt(cost / (2 mtbf)) / 3 + cost / (18 mtbf)) - cost
(for cost < 2 mtbf, else T = mtbf), is close to that model's minimum.

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


def waste_per_work(interval, cost, mtbf, restart=0.0):
    """First-order seconds lost per second of work: ``C/T + (R + T/2) / M``.

    ``cost / T`` goes to saving; a failure (``1 / mtbf`` of them per second)
    loses the restart plus half an interval on average. Not a fraction of
    the wall clock: past 1 the job loses more than it works
    (:func:`lost_fraction`).
    """
    _check(cost, mtbf)
    if interval <= 0 or restart < 0:
        raise ValueError(
            f"need interval > 0 and restart >= 0, got {interval!r} and {restart!r}"
        )
    return cost / interval + (restart + interval / 2.0) / mtbf


def lost_fraction(interval, cost, mtbf, restart=0.0):
    """First-order share of the wall clock lost: ``w / (1 + w)``, w per work second."""
    w = waste_per_work(interval, cost, mtbf, restart)
    return w / (1.0 + w)


def lost_per_day(interval, cost, mtbf, restart=0.0):
    """First-order seconds of a day's wall clock lost: ``86400 * w / (1 + w)``."""
    return DAY_S * lost_fraction(interval, cost, mtbf, restart)


def daly_wall_per_work(interval, cost, mtbf, restart=0.0):
    """Wall-clock seconds per second of work, failures a Poisson process (Daly 2006).

    ``mtbf * exp(restart / mtbf) * (exp((T + cost) / mtbf) - 1) / T``: the
    expected time to get ``T`` seconds of work and its checkpoint done when a
    failure may strike anywhere, in a save or a restart too. Exceeds the
    first-order ``1 + w`` once ``T``, ``cost`` or ``restart`` is not small
    against ``mtbf``.
    """
    waste_per_work(interval, cost, mtbf, restart)  # the same checks
    exponent = (interval + cost) / mtbf
    if exponent > 700.0:  # exp would overflow: the job never gets through
        return math.inf
    return mtbf * math.exp(restart / mtbf) * math.expm1(exponent) / interval


def lost_per_day_daly(interval, cost, mtbf, restart=0.0):
    """Seconds of a day's wall clock lost in Daly's model: ``86400 (1 - 1 / wall)``."""
    return DAY_S * (1.0 - 1.0 / daly_wall_per_work(interval, cost, mtbf, restart))


def best_interval_numeric(
    cost, mtbf, restart=0.0, lo=None, hi=None, points=4000, model="first-order"
):
    """The interval that minimises the time lost, found by a log-spaced scan.

    ``model="first-order"`` minimises :func:`waste_per_work` (Young's interval
    is its exact minimum, whatever the restart time); ``model="daly"``
    minimises :func:`daly_wall_per_work` (Daly's interval is close to it).
    """
    _check(cost, mtbf)
    cost_of = {"first-order": waste_per_work, "daly": daly_wall_per_work}[model]
    lo = lo or max(1e-3, cost / 100.0)
    hi = hi or 10.0 * mtbf
    best = None
    for i in range(points + 1):
        t = lo * (hi / lo) ** (i / points)
        w = cost_of(t, cost, mtbf, restart)
        if best is None or w < best[1]:
            best = (t, w)
    return best[0]


def _check(cost, mtbf):
    if cost <= 0 or mtbf <= 0:
        raise ValueError(
            f"need cost > 0 and mtbf > 0 (seconds), got cost={cost!r}, mtbf={mtbf!r}"
        )
