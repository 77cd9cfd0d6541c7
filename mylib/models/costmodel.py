"""The alpha-beta cost model of communication, and fitting it to measurements.

Sending one message of ``b`` bytes costs a fixed start-up time plus a time
per byte (Hockney, 1994):

    t(b) = alpha + b / beta

``alpha`` (seconds) is the latency: software overhead, synchronisation, the
wire's delay; ``beta`` (bytes per second) is the bandwidth. A ring
all-reduce over ``n`` ranks is ``2(n-1)`` steps, each sending a chunk of
``b/n`` bytes on every link at once, so

    T(b, n) = 2(n-1) * (alpha + (b/n) / beta)
            = 2(n-1) alpha  +  2 (n-1)/n * b / beta

The first term grows with ``n`` and not with ``b``: small messages are
*latency-bound*. The second hardly grows with ``n`` (it tends to ``2 b /
beta``): large messages are *bandwidth-bound*. The two terms are equal at
``b = n * alpha * beta`` (:func:`crossover_bytes`).

Standard library only, on purpose: these functions also run in the reader's
browser (Pyodide) behind the chapter's slider figure. Measuring alpha and
beta needs torch and lives in :mod:`mylib.experiments.commbench`.
"""

import math
import statistics
from dataclasses import dataclass, field


def message_time(nbytes, alpha, beta):
    """Seconds to send one message of ``nbytes`` bytes: ``alpha + nbytes / beta``."""
    _check_link(alpha, beta)
    return alpha + nbytes / beta


def ring_all_reduce_time(nbytes, world_size, alpha, beta):
    """Seconds for a ring all-reduce of ``nbytes`` over ``world_size`` ranks.

    That is ``2(n-1)(alpha + b/(n beta))``, with ``n`` ranks and ``b`` bytes.
    """
    lat, bw = ring_all_reduce_terms(nbytes, world_size, alpha, beta)
    return lat + bw


def ring_all_reduce_terms(nbytes, world_size, alpha, beta):
    """The latency and bandwidth terms of :func:`ring_all_reduce_time`, in seconds.

    Returns ``(latency term, bandwidth term)``.
    """
    _check_link(alpha, beta)
    n = _check_world(world_size)
    steps = 2 * (n - 1)
    return steps * alpha, steps * (nbytes / n) / beta


def ring_reduce_scatter_time(nbytes, world_size, alpha, beta):
    """Seconds for a ring reduce-scatter of an ``nbytes`` input; half an all-reduce.

    That is ``(n-1)(alpha + b/(n beta))``.
    """
    _check_link(alpha, beta)
    n = _check_world(world_size)
    return (n - 1) * (alpha + (nbytes / n) / beta)


def ring_all_gather_time(nbytes, world_size, alpha, beta):
    """Seconds for a ring all-gather whose *output* is ``nbytes``; the other half.

    That is ``(n-1)(alpha + b/(n beta))``, as for :func:`ring_reduce_scatter_time`.
    """
    return ring_reduce_scatter_time(nbytes, world_size, alpha, beta)


def crossover_bytes(world_size, alpha, beta):
    """Message size at which a ring all-reduce's latency and bandwidth terms are equal.

    That size is ``n alpha beta``. Smaller messages are latency-bound (sending
    them together in one bucket saves time), larger ones bandwidth-bound (only
    fewer bytes help).
    """
    _check_link(alpha, beta)
    return _check_world(world_size) * alpha * beta


def bus_bandwidth(nbytes, world_size, seconds):
    """The "bus bandwidth" of an all-reduce that took ``seconds`` (nccl-tests' busbw).

    It is ``2(n-1)/n * b / t``, the rate each link really carried, so it can be
    compared with the link's bandwidth ``beta`` whatever the number of ranks.
    """
    n = _check_world(world_size)
    return 2 * (n - 1) / n * nbytes / seconds


@dataclass
class AlphaBetaFit:
    """A fitted alpha-beta model and how well it fits the measurements it came from.

    ``world_size`` is None when the fit is of single messages (ping-pong),
    else the all-reduce model for that many ranks was fitted.
    """

    alpha: float
    beta: float
    world_size: object
    nbytes: list
    seconds: list
    relative_errors: list = field(default_factory=list)

    def predict(self, nbytes):
        """The fitted model's time for a message (or all-reduce) of ``nbytes``."""
        if self.world_size is None:
            return message_time(nbytes, self.alpha, self.beta)
        return ring_all_reduce_time(nbytes, self.world_size, self.alpha, self.beta)

    @property
    def median_relative_error(self):
        """Median over the measured sizes of ``|predicted - measured| / measured``."""
        errs = sorted(self.relative_errors)
        mid = len(errs) // 2
        return errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2

    @property
    def max_relative_error(self):
        """Largest ``|predicted - measured| / measured`` over the measured sizes."""
        return max(self.relative_errors)


