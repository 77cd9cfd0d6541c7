"""Running a check on real ``torch.distributed`` ranks (gloo, on the CPU).

``on_ranks(worker, world_size, *args)`` runs ``worker(*args)`` on every rank
of a fresh gloo group and returns the results in rank order.

Where it runs: the checks run in the judge's process, which never runs the
reader's code. There ``on_ranks`` asks the process that runs the reader's
code (``child.py``) to fork the ranks (``forkranks.py``); the reader's
functions among ``args`` are handles to objects in that process, and only
the workers' plain results come back, for the check to compare. A rank that
raises becomes ``RankFailed`` and ranks that hang or loop become
``RanksStuck`` (with each rank's stack); :mod:`running` words both.

A checks module may list ``RANK_PRELOAD`` (module names): the fork server
imports them once, so no grade does.

A worker returns raw tensors and the check compares them with references it
computes itself, here in the judge (:func:`max_diff`, :func:`spread`): the
reader's code runs in the ranks and can reach anything computed there.
:func:`reference_on_ranks` runs what only ranks compute (PyTorch's own DDP,
hooks) on ranks of a second process that never loads the reader's file.

``spy_on_dist`` (used inside a worker) records, or forbids, calls to
``torch.distributed`` functions: a check can then say "all-reduce was called
4 times" or "build it from send/recv, not dist.all_reduce". It sees every
path to a collective: the functions of ``torch.distributed`` and of
``distributed_c10d``, the names the reader imported, the process group's
and its backend's methods, the functional collectives, and the c10d
operators (``torch.ops.c10d.*``, ``torch.ops._c10d_functional.*`` and
``torch.ops._c10d_functional_autograd.*``).
"""

import contextlib
import threading

# The judge's side: the connection to the process running the reader's code,
# per thread (``all --jobs 2`` grades two exercises at once).
_CURRENT = threading.local()
LOCAL_LOG_DIR = None


def on_ranks(worker, world_size, *args, timeout_s=None):
    """Run ``worker(*args)`` on ``world_size`` gloo ranks; return results in rank order.

    ``worker`` must be a function of the checks module. ``timeout_s`` bounds
    how long a rank may stay busy (by default the check's time left).
    """
    client = getattr(_CURRENT, "client", None)
    if client is not None:
        return client.on_ranks(worker, world_size, args, timeout_s)
    return run_locally(worker, world_size, args, busy_s=timeout_s or 60.0)


def reference_on_ranks(worker, world_size, *args, timeout_s=None):
    """Like :func:`on_ranks`, on ranks that run none of the reader's code.

    For what only real ranks compute (PyTorch's own DDP, hooks, collectives):
    they are forked from a second process of the grade, which never loads the
    reader's file, so its results are the checks' own. ``args`` are plain
    values and the checks' functions, never the reader's.
    """
    factory = getattr(_CURRENT, "reference", None)
    if factory is None:
        return run_locally(worker, world_size, args, busy_s=timeout_s or 60.0)
    client, reader = factory(), _CURRENT.client
    client.deadline, client.check_timeout_s = reader.deadline, reader.check_timeout_s
    client.what = f"the checks' reference ranks ({reader.what})"
    return client.on_ranks(worker, world_size, args, timeout_s)


def run_locally(worker, world_size, args, busy_s):
    from _judge.forkranks import run_forked

    return run_forked(
        worker, world_size, tuple(args), busy_s=busy_s, log_dir=LOCAL_LOG_DIR
    )


def max_diff(got, expected):
    """Largest ``|got - expected|`` over two lists of tensors (computed in the judge).

    ``inf`` where the lists differ in length, or a pair in shape or in being
    None; 0.0 for two empty lists. Both sides in float64.
    """
    import torch

    if len(got) != len(expected):
        return float("inf")
    worst = 0.0
    for g, e in zip(got, expected):
        if g is None or e is None:
            if (g is None) != (e is None):
                return float("inf")
            continue
        if not (torch.is_tensor(g) and tuple(g.shape) == tuple(e.shape)):
            return float("inf")
        if g.numel():
            worst = max(worst, float((g.double() - e.double()).abs().max()))
    return worst


def spread(per_rank):
    """Largest difference between any rank's tensors and rank 0's (lists of tensors)."""
    return max((max_diff(mine, per_rank[0]) for mine in per_rank), default=0.0)


class DistSpy:
    """What the code inside :func:`spy_on_dist` called.

    ``calls`` is a list of (name, dtype, numel, nbytes, data_ptr) of each call's
    first tensor.
    """

    def __init__(self):
        self.calls = []

    def count(self, name):
        return sum(1 for c in self.calls if c[0] == name)

    def bytes(self, *names):
        return sum(c[3] for c in self.calls if c[0] in names)


