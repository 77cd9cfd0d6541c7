"""Chapter 9's sharded checkpoints: FSDP2 saved on N ranks, resumed on M.

With ``fully_shard`` (FSDP2) each rank holds a shard of every parameter and
of Adam's state, as ``DTensor``s that know their place in the whole tensor.
``torch.distributed.checkpoint`` (DCP) saves such a state with every rank
writing its own shard, in parallel, plus one metadata file that records where
each piece of each tensor went; loading reads, on each rank, exactly the
pieces its (new) shards need. So a checkpoint saved on 4 ranks loads on 2.

The functions here run on every rank of a group (under ``torchrun``, see
``notebooks/scripts/dcp_reshard.py``, or ``mylib.run_ranks``):

* :func:`save_both` trains a few steps, then saves the sharded checkpoint
  with DCP (timed, bytes per rank counted) and, for comparison, the whole
  unsharded state gathered into one ``torch.save`` file;
* :func:`resume_both` builds the model at the current world size, loads each
  of the two, checks that the loaded state equals the unsharded file bit for
  bit, trains on, and reports whether the two resumed runs stay identical;
* :func:`time_async_save` measures what ``dcp.async_save`` leaves to the
  training loop and what it does in the background.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from mylib.experiments.run_events import same_state as _equal

WIDTH, LAYERS, GLOBAL_BATCH = 256, 4, 8
FULL = StateDictOptions(full_state_dict=True)  # on every rank (cpu_offload: rank 0)


def sharded_model():
    """The seeded MLP, each layer and the whole wrapped with ``fully_shard``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def train_steps(model, opt, first, last):
    """Steps ``first..last`` on seeded global batches, each rank taking its rows."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(first, last + 1):
        gen = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(GLOBAL_BATCH, WIDTH, generator=gen)
        y = torch.randn(GLOBAL_BATCH, 1, generator=gen)
        rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
        nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
        opt.zero_grad()


def full_state(model, opt):
    """The whole state, unsharded, on every rank: ``{"model": ..., "optim": ...}``."""
    model_sd, optim_sd = get_state_dict(model, opt, options=FULL)
    return {"model": model_sd, "optim": optim_sd}


def save_both(folder, steps=3):
    """Train ``steps`` steps, then save sharded (DCP) and unsharded; return figures.

    Returns, per rank: the DCP save time, the bytes of the file this rank
    wrote, and the metadata file's bytes.
    """
    rank = dist.get_rank()
    model, opt = sharded_model()
    train_steps(model, opt, 1, steps)
    model_sd, optim_sd = get_state_dict(model, opt)  # DTensor shards, no copy
    dist.barrier()
    t0 = time.perf_counter()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=_dcp(folder))
    save_s = time.perf_counter() - t0
    whole = full_state(model, opt)  # a collective: every rank takes part
    if rank == 0:
        torch.save({"step": steps, **whole}, os.path.join(folder, "full.pt"))
    dist.barrier()
    return {
        "save_s": save_s,
        "bytes": _rank_file_bytes(folder, rank),
        "metadata_bytes": os.path.getsize(os.path.join(_dcp(folder), ".metadata")),
    }


def resume_both(folder, more_steps=2):
    """Resume at this world size from the DCP checkpoint and from the unsharded file.

    Returns, per rank: the DCP load time; whether the state loaded from
    DCP equals the saved unsharded state bit for bit; whether the two runs
    are still bit-identical after ``more_steps`` more steps; and the largest
    difference between their parameters then.
    """
    full = torch.load(os.path.join(folder, "full.pt"), weights_only=False)
    steps = full["step"]
    # Resume 1: the sharded checkpoint. Each rank loads into its own shards.
    model, opt = sharded_model()
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(state, checkpoint_id=_dcp(folder))
    set_state_dict(
        model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    load_s = time.perf_counter() - t0
    loaded_equal = _equal(
        full_state(model, opt), {"model": full["model"], "optim": full["optim"]}
    )
    # Resume 2: the unsharded state, every rank cutting its shards from it.
    model2, opt2 = sharded_model()
    set_state_dict(
        model2,
        opt2,
        model_state_dict=full["model"],
        optim_state_dict=full["optim"],
        options=StateDictOptions(full_state_dict=True),
    )
    train_steps(model, opt, steps + 1, steps + more_steps)
    train_steps(model2, opt2, steps + 1, steps + more_steps)
    a, b = full_state(model, opt), full_state(model2, opt2)
    diff = max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])
    return {
        "load_s": load_s,
        "loaded_equal": loaded_equal,
        "resumed_equal": _equal(a, b),
        "max_diff": diff,
    }


def time_async_save(folder, steps_meanwhile=3):
    """``dcp.async_save``: how long the caller waits, and what runs meanwhile.

    Saves with ``async_save`` on a process group of its own (its background
    thread runs collectives; sharing the training group's would interleave
    them with the training's), trains ``steps_meanwhile`` steps while the
    write goes on, then waits for it: the next save must not start before
    (each call runs on an executor of its own, nothing orders two). Returns
    the seconds of a blocking ``dcp.save``, of the same steps with no save
    running (the baseline), blocked in ``async_save`` (staging: copying the
    state aside), of the steps while it wrote, and of the wait at the end.
    """
    model, opt = sharded_model()
    train_steps(model, opt, 1, 1)
    ckpt_group = dist.new_group(backend="gloo")
    model_sd, optim_sd = get_state_dict(model, opt)
    dist.barrier()
    t0 = time.perf_counter()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=_dcp(folder, "sync"))
    blocking_s = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    train_steps(model, opt, 2, 1 + steps_meanwhile)
    baseline_s = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    future = dcp.async_save(
        {"model": model_sd, "optim": optim_sd},
        checkpoint_id=_dcp(folder, "async"),
        process_group=ckpt_group,
    )
    staged_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    last = 1 + steps_meanwhile
    train_steps(model, opt, last + 1, last + steps_meanwhile)
    steps_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    future.result()
    wait_s = time.perf_counter() - t2
    dist.barrier()
    dist.destroy_process_group(ckpt_group)
    return {
        "blocking_save_s": blocking_s,
        "steps_alone_s": baseline_s,
        "async_blocked_s": staged_s,
        "steps_meanwhile_s": steps_s,
        "final_wait_s": wait_s,
    }


def _dcp(folder, name="dcp"):
    return os.path.join(folder, name)


def _rank_file_bytes(folder, rank):
    """Bytes of the files DCP wrote for ``rank`` (named ``__{rank}_*.distcp``)."""
    path = _dcp(folder)
    return sum(
        os.path.getsize(os.path.join(path, n))
        for n in os.listdir(path)
        if n.startswith(f"__{rank}_") and n.endswith(".distcp")
    )
