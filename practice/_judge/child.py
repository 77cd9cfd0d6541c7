"""The process that runs the reader's code: it computes, the judge grades.

The fork server (``server.py``) forks this process for each grade, in a
session of its own, with its output going to a file. It receives from the
judge, over a socket, the exercise's ``checks.py`` (as verified bytes) and a
snapshot of the reader's file, loads both, and then answers requests: get an
attribute of the reader's module (or of an object it returned), call it,
run a check's worker on ranks. Every answer is plain data (see ``wire.py``);
the checks themselves, and so every verdict, run in the judge's process.

What this process reports can be wrong only in the values the reader's code
computed: it never says "passed".
"""

import contextlib
import faulthandler
import io
import linecache
import os
import pickle
import signal
import sys
import types

from _judge import wire
from _judge.loading import load_solution_source
from _judge.running import classify_exception


class CheckTimeout(Exception):
    """A call ran past its time limit; raised by the alarm inside the reader's code."""

    check_timeout = True


def limit_resources(output_cap_bytes, memory_cap_bytes):
    """Caps that turn a runaway into a clear verdict.

    Instead of a full disk, a full memory or a core dump.
    """
    import resource

    # Writing past the cap kills this process with SIGXFSZ (Python ignores that
    # signal by default, which would turn the flood into an OSError in the reader's
    # code).
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_cap_bytes, output_cap_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_cap_bytes:  # a list that grows forever: MemoryError, not swapping
        # On top of what is mapped already (a warm fork server may hold torch).
        cap = memory_cap_bytes + _mapped_bytes()
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _mapped_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextlib.contextmanager
def alarm(seconds, what):
    """Raise :class:`CheckTimeout` in this thread after ``seconds``."""

    def ring(signum, frame):
        raise CheckTimeout(
            f"{what} ran past its time limit of {seconds:.3g} s: an infinite loop, "
            f"or a loop whose end condition is never met?"
        )

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _JudgeUnpickler(pickle.Unpickler):
    """Requests from the judge: its handles become the reader's objects again."""

    def __init__(self, data, objects):
        super().__init__(io.BytesIO(data))
        self._objects = objects

    def persistent_load(self, pid):
        return self._objects[pid[1]]


