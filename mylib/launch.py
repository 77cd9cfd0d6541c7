"""Chapter 0. Starting N ranks: from a notebook cell, a script, or ``torchrun``.

``run_ranks(fn, world_size)`` runs ``fn(*args)`` on every rank of a fresh
process group and returns the results in rank order. It is what every
chapter uses to execute its claims on real ``torch.distributed`` groups.

Why it is more than ``torch.multiprocessing.spawn``:

* ``fn`` may be defined in a notebook cell. ``spawn`` pickles a function by
  name, and a child cannot import ``__main__`` of a notebook; we ship ``fn``
  by value with cloudpickle.
* Results and prints come back to the caller, in rank order, so a notebook's
  output is the same on every run.
* Failures are loud and fast: a rank that raises is reported with its rank
  and traceback while the others are torn down; a rank that hangs (say two
  ranks calling different collectives) ends in :class:`RankTimeout`, which
  shows where each stuck rank was; no process outlives the call.
* Ports never collide: the parent opens the rendezvous store on port 0 and
  keeps it open, so the OS picks a free port and nobody can take it meanwhile.

On a cluster the same worker code runs under ``torchrun`` instead, which starts
one process per GPU and describes the group in environment variables; a script
joins it with :func:`init_from_env` (the last section of this file).
"""

import contextlib
import datetime
import faulthandler
import io
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings

import cloudpickle
import torch
import torch.distributed as dist

from mylib import _EXPORTS

HOST = "127.0.0.1"


class RankError(RuntimeError):
    """A rank raised (or died). ``.rank`` says which, ``.rank_traceback`` why."""

    def __init__(self, rank, message, rank_traceback=""):
        self.rank = rank
        self.rank_traceback = rank_traceback
        super().__init__(
            f"rank {rank} failed: {message}\n\n"
            f"--- traceback of rank {rank} ---\n{rank_traceback}"
        )


class RankTimeout(TimeoutError):
    """Ranks did not finish in time. ``.stuck`` maps each rank to its stack."""

    def __init__(self, timeout_s, stuck):
        self.stuck = stuck
        where = "\n".join(
            f"--- rank {r} was here ---\n{stack}" for r, stack in sorted(stuck.items())
        )
        super().__init__(
            f"ranks {sorted(stuck)} did not finish within {timeout_s:g} s. "
            "A common cause is ranks calling different collectives (or the same "
            "ones in a different order). Where each stuck rank was:\n"
            f"{where}"
        )


