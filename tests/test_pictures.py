"""The pictures of chapters 1 and 2 are drawn from data, and say what the data says."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mylib.figures.ring import (  # noqa: E402
    collectives_figure,
    contributors,
    data_parallel_step_figure,
    holdings,
    ring_figure,
)


def test_bit_masks_name_their_contributors():
    assert contributors(5.0) == frozenset({0, 2})
    assert contributors(0.0) == frozenset()
    assert contributors(float("nan")) is None
    assert holdings([[1, math.nan], [3, 8]]) == [
        [frozenset({0}), None],
        [frozenset({0, 1}), frozenset({3})],
    ]
    with pytest.raises(ValueError, match="not a bit mask"):
        contributors(1.5)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_figure_has_a_panel_per_state(n):
    fig = ring_figure(n)
    drawn = [ax for ax in fig.axes if ax.patches]
    assert len(drawn) == 2 * (n - 1) + 1
    # The last panel is all sums: every cell reads "Σ".
    assert [t.get_text() for t in drawn[-1].texts] == ["Σ"] * (n * n)
    plt.close(fig)


def test_collectives_and_step_figures_draw():
    grid = holdings([[1, 1], [2, 2]])
    fig = collectives_figure([("all-reduce", grid, holdings([[3, 3], [3, 3]]))])
    assert len(fig.axes) == 2 and fig.axes[1].texts[0].get_text() == "Σ"
    plt.close(fig)
    fig = data_parallel_step_figure(3)
    assert sum("rank 2" in t.get_text() for t in fig.axes[0].texts) == 2
    plt.close(fig)
