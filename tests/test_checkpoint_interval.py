"""Chapter 9: how often to checkpoint (Young 1974, Daly 2006), and its figure.

Young's interval is the exact minimum of the first-order waste (found by a
scan); Daly's interval is close to the minimum of Daly's model (failures a
Poisson process, striking during saves and restarts too), and close to
Young's when the checkpoint is cheap against the mean time between failures.
The time lost is a share of the wall clock: w / (1 + w) for w seconds lost
per second of work. The figure shows the model's numbers and runs in the
browser (standard library only).
"""

import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mylib.figures import browser
from mylib.figures.checkpoint_interval import (
    CHECKPOINT_SLIDERS,
    LLAMA3_NODE_MTBF_DAYS,
    checkpoint_interval_figure,
    interval_numbers,
)
from mylib.figures.livefig import Slider
from mylib.models.checkpoint_interval import (
    DAY_S,
    best_interval_numeric,
    daly_interval,
    daly_wall_per_work,
    job_mtbf,
    lost_per_day,
    lost_per_day_daly,
    waste_per_work,
    young_interval,
)


@settings(max_examples=40, deadline=None)
@given(
    cost=st.floats(0.1, 3600),
    mtbf=st.floats(600, 1e7),
    restart=st.floats(0, 900),
)
@example(cost=30.0, mtbf=11135.0, restart=300.0)
@example(cost=300.0, mtbf=600.0, restart=0.0)  # more lost than worked: w > 1
def test_young_is_the_minimum_of_the_first_order_waste(cost, mtbf, restart):
    young = young_interval(cost, mtbf)
    scanned = best_interval_numeric(cost, mtbf, restart)
    assert scanned == pytest.approx(young, rel=0.01)
    for t in (young / 2, young * 2):
        assert waste_per_work(t, cost, mtbf, restart) > waste_per_work(
            young, cost, mtbf, restart
        )
        assert lost_per_day(t, cost, mtbf, restart) > lost_per_day(
            young, cost, mtbf, restart
        )
    assert 0 < lost_per_day(young, cost, mtbf, restart) < DAY_S  # a share of a day


@settings(max_examples=40, deadline=None)
@given(cost=st.floats(0.1, 600), mtbf=st.floats(6000, 1e7), restart=st.floats(0, 900))
@example(cost=600.0, mtbf=54 * 86400 / 419, restart=300.0)  # the chapter's case
def test_daly_is_the_minimum_of_dalys_model(cost, mtbf, restart):
    # C <= M / 10: Daly's closed form is within 1 % of his model's minimum
    scanned = best_interval_numeric(cost, mtbf, restart, model="daly")
    assert daly_interval(cost, mtbf) == pytest.approx(scanned, rel=0.01)
    # and his model loses more than the first-order one: failures in saves too
    t = daly_interval(cost, mtbf)
    assert lost_per_day_daly(t, cost, mtbf, restart) > lost_per_day(
        t, cost, mtbf, restart
    )


def test_daly_refines_young():
    assert young_interval(10, 3600) == pytest.approx(math.sqrt(2 * 10 * 3600))
    # cheap checkpoint: within 2 %; Daly subtracts about one cost
    assert daly_interval(10, 86400) == pytest.approx(young_interval(10, 86400), 0.02)
    assert daly_interval(7200, 3600) == 3600  # cost >= 2 MTBF: once per MTBF
    assert job_mtbf(100, 4) == 25
    # w = 60 / 600 = 0.1 s lost per second of work: 0.1 / 1.1 of the wall clock
    assert lost_per_day(600, 60, 1e12) == pytest.approx(86400 * 0.1 / 1.1)
    # Daly's model tends to the first-order one when failures are rare
    assert daly_wall_per_work(600, 60, 1e12) == pytest.approx(1.1, rel=1e-6)
    with pytest.raises(ValueError, match="cost > 0"):
        young_interval(0, 10)
    with pytest.raises(ValueError, match="nodes >= 1"):
        job_mtbf(10, 0)


def test_llama3_failure_rate():
    # 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048 nodes of 8)
    assert LLAMA3_NODE_MTBF_DAYS == pytest.approx(263.94, abs=0.01)
    n = interval_numbers()  # the defaults: Llama 3's cluster
    assert n["mtbf_s"] == pytest.approx(54 * 86400 / 419)


def test_the_figure_prints_the_models_numbers_at_every_setting():
    sliders = [Slider(**spec) for spec in CHECKPOINT_SLIDERS]
    for s in sliders:
        for position in range(len(s.options)):
            values = {s.name: s.value_at(position)}
            svg = checkpoint_interval_figure(**values)
            shown = {
                e.get("data-metric"): float(e.get("data-value"))
                for e in ET.fromstring(svg).iter()
                if e.get("data-value")
            }
            n = interval_numbers(**values)
            for key in ("mtbf_s", "young_s", "lost_h_at_young", "lost_h_daly"):
                assert shown[key] == pytest.approx(n[key], rel=1e-5)


def test_the_figure_runs_in_the_browser():
    needed = browser.module_closure("mylib.figures.checkpoint_interval")
    assert "models.checkpoint_interval" in needed
    assert "figures.checkpoint_interval" in browser.browser_modules()