def run_ranks(
    fn,
    world_size=2,
    args=(),
    kwargs=None,
    *,
    backend="gloo",
    timeout_s=60.0,
    show_output=True,
):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return each rank's result.

    The results come in rank order. Each rank is a fresh process inside an
    initialised process group (``dist.get_rank()`` works in ``fn``). ``backend``
    is ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank). Whatever a rank prints
    is shown after the run, rank by rank, prefixed ``[rank r]``
    (``show_output=False`` hides it). Each rank treats warnings as the caller
    does at the call (its filters for Python's warning classes), so a test
    that makes a warning an error makes it one in the ranks too.

    Raises :class:`RankError` naming the first rank that failed, with its
    traceback, and :class:`RankTimeout` if the ranks are not all done within
    ``timeout_s`` seconds. Either way every rank is stopped before it returns.
    """
    if not callable(fn):
        raise TypeError(
            f"run_ranks needs a function to run on each rank, got {type(fn).__name__}"
        )
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeError(
            f"backend='nccl' needs one GPU per rank: {world_size} ranks, "
            f"{torch.cuda.device_count()} GPUs. Use backend='gloo' to run on the CPU."
        )
    ctx = _context()
    # sys.path travels too: fn may live in a module only the caller can import
    # (a test folder, say).
    payload = (
        list(sys.path),
        _builtin_warning_filters(),
        cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))),
    )
    # The parent owns the rendezvous store: port 0 lets the OS choose a free
    # port, and holding it open means no other launch can grab it meanwhile.
    store = dist.TCPStore(
        HOST,
        0,
        world_size + 1,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    log_dir = tempfile.mkdtemp(prefix="mylib-ranks-")
    results_q = ctx.Queue()
    procs = []
    try:
        for rank in range(world_size):
            with _main_module_hidden():
                p = ctx.Process(
                    target=_rank_main,
                    args=(
                        rank,
                        world_size,
                        backend,
                        store.port,
                        timeout_s,
                        payload,
                        results_q,
                        os.path.join(log_dir, f"rank{rank}.log"),
                        os.getpid(),
                    ),
                    daemon=True,
                )
                p.start()
            procs.append(p)
        outputs = _collect(procs, results_q, timeout_s, log_dir)
    finally:
        _stop(procs)
        results_q.close()
        shutil.rmtree(log_dir, ignore_errors=True)
        del store
    if show_output:
        for rank, (_, printed) in enumerate(outputs):
            for line in printed.splitlines():
                print(f"[rank {rank}] {line}")
    return [result for result, _ in outputs]


# What the fork server imports once, so that no rank has to. torch.optim and
# DDP import torch._dynamo on first use: seconds per rank on a busy machine. Then
# the modules of the classes mylib exports, this one among them (mylib/__init__.py
# imports them only when first used).
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "cloudpickle"]
_PRELOAD += sorted(set(_EXPORTS.values()))


def preload_in_ranks(*module_names):
    """Have the fork server import ``module_names`` once, before it forks any rank.

    Only takes effect if called before the first launch of this process (the
    fork server starts then and keeps what it imported).
    """
    _PRELOAD.extend(name for name in module_names if name not in _PRELOAD)


def _context():
    # A fork server imports torch once; every launch then forks from it in a
    # fraction of a second, instead of re-importing torch in each rank.
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(_PRELOAD))
        return ctx
    return mp.get_context("spawn")


@contextlib.contextmanager
def _main_module_hidden():
    """Stop the child from re-running the caller's script.

    multiprocessing re-imports ``__main__`` in every child so that functions
    pickled by name can be found; a script without an ``if __name__ ==
    "__main__"`` guard would then launch ranks from inside its ranks. We ship
    ``fn`` by value, so the child needs nothing from ``__main__``.
    """
    main = sys.modules.get("__main__")
    saved = {
        name: getattr(main, name)
        for name in ("__file__", "__spec__")
        if hasattr(main, name)
    }
    try:
        if main is not None:
            main.__spec__ = None
            if "__file__" in saved:
                del main.__file__
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


def _collect(procs, results_q, timeout_s, log_dir):
    world_size = len(procs)
    outputs = [None] * world_size
    deadline = time.monotonic() + timeout_s
    died_at = {}
    while any(o is None for o in outputs):
        try:
            status, rank, body, printed = results_q.get(timeout=0.05)
        except queue.Empty:
            now = time.monotonic()
            for rank, p in enumerate(procs):
                if outputs[rank] is None and p.exitcode is not None:
                    # Give a result already in the pipe a moment to arrive.
                    if now - died_at.setdefault(rank, now) > 1.0:
                        raise RankError(
                            rank, _describe_exit(p.exitcode), _log_tail(log_dir, rank)
                        )
            if now > deadline:
                stuck = [r for r, o in enumerate(outputs) if o is None]
                raise RankTimeout(timeout_s, _stacks_of(procs, stuck, log_dir))
            continue
        if status == "error":
            raise _root_cause(procs, results_q, log_dir, {rank: (body, printed)})
        outputs[rank] = (cloudpickle.loads(body), printed)
    return outputs


# What a rank says when it is a victim, not the cause: its peer went away.
_PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Read error",
    "Socket closed",
    "Broken pipe",
    "Timed out waiting",
)


def _root_cause(procs, results_q, log_dir, errors, grace_s=1.0):
    """Pick the rank that failed first, not one that merely lost its peer.

    When one rank dies its peers soon fail too, with connection errors that
    can reach us before we notice the death. Collect for a moment, then blame
    a rank that died silently, else one whose error is not a lost peer.
    """
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            status, rank, body, printed = results_q.get(timeout=0.05)
            if status == "error":
                errors[rank] = (body, printed)
        except queue.Empty:
            pass
    silent = [
        r
        for r, p in enumerate(procs)
        if r not in errors and p.exitcode not in (None, 0)
    ]
    if silent:
        return RankError(
            silent[0],
            _describe_exit(procs[silent[0]].exitcode),
            _log_tail(log_dir, silent[0]),
        )
    causes = [
        r for r, (body, _) in errors.items() if not any(s in body for s in _PEER_LOST)
    ] or list(errors)
    body, printed = errors[causes[0]]
    return RankError(
        causes[0], body.strip().splitlines()[-1], body + _printed_note(printed)
    )


def _describe_exit(exitcode):
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"the process was killed by {name} without returning a result"
    return (
        f"the process exited with code {exitcode} without returning a result "
        "(sys.exit or os._exit in fn?)"
    )


def _printed_note(printed):
    return f"\n--- it printed ---\n{printed}" if printed.strip() else ""


def _log_tail(log_dir, rank, max_chars=4000):
    try:
        with open(os.path.join(log_dir, f"rank{rank}.log"), errors="replace") as f:
            text = f.read()
    except OSError:
        return "(no log)"
    return text[-max_chars:] or "(the rank wrote nothing to stdout/stderr)"


def _dump_is_complete(log_text):
    header = log_text.rfind("Stack (most recent call first)")
    return header >= 0 and " in <module>\n" in log_text[header:]


def _stacks_of(procs, ranks, log_dir):
    for r in ranks:
        if procs[r].is_alive():
            with contextlib.suppress(ProcessLookupError):
                # faulthandler dumps its stack to the log
                os.kill(procs[r].pid, signal.SIGUSR1)
    # A busy machine can take a while to deliver the signal and write the dump,
    # and we may read the log while it is half written: wait for the whole dump,
    # which ends at the outermost frame (the process's "<module>").
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not all(
        _dump_is_complete(_log_tail(log_dir, r, max_chars=20000))
        or not procs[r].is_alive()
        for r in ranks
    ):
        time.sleep(0.05)
    stacks = {}
    for r in ranks:
        tail = _log_tail(log_dir, r, max_chars=20000)
        start = (
            tail.rfind("Thread 0x")
            if "Current thread" not in tail
            else tail.rfind("Current thread")
        )
        stack = tail[start:] if start >= 0 else tail
        # The frames below fn are the launcher's and multiprocessing's own.
        cut = stack.find(f'File "{__file__}"')
        cut = stack.rfind("\n", 0, cut) if cut >= 0 else -1
        stacks[r] = stack[:cut] if cut >= 0 else stack
    return stacks


def _stop(procs):
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _rank_main(
    rank, world_size, backend, port, timeout_s, payload, results_q, log_path, parent_pid
):
    """Body of one rank's process: join the group, run fn, report back."""
    log = open(log_path, "w", buffering=1)
    # C-level output (gloo, NCCL) goes to the log, shown only on failure.
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=False)
    _exit_with_parent(parent_pid)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR=HOST,
        MASTER_PORT=str(port),
    )
    # N ranks share the cores: one thread pool per rank would oversubscribe them.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            parent_path, warning_filters, pickled = payload
            _use_warning_filters(warning_filters)
            sys.path[:0] = [p for p in parent_path if p not in sys.path]
            fn, args, kwargs = cloudpickle.loads(pickled)
            if backend == "nccl":
                torch.cuda.set_device(rank)
            # gloo's own timeout comes later than the caller's, so that a hang ends in
            # RankTimeout with every rank's stack rather than in one rank's gloo error.
            timeout = datetime.timedelta(seconds=timeout_s + 60)
            store = dist.TCPStore(
                HOST, port, world_size + 1, is_master=False, timeout=timeout
            )
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world_size, timeout=timeout
            )
            # gloo connects the mesh lazily on some ranks: without this barrier a
            # rank whose fn needs no collective could exit while a peer still connects.
            dist.barrier()
            result = fn(*args, **kwargs)
        results_q.put(("ok", rank, cloudpickle.dumps(result), printed.getvalue()))
    except BaseException:  # SystemExit and KeyboardInterrupt are failures of fn too
        results_q.put(("error", rank, traceback.format_exc(), printed.getvalue()))
    finally:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
    results_q.close()
    results_q.join_thread()


