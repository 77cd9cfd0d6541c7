"""Chapter 6's checks: one model trained unsharded, under DDP and under each ZeRO stage.

Chapter 6 and ``tests/test_zero*.py`` run the same functions, so what the
book shows is what CI asserts. The model has what real models have and what
breaks naive sharding: a frozen layer and an output head tied to the
embedding. The data are random tokens; each rank takes an equal share of
every global batch, so averaging the ranks' mean-loss gradients gives the
whole-batch gradient (chapter 2) and every stage must reproduce
single-process training on the whole batch.

To set beside :mod:`mylib.models.memory`'s model, ``held_bytes`` counts the
memory a rank actually holds, from the tensors themselves (each storage once),
and :class:`GradientMemory` the gradient bytes it holds at its peak, during
the step.
"""

import itertools
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mylib import comm
from mylib.ddp import MyDDP
from mylib.models.buckets import MB
from mylib.models.memory import memory_per_rank
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

CHECK = {
    "vocab": 64,
    "dim": 32,
    "hidden": 64,
    "layers": 2,
    "frozen": True,
    "tied": True,
    "batch": 8,
    "seq": 12,
    "steps": 10,
    "optimizer": torch.optim.AdamW,
    "lr": 1e-2,
    "weight_decay": 0.1,
    "bucket_cap_mb": 0.01,
    "reduce_scatter_mb": 25.0,
    "seed": 0,
    "dtype": torch.float32,
}
"""The equivalence check: a small model, 10 steps of AdamW with two parameter groups."""

CHECK_TOL = 1e-5
"""How far CHECK's float32 runs may end from one process: rounding, as Adam grows it.

Adam divides each step by the root of the mean squared gradient, so a coordinate
whose gradient is a near-cancelling sum turns its last-bit rounding into a visible
step. After CHECK's 10 steps every setup, PyTorch's own DDP included, ends 2.4e-7
to 8.3e-7 from one process, depending on the CPU's kernels (ATen's SIMD level,
MKL's code path); 1e-5 leaves ten times that. A wrong average or a lost shard
moves parameters by 1e-3 or more. The exact claim is checked in float64
(tests/test_zero_property.py).
"""

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

