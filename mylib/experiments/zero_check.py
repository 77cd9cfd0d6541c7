"""Chapter 6's checks: one model trained unsharded, under DDP and under each ZeRO stage.

Chapter 6 and ``tests/test_zero*.py`` run the same functions, so what the
book shows is what CI asserts. The model has what real models have and what
breaks naive sharding: a frozen layer and an output head tied to the
embedding. The data are random tokens; each rank takes an equal share of
every global batch, so averaging the ranks' mean-loss gradients gives the
whole-batch gradient (chapter 2) and every stage must reproduce
single-process training on the whole batch.

To set beside :mod:`mylib.models.memory`'s model, ``held_bytes`` counts the
memory a rank actually holds, from the tensors themselves (each storage once).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mylib import comm
from mylib.ddp import MyDDP
from mylib.zero1 import ShardedOptimizer
from mylib.zero2 import ShardedGradOptimizer
from mylib.zero3 import ShardedModel

# name -> the stage of mylib.models.memory it is (0 = DDP); the torch-* ones
# are PyTorch's own.
SETUPS = {
    "ddp": 0,
    "zero1": 1,
    "zero1-ddp": 1,
    "zero2": 2,
    "zero3": 3,
    "zero3-prefetch": 3,
    "torch-ddp": 0,
    "torch-zero1": 1,
    "torch-fsdp": 3,
}

CHECK = dict(
    vocab=64,
    dim=32,
    hidden=64,
    layers=2,
    frozen=True,
    tied=True,
    batch=8,
    seq=12,
    steps=10,
    optimizer=torch.optim.AdamW,
    lr=1e-2,
    weight_decay=0.1,
    bucket_cap_mb=0.01,
    reduce_scatter_mb=25.0,
    seed=0,
    dtype=torch.float32,
)
"""The equivalence check: a small model, 10 steps of AdamW with two parameter groups."""

MEASURE = dict(
    CHECK,
    vocab=512,
    dim=256,
    hidden=1024,
    layers=2,
    frozen=False,
    batch=4,
    seq=16,
    steps=2,
    bucket_cap_mb=1.0,
)
"""The measurement: 1.25M trainable parameters, 2 steps.

Every parameter is trained, so psi is the whole model.
"""


class Block(nn.Module):
    """A residual MLP block: x + down(gelu(up(norm(x))))."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.norm, self.up, self.down = (
            nn.LayerNorm(dim),
            nn.Linear(dim, hidden),
            nn.Linear(hidden, dim),
        )

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding, residual blocks, a frozen projection, a head tied to the embedding."""

    def __init__(self, vocab, dim, hidden, layers, frozen=True, tied=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(layers))
        self.proj = nn.Linear(dim, dim)
        # frozen: as a pretrained part that is not fine-tuned
        self.proj.requires_grad_(not frozen)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(self.proj(x)))


def tiny_lm(config):
    """The model of ``config``, with the same initial weights on every rank (seeded)."""
    torch.manual_seed(config["seed"])
    return TinyLM(
        config["vocab"],
        config["dim"],
        config["hidden"],
        config["layers"],
        config["frozen"],
        config["tied"],
    ).to(config["dtype"])


def num_trainable(model):
    """psi: the number of parameters the optimizer trains, tied weights counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lm_loss(model, tokens):
    """Next-token cross-entropy, averaged over the tokens of ``tokens``."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )


def token_batches(config):
    """``steps`` global batches of random tokens, ``batch`` sequences each."""
    g = torch.Generator().manual_seed(config["seed"] + 1)
    return [
        torch.randint(config["vocab"], (config["batch"], config["seq"]), generator=g)
        for _ in range(config["steps"])
    ]


def param_groups(model, config):
    """AdamW's usual two groups: weight decay on matrices, none on the rest.

    No decay on biases, norms and the embedding's bias.
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    ids = {id(p) for p in decay}
    return [
        {"params": decay, "weight_decay": config["weight_decay"]},
        {
            "params": [p for p in model.parameters() if id(p) not in ids],
            "weight_decay": 0.0,
        },
    ]


