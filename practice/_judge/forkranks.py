"""Ranks forked from the process that runs the reader's code: fast starts, quick hangs.

:func:`run_forked` forks ``world_size`` ranks from the current process (which
has torch, the checks and the reader's module loaded already, so a rank
starts in milliseconds), joins them in a gloo group through a ``FileStore``,
runs ``worker(*args)`` on each and returns the results in rank order.

It watches the ranks as they run, from their CPU time in ``/proc``:

* ranks that are all waiting (no rank used the CPU for ``HANG_S`` seconds)
  are a hang: :class:`RanksStuck` with each rank's stack, a few seconds in;
* a rank still busy after ``busy_s`` is a loop that does not end:
  :class:`RanksStuck` with ``busy=True``;
* a rank that raises or dies: :class:`RankFailed`, naming the rank that
  failed first rather than a peer that lost its connection.

Every rank is killed before it returns.
"""

import contextlib
import datetime
import faulthandler
import gc
import io
import os
import pickle
import select
import signal
import sys
import tempfile
import time
import traceback

HANG_S = float(os.environ.get("JUDGE_HANG_S", "3"))
_PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Read error",
    "Socket closed",
    "Broken pipe",
    "Timed out waiting",
)


class RankFailed(RuntimeError):
    """A rank raised (or died). ``.rank`` says which, ``.rank_traceback`` why."""

    def __init__(self, rank, message, rank_traceback=""):
        self.rank = rank
        self.rank_traceback = rank_traceback
        super().__init__(f"rank {rank} failed: {message}")


class RanksStuck(TimeoutError):
    """Ranks that did not finish: ``.stuck`` maps each to its stack; ``.busy``."""

    def __init__(self, stuck, busy, seconds):
        self.stuck = stuck
        self.busy = busy
        self.seconds = seconds
        super().__init__(f"ranks {sorted(stuck)} did not finish")


def run_forked(worker, world_size, args, *, busy_s, log_dir=None):
    log_dir = tempfile.mkdtemp(prefix="ranks-", dir=log_dir)
    store_path = os.path.join(log_dir, "store")
    ranks = []  # (pid, read fd)
    try:
        for rank in range(world_size):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                _rank_main(
                    rank,
                    world_size,
                    store_path,
                    worker,
                    args,
                    write_fd,
                    os.path.join(log_dir, f"rank{rank}.log"),
                    busy_s,
                )
            os.close(write_fd)
            ranks.append((pid, read_fd))
        return _collect(ranks, log_dir, busy_s)
    finally:
        for pid, fd in ranks:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.close(fd)
        for pid, _ in ranks:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        import shutil

        shutil.rmtree(log_dir, ignore_errors=True)


def _rank_main(rank, world_size, store_path, worker, args, write_fd, log_path, busy_s):
    code = 0
    try:
        signal.setitimer(signal.ITIMER_REAL, 0)  # the parent's alarm is not ours
        log = open(log_path, "w", buffering=1)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        faulthandler.enable(file=log)
        faulthandler.register(signal.SIGUSR1, file=log, all_threads=False)
        os.environ.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size)
        )
        printed = io.StringIO()
        # What the rank inherited (torch and its many modules) is never garbage:
        # the collector skips it, so a check's gc.collect() scans the worker's
        # objects only (milliseconds, not a fifth of a second).
        gc.freeze()
        try:
            import torch
            import torch.distributed as dist

            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
            with contextlib.redirect_stdout(printed):
                timeout = datetime.timedelta(seconds=busy_s + 30)
                store = dist.FileStore(store_path, world_size)
                dist.init_process_group(
                    "gloo",
                    store=store,
                    rank=rank,
                    world_size=world_size,
                    timeout=timeout,
                )
                dist.barrier()
                result = worker(*args)
            message = ("ok", result, printed.getvalue())
        except BaseException:
            message = ("error", traceback.format_exc(), printed.getvalue())
        data = pickle.dumps(message)
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    except BaseException:
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(code)


