"""Exercise 3.1: assign parameters to buckets (chapter 3).

Read practice/exercises/06_assign_buckets/README.md, write the function
below, then grade it:  python practice/judge.py 3.1
"""

MB = 1024 * 1024


def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
    """Group parameters into buckets, walking them in backward order.

    param_bytes: gradient bytes of each parameter, in forward order.
    Returns a list of buckets (lists of forward indices), in launch order.
    """
    raise NotImplementedError("write buckets_for_parameters")
