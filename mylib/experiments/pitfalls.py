"""The classic data-parallel bugs and their fixes, each a small run on a process group.

Each run is a function for :func:`mylib.run_ranks`. Chapter 8 reproduces
every bug on a real gloo group and then fixes it; the tests run the very
same functions. Each takes a switch between the buggy and the fixed version
and returns what the chapter checks (parameters to compare with one process,
buffers, the data each rank read), or fails the way the bug fails: an error
naming the parameter, a crash, a hang that the launcher's timeout turns into
:class:`mylib.RankTimeout`, or a silently wrong number.

Every rank draws its own data from ``seed + rank``; :func:`reference`
trains one process on all ranks' data at once, which is what data
parallelism must reproduce.
"""

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from mylib import debug
from mylib.ddp import MyDDP
from mylib.ledger import CollectiveHang, CollectiveLedger

LR = 0.1


class BranchNet(nn.Module):
    """A trunk, a head, and an ``extra`` head that only some forwards use."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.head, self.extra = (
            nn.Linear(6, 8),
            nn.Linear(8, 3),
            nn.Linear(8, 3),
        )

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.trunk(x))
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


class TiedNet(nn.Module):
    """An embedding whose weight the output layer shares, as language models do.

    Optionally untied (``tie=False``).
    """

    def __init__(self, tie=True, vocab=11, dim=6):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.mix = nn.Embedding(vocab, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.mix(self.embed(tokens))))


class NormNet(nn.Module):
    """Linear, a normalisation, Linear.

    ``norm="batch"``: BatchNorm1d with running buffers; ``"layer"``: LayerNorm.
    """

    def __init__(self, norm="batch"):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(6, 8), nn.Linear(8, 3)
        self.norm = nn.BatchNorm1d(8) if norm == "batch" else nn.LayerNorm(8)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.inp(x))))


def rank_data(rank, steps, batch=4, kind="regression", shift_per_rank=0.0, seed=10):
    """This rank's ``(x, y)`` batches, inputs shifted by ``rank * shift_per_rank``."""
    gen = torch.Generator().manual_seed(seed + rank)
    if kind == "tokens":
        return [
            (
                torch.randint(0, 11, (batch, 3), generator=gen),
                torch.randint(0, 11, (batch, 3), generator=gen),
            )
            for _ in range(steps)
        ]
    return [
        (
            torch.randn(batch, 6, generator=gen) + rank * shift_per_rank,
            torch.randn(batch, 3, generator=gen),
        )
        for _ in range(steps)
    ]


def _loss(model, x, y, **kwargs):
    out = model(x, **kwargs)
    return (
        F.cross_entropy(out.flatten(0, -2), y.flatten())
        if y.dtype == torch.long
        else F.mse_loss(out, y)
    )


def _sgd(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-LR)
                p.grad.zero_()


def _params(model):
    module = getattr(model, "module", model)
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def reference(make_model, world_size, steps, use_extra_on=None, **data):
    """One process on every rank's data at once: what data parallelism must reproduce.

    Each step runs ONE forward on all ranks' batches concatenated (the whole
    global batch). With ``use_extra_on`` (ranks whose forward uses the extra
    head), each rank's batch goes through its own forward and the mean losses
    are averaged, as the ranks do.
    """
    model = make_model()
    per_rank = [rank_data(r, steps, **data) for r in range(world_size)]
    for step in range(steps):
        batches = [per_rank[r][step] for r in range(world_size)]
        if use_extra_on is None:
            loss = _loss(
                model,
                torch.cat([x for x, _ in batches]),
                torch.cat([y for _, y in batches]),
            )
        else:
            loss = sum(
                _loss(model, x, y, use_extra=r in use_extra_on)
                for r, (x, y) in enumerate(batches)
            )
            loss = loss / world_size
        loss.backward()
        _sgd(model)
    return _params(model)


# -- 1. a parameter that gets no gradient --------------------------------------


