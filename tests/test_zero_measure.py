"""Measured against the model: the bytes each rank holds and sends.

For DDP and every ZeRO stage, on 2 and 4 ranks.

The model (:mod:`mylib.models.memory`) in float32: 4-byte parameters and gradients,
K = 8 (Adam's two moments). The measurement counts the tensors a rank holds
after the backward (``held_bytes``) and the bytes it sends in one step
(``mylib.comm.count_bytes``), on a model of 1.25M parameters.
"""

import pytest

from mylib import run_ranks
from mylib.experiments.zero_check import MEASURE, SETUPS, train_setups
from mylib.models.memory import STAGE_NAMES, comm_per_step, memory_per_rank

SETUPS_MEASURED = ["ddp", "zero1", "zero2", "zero3"]


@pytest.fixture(scope="module", params=[2, 4], ids=["N=2", "N=4"])
def measured(request):
    world = request.param
    return world, run_ranks(
        train_setups, world, args=(SETUPS_MEASURED, MEASURE), timeout_s=300
    )


def test_model_is_big_enough(measured):
    _, results = measured
    assert results[0]["ddp"]["psi"] >= 1_000_000


@pytest.mark.parametrize("setup", SETUPS_MEASURED)
def test_memory_held_matches_the_model_within_5_percent(measured, setup):
    world, results = measured
    stage = SETUPS[setup]
    for result in results:
        r = result[setup]
        model = memory_per_rank(
            r["psi"], world, stage, k=8, param_bytes=4, grad_bytes=4
        )
        for key in ("params", "grads", "optimizer"):
            assert r["held"][key] == pytest.approx(getattr(model, key), rel=0.05), (
                STAGE_NAMES[stage],
                key,
            )
        assert sum(r["held"].values()) == pytest.approx(model.total, rel=0.05)


@pytest.mark.parametrize("setup", SETUPS_MEASURED)
def test_bytes_sent_match_the_model(measured, setup):
    world, results = measured
    stage = SETUPS[setup]
    for result in results:
        r = result[setup]
        want = comm_per_step(r["psi"], world, stage, param_bytes=4, grad_bytes=4)
        assert set(r["bytes_by_op"]) == set(want)
        for op, nbytes in want.items():
            assert r["bytes_by_op"][op] == pytest.approx(nbytes, rel=0.01), (
                op
            )  # padding: a few elements


def test_zero3_sends_one_and_a_half_times_ddp(measured):
    _, results = measured
    for result in results:
        assert result["zero3"]["bytes_sent"] / result["ddp"][
            "bytes_sent"
        ] == pytest.approx(1.5, rel=0.01)
        assert result["zero2"]["bytes_sent"] / result["ddp"][
            "bytes_sent"
        ] == pytest.approx(1.0, rel=0.01)
