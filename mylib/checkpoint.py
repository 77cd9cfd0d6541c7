"""Chapter 9. A checkpoint that resumes exactly: nothing lost, nothing repeated.

When a rank dies, ``torchrun`` restarts the whole group and the script starts
again from its first line. To end where an uninterrupted run ends, bit for
bit, the restarted run must find everything that decides the next step:

* the model's parameters and buffers;
* the optimizer's state (Adam's moments and step counts);
* the data position: which epoch's shuffle, and how far into it
  (:class:`ResumableSampler`);
* the random number generators of every rank (dropout draws from them);
* the step counter.

And the restarted group must not meet the dead one: :func:`init_for_restarts`
joins the process group in a store of this round of rendezvous only
(:func:`round_store`), on one machine or many.

:func:`save_checkpoint` gathers the ranks' generator states to rank 0, which
writes one file *atomically*: to a temporary name, flushed to disk, then
renamed. A crash in the middle of a save leaves the previous checkpoint
intact, never half a file. :func:`load_checkpoint` puts everything back.
"""

import datetime
import os
import random
import sys

import torch
import torch.distributed as dist

from mylib.launch import current_device

PREFIX, SUFFIX = "step", ".pt"


class ResumableSampler:
    """Global batches of a shuffled dataset, with a position that can be saved.

    Each epoch shuffles ``range(dataset_size)`` with a generator seeded
    ``seed + epoch`` (as ``DistributedSampler`` does), then hands out
    consecutive global batches of ``global_batch`` indices; an incomplete tail
    is dropped. The position is ``(epoch, offset)``: the epoch and the number
    of indices of it already handed out. It depends on neither the rank nor
    the world size, so a group of another size resumes at the same sample.
    A rank takes its share with :meth:`share`.
    """

    def __init__(self, dataset_size, global_batch, seed=0):
        if global_batch < 1 or dataset_size < global_batch:
            raise ValueError(
                f"need 1 <= global_batch <= dataset_size, got global_batch="
                f"{global_batch} for {dataset_size} samples: lower global_batch"
            )
        self.dataset_size, self.global_batch, self.seed = (
            dataset_size,
            global_batch,
            seed,
        )
        self.epoch, self.offset = 0, 0

    def order(self, epoch):
        """The shuffled sample order of ``epoch``."""
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.dataset_size, generator=gen)

    def next_batch(self):
        """The next global batch of sample indices (a tensor); advances the position."""
        if self.offset + self.global_batch > self.dataset_size:
            self.epoch, self.offset = self.epoch + 1, 0
        start = self.offset
        self.offset += self.global_batch
        return self.order(self.epoch)[start : self.offset]

    @staticmethod
    def share(batch, rank, world_size, accumulation=1):
        """Rank ``rank``'s ``accumulation`` micro-batches of a global ``batch``.

        The batch is cut into ``world_size * accumulation`` equal micro-batches;
        rank r takes micro-batches ``r, r + world_size, ...``. Changing the
        world size while keeping ``world_size * accumulation`` fixed keeps the
        global batch, and so the gradient, the same.
        """
        parts = world_size * accumulation
        if len(batch) % parts:
            raise ValueError(
                f"a global batch of {len(batch)} does not split into {parts} equal "
                "micro-batches: choose world_size * accumulation dividing it"
            )
        micro = batch.view(parts, -1)
        return [micro[rank + i * world_size] for i in range(accumulation)]

    def state_dict(self):
        """The position: ``{"epoch": e, "offset": o}``."""
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state):
        """Resume at a saved position."""
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


