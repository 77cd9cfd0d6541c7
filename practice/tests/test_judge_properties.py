"""Property tests of the exercises' own claims (hypothesis).

* Exercise 06's rule check pins down one answer: the reference passes it,
  and every other split of the same backward order fails it.
* Exercise 12's closed form for the exposed communication is what exercise
  07's timeline gives for equal buckets ready evenly during the backward
  (its README says so; here it is proved on random cases).
* Exercise 10: each ZeRO stage holds no more per rank than the one before,
  and on one rank all stages hold the same.
"""

import importlib.util
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from _judge import catalog

EXERCISES = catalog.load_exercises()


def load(exercise_number, name):
    ex = catalog.find(EXERCISES, exercise_number)
    spec = importlib.util.spec_from_file_location(
        f"ex{exercise_number}_{name}", ex.path(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUCKETS, BUCKET_CHECKS = load("06", "solution"), load("06", "checks")
TIMELINE, OVERLAP, MEMORY = (
    load("07", "solution"),
    load("12", "solution"),
    load("10", "solution"),
)

sizes = st.lists(st.integers(0, 5000), max_size=25)
caps = st.integers(0, 20000)
first_caps = st.one_of(st.none(), st.integers(0, 20000))


@settings(max_examples=300, deadline=None)
@given(sizes, caps, first_caps)
def test_bucket_rule_accepts_the_reference(param_bytes, cap, first):
    buckets = BUCKETS.buckets_for_parameters(param_bytes, cap, first)
    assert BUCKET_CHECKS.rule_broken(param_bytes, cap, first, buckets) == ""


@settings(max_examples=300, deadline=None)
@given(sizes, caps, first_caps, st.data())
def test_bucket_rule_rejects_every_other_split(param_bytes, cap, first, data):
    order = list(reversed(range(len(param_bytes))))
    cuts = sorted(
        data.draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=len(order)))
    )
    bounds = [0] + [c for c in cuts if 0 < c < len(order)] + [len(order)]
    other = [order[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    if other != BUCKETS.buckets_for_parameters(param_bytes, cap, first):
        assert BUCKET_CHECKS.rule_broken(param_bytes, cap, first, other) != ""


@settings(max_examples=300, deadline=None)
@given(
    st.floats(1e6, 2e10),
    st.sampled_from([1, 2, 3, 8, 64, 512]),
    st.floats(1e8, 1e12),
    st.floats(0.0, 3.0),
    st.floats(1e6, 1e9),
    st.sampled_from([0.0, 1e-5, 1e-3]),
)
def test_overlap_closed_form_matches_the_timeline(
    grad_bytes, n, bandwidth, backward_s, bucket_bytes, alpha
):
    report = OVERLAP.sync_report(
        grad_bytes,
        1,
        n,
        bandwidth,
        backward_s,
        bucket_bytes=bucket_bytes,
        alpha_s=alpha,
    )
    b = report["n_buckets"]
    assert b == math.ceil(grad_bytes / bucket_bytes)
    timeline = TIMELINE.simulate_backward(
        [backward_s / b] * b,
        [grad_bytes / b] * b,
        [[i] for i in range(b)],
        n,
        alpha,
        bandwidth,
    )
    assert math.isclose(
        report["comm_s"], timeline["comm_s"], rel_tol=1e-9, abs_tol=1e-12
    )
    # With one rank nothing is sent: the timeline's exposed time is 0, the closed form's
    # max(c, ...) too.
    assert math.isclose(
        report["exposed_s"],
        max(timeline["exposed_comm_s"], 0.0),
        rel_tol=1e-7,
        abs_tol=1e-9,
    )


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e12), st.integers(1, 4096), st.integers(0, 16))
def test_each_zero_stage_holds_no_more_than_the_one_before(psi, n, k):
    per_stage = [MEMORY.per_rank_bytes(psi, n, stage, k=k) for stage in range(4)]
    assert all(a >= b * (1 - 1e-12) for a, b in zip(per_stage, per_stage[1:]))
    if n == 1:
        assert all(
            math.isclose(m, (4 + k) * psi, rel_tol=1e-12, abs_tol=1e-6)
            for m in per_stage
        )
