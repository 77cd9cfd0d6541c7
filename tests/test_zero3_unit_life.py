"""Chapter 6's picture of a ZeRO-3 unit's life, against the memory model and by hand.

gather, forward, free; gather, backward, reduce-scatter, free: what one rank
holds of a unit after each event, and what it sends.
"""

import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mylib.figures.unit_life import LOOK, unit_life_picture
from mylib.models.memory import comm_per_step, memory_per_rank
from mylib.models.unit_life import EVENTS, KINDS, unit_life


def test_the_events_are_the_chapters_sentence():
    words = [event for event, _ in EVENTS]
    assert words == "gather forward free gather backward reduce-scatter free".split()
    assert [phase for _, phase in EVENTS] == ["forward"] * 3 + ["backward"] * 4


def test_a_100m_unit_on_4_ranks_by_hand():
    """bf16, K = 12: shards of 50 + 300 MB, full parameters 200, full gradient 200."""
    rows = unit_life(100e6, 4)
    held = [row.total / 1e6 for row in rows]
    assert held == pytest.approx([550, 550, 350, 550, 750, 800, 400])
    sent = [row.sent / 1e6 for row in rows]  # 3/4 of a 200 MB buffer
    assert sent == pytest.approx([150, 0, 0, 150, 0, 150, 0])
    assert [row.collective for row in rows if row.sent] == [
        "all-gather",
        "all-gather",
        "reduce-scatter",
    ]


@given(
    unit_params=st.floats(1e3, 1e10),
    world=st.sampled_from([1, 2, 4, 8, 64, 1024]),
    k=st.sampled_from([0, 4, 8, 12]),
)
def test_the_life_is_the_memory_models_zero3(unit_params, world, k):
    rows = unit_life(unit_params, world, k)
    shard = memory_per_rank(unit_params, world, 3, k)
    # after the last free: exactly the ZeRO-3 state of the unit
    assert rows[-1].total == pytest.approx(shard.total)
    assert rows[-1].transient == 0
    # between: one unit whole at a time, 2 bytes a parameter, and its gradient
    assert max(row.transient for row in rows) == pytest.approx(4 * unit_params)
    assert [row.full_params > 0 for row in rows] == [1, 1, 0, 1, 1, 1, 0]
    # the step sends ZeRO-3's three halves: comm_per_step's bytes
    sent = sum(comm_per_step(unit_params, world, 3).values())
    assert sum(row.sent for row in rows) == pytest.approx(sent)


def _metrics(svg):
    return {
        (int(e.get("data-row")), e.get("data-metric")): float(e.get("data-value"))
        for e in ET.fromstring(svg).iter()
        if e.get("data-metric")
    }


def test_the_picture_draws_the_models_numbers():
    rows = unit_life(100e6, 4)
    got = _metrics(unit_life_picture(100e6, 4))
    for i, row in enumerate(rows):
        assert got[i, "held_bytes"] == row.total
        assert got.get((i, "sent_bytes"), 0.0) == row.sent
    text = " ".join(ET.fromstring(unit_life_picture()).itertext())
    for value in ("550 MB", "750 MB", "800 MB", "sends 150 MB", "10^6 bytes"):
        assert value in text


def test_every_size_in_the_picture_says_its_unit():
    """Each legend entry gives bytes a parameter; each number says MB."""
    assert set(LOOK) == set(KINDS)
    for legend, _ in LOOK.values():
        assert re.search(r"[\dK](/N)? bytes a parameter$", legend), legend
    text = list(ET.fromstring(unit_life_picture()).itertext())
    numbers = [t for t in text if re.search(r"\d", t)]
    unitless = [
        t
        for t in numbers
        if not re.search(r"\b(MB|bytes|ranks|parameters|K = \d+)\b", t)
        and not re.fullmatch(r"\d\. [a-z-]+|0", t)
    ]
    assert not unitless, unitless