def fit_alpha_beta(nbytes, seconds, world_size=None):
    """Fit ``alpha`` and ``beta`` to measured times: least squares on *relative* error.

    ``seconds[i]`` is the measured time of a message of ``nbytes[i]`` bytes
    (``world_size=None``), or of a ring all-reduce over ``world_size`` ranks.
    Both models are linear in ``(alpha, 1/beta)``. Sizes span many orders of
    magnitude, so plain least squares would fit the largest messages and
    ignore the small ones that determine alpha; minimising
    ``sum(((model - measured) / measured)^2)`` weighs every size alike.
    Neither constant can be negative: if the unconstrained fit gives a
    negative one, it is fixed at (nearly) zero and the other refitted.
    """
    _check_times(nbytes, seconds)
    if len(nbytes) < 2 or len(set(nbytes)) < 2:
        raise ValueError(
            "need times for at least two different sizes to fit both alpha and beta"
        )
    lat_coef, bw_coef = _coefficients(world_size)
    # Rows of the weighted problem:
    # [lat_coef, bw_coef * b] / t . (alpha, inv_beta) ~ 1.
    rows = [(lat_coef / t, bw_coef * b / t) for b, t in zip(nbytes, seconds)]
    alpha, inv_beta = _least_squares_2(rows)
    if alpha < 0 or inv_beta <= 0:
        # Fit one parameter with the other pinned (alpha at 0, or beta at infinity).
        fit_alpha = sum(r[0] for r in rows) / sum(r[0] ** 2 for r in rows)
        fit_inv_beta = (
            sum(r[1] for r in rows) / sum(r[1] ** 2 for r in rows)
            if any(r[1] for r in rows)
            else 0.0
        )
        alpha, inv_beta = (
            (0.0, fit_inv_beta) if alpha < 0 and fit_inv_beta > 0 else (fit_alpha, 0.0)
        )
    beta = 1.0 / inv_beta if inv_beta > 0 else math.inf
    return _fitted(alpha, beta, world_size, nbytes, seconds)


def alpha_beta_from_ends(nbytes, seconds, world_size=None, n_small=3):
    """Read ``alpha`` off the smallest sizes and ``beta`` off the largest ones.

    The textbook way to measure a link, and the right one when no straight
    line fits every size. On a CPU the time per byte changes with the size
    (a buffer that fits in cache moves faster), and a least-squares line
    (:func:`fit_alpha_beta`) then splits the difference: its beta is too
    high for the large messages, where a training step spends its time, and
    its alpha off for the small ones. Here ``alpha`` comes from the median
    time of the ``n_small`` smallest sizes (all latency), ``beta`` from how
    much time each extra byte adds between the largest size and the largest
    one at most a quarter of it.
    """
    _check_times(nbytes, seconds)
    points = sorted(zip(nbytes, seconds))
    largest, t_largest = points[-1]
    lower = [(b, t) for b, t in points if 4 * b <= largest]
    if len(lower) < n_small:
        raise ValueError(
            f"need {n_small} sizes at most a quarter of the largest ({largest} bytes) "
            "and the largest: measure sizes spanning several orders of magnitude"
        )
    lat_coef, bw_coef = _coefficients(world_size)
    alpha = statistics.median(t for _, t in points[:n_small]) / lat_coef
    b_low, t_low = lower[-1]
    per_byte = (t_largest - t_low) / (largest - b_low)
    beta = bw_coef / per_byte if per_byte > 0 else math.inf
    return _fitted(alpha, beta, world_size, nbytes, seconds)


def _check_times(nbytes, seconds):
    if len(nbytes) != len(seconds):
        raise ValueError(
            f"got {len(nbytes)} sizes and {len(seconds)} times; give one time per size"
        )
    if any(t <= 0 for t in seconds):
        raise ValueError("every measured time must be positive")


def _fitted(alpha, beta, world_size, nbytes, seconds):
    """The fit's record: its constants, the measurements and the model's error on each.

    The error is relative: ``|predicted - measured| / measured``.
    """
    fit = AlphaBetaFit(alpha, beta, world_size, list(nbytes), list(seconds))
    fit.relative_errors = [abs(fit.predict(b) - t) / t for b, t in zip(nbytes, seconds)]
    return fit


def _coefficients(world_size):
    """The model's ``(latency, bandwidth)`` coefficients.

    1 and 1 for a message, 2(n-1) and 2(n-1)/n for a ring.
    """
    if world_size is None:
        return 1.0, 1.0
    n = _check_world(world_size)
    if n == 1:
        raise ValueError(
            "an all-reduce over one rank sends nothing: "
            "fit world_size >= 2, or None for messages"
        )
    return 2.0 * (n - 1), 2.0 * (n - 1) / n


def _least_squares_2(rows):
    """Solve ``min sum((x0*a + x1*c - 1)^2)`` by the 2x2 normal equations.

    ``rows`` are the pairs ``(a, c)``; returns ``(x0, x1)``.
    """
    saa = sum(a * a for a, _ in rows)
    sac = sum(a * c for a, c in rows)
    scc = sum(c * c for _, c in rows)
    sa = sum(a for a, _ in rows)
    sc = sum(c for _, c in rows)
    det = saa * scc - sac * sac
    if det <= 1e-12 * saa * scc:
        raise ValueError(
            "the sizes do not separate alpha from beta: "
            "measure sizes spanning several orders of magnitude"
        )
    return (sa * scc - sc * sac) / det, (saa * sc - sac * sa) / det


def _check_link(alpha, beta):
    if alpha < 0:
        raise ValueError(
            f"alpha is a latency in seconds and cannot be negative, got {alpha}"
        )
    if not beta > 0:
        raise ValueError(
            f"beta is a bandwidth in bytes per second and must be positive, got {beta}"
        )


def _check_world(world_size):
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            "world_size must be a positive int (the number of ranks), "
            f"got {world_size!r}"
        )
    return world_size
