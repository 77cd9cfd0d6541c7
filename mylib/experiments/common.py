"""What the chapters' experiments share: a model, its data, and one comparison.

Every check in the book trains the same way: a small seeded model, global
batches that every rank draws identically (each rank then takes its share),
and at the end the largest difference between two sets of parameters. One
definition of each keeps the chapters' numbers comparable.
"""

import torch
from torch import nn


def mlp(sizes, *, seed=0, activation=nn.Tanh, dtype=None):
    """Linear layers ``sizes[0] -> sizes[1] -> ...``, ``activation`` between them.

    Seeded, so every rank (and the one-process reference) builds the same
    weights; pass a different ``seed`` per rank to test the initial broadcast.
    ``dtype`` defaults to torch's default dtype.
    """
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(activation())
    model = nn.Sequential(*layers)
    return model if dtype is None else model.to(dtype)


def global_batches(steps, rows, sizes, *, seed=1, dtype=torch.float32):
    """``steps`` global batches of ``rows`` (inputs, targets) for an ``mlp(sizes)``.

    The same on every rank (seeded): a rank takes its share of each, and the
    one-process reference trains on the whole.
    """
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(rows, sizes[0], generator=g, dtype=dtype),
            torch.randn(rows, sizes[-1], generator=g, dtype=dtype),
        )
        for _ in range(steps)
    ]


def max_param_diff(a, b):
    """The largest absolute difference between two models' parameters.

    ``a`` and ``b`` are modules, or ``{name: tensor}`` dicts (what a rank
    returns); they must have the same names and shapes. Compared in float64.
    """
    a, b = _named(a), _named(b)
    if a.keys() != b.keys():
        raise ValueError(f"different parameter names: {sorted(a.keys() ^ b.keys())}")
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _named(params):
    if isinstance(params, nn.Module):
        return {name: p.detach() for name, p in params.named_parameters()}
    return dict(params)
