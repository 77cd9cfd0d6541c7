"""Checks for exercise 9.1: on 2 gloo ranks, a crashed and resumed run against one
that never crashed, compared with torch.equal.

The run that never crashed trains on ranks that run none of the reader's code
(reference_on_ranks); the snapshots of both come back and are compared here,
in the judge.
"""

from _judge.checking import check, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # AdamW imports them: once, before forking
WORLD, EXAMPLES, BATCH, TOTAL = 2, 40, 4, 12
SCENARIOS = {  # name -> (checkpoint every, crash before step)
    "mid-epoch": (3, 8),  # resumes from step 6: epoch 1, batch 1
    "end of epoch": (5, 7),  # resumes from step 5: epoch 0, all 5 batches done
}
_results = []  # the ranks' results, computed once for the checks


class Run:
    """What the reader's functions see: model, optimizer, epoch, batch, step."""

    def __init__(self, seed):
        import torch

        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(6, 16),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(16, 2),
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.epoch = self.batch = self.step = 0


def train(run, sampler, data, save_state, until, every, crash_at=None, saved=None):
    """Train to step ``until`` (or stop before ``crash_at``), saving every ``every``."""
    import io

    import torch
    import torch.distributed as dist

    x_all, y_all = data
    while run.step < until:
        sampler.set_epoch(run.epoch)
        order = list(sampler)
        batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
        while run.batch < len(batches) and run.step < until:
            if run.step == crash_at:
                return
            idx = batches[run.batch]
            loss = torch.nn.functional.mse_loss(run.model(x_all[idx]), y_all[idx])
            run.optimizer.zero_grad()
            loss.backward()
            for p in run.model.parameters():  # DDP's averaging, done for you
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            run.optimizer.step()
            run.batch += 1
            run.step += 1
            if saved is not None and run.step % every == 0:
                saved["truth"] = snapshot(run)
                saved.setdefault("truths", {})[run.step] = saved["truth"]
                if save_state is None:  # the reference run: snapshots only
                    continue
                state = save_state(run)
                buffer = io.BytesIO()
                try:
                    torch.save(state, buffer)
                except Exception as e:
                    saved["problem"] = (
                        "torch.save cannot write what save_state returned "
                        f"({type(e).__name__}: {e})"
                    )
                    return
                saved["bytes"] = buffer.getvalue()
        if run.batch == len(batches):
            run.epoch, run.batch = run.epoch + 1, 0


def snapshot(run):
    import copy

    import torch

    return {
        "model": [p.detach().clone() for p in run.model.parameters()],
        "optimizer": copy.deepcopy(run.optimizer.state_dict()),
        "position": (run.epoch, run.batch),
        "step": run.step,
        "rng": torch.get_rng_state(),
    }


def differences(now, truth):
    """Which pieces of the snapshot ``now`` differ from ``truth``: name -> detail.

    Computed in the judge, from the snapshots the ranks send back.
    """
    import torch

    out = {}
    if len(now["model"]) != len(truth["model"]) or not all(
        torch.equal(a, b) for a, b in zip(now["model"], truth["model"])
    ):
        out["model"] = "the model's weights"
    if not same_optimizer_state(now["optimizer"], truth["optimizer"]):
        out["optimizer"] = "the optimizer's state (AdamW's moments and step counts)"
    if tuple(now["position"]) != tuple(truth["position"]):
        out["position"] = (
            "the data position: the run is at (epoch, batch) = "
            f"{now['position']}, it was saved at {truth['position']}"
        )
    if now["step"] != truth["step"]:
        out["step"] = (
            f"the step counter: the run is at step {now['step']}, "
            f"it was saved at step {truth['step']}"
        )
    if not torch.equal(now["rng"], truth["rng"]):
        out["rng"] = "the RNG state: dropout would draw other masks"
    return out


def same_optimizer_state(a, b):
    import torch

    if a["param_groups"] != b["param_groups"] or a["state"].keys() != b["state"].keys():
        return False
    for key, state in a["state"].items():
        other = b["state"][key]
        if state.keys() != other.keys():
            return False
        for name, value in state.items():
            if torch.is_tensor(value):
                if not (
                    torch.is_tensor(other[name]) and torch.equal(value, other[name])
                ):
                    return False
            elif value != other[name]:
                return False
    return True