def train_single(config):
    """Single-process training on the whole batch: the reference.

    Returns ``{name: final parameter}``.
    """
    model = tiny_lm(config)
    opt = config["optimizer"](param_groups(model, config), lr=config["lr"])
    for tokens in token_batches(config):
        lm_loss(model, tokens).backward()
        opt.step()
        opt.zero_grad()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def build(setup, model, config):
    """Wrap ``model`` for ``setup`` (a key of SETUPS).

    Returns (model to call, optimizer, sync after backward).
    """
    opt_class, lr, cap = config["optimizer"], config["lr"], config["bucket_cap_mb"]
    # the stages that need no call between backward and step
    no_sync = lambda: None  # noqa: E731
    if setup == "ddp":
        ddp = MyDDP(model, bucket_cap_mb=cap)
        return (
            ddp,
            opt_class(param_groups(model, config), lr=lr),
            ddp.finish_gradient_sync,
        )
    if setup == "zero1":
        return (
            model,
            ShardedOptimizer(
                param_groups(model, config),
                opt_class,
                average_gradients=True,
                reduce_scatter_mb=config["reduce_scatter_mb"],
                lr=lr,
            ),
            no_sync,
        )
    if setup == "zero1-ddp":
        ddp = MyDDP(model, bucket_cap_mb=cap)
        return (
            ddp,
            ShardedOptimizer(param_groups(model, config), opt_class, lr=lr),
            ddp.finish_gradient_sync,
        )
    if setup == "zero2":
        return (
            model,
            ShardedGradOptimizer(
                param_groups(model, config),
                opt_class,
                bucket_cap_mb=cap,
                module=model,
                lr=lr,
            ),
            no_sync,
        )
    if setup in ("zero3", "zero3-prefetch"):
        # before wrapping: afterwards every parameter is a 1-D piece
        groups = param_groups(model, config)
        sharded = ShardedModel(
            model, unit_modules=list(model.blocks), prefetch=setup == "zero3-prefetch"
        )
        return sharded, opt_class(groups, lr=lr), no_sync
    if setup == "torch-ddp":
        return (
            torch.nn.parallel.DistributedDataParallel(model),
            opt_class(param_groups(model, config), lr=lr),
            no_sync,
        )
    if setup == "torch-zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        ddp = torch.nn.parallel.DistributedDataParallel(model)
        return (
            ddp,
            ZeroRedundancyOptimizer(param_groups(model, config), opt_class, lr=lr),
            no_sync,
        )
    if setup == "torch-fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, opt_class(param_groups(model, config), lr=lr), no_sync
    raise ValueError(f"unknown setup {setup!r}; choose one of {sorted(SETUPS)}")


def full_parameters(setup, model, wrapped):
    """Every parameter, whole, on this rank.

    Gathered from the shards where the setup shards them.
    """
    if setup.startswith("zero3"):
        return wrapped.full_parameters()
    if setup == "torch-fsdp":
        return {
            name: p.full_tensor().detach().clone()
            for name, p in model.named_parameters()
        }
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_rank(setup, config):
    """Run on every rank: train ``config`` under ``setup``, report on it.

    Returns a dict: ``params`` (all final parameters, whole), ``bytes_sent``
    and ``bytes_by_op`` (of the last step), ``held`` (bytes held after the
    last backward, from :func:`held_bytes`), ``psi``, and for ZeRO-3 the
    peak bytes of full parameters gathered at once.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_lm(config)
    psi = num_trainable(model)
    wrapped, opt, sync = build(setup, model, config)
    for tokens in token_batches(config):
        with comm.count_bytes() as stats:
            lm_loss(wrapped, tokens.chunk(world)[rank]).backward()
            sync()
            held = held_bytes(model, opt)
            opt.step()
        opt.zero_grad()
    return {
        "params": full_parameters(setup, model, wrapped),
        "bytes_sent": stats.bytes_sent,
        "bytes_by_op": dict(stats.by_op),
        "held": held,
        "psi": psi,
        "peak_gathered_bytes": getattr(wrapped, "peak_gathered_bytes", None),
    }


def train_setups(setups, config):
    """Run on every rank: :func:`train_rank` for each setup in turn.

    One launch for many checks.
    """
    return {setup: train_rank(setup, config) for setup in setups}


def held_bytes(model, optimizer):
    """Bytes of parameters, gradients and optimizer state this rank holds.

    Counted from the tensors, now. Each storage is counted once, however
    many views of it there are (a ZeRO-1 parameter is a view of a flat
    buffer; a ZeRO-3 parameter is a view of its shard). For a sharded
    optimizer the gradients include the gradient shards its wrapped
    optimizer sees.
    """
    seen = set()

    def size(tensors):
        total = 0
        for t in tensors:
            if t is None or isinstance(t, float) or not torch.is_tensor(t):
                continue
            if hasattr(t, "to_local"):  # FSDP2's DTensor: this rank's shard
                t = t.to_local()
            storage = t.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    inner = getattr(optimizer, "optim", optimizer)
    params = list(model.parameters())
    pieces = [p for group in inner.param_groups for p in group["params"]]
    return {
        "params": size(params),
        "grads": size([p.grad for p in params + pieces]),
        "optimizer": size(t for state in inner.state.values() for t in state.values()),
    }