# The c10d operators every path to a collective ends in, and the name each has in
# torch.distributed (torch/csrc/distributed/c10d/Ops.cpp; _functional_collectives).
C10D_NAMES = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single",
    "gather_": "gather",
    "scatter_": "scatter",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "barrier": "barrier",
    "monitored_barrier_": "barrier",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
}
# torch.distributed._functional_collectives, by torch.distributed name.
FUNCTIONAL_NAMES = {
    "all_reduce": "all_reduce",
    "all_reduce_inplace": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_tensor": "all_gather_into_tensor",
    "all_gather_tensor_autograd": "all_gather_into_tensor",
    "all_gather_tensor_inplace": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single",
    "all_to_all_single_autograd": "all_to_all_single",
    "broadcast": "broadcast",
}
# Methods of ProcessGroup and its backends, and their torch.distributed names.
METHOD_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
    "barrier": "barrier",
}
_INSIDE = threading.local()  # depth of spied torch.distributed calls on this thread


class _refusing:
    """An operator packet that refuses: called, or through ``.default``."""

    def __init__(self, name, refuse):
        self._name, self._refuse = name, refuse

    def __call__(self, *args, **kwargs):
        self._refuse(self._name)

    def __getattr__(self, overload):
        return self

    def __iter__(self):
        return iter(())

    def __contains__(self, item):
        return False


def _hashable(value):
    try:
        hash(value)
        return True
    except TypeError:
        return False


def _first_tensor(args, kwargs):
    import torch

    todo = list(args) + list((kwargs or {}).values())
    while todo:
        a = todo.pop(0)
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            todo[:0] = list(a)
    return None


@contextlib.contextmanager
def spy_on_dist(names, forbid=(), reader_functions=(), why=""):
    """Record calls to ``torch.distributed.<name>`` for each name.

    Calls to the ``forbid`` names raise instead, whichever way they are made:
    ``torch.distributed.X``, ``distributed_c10d.X``, a name imported from
    either, a method of the process group or of its backend, or a c10d
    operator. A call made through a lower layer is recorded under its
    ``torch.distributed`` name. Everything is restored on exit.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    spy = DistSpy()
    watched = set(names) | set(forbid)
    saved = []

    def refuse(name):
        raise RuntimeError(
            f"this exercise does not allow torch.distributed.{name}: {why}"
        )

    def note(name, args, kwargs):
        if name in forbid:
            refuse(name)
        if name not in names:
            return
        tensor = args[0] if args else kwargs.get("tensor")
        if not hasattr(tensor, "dtype"):
            tensor = _first_tensor(args, kwargs)
        if tensor is not None:
            spy.calls.append(
                (
                    name,
                    str(tensor.dtype).replace("torch.", ""),
                    tensor.numel(),
                    tensor.numel() * tensor.element_size(),
                    tensor.data_ptr(),
                )
            )
        else:
            spy.calls.append((name, None, 0, 0, 0))

    def outermost():
        return getattr(_INSIDE, "depth", 0) == 0

    def wrap(name, original):
        def spied(*args, **kwargs):
            if outermost():
                note(name, args, kwargs)
            _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                _INSIDE.depth -= 1

        spied.__wrapped__ = original
        return spied

    def wrap_method(name, original):
        def spied(self, *args, **kwargs):
            if outermost():
                note(name, args, kwargs)
            _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
            try:
                return original(self, *args, **kwargs)
            finally:
                _INSIDE.depth -= 1

        return spied

    replacements = {}
    for name in watched:
        original = getattr(dist, name)
        replacements[original] = wrap(name, original)
    for module in (dist, c10d):
        for key, value in list(vars(module).items()):
            if callable(value) and _hashable(value) and value in replacements:
                saved.append((module, key, value))
                setattr(module, key, replacements[value])
    for fn in reader_functions:
        g = getattr(fn, "__globals__", {})
        for key, value in list(g.items()):
            if callable(value) and _hashable(value) and value in replacements:
                saved.append((g, key, value))
                g[key] = replacements[value]
    classes = [dist.ProcessGroup, getattr(torch._C._distributed_c10d, "Backend", None)]
    gloo = getattr(dist, "ProcessGroupGloo", None)
    classes += [gloo] if gloo is not None else []
    for cls in classes:
        for method, name in METHOD_NAMES.items():
            if cls is not None and method in cls.__dict__ and name in watched:
                original = cls.__dict__[method]
                saved.append((cls, method, original))
                setattr(cls, method, wrap_method(name, original))
    # The functional collectives (torch.distributed._functional_collectives) and
    # the c10d operators (torch.ops.c10d.allreduce_, ...): refused if forbidden.
    import torch.distributed._functional_collectives as functional

    for op, name in FUNCTIONAL_NAMES.items():
        if name in forbid and hasattr(functional, op):
            saved.append((functional, op, getattr(functional, op)))
            setattr(functional, op, _refusing(name, refuse))
    namespaces = [torch.ops.c10d, torch.ops._c10d_functional]
    namespaces.append(torch.ops._c10d_functional_autograd)
    for namespace in namespaces:
        for op, name in C10D_NAMES.items():
            if name in forbid:
                try:
                    original = getattr(namespace, op)
                except (AttributeError, RuntimeError):
                    continue
                saved.append((namespace, op, original))
                setattr(namespace, op, _refusing(name, refuse))
    try:
        yield spy
    finally:
        for target, name, original in reversed(saved):
            if isinstance(target, dict):
                target[name] = original
            else:
                setattr(target, name, original)
