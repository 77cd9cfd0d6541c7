"""The memory and communication model of chapter 6, and its calculator figure.

No processes needed.
"""

import json
import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.figures import browser
from mylib.figures.livefig import LiveFigure, Slider, render_positions
from mylib.figures.memory import MEMORY_SLIDERS, memory_figure
from mylib.models.memory import (
    GB,
    STAGES,
    comm_per_step,
    comm_volume_in_psi,
    max_params_that_fit,
    memory_per_rank,
    min_ranks_to_fit,
)

psis = st.floats(1e3, 1e13)
worlds = st.integers(1, 4096)
ks = st.sampled_from([0, 4, 8, 12, 16, 20])


def test_the_zero_papers_numbers():
    """7.5B parameters, K = 12, N = 64: 120, 31.4, 16.6 and 1.9 GB.

    Rajbhandari et al. 2020, figure 1.
    """
    totals = [memory_per_rank(7.5e9, 64, stage, k=12).total / GB for stage in STAGES]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]
    assert totals == [120.0, 31.40625, 16.640625, 1.875]


@given(psi=psis, n=worlds, k=ks)
def test_the_formulas_of_each_stage(psi, n, k):
    got = [memory_per_rank(psi, n, stage, k=k).total for stage in STAGES]
    want = [
        (4 + k) * psi,
        4 * psi + k * psi / n,
        2 * psi + (2 + k) * psi / n,
        (4 + k) * psi / n,
    ]
    assert got == pytest.approx(want, rel=1e-12)
    assert all(
        a >= b * (1 - 1e-12) for a, b in zip(got, got[1:])
    )  # each stage holds no more than the one before
    if n == 1:
        assert got == pytest.approx(
            [got[0]] * 4, rel=1e-12
        )  # on one rank, sharding saves nothing


def test_float32_adam_counts():
    """The chapter's measurements are in float32.

    4-byte parameters and gradients, K = 8 (two moments).
    """
    m = memory_per_rank(1e6, 4, 2, k=8, param_bytes=4, grad_bytes=4)
    assert (m.params, m.grads, m.optimizer) == (4e6, 1e6, 2e6)


@given(psi=psis, n=st.integers(2, 4096))
def test_communication_is_2_psi_then_3_psi(psi, n):
    ring = (n - 1) / n
    for stage in STAGES:
        sent = sum(comm_per_step(psi, n, stage, param_bytes=1, grad_bytes=1).values())
        assert sent == pytest.approx((3 if stage == 3 else 2) * ring * psi, rel=1e-12)
        assert comm_volume_in_psi(stage, n) == pytest.approx(
            (3 if stage == 3 else 2) * ring
        )
    ddp = sum(comm_per_step(psi, n, 0).values())
    assert sum(comm_per_step(psi, n, 3).values()) / ddp == pytest.approx(1.5)
    behind_ddp = comm_per_step(psi, n, 1, zero1_after_all_reduce=True)
    assert sum(behind_ddp.values()) / ddp == pytest.approx(
        1.5
    )  # PyTorch's ZeroRedundancyOptimizer behind DDP
    assert [comm_volume_in_psi(s) for s in STAGES] == [2, 2, 2, 3]


def test_why_ddp_cannot_hold_70b():
    ddp = memory_per_rank(70e9, 1024, 0).total / GB
    assert ddp == pytest.approx(1120.0)  # on every rank, however many there are
    assert [min_ranks_to_fit(70e9, s, 80 * GB) for s in STAGES] == [
        None,
        None,
        None,
        14,
    ]
    assert max_params_that_fit(80 * GB, 1, 0) == pytest.approx(
        5e9
    )  # DDP: 5B parameters at most


def test_the_13b_exercise_of_chapter_6():
    """Exercise ex-6-fit-13b's key points: 208, 71.5, 48.75 and 26 GB per GPU on 8 GPUs.

    And what is left of 80 GB.
    """
    totals = [memory_per_rank(13e9, 8, stage).total / GB for stage in STAGES]
    assert totals == pytest.approx([208, 71.5, 48.75, 26])
    assert [80 - t for t in totals[1:]] == pytest.approx([8.5, 31.25, 54])


def test_the_zero3_timeline_prints_decimal_bytes_like_the_chapter():
    from mylib.figures.timeline_zero3 import zero3_timeline_figure

    svg = zero3_timeline_figure()  # 12 layers of 100M bf16 parameters, 32 ranks
    ring = 31 / 32  # of each buffer, a rank sends (N-1)/N
    ddp, zero3 = 2 * ring * 2.4, 3 * ring * 2.4  # GB: the model is 2.4 GB in bf16
    assert f"sent per rank {ddp:.2f} GB" in svg and "whole at once 2.40 GB" in svg
    assert f"sent per rank {zero3:.2f} GB" in svg and "whole at once 200 MB" in svg