def _sample(pid):
    """(asleep, CPU ticks) of a rank's main thread, from /proc; None if unknown.

    A rank starved of the CPU by a busy machine is runnable ('R'), one reading
    files is 'D': neither is waiting for a peer. Only 'S' (sleeping) is.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rfind(b")") + 2 :].split()
        return fields[0] == b"S", int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _collect(ranks, log_dir, busy_s):
    n = len(ranks)
    data = [bytearray() for _ in range(n)]
    done = [False] * n
    exit_codes = [None] * n
    started = time.monotonic()
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    asleep_since = None  # (when every rank left was first seen asleep, their ticks)
    errors = {}
    first_error_at = None
    while True:
        fds = {ranks[r][1]: r for r in range(n) if not done[r]}
        if not fds:
            break
        readable, _, _ = select.select(list(fds), [], [], 0.05)
        for fd in readable:
            r = fds[fd]
            chunk = os.read(fd, 1 << 20)
            if chunk:
                data[r] += chunk
            else:
                done[r] = True
                status = _wait(ranks[r][0])
                exit_codes[r] = status
                if not data[r]:
                    errors.setdefault(r, ("died", status))
                else:
                    message = pickle.loads(bytes(data[r]))
                    if message[0] == "error":
                        errors[r] = ("raised", message[1] + _printed(message[2]))
                    else:
                        data[r] = message
        now = time.monotonic()
        if errors and first_error_at is None:
            first_error_at = now
        if first_error_at is not None and (all(done) or now - first_error_at > 1.0):
            raise _root_cause(errors, log_dir)
        if errors:
            continue
        waiting = [r for r in range(n) if not done[r]]
        state = {r: _sample(ranks[r][0]) for r in waiting}
        asleep = [state[r] is not None and state[r][0] for r in waiting]
        if waiting and all(asleep):
            asleep_since = asleep_since or (now, {r: t for r, (_, t) in state.items()})
            used = max(state[r][1] - asleep_since[1].get(r, 0) for r in waiting)
            if now - asleep_since[0] >= HANG_S and used <= 0.05 * HANG_S * tick:
                raise RanksStuck(_stacks(ranks, waiting, log_dir), False, now - started)
        else:
            asleep_since = None  # someone is running, runnable or reading: progress
        if now - started > busy_s:
            raise RanksStuck(_stacks(ranks, waiting, log_dir), True, now - started)
    results = []
    for r in range(n):
        _, result, printed = data[r]
        for line in printed.splitlines():
            print(f"[rank {r}] {line}")
        results.append(result)
    return results


def _wait(pid):
    try:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    except ChildProcessError:
        return None


def _printed(printed):
    return f"\n--- it printed ---\n{printed}" if printed.strip() else ""


def _log(log_dir, rank, max_chars=20000):
    try:
        with open(os.path.join(log_dir, f"rank{rank}.log"), errors="replace") as f:
            return f.read()[-max_chars:]
    except OSError:
        return ""


def _root_cause(errors, log_dir):
    died = [r for r, (how, _) in errors.items() if how == "died"]
    if died:
        r = died[0]
        status = errors[r][1]
        if status is not None and status < 0:
            what = signal.Signals(-status).name
            message = f"the process was killed by {what} without returning a result"
        else:
            message = (
                f"the process exited with code {status} without returning a result"
            )
        return RankFailed(r, message, _log(log_dir, r) or "(it wrote nothing)")
    causes = [
        r for r, (_, tb) in errors.items() if not any(s in tb for s in _PEER_LOST)
    ] or sorted(errors)
    r = sorted(causes)[0]
    tb = errors[r][1]
    return RankFailed(r, tb.strip().splitlines()[-1] if tb.strip() else "", tb)


def _dump_complete(text):
    start = text.rfind("Stack (most recent call first)")
    return start >= 0 and " in <module>" in text[start:]


def _stacks(ranks, which, log_dir):
    for r in which:
        with contextlib.suppress(OSError):
            os.kill(ranks[r][0], signal.SIGUSR1)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not all(
        _dump_complete(_log(log_dir, r)) for r in which
    ):
        time.sleep(0.02)
    stacks = {}
    for r in which:
        text = _log(log_dir, r)
        start = max(text.rfind("Current thread"), text.rfind("Stack (most"))
        stack = text[start:] if start >= 0 else text
        cut = stack.find(f'File "{__file__}"')
        stacks[r] = stack[: stack.rfind("\n", 0, cut)] if cut > 0 else stack
    return stacks
