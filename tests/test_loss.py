"""The normalisation trap, and its token-count fix.

The trap: ranks with different numbers of target tokens.
"""

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from mylib import run_ranks
from mylib.averaging import average_gradients
from mylib.comm import count_bytes
from mylib.figures import browser
from mylib.figures.loss import loss_weights, token_weights_figure
from mylib.loss import global_count, global_mean_loss, token_mean_cross_entropy

IGNORE = -100
VOCAB, WIDTH = 7, 5


def logits_with_losses(losses, pad):
    """Logits over 2 classes whose cross-entropy for label 1 is each of ``losses``.

    Then ``pad`` masked positions. With logits ``(a, 0)`` and label 1 the loss is
    ``log(1 + e^a)``, so ``a = log(e^loss - 1)``.
    """
    a = torch.tensor(
        [math.log(math.expm1(loss)) for loss in losses] + [0.0] * pad,
        dtype=torch.float64,
    )
    logits = torch.stack([a, torch.zeros_like(a)], dim=1)
    labels = torch.tensor([1] * len(losses) + [IGNORE] * pad)
    return logits, labels


def _worked_example():
    """Rank 0: three tokens of loss 1; rank 1: one of loss 3 (and masked padding)."""
    rank = dist.get_rank()
    logits, labels = (
        logits_with_losses([1.0, 1.0, 1.0], pad=1)
        if rank == 0
        else logits_with_losses([3.0], pad=3)
    )
    rank_mean = F.cross_entropy(
        logits, labels, ignore_index=IGNORE
    )  # what each rank computes by default
    fixed = token_mean_cross_entropy(logits, labels, ignore_index=IGNORE)
    both = torch.stack([rank_mean, fixed]).detach()
    dist.all_reduce(both)
    both /= dist.get_world_size()  # averaged over ranks, as gradient averaging does
    return rank_mean.item(), both.tolist()


def test_the_worked_example_two_versus_one_and_a_half():
    (mean0, (mean_of_means, token_mean)), (mean1, _) = run_ranks(_worked_example, 2)
    assert math.isclose(mean0, 1.0, rel_tol=1e-12) and math.isclose(
        mean1, 3.0, rel_tol=1e-12
    )
    assert math.isclose(mean_of_means, 2.0, rel_tol=1e-12)
    assert math.isclose(token_mean, 1.5, rel_tol=1e-12)
    single = F.cross_entropy(
        *[
            torch.cat(t)
            for t in zip(logits_with_losses([1.0] * 3, 1), logits_with_losses([3.0], 3))
        ],
        ignore_index=IGNORE,
    )
    assert math.isclose(
        single.item(), 1.5, rel_tol=1e-12
    )  # one process on the whole batch


def tiny_lm(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB)).double()


