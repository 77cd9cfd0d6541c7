"""The calibrator reads nccl-tests' all_reduce_perf and recovers the link it measured.

Fixtures in ``tests/fixtures/nccl_tests`` (its README says where each comes
from): the current format, the 2019-2022 format, rows of a real run posted in
a public thread, another nccl-tests tool, another tool altogether, one size
only. Synthetic outputs are written by ``format_table``, whose lines are
checked here against nccl-tests' C format strings (``src/util.cu``), and the
fit must recover the link they were made from within 2%.
"""

import pathlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.models import nccl_tests as nt
from mylib.models.cluster import ALL_REDUCE, Cluster, dgx_a100, dgx_h100, ring
from mylib.models.hardware import NODES
from mylib.models.plan_inputs import run

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "nccl_tests"
SIZES = [8 * 2**i for i in range(31)]  # -b 8 -e 8G -f 2


def fixture(name):
    return (FIXTURES / name).read_text()


def step_alpha(cluster):
    cost = ring(cluster, ALL_REDUCE, 1.0)
    return cost.latency_s / (2 * (cluster.ranks - 1)), cost.peak_busbw


def synthetic(cluster, noise=0.0, seed=0):
    rng = random.Random(seed)
    seconds = [
        ring(cluster, ALL_REDUCE, s).seconds * rng.uniform(1 - noise, 1 + noise)
        for s in SIZES
    ]
    hosts = tuple(f"node{i}" for i in range(cluster.nodes))
    return nt.format_table(SIZES, seconds, cluster.ranks, hosts)


# nccl-tests' C format strings, verbatim from src/util.cu (writeResultHeader,
# writeBenchmarkLinePreamble, writeBenchmarkLineBody, writeResultFooter)
HEADER = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
PREAMBLE, BODY = "%12li  %12li  %8s  %6s  %6s", "  %7s  %6s  %6s  %6g"
FOOTER = "# %-20s : %d %s"


def test_format_table_prints_what_nccl_tests_prints():
    # the C format strings applied with Python's %, which follows printf
    text = synthetic(dgx_h100(2))
    lines = text.splitlines()
    columns = ("size", "count", "type", "redop", "root")
    columns += ("time", "algbw", "busbw", "#wrong") * 2
    assert HEADER % (*columns, 0, "") in lines  # noqa: UP031
    row = next(x for x in lines if x.startswith(" " * 5 + "1048576"))
    words = row.split()
    time_us = float(words[5])
    body = BODY % (words[5], words[6], words[7], 0)  # noqa: UP031
    preamble = PREAMBLE % (1048576, 262144, "float", "sum", "%6i" % -1)  # noqa: UP031
    assert row == preamble + body * 2
    algbw = "%6.2f" % (1048576 / 1e9 / (time_us * 1e-6))  # noqa: UP031 (S / t)
    assert words[6] == algbw.strip()
    assert FOOTER % ("Out of bounds values", 0, "OK") in lines  # noqa: UP031
    assert lines[1] == "# Collective test starting: all_reduce_perf"


def test_float_width_follows_getfloatstr():
    assert nt._float(28.149, 7) == "  28.15"
    assert nt._float(23218.53, 7) == "23218.5"  # 2 decimals do not fit 7 columns
    assert nt._float(1234.5, 6) == "1234.5"
    assert nt._float(123456.0, 6) == "123456"


def test_parses_the_current_format_with_devices_and_hosts():
    table = nt.parse(fixture("all_reduce_2x8_h100_v2.19.txt"))
    assert (table.ranks, table.nodes, len(table.rows)) == (16, 2, 31)
    assert [r.nbytes for r in table.rows] == SIZES
    big = table.rows[-1]
    assert big.busbw / big.algbw == pytest.approx(2 * 15 / 16, rel=1e-3)


def test_parses_real_rows_and_infers_the_ranks_from_busbw():
    table = nt.parse(fixture("all_reduce_8gpu_posted_rows.txt"))
    assert (table.ranks, table.nodes) == (8, None)
    first = table.rows[0]
    assert (first.nbytes, first.seconds) == (32768, pytest.approx(18.66e-6))
    assert (first.algbw, first.busbw) == (pytest.approx(1.76e9), pytest.approx(3.07e9))
    fitted = nt.fit(table)
    assert len(fitted.regimes) == 2  # NCCL changes protocol with the size
    assert fitted.regimes[0].max_bytes < fitted.regimes[1].min_bytes


def test_parses_the_2019_format():
    table = nt.parse(fixture("all_reduce_dgx_a100_2019_format.txt"))
    assert (table.ranks, table.nodes, len(table.rows)) == (8, 1, 25)
    fitted = nt.fit(table)
    alpha, busbw = step_alpha(dgx_a100(1))
    assert fitted.busbw == pytest.approx(busbw, rel=0.02)
    assert fitted.alpha_s == pytest.approx(alpha, rel=0.02)


@pytest.mark.parametrize(
    "name, says",
    [
        ("all_gather_2x8_h100_v2.19.txt", "all_gather_perf, not of all_reduce_perf"),
        ("ucc_perftest_not_nccl.txt", "no all_reduce_perf table found"),
        ("all_reduce_one_size_v2.19.txt", "only 1 message size"),
    ],
)
def test_other_output_gets_a_message_saying_what_was_expected(name, says):
    with pytest.raises(ValueError, match=says) as err:
        nt.parse(fixture(name))
    assert "-b 8 -e 8G -f 2" in str(err.value)