def unused_parameters(used_by="none", find_unused=False, wrapper="mylib", steps=3):
    """Train ``BranchNet``; its ``extra`` head is used by no rank or by rank 0 only.

    ``used_by``: ``"none"`` or ``"rank0"``. ``wrapper``: ``"mylib"`` (MyDDP) or
    ``"torch"`` (PyTorch's DistributedDataParallel).
    """
    rank = dist.get_rank()
    net = BranchNet()
    wrap = MyDDP if wrapper == "mylib" else nn.parallel.DistributedDataParallel
    model = wrap(net, find_unused_parameters=find_unused)
    for x, y in rank_data(rank, steps):
        use_extra = used_by == "rank0" and rank == 0
        _loss(model, x, y, use_extra=use_extra).backward()
        if wrapper == "mylib":
            model.finish_gradient_sync()
        _sgd(model)
    return _params(model)


# -- 2. frozen and tied parameters ---------------------------------------------


def frozen_parameter(freeze_after_wrap=False, steps=3):
    """Freeze ``trunk.weight``, before wrapping (fine) or after.

    After wrapping, MyDDP still waits for its gradient.
    """
    net = BranchNet()
    if not freeze_after_wrap:
        net.trunk.weight.requires_grad_(False)
    model = MyDDP(net)
    if freeze_after_wrap:
        net.trunk.weight.requires_grad_(False)
    for x, y in rank_data(dist.get_rank(), steps):
        _loss(model, x, y).backward()
        model.finish_gradient_sync()
        _sgd(model)
    return _params(model)


def tied_parameter(tie_after_wrap=False, steps=3):
    """Tie the output layer to the embedding, before wrapping or after.

    Before wrapping, the two are one parameter, synced once.
    """
    net = TiedNet(tie=not tie_after_wrap)
    model = MyDDP(net)
    if tie_after_wrap:
        # MyDDP's buckets still hold the old, now unused, out.weight
        net.out.weight = net.embed.weight
    for x, y in rank_data(dist.get_rank(), steps, kind="tokens"):
        _loss(model, x, y).backward()
        model.finish_gradient_sync()
        _sgd(model)
    return _params(model), [name for b in model.buckets for name in b.names]


# -- 3. buffers: BatchNorm's running statistics --------------------------------


def norm_buffers(broadcast_buffers=True, norm="batch", steps=5, shift_per_rank=1.0):
    """Train ``NormNet`` on ranks whose data differ.

    Reports the drift, the eval outputs and the parameters.
    """
    rank = dist.get_rank()
    model = MyDDP(NormNet(norm), broadcast_buffers=broadcast_buffers)
    for x, y in rank_data(rank, steps, shift_per_rank=shift_per_rank):
        _loss(model, x, y).backward()
        model.finish_gradient_sync()
        _sgd(model)
    drift_after_training = debug.replica_drift(model.module)
    model.eval()
    with torch.no_grad():
        probe = torch.linspace(-1, 1, 12).reshape(2, 6)
        # the wrapper broadcasts rank 0's buffers first, if asked to
        evaluated = model(probe)
    return {"drift": drift_after_training, "eval": evaluated, "params": _params(model)}


# -- 4. ranks calling collectives in different orders --------------------------


def mismatched_collectives(kind="order", checked=False, ledger=None):
    """Two collectives that rank 0 calls in one order and the others in the other.

    ``kind="order"``: an all-reduce and a broadcast (the ranks wait for
    each other forever); ``kind="same_shape"``: two all-reduces of same-shaped
    tensors, a metric and a gradient (they pair up wrongly and nobody
    notices). ``checked=True`` runs them on :func:`mylib.debug.checked_group`;
    ``ledger`` (a dict of :class:`mylib.ledger.CollectiveLedger` arguments) in
    a ledger, and returns its report.
    """
    if ledger is not None:
        try:
            with CollectiveLedger(**ledger):
                return mismatched_collectives(kind, checked)
        except CollectiveHang as e:
            return e.report
    rank = dist.get_rank()
    group = debug.checked_group() if checked else None
    metric, grad = torch.tensor([float(rank + 1)]), torch.tensor([10.0 * (rank + 1)])

    def first():
        dist.all_reduce(grad, group=group)

    def second():
        if kind == "order":
            dist.broadcast(grad, 0, group=group)
        else:
            dist.all_reduce(metric, group=group)

    if rank == 0:
        first()
        second()
    else:
        second()
        first()
    return {"metric": metric.item(), "grad": grad.item()}