PEAK = dict(
    MEASURE,
    dim=128,
    hidden=512,
    layers=8,
    bucket_cap_mb=0.25,
    reduce_scatter_mb=0.25,
)
"""The peak: 1.14M trainable parameters in 8 thinner blocks, 0.25 MB buckets.

At its peak ZeRO-2 holds two buckets beyond its shard, and ZeRO-3 the root
unit and two blocks: the saving shows when those are small beside the gradient,
as a 7B model's 25 MB buckets are beside its 28 GB of fp32 gradient. In
MEASURE one block is 42% of the model. ZeRO-1 sends its reduce-scatter in
pieces of the same size.
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
    model, _ = train_single_model(config)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_single_model(config):
    """The reference run itself: the trained model and its optimizer."""
    model = tiny_lm(config)
    opt = config["optimizer"](param_groups(model, config), lr=config["lr"])
    for tokens in token_batches(config):
        lm_loss(model, tokens).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def build(setup, model, config):
    """Wrap ``model`` for ``setup`` (a key of SETUPS).

    Returns (model to call, optimizer, sync after backward).
    """
    if setup not in SETUPS:
        raise ValueError(f"unknown setup {setup!r}; choose one of {sorted(SETUPS)}")
    opt_class, lr, cap = config["optimizer"], config["lr"], config["bucket_cap_mb"]
    # before wrapping: ZeRO-3 makes every parameter a 1-D piece
    groups = param_groups(model, config)
    # the model to call, and what to call between backward and step
    wrapped, sync = model, lambda: None
    if setup in ("ddp", "zero1-ddp"):
        wrapped = MyDDP(model, bucket_cap_mb=cap)
        sync = wrapped.finish_gradient_sync
    elif setup in ("torch-ddp", "torch-zero1"):
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    elif setup in ("zero3", "zero3-prefetch"):
        wrapped = ShardedModel(
            model, unit_modules=list(model.blocks), prefetch=setup == "zero3-prefetch"
        )
    elif setup == "torch-fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        # after wrapping: FSDP puts new parameters (DTensors) in the model
        groups = param_groups(model, config)
    # the optimizer: a sharded one for ZeRO-1 and 2, else the plain one
    if setup == "zero1":
        opt = ShardedOptimizer(
            groups,
            opt_class,
            average_gradients=True,
            reduce_scatter_mb=config["reduce_scatter_mb"],
            lr=lr,
        )
    elif setup == "zero1-ddp":
        opt = ShardedOptimizer(groups, opt_class, lr=lr)
    elif setup == "zero2":
        opt = ShardedGradOptimizer(
            groups, opt_class, bucket_cap_mb=cap, module=model, lr=lr
        )
    elif setup == "torch-zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(groups, opt_class, lr=lr)
    else:
        opt = opt_class(groups, lr=lr)
    return wrapped, opt, sync


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


# -- peak gradient memory -------------------------------------------------------------

# Operations that copy data into their output: a storage copied into a gradient
# buffer held gradient too.
_COPIES = {
    torch.ops.aten.copy_.default,
    torch.ops.aten.cat.default,
    torch.ops.aten.clone.default,
    torch.ops.aten._to_copy.default,
    torch.ops.aten.stack.default,
}


class GradientMemory(TorchDispatchMode):
    """Gradient bytes alive at every moment: each storage's bytes, birth and death.

    ``with GradientMemory(model.parameters()) as grads:`` around the wrapping
    and the training steps, then ``grads.peak_bytes()``. Every tensor
    operation passes through the mode (``TorchDispatchMode`` sees the
    forward, autograd's backward ops, the collectives, the optimizer), so it
    notes each new storage with its size and the moment it was made; a
    ``weakref.finalize`` on the storage notes the moment its memory is freed
    (the last view gone). A storage holds gradient when it is

    * a parameter's ``.grad``, seen when autograd has finished it (a
      post-accumulate-grad hook, registered before the stage's own hooks);
    * sent or received by a reduce-scatter or an all-reduce, the collectives
      that average gradients (all-gathers move parameters);
    * copied or concatenated into one of those (a gradient on its way into a
      bucket, or ZeRO-3's per-parameter gradients before they become one
      flat gradient).

    The peak is the most bytes of such storages alive at once. Why this and
    not ``torch.profiler(profile_memory=True)``: the profiler records every
    allocation of the CPU allocator, exact, but as addresses and sizes, with
    activations, temporaries and the optimizer mixed in and addresses reused,
    so it cannot say which bytes are gradients; here each byte has a role,
    and the count is exact (storage bytes, not allocator blocks). What is
    left out: storages this mode never saw made, such as the scratch buffer
    of gloo's reduce-scatter (a full-size copy of the input, made inside the
    backend; NCCL needs none), and autograd's partial sums of a gradient used
    twice (a tied weight).
    """

    def __init__(self, params):
        super().__init__()
        self._clock = itertools.count()
        self._life = []  # per storage: [bytes, made at, freed at or None]
        self._key = {}  # id of a live storage -> its index in _life
        self._gradient = set()
        self._copies = []  # (destinations, sources) of every copy
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad)
            for p in params
            if p.requires_grad
        ]

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def _made(self, t):
        """Note ``t``'s storage if it is new; return its key."""
        storage = t.untyped_storage()
        key = self._key.get(id(storage))
        if key is None:
            key = len(self._life)
            self._life.append([storage.nbytes(), next(self._clock), None])
            self._key[id(storage)] = key
            weakref.finalize(storage, self._freed, id(storage), key)
        return key

    def _freed(self, storage_id, key):
        self._life[key][2] = next(self._clock)
        del self._key[storage_id]

    def _on_grad(self, param):
        self._gradient.add(self._made(param.grad))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if torch.is_tensor(t)]
        # Storages made out of our sight (inside a backend), and views of
        # them, are not counted.
        unseen = {
            id(t.untyped_storage())
            for t in inputs
            if id(t.untyped_storage()) not in self._key
        }
        ins = [
            self._key[id(t.untyped_storage())]
            for t in inputs
            if id(t.untyped_storage()) not in unseen
        ]
        outs = [
            self._made(t)
            for t in tree_leaves(out)
            if torch.is_tensor(t) and id(t.untyped_storage()) not in unseen
        ]
        name = func.name()
        if name.startswith("c10d::") and (
            "reduce_scatter" in name or "allreduce" in name
        ):
            self._gradient.update(outs, ins)
        elif func in _COPIES:
            # copy_ writes into its first argument
            into = outs + ins[:1] if func is torch.ops.aten.copy_.default else outs
            self._copies.append((set(into), set(ins) - set(into)))
        return out

    def gradient_storages(self):
        """Keys of the storages that held gradient, with what was copied into them."""
        gradient, grew = set(self._gradient), True
        while grew:
            grew = False
            for into, sources in self._copies:
                if into & gradient and not sources <= gradient:
                    gradient |= sources
                    grew = True
        return gradient

    def peak_bytes(self):
        """The most bytes of gradient alive at once."""
        events = []
        for key in self.gradient_storages():
            nbytes, made, freed = self._life[key]
            events.append((made, nbytes))
            if freed is not None:
                events.append((freed, -nbytes))
        alive = peak = 0
        for _, change in sorted(events):
            alive += change
            peak = max(peak, alive)
        return peak