def test_a_truncated_table_is_refused():
    text = fixture("all_reduce_2x8_h100_v2.19.txt")
    mid_row = text[: text.index("     1048576") + 60]
    with pytest.raises(ValueError, match="cut short"):
        nt.parse(mid_row)
    no_footer = text[: text.index("# Out of bounds")]
    with pytest.raises(ValueError, match="truncated"):
        nt.parse(no_footer)


def test_rows_from_another_collective_without_devices_are_refused():
    # all_gather's busbw / algbw is (n-1)/n < 1: not an all-reduce's
    lines = [x for x in fixture("all_gather_2x8_h100_v2.19.txt").splitlines()]
    rows = [x.replace(" none ", "  sum ") for x in lines if not x.startswith("#  Rank")]
    text = "\n".join(x for x in rows if "Collective test" not in x)
    with pytest.raises(ValueError, match="not an all-reduce"):
        nt.parse(text)


def test_wrong_values_are_refused():
    text = fixture("all_reduce_8gpu_posted_rows.txt").replace(
        "300.51       0", "300.51       3"
    )
    with pytest.raises(ValueError, match="wrong values"):
        nt.parse(text)


def test_cputime_is_refused_with_the_fix():
    # all_reduce_perf -C 1 heads the time column "cputime" (src/util.cu) and fills
    # it with the host's launch time, taken before the collectives complete.
    lines = fixture("all_reduce_2x8_h100_v2.19.txt").splitlines()
    text = "\n".join(
        x.replace("    time ", " cputime ") if "size" in x and "count" in x else x
        for x in lines
    )
    assert " cputime " in text
    with pytest.raises(ValueError, match="without -C"):
        nt.parse(text)


CLUSTERS = st.builds(
    lambda nodes, g, nics, nic, links: Cluster(
        "synthetic", nodes, g, links * 20e9, nics, nic * 1e9
    ),
    st.integers(1, 16),
    st.sampled_from([2, 4, 8]),
    st.sampled_from([1, 2, 4, 8]),
    st.floats(5, 60),
    st.integers(4, 18),
)


@settings(max_examples=40, deadline=None)
@given(cluster=CLUSTERS, seed=st.integers(0, 10**6))
def test_the_fit_recovers_the_link_within_two_percent(cluster, seed):
    if cluster.ranks < 2:
        return
    fitted = nt.fit(nt.parse(synthetic(cluster, noise=0.01, seed=seed)))
    alpha, busbw = step_alpha(cluster)
    assert abs(fitted.alpha_s / alpha - 1) < 0.02
    assert abs(fitted.busbw / busbw - 1) < 0.02


def test_two_regimes_are_fitted_apart():
    # small sizes on one link, large on a slower one with more latency a step,
    # as when NCCL switches from its low-latency protocol to its "Simple" one
    fast = dgx_h100(2)
    slow = Cluster("slow", 2, 8, 200e9, 8, 25e9, 30e-6, 30e-6)
    small = [s for s in SIZES if s < 2**20]
    seconds = [ring(fast, ALL_REDUCE, s).seconds for s in small] + [
        ring(slow, ALL_REDUCE, s).seconds for s in SIZES[len(small) :]
    ]
    text = nt.format_table(SIZES, seconds, 16, ("a", "b"))
    fitted = nt.fit(nt.parse(text))
    assert len(fitted.regimes) == 2
    assert fitted.alpha_s == pytest.approx(step_alpha(fast)[0], rel=0.02)
    assert fitted.busbw == pytest.approx(step_alpha(slow)[1], rel=0.02)


def test_calibrated_cluster_puts_the_link_on_the_nics_or_on_nvlink():
    across = nt.fit(nt.parse(synthetic(Cluster("x", 2, 8, 360e9, 4, 20e9))))
    c = nt.calibrated_cluster(dgx_h100(8), across)
    assert c.nic_bw == pytest.approx(across.busbw / 8)
    assert c.nic_latency_s == c.nvlink_latency_s == across.alpha_s
    assert ring(c, ALL_REDUCE, 1.0).peak_busbw == pytest.approx(across.busbw)
    inside = nt.fit(nt.parse(synthetic(Cluster("y", 1, 8, 300e9, 8, 50e9))))
    c = nt.calibrated_cluster(dgx_h100(8), inside)
    assert (c.nvlink_bw, c.nic_bw) == (inside.busbw, dgx_h100(8).nic_bw)


def test_the_planner_plans_on_the_calibrated_link():
    slow = Cluster("slow", 2, 8, 360e9, 8, 12.5e9)  # 100 Gb/s NICs
    plan, fitted = run({"nodes": 8, "nccl_tests": synthetic(slow)})
    assert plan.cluster.nic_bw == pytest.approx(12.5e9, rel=0.02)
    preset, _ = run({"nodes": 8})
    assert plan.costs["ZeRO-3"].comm_s > 3 * preset.costs["ZeRO-3"].comm_s
    with pytest.raises(ValueError, match="all_reduce_perf output: only 1"):
        run({"nccl_tests": fixture("all_reduce_one_size_v2.19.txt")})
    assert NODES["DGX H100"].cluster(8).nic_bw == dgx_h100(8).nic_bw
