"""What the code on a rank calls in ``torch.distributed``: counted, or refused.

``spy_on_dist`` (used inside a worker) records, or forbids, calls to
``torch.distributed`` functions: a check can then say "all-reduce was called
4 times" or "build it from send/recv, not dist.all_reduce". It sees every
path to a collective: the functions of ``torch.distributed`` and of
``distributed_c10d``, the names the reader imported, the process group's
and its backend's methods, the functional collectives, and the c10d
operators (``torch.ops.c10d.*``, ``torch.ops._c10d_functional.*`` and
``torch.ops._c10d_functional_autograd.*``). Below all of them, where every
path ends, a dispatch mode notes each c10d operator of a forbidden collective
the dispatcher runs, whatever name the call was made by, and the spy refuses
it when the watched code returns.
"""

import contextlib
import threading

from _judge.collectives import (
    ALIASES,
    C10D_NAMES,
    C10D_NAMESPACES,
    FUNCTIONAL_NAMES,
    METHOD_NAMES,
    canonical,
    collective,
)


class DistSpy:
    """What the code inside :func:`spy_on_dist` called.

    ``calls`` is a list of (name, dtype, numel, nbytes, data_ptr) of each call's
    first tensor, under the collective's new name (:func:`canonical`).
    """

    def __init__(self):
        self.calls = []

    def count(self, name):
        return sum(1 for c in self.calls if c[0] == canonical(name))

    def bytes(self, *names):
        names = {canonical(n) for n in names}
        return sum(c[3] for c in self.calls if c[0] in names)


_INSIDE = threading.local()  # depth of spied torch.distributed calls on this thread


def _refused(name, refuse):
    def refused(*args, **kwargs):
        refuse(name)

    return refused


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


def _guarded_call(original, forbid, refuse):
    def __call__(self, /, *args, **kwargs):
        name = collective(self)
        if name in forbid:
            refuse(name)
        return original(self, *args, **kwargs)

    return __call__


def _refuser(forbid):
    """A dispatch mode that notes the c10d operators of the ``forbid`` collectives.

    It notes rather than raises, and the spy refuses what it noted when the code
    it watches returns: an exception raised here could be caught by the reader's
    code, and the call would go unreported.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class Refuser(TorchDispatchMode):
        called = []

        @classmethod
        def _should_skip_dynamo(cls):
            # Nothing here compiles; skipping Dynamo would import it (seconds).
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            namespace, _, op = func.name().partition("::")
            if namespace in C10D_NAMESPACES and C10D_NAMES.get(op) in forbid:
                self.called.append(C10D_NAMES[op])
            return func(*args, **(kwargs or {}))

    return Refuser()


@contextlib.contextmanager
def spy_on_dist(names, forbid=(), reader_functions=(), why=""):
    """Record calls to ``torch.distributed.<name>`` for each name.

    Calls to the ``forbid`` names raise instead, whichever way they are made:
    ``torch.distributed.X``, ``distributed_c10d.X``, a name imported from
    either, a method of the process group or of its backend, a functional
    collective, or a c10d operator, and, below all of them, any operator of
    that collective the dispatcher runs. A call made through a lower layer is
    recorded under its ``torch.distributed`` name; a collective's old and new
    names (``all_gather_into_tensor``, ``all_gather_single``) are one name
    (:data:`ALIASES`). Everything is restored on exit.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    spy = DistSpy()
    names = {canonical(n) for n in names}
    forbid = {canonical(n) for n in forbid}
    watched = names | forbid
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
    for key in list(watched) + list(ALIASES):
        name = canonical(key)
        original = getattr(dist, key, None) or getattr(c10d, key, None)
        if name in watched and original is not None:
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
    # The functional collectives (torch.distributed._functional_collectives):
    # refused if forbidden.
    import torch.distributed._functional_collectives as functional

    for op, name in FUNCTIONAL_NAMES.items():
        if name in forbid and hasattr(functional, op):
            saved.append((functional, op, getattr(functional, op)))
            setattr(functional, op, _refused(name, refuse))
    # The c10d operators (torch.ops.c10d.allreduce_, torch.ops._c10d_functional...),
    # however the reader reached them, even before the spy began (``OP = torch.ops.
    # c10d._allgather_base_.default`` at the top of their file): refused when
    # called from Python, at once. (Their names stay in place: torch looks them up.)
    for cls in (torch._ops.OpOverloadPacket, torch._ops.OpOverload):
        for klass in [cls, *cls.__subclasses__()]:
            if "__call__" in klass.__dict__ and forbid:
                original = klass.__dict__["__call__"]
                saved.append((klass, "__call__", original))
                setattr(klass, "__call__", _guarded_call(original, forbid, refuse))
    # Below every name: the dispatcher, which each of these paths and any other
    # (a name this module does not list, a method taken before the spy began)
    # goes through to run a c10d operator.
    refuser = _refuser(forbid) if forbid else None
    try:
        with refuser or contextlib.nullcontext():
            yield spy
        if refuser is not None and refuser.called:
            refuse(refuser.called[0])
    finally:
        for target, name, original in reversed(saved):
            if isinstance(target, dict):
                target[name] = original
            else:
                setattr(target, name, original)