@settings(max_examples=200)
@given(
    psi=st.floats(1e8, 2e12),
    stage=st.sampled_from(STAGES),
    k=ks,
    memory_gb=st.sampled_from([16, 40, 80, 141]),
)
def test_min_ranks_to_fit_is_the_smallest(psi, stage, k, memory_gb):
    n = min_ranks_to_fit(psi, stage, memory_gb * GB, k)
    if n is None:
        assert memory_per_rank(psi, 10**9, stage, k).total > memory_gb * GB * (1 - 1e-9)
    else:
        assert memory_per_rank(psi, n, stage, k).total <= memory_gb * GB
        assert n == 1 or memory_per_rank(psi, n - 1, stage, k).total > memory_gb * GB


@pytest.mark.parametrize(
    "call, fix",
    [
        (lambda: memory_per_rank(1e9, 0, 1), "positive int"),
        (lambda: memory_per_rank(1e9, 8, 4), "0 = DDP"),
        (lambda: memory_per_rank(-1, 8, 1), ">= 0"),
        (lambda: memory_per_rank(1e9, 8, 1, k=-2), "k >= 0"),
        (lambda: comm_per_step(1e9, 2.5, 0), "positive int"),
    ],
)
def test_bad_input_names_the_fix(call, fix):
    with pytest.raises(ValueError, match=fix):
        call()


# -- the calculator figure
# -----------------------------------------------------------------------------------


def metrics(svg):
    """``{data-metric: data-value}`` of a drawing."""
    root = ET.fromstring(svg)
    return {
        e.get("data-metric"): e.get("data-value")
        for e in root.iter()
        if e.get("data-metric")
    }


@settings(max_examples=60, deadline=None)
@given(
    positions=st.fixed_dictionaries(
        {s["name"]: st.integers(0, 12) for s in MEMORY_SLIDERS}
    )
)
def test_every_slider_position_draws_the_models_numbers(positions):
    sliders = [Slider(**s) for s in MEMORY_SLIDERS]
    values = {s.name: s.value_at(positions[s.name]) for s in sliders}
    svg = memory_figure(**values)
    got = metrics(svg)
    psi, n, stage, k = (
        values["params_b"] * 1e9,
        values["world_size"],
        values["stage"],
        values["k"],
    )
    for s in STAGES:
        assert float(got[f"total_gb_{s}"]) == pytest.approx(
            memory_per_rank(psi, n, s, k).total / GB
        )
    chosen = memory_per_rank(psi, n, stage, k).gb()
    for key in ("params", "grads", "optimizer", "total"):
        assert float(got[f"{key}_gb"]) == pytest.approx(chosen[key])
    assert got["fits"] == repr(chosen["total"] <= 80)
    assert got["min_ranks"] == repr(min_ranks_to_fit(psi, stage, 80 * GB, k))
    assert float(got["sent_gb"]) == pytest.approx(
        sum(comm_per_step(psi, n, stage).values()) / GB
    )
    assert 'stroke="#d62728"' in svg and "80 GB" in svg  # the one-GPU line


def test_the_figure_runs_in_the_browser_and_redraws_by_slider_position():
    fig = LiveFigure(memory_figure, MEMORY_SLIDERS)
    assert {"models.memory", "figures.memory", "figures.svg"} <= set(
        fig.modules
    )  # standard library only: Pyodide can run it
    assert set(browser.module_closure("mylib.figures.memory")) >= {
        "models.memory",
        "figures.svg",
    }
    specs = json.dumps([Slider(**s).spec() for s in MEMORY_SLIDERS])
    svg = render_positions(
        "mylib.figures.memory",
        "memory_figure",
        specs,
        json.dumps({"stage": 0, "params_b": 9}),
    )
    assert svg == memory_figure(params_b=70.0, stage=0)
    assert metrics(svg)["fits"] == "False" and metrics(svg)["min_ranks"] == "None"


def test_default_figure_is_the_papers_setting():
    got = metrics(memory_figure())
    assert [round(float(got[f"total_gb_{s}"]), 1) for s in STAGES] == [
        120.0,
        31.4,
        16.6,
        1.9,
    ]
    assert math.isclose(float(got["total_gb"]), 1.875)
