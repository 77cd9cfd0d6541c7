"""Exercise 1.2: predict all-reduce time from alpha and beta (chapter 1).

Read practice/exercises/02_alpha_beta/README.md, write both functions,
then grade them:  python practice/judge.py 1.2
"""


def ring_allreduce_seconds(nbytes, world_size, alpha_s, bandwidth_bytes_per_s):
    """Seconds a ring all-reduce of ``nbytes`` over ``world_size`` ranks takes.

    In the alpha-beta model; beta is the bandwidth, in bytes per second.
    """
    raise NotImplementedError("write ring_allreduce_seconds")


def fit_alpha_beta(message_bytes, seconds):
    """Fit ``seconds = alpha + bytes / beta`` by least squares.

    Returns (alpha_s, beta_bytes_per_s): the line's intercept, and the inverse
    of its slope.
    """
    raise NotImplementedError("write fit_alpha_beta")