def rng_state():
    """This process's generator states: torch's, Python's and (if loaded) NumPy's."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if "numpy" in sys.modules:  # only if the program uses it
        state["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def checkpoint_path(folder, step):
    """Where the checkpoint of ``step`` lives: ``folder/step00000012.pt``."""
    return os.path.join(folder, f"{PREFIX}{step:08d}{SUFFIX}")


def latest_checkpoint(folder):
    """The newest complete checkpoint in ``folder``, or None.

    Temporary files of a save that never finished are ignored.
    """
    if not os.path.isdir(folder):
        return None
    done = sorted(
        name
        for name in os.listdir(folder)
        if name.startswith(PREFIX) and name.endswith(SUFFIX)
    )
    return os.path.join(folder, done[-1]) if done else None


def atomic_save(obj, path):
    """``torch.save(obj, path)`` so that ``path`` is either old or whole, never partial.

    Writes ``path + ".tmp"``, flushes it to disk, renames it over ``path``
    and flushes the folder entry. ``os.replace`` is atomic on a local POSIX
    file system; an object store has no rename, and there the commit is an
    object written last (as ``torch.distributed.checkpoint`` writes its
    ``.metadata`` after every rank's data).
    """
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def save_checkpoint(folder, step, model, optimizer, sampler, keep=2):
    """Save everything a resumed run needs; every rank must call it.

    Model, optimizer and sampler are the same on every rank (data parallel),
    so rank 0 writes them; the generator states differ per rank and are
    gathered to it. Keeps the newest ``keep`` checkpoints. Returns the path.
    """
    rank, world = _rank_world()
    states = [None] * world
    if world > 1:
        dist.all_gather_object(states, rng_state())
    else:
        states = [rng_state()]
    path = checkpoint_path(folder, step)
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        atomic_save(
            {
                "step": step,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "data": sampler.state_dict(),
                "rng": states,
                "world_size": world,
            },
            path,
        )
        old = sorted(n for n in os.listdir(folder) if n.endswith(SUFFIX))
        for name in old[:-keep]:
            os.remove(os.path.join(folder, name))
    if world > 1:
        dist.barrier()  # nobody runs ahead of a checkpoint that is not on disk yet
    return path


def load_checkpoint(path, model, optimizer, sampler, restore=("data", "rng")):
    """Load a checkpoint from :func:`save_checkpoint`; returns its step.

    ``restore`` names the optional pieces put back; the chapter leaves one out
    to show what goes wrong. Generator states are restored only at the world
    size they were saved at (rank r takes rank r's); at another world size
    the caller must reseed, and the run is no longer bit-exact.
    """
    unknown = set(restore) - {"data", "rng"}
    if unknown:
        raise ValueError(f"restore takes 'data' and 'rng', not {sorted(unknown)}")
    ckpt = torch.load(path, weights_only=False)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if "data" in restore:
        sampler.load_state_dict(ckpt["data"])
    rank, world = _rank_world()
    if "rng" in restore and world == ckpt["world_size"]:
        set_rng_state(ckpt["rng"][rank])
    return ckpt["step"]


# What torchrun's agents must be started with so that every round of rendezvous
# gets a store of its own (see round_store).
FRESH_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def round_store(timeout_s=300.0, host=True):
    """The key-value store this round's group meets in, holding nothing older.

    torchrun re-forms the group in rounds (a restart, a machine lost or
    added), and the new group must not read what a dead one wrote: a peer's
    address, a communicator's id. With ``FRESH_STORE_ENV`` set for every
    agent, each round gets its own store: the rank-0 agent draws a new
    ``MASTER_PORT`` for the round and publishes it in the round's rendezvous
    keys, so every agent hands its workers the same port, and rank 0 hosts a
    new store there. Without it, the agents keep one store for all rounds;
    with a single agent its restart count numbers the rounds and the keys go
    under ``attempt{count}/``, but with several agents the counts disagree
    (an agent whose worker is healthy restarts for a membership change
    without counting), so that case is refused with the fix. ``host=False``
    only connects (a second client of the same round's store).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    agents = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    if shared and agents > 1:
        raise RuntimeError(
            f"{agents} torchrun agents share one store across rounds and their "
            "restart counts differ: a re-formed group could read a dead group's "
            "keys. Start every agent with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "in its environment (mylib.checkpoint.FRESH_STORE_ENV)."
        )
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world if host else None,
        is_master=host and rank == 0 and not shared,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    if shared:  # one agent: its restart count numbers the rounds
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"attempt{attempt}/", store)
    return store


def init_for_restarts(timeout_s=300.0):
    """Join the group ``torchrun`` formed in this round, in this round's store.

    Like :func:`mylib.init_from_env`, but safe when the group is re-formed
    (``--max-restarts``, ``--nnodes=MIN:MAX``): it meets in
    :func:`round_store`, never among a dead group's keys. Returns
    ``(rank, world_size, device)``.
    """
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(
                f"environment variable {var} is not set: start this script with "
                "`torchrun --nproc-per-node=N --max-restarts=K script.py`"
            )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = round_store(timeout_s)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return rank, world, current_device()


def _rank_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