def logged_on_rank_zero(steps=3, ledger_timeout_s=None):
    """A training loop that logs the global loss inside ``if rank == 0:``.

    Rank 0's all-reduce of the loss meets the other ranks' all-reduce of the
    next step's first gradient: sizes differ, and gloo aborts the process.
    With ``ledger_timeout_s``, the loop runs inside
    :class:`mylib.ledger.CollectiveLedger` and each rank returns the ledger's
    report instead.
    """
    rank = dist.get_rank()
    model = BranchNet()
    ledger = (
        CollectiveLedger(timeout_s=ledger_timeout_s)
        if ledger_timeout_s
        else contextlib.nullcontext()
    )
    try:
        with ledger:
            for x, y in rank_data(rank, steps):
                loss = _loss(model, x, y)
                loss.backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                if rank == 0:  # the bug: a collective only rank 0 calls
                    total = loss.detach().clone()
                    dist.all_reduce(total)
    except CollectiveHang as e:
        return e.report
    return "no hang"


# -- 5. an uneven last batch ---------------------------------------------------


def uneven_batches(sharding="naive", dataset_size=10, batch=2):
    """Train on ``dataset_size`` samples split over the ranks, then meet at a barrier.

    The barrier stands for, say, a save.

    ``sharding="naive"``: rank r takes samples r, r+n, ...: some ranks get one
    batch more and wait in an all-reduce the others never start.
    ``"sampler"``: ``DistributedSampler`` pads by repeating samples, so every
    rank has as many batches; ``"drop_last"``: it drops the remainder instead.
    """
    from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

    rank, n = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(3)
    data = TensorDataset(
        torch.arange(dataset_size),
        torch.randn(dataset_size, 6, generator=gen),
        torch.randn(dataset_size, 3, generator=gen),
    )
    if sharding == "naive":
        loader = DataLoader(
            Subset(data, range(rank, dataset_size, n)), batch_size=batch
        )
    else:
        sampler = DistributedSampler(
            data, shuffle=False, drop_last=(sharding == "drop_last")
        )
        loader = DataLoader(data, batch_size=batch, sampler=sampler)
    model = MyDDP(BranchNet())
    seen, steps = [], 0
    for index, x, y in loader:
        _loss(model, x, y).backward()
        model.finish_gradient_sync()
        _sgd(model)
        seen += index.tolist()
        steps += 1
    dist.barrier()
    return {"steps": steps, "seen": seen}


# -- 6. ranks reading the same data --------------------------------------------


def data_shards(kind="sampler", dataset_size=16, epochs=2, batch=4):
    """The indices each rank reads per epoch, and the first epoch's shard report.

    The report is :func:`mylib.debug.shard_report`'s.

    ``"no_sampler"``: a shuffling DataLoader with the same seed on every rank;
    ``"rank_seed"``: ``DistributedSampler`` seeded differently on each rank;
    ``"no_set_epoch"``: ``DistributedSampler`` without ``set_epoch``;
    ``"sampler"``: ``DistributedSampler``, one seed, ``set_epoch`` every epoch.
    """
    from torch.utils.data import DataLoader, DistributedSampler

    rank = dist.get_rank()
    data = torch.arange(dataset_size)
    if kind == "no_sampler":
        loader = DataLoader(
            data,
            batch_size=batch,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
        )
        sampler = None
    else:
        sampler = DistributedSampler(
            data, shuffle=True, seed=rank if kind == "rank_seed" else 0
        )
        loader = DataLoader(data, batch_size=batch, sampler=sampler)
    per_epoch = []
    for epoch in range(epochs):
        if sampler is not None and kind != "no_set_epoch":
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        if kind == "no_sampler":
            loader.generator.manual_seed(epoch)
        per_epoch.append([int(i) for b in loader for i in b])
    return {
        "epochs": per_epoch,
        "report": debug.shard_report(per_epoch[0], dataset_size),
    }