def setup():
    """The data and this rank's sampler, the same on the reader's and the
    reference ranks."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = (torch.randn(EXAMPLES, 6), torch.randn(EXAMPLES, 2))

    def sampler():
        return DistributedSampler(
            range(EXAMPLES), num_replicas=world, rank=rank, shuffle=True, seed=7
        )

    return rank, data, sampler


def saved_at(every, crash_at):
    """The step of the last checkpoint before the crash."""
    return (crash_at // every) * every


def reference_worker():
    """On ranks that run none of the reader's code: the run that never crashed,
    at the step of the last checkpoint and at the end, per scenario."""
    import torch

    rank, data, sampler = setup()
    out = {}
    for name, (every, crash_at) in SCENARIOS.items():
        run, saved = Run(seed=1), {}
        torch.manual_seed(100 + rank)  # each rank's own dropout masks
        train(run, sampler(), data, None, TOTAL, every, saved=saved)
        out[name] = {
            "truth": saved["truths"][saved_at(every, crash_at)],
            "end": snapshot(run),
        }
    return out


def worker(save_state, load_state):
    """On the reader's ranks: crash, save, load into a fresh run, train to the end;
    the snapshots right after loading and at the end go back to the judge."""
    import io
    import pickle
    import re

    import torch

    rank, data, sampler = setup()
    out = {}
    for name, (every, crash_at) in SCENARIOS.items():
        result = out[name] = {}
        crashed, saved = Run(seed=1), {}
        torch.manual_seed(100 + rank)
        train(crashed, sampler(), data, save_state, TOTAL, every, crash_at, saved)
        if "problem" in saved:
            result["problem"] = saved["problem"]
            continue
        try:
            state = torch.load(io.BytesIO(saved["bytes"]), weights_only=True)
        except pickle.UnpicklingError as e:
            why = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
            result["problem"] = (
                "torch.load(..., weights_only=True) refuses the checkpoint"
                + (f": it holds a {why.group(1)}" if why else "")
                + "; save state_dict()s, tensors and plain values, not objects"
            )
            continue
        fresh = Run(seed=2)  # other weights
        torch.manual_seed(999 + rank)  # another RNG state: a new process
        load_state(fresh, state)
        result["after_load"] = snapshot(fresh)
        result["saved_at"] = saved["truth"]["step"]
        train(fresh, sampler(), data, save_state, TOTAL, every)
        result["at_end"] = snapshot(fresh)
    return out


def results(sol):
    from _judge.ranks import reference_on_ranks

    if not _results:
        reference = reference_on_ranks(reference_worker, WORLD)
        for rank, out in enumerate(
            on_ranks(worker, WORLD, sol.save_state, sol.load_state)
        ):
            for name, result in out.items():
                if "problem" not in result:
                    truth, end = (
                        reference[rank][name]["truth"],
                        reference[rank][name]["end"],
                    )
                    result["after_load"] = differences(result["after_load"], truth)
                    result["at_end"] = differences(result["at_end"], end)
            _results.append(out)
    return _results


def shown(name):
    every, crash_at = SCENARIOS[name]
    return (
        f"{WORLD} ranks, {TOTAL} steps of AdamW, a checkpoint every {every} steps "
        f"(save_state, torch.save); crash before step {crash_at}; a fresh run, "
        "torch.load(weights_only=True), load_state, train to the end"
    )


def verify_saved(sol):
    for name in SCENARIOS:
        for rank, out in enumerate(results(sol)):
            if "problem" in out[name]:
                fail(f"on rank {rank}: {out[name]['problem']}", input=shown(name))


def verify_pieces(sol, pieces):
    verify_saved(sol)
    for name in SCENARIOS:
        for rank, out in enumerate(results(sol)):
            wrong = [
                out[name]["after_load"][p]
                for p in pieces
                if p in out[name]["after_load"]
            ]
            if wrong:
                fail(
                    f"on rank {rank}, right after load_state, the run differs from "
                    f"the one saved at step {out[name]['saved_at']} in "
                    + "; and in ".join(wrong)
                    + ": save it in save_state and restore it in load_state",
                    input=shown(name),
                )


@check("the checkpoint is plain data: torch.save, then torch.load(weights_only=True)")
def plain_data(sol):
    verify_saved(sol)


@check("after load_state: the weights and the optimizer's state as saved")
def model_and_optimizer(sol):
    verify_pieces(sol, ["model", "optimizer"])


@check("after load_state: the data position (epoch, batch) and the step counter")
def position(sol):
    verify_pieces(sol, ["position", "step"])


@check("after load_state: the RNG state")
def rng(sol):
    verify_pieces(sol, ["rng"])


def verify_end(sol, name):
    verify_pieces(sol, ["model", "optimizer", "position", "step", "rng"])
    for rank, out in enumerate(results(sol)):
        wrong = [d for p, d in out[name]["at_end"].items() if p != "rng"]
        if wrong:
            fail(
                f"on rank {rank}, at step {TOTAL}, the resumed run differs from the "
                "run that never crashed in " + "; and in ".join(wrong),
                input=shown(name),
            )


@check("crashed at step 8, resumed from step 6: bit-identical at step 12")
def resumed_mid_epoch(sol):
    verify_end(sol, "mid-epoch")


@check("resumed from a checkpoint at the end of an epoch: bit-identical too")
def resumed_end_of_epoch(sol):
    verify_end(sol, "end of epoch")