def _gradients_vs_one_process(tokens, labels):
    """Each rank holds rows of (tokens, labels).

    Compare the averaged gradients with one process's token mean.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = tokens.shape[0] // n
    mine = slice(rank * rows, (rank + 1) * rows)
    diffs = {}
    whole = tiny_lm()
    F.cross_entropy(
        whole(tokens).reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE
    ).backward()
    for how in ("mean of means", "token mean"):
        model = tiny_lm()
        logits = model(tokens[mine])
        if how == "mean of means":
            loss = F.cross_entropy(
                logits.reshape(-1, VOCAB), labels[mine].reshape(-1), ignore_index=IGNORE
            )
            loss = torch.nan_to_num(loss)  # a rank with no target tokens gets NaN here
        else:
            loss = token_mean_cross_entropy(logits, labels[mine], ignore_index=IGNORE)
        loss.backward()
        average_gradients(model)
        diffs[how] = max(
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), whole.parameters())
        )
    return diffs


@st.composite
def masked_batches(draw):
    world = draw(st.integers(1, 4))
    rows_per_rank, length = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    rows = world * rows_per_rank
    seed = draw(st.integers(0, 10**6))
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (rows, length), generator=g)
    labels = torch.randint(0, VOCAB, (rows, length), generator=g)
    keep = torch.rand(rows, length, generator=g) < draw(st.floats(0.1, 1.0))
    keep[0, 0] = True  # at least one target token somewhere
    return world, tokens, torch.where(keep, labels, torch.full_like(labels, IGNORE))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=masked_batches())
def test_token_mean_gradients_equal_one_process_for_any_mask(case):
    world, tokens, labels = case
    for diffs in run_ranks(_gradients_vs_one_process, world, args=(tokens, labels)):
        assert diffs["token mean"] < 1e-12


def test_mean_of_means_is_wrong_when_counts_differ():
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 1]])
    labels = torch.tensor(
        [[2, 3, 4, IGNORE], [6, IGNORE, IGNORE, IGNORE]]
    )  # 3 targets on rank 0, 1 on rank 1
    for diffs in run_ranks(_gradients_vs_one_process, 2, args=(tokens, labels)):
        assert diffs["mean of means"] > 1e-3
        assert diffs["token mean"] < 1e-12


def _no_targets(everywhere):
    rank = dist.get_rank()
    model = tiny_lm()
    tokens = torch.tensor([[1, 2, 3]])
    labels = torch.full((1, 3), IGNORE)
    if rank == 0 and not everywhere:
        labels[0, 1] = 4
    loss = token_mean_cross_entropy(model(tokens), labels)
    loss.backward()
    average_gradients(model)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return loss.item(), bool(torch.isfinite(grads).all()), grads.abs().max().item()


def test_a_rank_without_targets_and_a_batch_without_any():
    (loss0, finite0, _), (loss1, finite1, _) = run_ranks(_no_targets, 2, args=(False,))
    assert finite0 and finite1 and loss1 == 0.0 and loss0 > 0
    for loss, finite, largest in run_ranks(_no_targets, 2, args=(True,)):
        assert (
            loss == 0.0 and finite and largest == 0.0
        )  # no NaN: zero loss, zero gradient


def _counting():
    rank = dist.get_rank()
    with count_bytes() as stats:
        total = global_count(rank + 2)
    return total, stats.bytes_sent


def test_the_fix_costs_one_all_reduce_of_one_integer():
    assert run_ranks(_counting, 2) == [
        (5, 8),
        (5, 8),
    ]  # 2 + 3 tokens; 2(n-1)/n x 8 bytes


def _bad_inputs():
    errors = []
    for call in (
        lambda: token_mean_cross_entropy(
            torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long)
        ),
        lambda: global_mean_loss(torch.tensor(1.0), -1),
    ):
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_bad_inputs_are_named():
    shapes, negative = run_ranks(_bad_inputs, 1)[0]
    assert "labels' shape plus a last dimension" in shapes
    assert "cannot be negative" in negative


# ---- the slider figure of the chapter
# ---------------------------------------------------------


@given(
    t0=st.integers(1, 64),
    t1=st.integers(1, 64),
    l0=st.floats(0, 10),
    l1=st.floats(0, 10),
)
def test_figure_weights_sum_to_one_and_match_the_losses(t0, t1, l0, l1):
    w = loss_weights(t0, t1, l0, l1)
    assert math.isclose(
        t0 * w["weight_mean_of_means"][0] + t1 * w["weight_mean_of_means"][1], 1.0
    )
    assert math.isclose(
        t0 * w["weight_token_mean"][0] + t1 * w["weight_token_mean"][1], 1.0
    )
    assert math.isclose(w["mean_of_means"], (l0 + l1) / 2, abs_tol=1e-12)
    assert math.isclose(w["token_mean"], (t0 * l0 + t1 * l1) / (t0 + t1), abs_tol=1e-12)
    assert "</svg>" in token_weights_figure(t0, t1, l0, l1)


def test_figure_default_is_the_worked_example_and_empty_ranks_give_nan():
    assert "mean of means = 2   vs   token mean = 1.5" in token_weights_figure()
    assert "NaN" in token_weights_figure(3, 0, 1.0, 3.0)
    assert loss_weights(0, 0, 1.0, 1.0)["token_mean"] == 0.0
    with pytest.raises(ValueError, match="cannot be negative"):
        loss_weights(-1, 2, 1.0, 1.0)
    assert "figures.loss" in browser.browser_modules()


# -- chapter 2's diagnosis: packing hides the trap until the ragged last batch
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_packing_hides_the_trap_until_the_ragged_last_batch(world):
    from mylib.experiments.packing import packed_epoch

    pack, per_rank = 8, 2
    tokens = 4 * world * per_rank * pack + (world - 1) * pack + 5
    rows = run_ranks(packed_epoch, world, args=(tokens, pack, per_rank))
    assert all(r == rows[0] for r in rows)  # every rank reports the same epoch
    *full, last = rows[0]
    assert len(full) == 4
    for targets, mean_of_means, one_process, fixed in full:
        assert targets == [per_rank * pack] * world
        assert mean_of_means == pytest.approx(one_process, abs=1e-12)
    targets, mean_of_means, one_process, fixed = last
    assert targets == [pack] * (world - 1) + [5]
    assert abs(mean_of_means - one_process) > 1e-3  # the blip
    for *_, one_process, fixed in rows[0]:
        assert fixed == pytest.approx(one_process, abs=1e-12)


def test_packed_epoch_refuses_a_rank_without_packs():
    from mylib import RankError
    from mylib.experiments.packing import packed_epoch

    with pytest.raises(RankError, match="leave a rank without any"):
        run_ranks(packed_epoch, 2, args=(4 * 32 + 5,), show_output=False)
