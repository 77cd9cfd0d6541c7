"""The references that new exercises' checks write out agree with what the book teaches.

An exercise's checks never import mylib's implementation of the same thing
(``practice/README.md``), so they write the rule out; here each such reference
is compared with mylib's code, on random cases (hypothesis), so the two
cannot drift apart:

* exercise 15's bucket rebuild with ``mylib.models.buckets``
  (``assign_buckets`` over the ready order, ``first_iteration_buckets``),
  which ``tests/test_ddp_like_torch.py`` compares with PyTorch's DDP;
* exercise 16's link schedule with
  ``mylib.experiments.emulated_link.EmulatedLink.book``;
* exercise 21's intervals and lost time with ``mylib.models.checkpoint_interval``
  (the day's wall clock lost, w / (1 + w) for w lost per second of work);
  Daly's interval tends to Young's as C / M -> 0, and Young's interval
  minimises the lost time the exercise defines.
"""

import importlib.util
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from _judge import catalog

EXERCISES = catalog.load_exercises()


def load(exercise_number, name):
    ex = catalog.find(EXERCISES, exercise_number)
    spec = importlib.util.spec_from_file_location(
        f"ref{exercise_number}_{name}", ex.path(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REBUILD, LINK, INTERVAL = (
    load("15", "checks"),
    load("16", "checks"),
    load("21", "checks"),
)

sizes = st.lists(st.integers(0, 5000), max_size=20)
caps = st.integers(0, 20000)
first_caps = st.one_of(st.none(), st.integers(0, 20000))
kinds = st.sampled_from([None, ["f32"], ["f32", "bf16"], ["f32", "bf16", "f16"]])


@settings(max_examples=300, deadline=None)
@given(sizes, caps, first_caps, kinds, st.randoms(use_true_random=False))
@example([4, 2, 4, 2], 8, None, ["bf16", "f32"], None)
def test_bucket_rebuild_reference_is_mylibs_rule(param_bytes, cap, first, kind, rng):
    from mylib.models.buckets import assign_buckets, first_iteration_buckets

    n = len(param_bytes)
    dtypes = None if kind is None else [kind[i % len(kind)] for i in range(n)]
    order = list(range(n))
    if rng is not None:
        rng.shuffle(order)
    else:
        order.reverse()
    keys = None if dtypes is None else [dtypes[i] for i in order]
    mylib = assign_buckets([param_bytes[i] for i in order], cap, first, keys=keys)
    assert REBUILD.reference_rebuilt(param_bytes, order, cap, first, dtypes) == [
        [order[k] for k in bucket] for bucket in mylib
    ]
    assert REBUILD.reference_first(
        param_bytes, cap, first, dtypes
    ) == first_iteration_buckets(param_bytes, cap, first, keys=dtypes)


class NoTimer:
    def call_at(self, when_s, fn):
        raise AssertionError("book() alone schedules nothing")


launches = st.lists(
    st.tuples(
        st.floats(0, 0.01), st.integers(0, 10**8), st.floats(0, 0.05)
    ),  # gap, bytes, real all-reduce time
    max_size=10,
)


@settings(max_examples=300, deadline=None)
@given(
    launches,
    st.sampled_from([1, 2, 3, 8, 64]),
    st.sampled_from([0.0, 1e-6, 2e-3]),
    st.sampled_from([1e6, 0.5e9, 12.5e9]),
)
def test_link_schedule_reference_is_the_emulated_links_booking(
    steps, ranks, alpha, bandwidth
):
    from mylib.experiments.emulated_link import EmulatedLink

    link = EmulatedLink(ranks, alpha, bandwidth, timer=NoTimer())
    t, buckets, expected = 0.0, [], []
    for gap, nbytes, real in steps:
        t += gap
        buckets.append((t, nbytes, t + real))
        transfer = link.book(nbytes, t)
        expected.append(
            (transfer.start_s, transfer.done_s, max(transfer.done_s, t + real))
        )
    got = LINK.reference_schedule(buckets, ranks, alpha, bandwidth)
    for g, e in zip(got, expected, strict=True):
        assert all(
            math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) for a, b in zip(g, e)
        )


@settings(max_examples=200, deadline=None)
@given(st.floats(1.0, 3600.0), st.floats(3600.0, 10**8), st.floats(0, 900))
def test_young_minimises_the_lost_time_and_daly_tends_to_it(c, m, r):
    from mylib.models import checkpoint_interval as book

    young = INTERVAL.ref_young(c, m)
    best = INTERVAL.ref_lost(young, c, m, r)
    assert math.isclose(young, book.young_interval(c, m), rel_tol=1e-12)
    assert math.isclose(INTERVAL.ref_daly(c, m), book.daly_interval(c, m), rel_tol=1e-9)
    assert math.isclose(best, book.lost_per_day(young, c, m, r), rel_tol=1e-12)
    for factor in (0.9, 0.99, 1.01, 1.1):
        assert INTERVAL.ref_lost(young * factor, c, m, r) >= best
    daly = INTERVAL.ref_daly(c, m)
    assert abs(daly - young) <= c + young * (
        math.sqrt(c / (2 * m)) / 3 + c / (2 * m) / 9
    )
    assert (
        abs(INTERVAL.ref_daly(c * 1e-6, m) / INTERVAL.ref_young(c * 1e-6, m) - 1) < 1e-3
    )