def _builtin_warning_filters():
    """The caller's warning filters for Python's own warning classes, picklable.

    Under pytest they include pyproject.toml's ``filterwarnings`` (torch's
    FutureWarnings are errors there); a class of another package might not
    import in the rank, so those filters stay behind.
    """

    def pattern(regex):  # a compiled regex, a plain string or None
        return getattr(regex, "pattern", regex) or ""

    return [
        (action, pattern(message), category, pattern(module), lineno)
        for action, message, category, module, lineno in warnings.filters
        if category.__module__ == "builtins"
    ]


def _use_warning_filters(filters):
    warnings.resetwarnings()
    for action, message, category, module, lineno in reversed(filters):
        warnings.filterwarnings(action, message, category, module, lineno)


def _exit_with_parent(parent_pid):
    """Never outlive the caller, even if it is killed with SIGKILL."""

    def watch():
        while True:
            if not _parent_alive(parent_pid):
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def _parent_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


# -- the cluster path: the same worker code under torchrun --------------------------
#
# In the notebooks :func:`mylib.run_ranks` starts the ranks. On a cluster
# ``torchrun`` starts one process per GPU and describes the group in
# environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
# ``MASTER_ADDR``, ``MASTER_PORT``); a script joins it with
# :func:`init_from_env` and computes on :func:`current_device`.


def current_device():
    """The device this rank should compute on: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_from_env(timeout_s=300.0):
    """Join the process group that ``torchrun`` describes in the environment.

    Picks NCCL when CUDA is available, gloo otherwise, and pins the rank to
    its local GPU. Returns ``(rank, world_size, device)``. Use it at the top of
    a script started with ``torchrun --standalone --nproc-per-node=N script.py``.
    """
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(
                f"environment variable {var} is not set: start this script with "
                "`torchrun --standalone --nproc-per-node=N "
                f"{os.path.basename(sys.argv[0])}`"
            )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), current_device()