def peak_rank(setup, config):
    """Run on every rank: train ``config`` under ``setup``, measuring gradient bytes.

    Returns a dict: ``peak`` (the most gradient bytes alive at once, from
    :class:`GradientMemory`, over the wrapping and every step), ``psi``, and
    the sizes :func:`gradient_peak_bound` needs: ``layer_bytes`` (the
    largest module's own parameters), ``bucket_bytes`` (ZeRO-2's largest
    bucket), ``unit_bytes`` (ZeRO-3's units' trainable parameters, the root
    first), ``reduce_scatter_bytes`` (the most ZeRO-1 sends in one call).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_lm(config)
    psi = num_trainable(model)
    layer_bytes = max(
        sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
        for m in model.modules()
    )
    with GradientMemory(model.parameters()) as grads:
        wrapped, opt, sync = build(setup, model, config)
        for tokens in token_batches(config):
            lm_loss(wrapped, tokens.chunk(world)[rank]).backward()
            sync()
            opt.step()
            opt.zero_grad()
    buckets = getattr(opt, "buckets", []) if setup == "zero2" else []
    units = getattr(wrapped, "units", [])
    return {
        "peak": grads.peak_bytes(),
        "psi": psi,
        "layer_bytes": layer_bytes,
        "bucket_bytes": max(
            (b.numel * b.params[0].element_size() for b in buckets), default=0
        ),
        "unit_bytes": [
            sum(f.full_bytes for f in unit.flats if f.trainable) for unit in units
        ],
        "reduce_scatter_bytes": int(config["reduce_scatter_mb"] * MB),
    }


def peak_setups(setups, config):
    """Run on every rank: :func:`peak_rank` for each setup in turn."""
    return {setup: peak_rank(setup, config) for setup in setups}


IN_FLIGHT = {
    "ddp": "one layer's gradients, fresh from autograd, not yet in their bucket",
    "zero1": "the averaged shard it receives, and one reduce-scatter's input",
    "zero2": "two buckets, and one layer's gradients not yet in their bucket",
    "zero3": "the root unit's gradients, and two other units'",
}
"""What each stage holds at its peak beyond the model's gradient bytes."""


def gradient_peak_bound(setup, result, world):
    """The model's gradient bytes for ``setup``, and the bound on its peak.

    ``result`` is what :func:`peak_rank` returned. The model is
    :func:`mylib.models.memory.memory_per_rank` in float32 (4 bytes a
    gradient); the bound adds what the stage holds in flight
    (:data:`IN_FLIGHT`). Returns ``(model, bound)`` in bytes.
    """
    psi, units = result["psi"], result["unit_bytes"]
    model = memory_per_rank(psi, world, SETUPS[setup], grad_bytes=4).grads
    if setup == "ddp":
        in_flight = result["layer_bytes"]
    elif setup == "zero1":
        in_flight = 4 * psi / world + result["reduce_scatter_bytes"]
    elif setup == "zero2":
        in_flight = 2 * result["bucket_bytes"] + result["layer_bytes"]
    elif setup == "zero3":
        in_flight = units[0] + sum(sorted(units[1:])[-2:])
    else:
        raise ValueError(f"no bound for {setup!r}; choose one of {sorted(IN_FLIGHT)}")
    return model, model + in_flight