class Child:
    def __init__(self, sock, sandbox_abi=0):
        self.sock = sock
        self.objects = {}
        self.path = None
        self.called = []  # the checks' functions the reader's code called
        self.sandbox_abi = sandbox_abi
        self.Pickler = wire.plain_pickler(self.keep)

    def keep(self, obj):
        key = len(self.objects) + 1
        self.objects[key] = obj
        return key

    def reply(self, *message):
        try:
            wire.send(self.sock, message, self.Pickler)
        except Exception as e:  # a value that cannot travel: say what it is
            wire.send(
                self.sock,
                (
                    "raise",
                    "TypeError",
                    "TypeError",
                    {
                        "status": "error",
                        "message": f"your code returned a value the judge cannot read "
                        f"({type(e).__name__}: {e})",
                    },
                ),
            )

    def fail(self, exc, what):
        result = classify_exception(what, exc, self.path)
        base = next(
            (c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"),
            "Exception",
        )
        result.pop("name", None)
        self.reply("raise", type(exc).__name__, base, result)

    def serve(self):
        init = pickle.loads(wire.recv_bytes(self.sock))
        wire.send(self.sock, ("hello", os.getpid()))
        limit_resources(init["output_cap"], init["memory_cap"])
        faulthandler.enable()  # a segfault prints the reader's line
        faulthandler.register(signal.SIGUSR1, all_threads=False)  # the judge asks
        for name in init.get("preload", ()):
            with contextlib.suppress(Exception):
                __import__(name)
        self.path = init["path"]
        checks = types.ModuleType(init["checks_name"])
        checks.__file__ = init["checks_path"]
        sys.modules[checks.__name__] = checks
        exec(compile(init["checks_source"], init["checks_path"], "exec"), vars(checks))
        _tripwire(checks, self.path, self.called)
        for path, data in (
            (init["checks_path"], init["checks_source"]),
            (self.path, init["source"]),
        ):
            # Tracebacks read lines from here: the exercise's folder is not readable.
            text = data.decode("utf-8", "replace")
            linecache.cache[path] = (len(text), None, text.splitlines(True), path)
        from _judge import ranks

        ranks.LOCAL_LOG_DIR = os.getcwd()
        if init.get("trusted"):  # the checks' reference ranks: no reader's code here
            module, problem = types.ModuleType("reference"), None
        else:
            module, problem = load_solution_source(
                init["source"],
                self.path,
                guard=lambda: alarm(init["check_timeout_s"], "loading your file"),
            )
        if problem:
            self.reply("load_error", problem)
            return
        self.objects[0] = module
        self.reply("loaded")
        while True:
            try:
                data = wire.recv_bytes(self.sock)
                request = _JudgeUnpickler(data, self.objects).load()
            except EOFError:
                return
            if request[0] == "bye":
                return
            self.answer(request)

    def answer(self, request):
        kind, key, *rest = request
        obj = self.objects.get(key)
        seconds = rest[-1]
        try:
            with alarm(seconds, "your code"):
                if kind == "getattr":
                    try:
                        value = getattr(obj, rest[0])
                    except AttributeError:
                        if key == 0:
                            self.reply("missing", rest[0])
                            return
                        raise
                    self.reply("ok", value, ())
                elif kind == "call":
                    args, kwargs = rest[0], rest[1]
                    value = obj(*args, **kwargs)
                    mutable = (list, dict, set, bytearray) + _tensor_types()
                    after = [a if isinstance(a, mutable) else None for a in args]
                    self.reply("ok", value, after)
                elif kind == "op":
                    name, args = rest[0], rest[1]
                    value = _OPS[name](obj, *args)
                    self.reply("ok", value, ())
                elif kind == "noticed":
                    from _judge.confine import NOTICED

                    self.reply(
                        "ok",
                        {
                            "read": list(NOTICED.read_reference),
                            "wrote": list(NOTICED.wrote_outside),
                            "called": list(dict.fromkeys(self.called)),
                            "landlock": self.sandbox_abi,
                        },
                        (),
                    )
                elif kind == "ranks":
                    from _judge import ranks

                    worker, world_size, args = rest[0:3]
                    value = ranks.run_locally(
                        worker, world_size, args, busy_s=max(seconds - 0.5, 0.5)
                    )
                    self.reply("ok", value, ())
        except BaseException as e:  # whatever the reader's code raised
            self.fail(e, "call")


def _tripwire(checks, reader_path, called):
    """Note every call of a checks function made straight from the reader's code.

    The checks' references (a least-squares fit, a whole-batch step) are
    there in this process, for the ranks' workers; a solution that calls them
    gets the right answer without computing it, and the report says so.
    """
    import functools

    def wrap(fn):
        @functools.wraps(fn)
        def watched(*args, **kwargs):
            if sys._getframe(1).f_code.co_filename == reader_path:
                called.append(fn.__name__)
            return fn(*args, **kwargs)

        return watched

    for name, value in list(vars(checks).items()):
        if (
            isinstance(value, types.FunctionType)
            and value.__module__ == checks.__name__
        ):
            setattr(checks, name, wrap(value))


def _tensor_types():
    torch = sys.modules.get("torch")
    return (torch.Tensor,) if torch is not None else ()


_OPS = {
    "len": len,
    "iter": lambda o: list(o),
    "getitem": lambda o, k: o[k],
    "contains": lambda o, k: k in o,
    "setattr": setattr,
    "str": str,
}


def main(fd, sandbox_abi=0):
    import socket

    sock = socket.socket(fileno=fd)
    try:
        Child(sock, sandbox_abi).serve()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
