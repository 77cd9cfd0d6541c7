"""Chapter 5: what compression does to training, on a real small task with each hook.

The task: predict the next character of the Python Language Reference (the
text every Python ships as ``pydoc_data.topics``) from the characters before
it, with a small MLP, on every rank of a process group.
:func:`compare_training` runs the chapter's table (:data:`RUNS`): the loss
curve, the held-out loss and the bytes per step of each hook;
``tests/test_powersgd.py`` asserts the chapter's claims on the same runs, under
the portable CPU kernels (``tests/portable_kernels.py``).
:func:`gradient_spectrum` shows how close to low rank this model's gradients
are, the bet PowerSGD makes.
"""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mylib import comm
from mylib.ddp import MyDDP
from mylib.experiments.compress_check import my_hook

CHAR_TASK = dict(
    context=16,
    dim=24,
    hidden=256,
    batch=32,
    steps=300,
    lr=2e-3,
    bucket_cap_mb=0.25,
    eval_every=25,
    eval_positions=2048,
    seed=0,
)
"""The chapter's convergence run: 300 Adam steps on 2 ranks.

Each rank takes 32 windows of 16 characters per step.
"""

POWERSGD = dict(start_powerSGD_iter=10)  # 10 plain steps first, then low rank
RUNS = [
    dict(label="fp32 (default hook)", hook="none"),
    dict(label="bf16", hook="bf16"),
    dict(
        label="PowerSGD, rank 4",
        hook="powersgd",
        matrix_approximation_rank=4,
        steps=450,
        **POWERSGD,
    ),
    dict(
        label="PowerSGD, rank 1",
        hook="powersgd",
        matrix_approximation_rank=1,
        **POWERSGD,
    ),
    dict(
        label="PowerSGD, rank 1, no error feedback",
        hook="powersgd",
        matrix_approximation_rank=1,
        use_error_feedback=False,
        **POWERSGD,
    ),
]
"""The runs of the chapter's table.

PowerSGD rank 4 runs 150 steps longer, to see when it reaches fp32's loss.
"""


def corpus():
    """Training and held-out character ids, and the vocabulary size.

    The vocabulary: printable ASCII, newline, one id for the rest.
    """
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    alphabet = ["\n"] + [chr(c) for c in range(32, 127)]
    index = {c: i for i, c in enumerate(alphabet)}
    ids = torch.tensor([index.get(c, len(alphabet)) for c in text], dtype=torch.long)
    # Every tenth block of 2,000 characters is held out, so both parts mix all
    # the topics.
    blocks = ids.split(2000)
    train = torch.cat([b for i, b in enumerate(blocks) if i % 10 != 9])
    held_out = torch.cat([b for i, b in enumerate(blocks) if i % 10 == 9])
    return train, held_out, len(alphabet) + 1


class CharMLP(nn.Module):
    """Next character from the ``context`` previous ones.

    Embed, concatenate, two hidden layers, logits.
    """

    def __init__(self, vocab, context, dim, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.net = nn.Sequential(
            nn.Linear(context * dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, vocab),
        )

    def forward(self, windows):
        return self.net(self.embed(windows).flatten(1))


def _windows(ids, starts, context):
    """Inputs and targets of the windows at ``starts``.

    Inputs are the ``context`` characters from each start, targets the
    character after them.
    """
    offsets = torch.arange(context)
    return ids[starts[:, None] + offsets], ids[starts + context]


def train_char_model(hook="none", config=CHAR_TASK, **powersgd):
    """On every rank: train the character model with ``hook``.

    ``hook`` is none, fp16, bf16 or powersgd. Every rank draws its own random
    windows of the training text (seeded by rank and step), so the ranks see
    different data, as in data-parallel training. Returns rank 0's: the
    training loss of every step (averaged over ranks), the held-out loss every
    ``eval_every`` steps (the same windows for every hook), the bytes this rank
    sent per step, the gradient bytes, and the seconds of the whole run.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    c = config
    train, held_out, vocab = corpus()
    torch.manual_seed(c["seed"])
    model = MyDDP(
        CharMLP(vocab, c["context"], c["dim"], c["hidden"]),
        bucket_cap_mb=c["bucket_cap_mb"],
    )
    state = None
    if hook != "none":
        state, hook_fn = my_hook(hook, **powersgd)
        model.register_comm_hook(state, hook_fn)
    opt = torch.optim.Adam(model.parameters(), lr=c["lr"])
    data = torch.Generator().manual_seed(1000 * c["seed"] + rank)
    eval_starts = torch.randint(
        len(held_out) - c["context"],
        (c["eval_positions"],),
        generator=torch.Generator().manual_seed(c["seed"]),
    )
    eval_x, eval_y = _windows(held_out, eval_starts, c["context"])
    out = {
        "loss": [],
        "held_out": [],
        "bytes": [],
        "grad_bytes": sum(b.nbytes for b in model.buckets),
        "buckets": len(model.buckets),
    }
    start = time.perf_counter()
    for step in range(c["steps"] + 1):
        if step % c["eval_every"] == 0:
            with torch.no_grad():
                out["held_out"].append(
                    (step, F.cross_entropy(model.module(eval_x), eval_y).item())
                )
        if step == c["steps"]:
            break
        x, y = _windows(
            train,
            torch.randint(len(train) - c["context"], (c["batch"],), generator=data),
            c["context"],
        )
        opt.zero_grad()
        with comm.count_bytes() as stats:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            model.finish_gradient_sync()
        opt.step()
        out["bytes"].append(stats.bytes_sent)
        mean_loss = loss.detach().clone()
        # for the curve only: not counted as the training's traffic
        dist.all_reduce(mean_loss)
        out["loss"].append(mean_loss.item() / world)
    out["seconds"] = time.perf_counter() - start
    if hook == "powersgd":
        out["compression_rate"] = state.compression_rate()
    return out


def compare_training(runs=RUNS, config=CHAR_TASK):
    """On every rank: :func:`train_char_model` for each run.

    A run is a dict: label, hook, optional steps, PowerSGD settings. One launch
    for all the runs; returns ``{label: result}`` in order.
    """
    results = {}
    for run in runs:
        settings = {k: v for k, v in run.items() if k not in ("label", "hook", "steps")}
        results[run["label"]] = train_char_model(
            run["hook"],
            {**config, "steps": run.get("steps", config["steps"])},
            **settings,
        )
    return results


def steps_to_reach(result, target):
    """The first evaluated step with a held-out loss at or below ``target``, or None."""
    return next((step for step, loss in result["held_out"] if loss <= target), None)


def held_out_at(result, step):
    """The held-out loss evaluated at ``step``."""
    return dict(result["held_out"])[step]


def gradient_spectrum(steps=100, config=CHAR_TASK):
    """One process: singular values of the weight gradients after ``steps`` Adam steps.

    Trains the character model ``steps`` Adam steps first. Returns
    ``{name: singular values (descending)}`` for the 2-D weights: how much of
    a real gradient a rank-r approximation can keep.
    """
    c = config
    train, _, vocab = corpus()
    torch.manual_seed(c["seed"])
    model = CharMLP(vocab, c["context"], c["dim"], c["hidden"])
    opt = torch.optim.Adam(model.parameters(), lr=c["lr"])
    data = torch.Generator().manual_seed(c["seed"])
    for _ in range(steps + 1):
        x, y = _windows(
            train,
            torch.randint(len(train) - c["context"], (c["batch"],), generator=data),
            c["context"],
        )
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if _ < steps:
            opt.step()
    return {
        name: torch.linalg.svdvals(p.grad).tolist()
        for name, p in model.named_parameters()
        if p.dim() == 2
    }
