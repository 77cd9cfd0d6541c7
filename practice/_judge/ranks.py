"""Running a check on real ``torch.distributed`` ranks (gloo, on the CPU).

``on_ranks(worker, world_size, *args)`` runs ``worker(*args)`` on every rank
of a fresh gloo group with :func:`mylib.run_ranks` and returns the results
in rank order. The reader's functions travel to the ranks by value
(cloudpickle), so their tracebacks still point at the reader's file. A rank
that raises becomes ``RankError`` and ranks that hang become
``RankTimeout`` (with each rank's stack); :mod:`checking` turns both into
verdicts that name the reader's line.

A checks module may list ``RANK_PRELOAD`` (module names): the fork server
that starts the ranks imports them once, so each rank does not.

``spy_on_dist`` (used inside a worker) records, or forbids, calls to
``torch.distributed`` functions: a check can then say "all-reduce was called
4 times" or "build it from send/recv, not dist.all_reduce".
"""

import contextlib
import os
import sys

# A hang is reported after this many seconds (the per-check limit is longer, so this
# fires first).
RANK_TIMEOUT_S = float(os.environ.get("JUDGE_RANK_TIMEOUT", "30"))


def on_ranks(worker, world_size, *args, timeout_s=None):
    """Run ``worker(*args)`` on ``world_size`` gloo ranks; return results in rank order.

    Functions and classes of the reader's file among ``args`` travel as
    :class:`ReaderObject`: each rank loads the reader's file itself, so a
    traceback or a stuck rank's stack names the reader's file and line.
    """
    import cloudpickle

    from mylib import run_ranks
    from mylib.launch import preload_in_ranks

    module = sys.modules.get(getattr(worker, "__module__", None) or "")
    preload_in_ranks(*getattr(module, "RANK_PRELOAD", ()))
    if module is not None and worker.__module__ != "__main__":
        with contextlib.suppress(ValueError):
            cloudpickle.register_pickle_by_value(
                module
            )  # checks.py is not importable by name in a rank
    args = tuple(_by_path(a) for a in args)
    timeout_s = RANK_TIMEOUT_S if timeout_s is None else min(timeout_s, RANK_TIMEOUT_S)
    return run_ranks(
        _call_resolved,
        world_size,
        args=(worker,) + args,
        timeout_s=timeout_s,
        show_output=True,
    )


def _call_resolved(worker, *args):
    """In a rank: run the worker on the reader's objects, loaded from their file."""
    import faulthandler

    # A rank killed by a signal (gloo aborts on mismatched collectives) then prints its
    # Python
    # stack into its log, which the launcher reports: the verdict can name the reader's
    # line.
    faulthandler.enable(file=sys.stderr)
    return worker(*(a.resolve() if isinstance(a, ReaderObject) else a for a in args))


def _by_path(obj):
    if getattr(obj, "__module__", None) == "solution" and hasattr(obj, "__qualname__"):
        return ReaderObject(sys.modules["solution"].__file__, obj.__qualname__)
    return obj


class ReaderObject:
    """A function or class of the reader's file, loaded on first use.

    It is named by its file and its name.
    """

    def __init__(self, path, qualname):
        self.path = path
        self.qualname = qualname

    def resolve(self):
        module = sys.modules.get("solution")
        if module is None or getattr(module, "__file__", None) != self.path:
            import importlib.util

            spec = importlib.util.spec_from_file_location("solution", self.path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["solution"] = module
            spec.loader.exec_module(module)
        obj = module
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    @property
    def __globals__(self):
        return getattr(self.resolve(), "__globals__", {})


class DistSpy:
    """What the code inside :func:`spy_on_dist` called.

    ``calls`` is a list of (name, dtype, numel, nbytes).
    """

    def __init__(self):
        self.calls = []

    def count(self, name):
        return sum(1 for c in self.calls if c[0] == name)

    def bytes(self, *names):
        return sum(c[3] for c in self.calls if c[0] in names)


@contextlib.contextmanager
def spy_on_dist(names, forbid=(), reader_functions=(), why=""):
    """Record calls to ``torch.distributed.<name>`` for each name.

    Calls to the ``forbid`` names raise instead.

    Patches the ``torch.distributed`` module and, for names the reader
    imported directly (``from torch.distributed import send``), the globals
    of ``reader_functions``. Everything is restored on exit.
    """
    import torch.distributed as dist

    spy = DistSpy()
    saved = []

    def wrap(name, original):
        def spied(*args, **kwargs):
            if name in forbid:
                raise RuntimeError(
                    f"this exercise does not allow torch.distributed.{name}: {why}"
                )
            tensor = args[0] if args else kwargs.get("tensor")
            if hasattr(tensor, "dtype"):
                spy.calls.append(
                    (
                        name,
                        str(tensor.dtype).replace("torch.", ""),
                        tensor.numel(),
                        tensor.numel() * tensor.element_size(),
                    )
                )
            else:
                spy.calls.append((name, None, 0, 0))
            return original(*args, **kwargs)

        spied.__wrapped__ = original
        return spied

    for name in set(names) | set(forbid):
        original = getattr(dist, name)
        replacement = wrap(name, original)
        saved.append((dist, name, original))
        setattr(dist, name, replacement)
        for fn in reader_functions:
            g = getattr(fn, "__globals__", {})
            for key, value in list(g.items()):
                if value is original:
                    saved.append((g, key, original))
                    g[key] = replacement
    try:
        yield spy
    finally:
        for target, name, original in reversed(saved):
            if isinstance(target, dict):
                target[name] = original
            else:
                setattr(target, name, original)
