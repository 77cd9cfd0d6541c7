"""The judge's side of a grade: the reader's module seen through a socket.

The checks run in the judge's process on :class:`RemoteModule`, a stand-in
for the reader's module: ``sol.f(x)`` sends the call to the process running
the reader's code (``child.py``) and returns the plain value it computed.
Objects that are not plain data (a class, an instance, a function) stay
there and come back as :class:`RemoteObject` stand-ins, whose attributes
and calls travel the same way. An exception in the reader's code comes back
as :class:`RemoteFailure`, a subclass of the same built-in exception (so
``expect_raises(..., ValueError)`` still works) carrying the verdict's words.

If that process stops answering (a loop that ignores the alarm), floods its
output, crashes or exits, the call raises :class:`ProcessEnded`, which says
why and where; the judge kills the process and skips the checks left.
"""

import builtins
import contextlib
import io
import os
import pickle
import re
import signal
import sys
import threading
import time

from _judge import wire
from _judge.checking import MissingName

try:  # now, not at the first call: by then the reader's code has run
    import cloudpickle
except ImportError:  # lambdas in checks then cannot travel; functions by name can
    cloudpickle = None

GRACE_S = 2.0  # how long past its own alarm the reader's process may take to answer
# Values nested deeper than this are refused as they arrive: comparing or printing
# them would recurse past Python's limit in the judge.
MAX_DEPTH = 100
ALLOWED_STATUSES = ("failed", "error", "todo", "hang", "timeout", "exit")

# Grades on several threads of one process (the judge's tests grade every solution
# and starter two at a time; judge.py forks a grader per grade) run their checks side
# by side, and so share torch's global random generator: a check that seeds it and
# builds its case while another grade's check draws from it gets another case, and
# fails a right answer. So the checks take turns: a grade's thread holds CHECKS_TURN
# while its checks compute, and lets it go while it waits for the reader's process,
# which is where a grade spends its time.
CHECKS_TURN = threading.Lock()
_turn = threading.local()


@contextlib.contextmanager
def checks_turn():
    """Around a grade's checks: no other grade's checks compute meanwhile."""
    with CHECKS_TURN:
        _turn.held = True
        try:
            yield
        finally:
            _turn.held = False


@contextlib.contextmanager
def _waiting():
    """Around a wait for the reader's process: other grades' checks compute."""
    if not getattr(_turn, "held", False):
        yield
        return
    _turn.held = False
    CHECKS_TURN.release()
    try:
        yield
    finally:
        CHECKS_TURN.acquire()
        _turn.held = True


class RemoteFailure(Exception):
    """The reader's code raised: ``.result`` is the check's result, worded."""

    from_reader_process = True

    def __init__(self, type_name, result):
        super().__init__(result.get("message", type_name))
        self.type_name = type_name
        self.result = result


class ProcessEnded(BaseException):
    """The process running the reader's code ended or was stopped during a call.

    ``kind`` is ``exit``, ``crash``, ``timeout`` or ``output``;
    ``judge_result`` the check's result.
    """

    def __init__(self, kind, result, returncode=None):
        super().__init__(result["message"])
        self.kind = kind
        self.judge_result = result
        self.returncode = returncode


_FAILURE_CLASSES = {}


def _failure(type_name, base_name, result):
    base = getattr(builtins, base_name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    key = (type_name, base)
    if key not in _FAILURE_CLASSES:
        try:
            cls = type(type_name, (RemoteFailure, base), {})
        except TypeError:  # a built-in whose layout does not mix
            cls = type(type_name, (RemoteFailure,), {})
        _FAILURE_CLASSES[key] = cls
    try:
        return _FAILURE_CLASSES[key](type_name, result)
    except Exception:  # a built-in whose constructor wants more
        return RemoteFailure(type_name, result)


class RemoteObject:
    """An object of the reader's process; its attributes and calls go there."""

    __slots__ = ("_client", "_key", "_text", "_callable")

    def __init__(self, client, key, text, is_callable):
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "_callable", is_callable)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._client.request("getattr", self._key, name)

    def __setattr__(self, name, value):
        self._client.request("op", self._key, "setattr", (name, value))

    def __call__(self, *args, **kwargs):
        return self._client.call(self._key, args, kwargs)

    def __repr__(self):
        return self._text

    def __str__(self):
        return self._client.request("op", self._key, "str", ())

    def __len__(self):
        return self._client.request("op", self._key, "len", ())

    def __iter__(self):
        return iter(self._client.request("op", self._key, "iter", ()))

    def __getitem__(self, key):
        return self._client.request("op", self._key, "getitem", (key,))

    def __contains__(self, key):
        return self._client.request("op", self._key, "contains", (key,))

    # Equality and truth are decided here, never by the reader's object: a stand-in
    # equals only itself and is true, whatever the object's __eq__ or __bool__
    # would say (an object whose __eq__ always returns True passes no check).
    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __bool__(self):
        return True

    __hash__ = object.__hash__


_OBJECT_CLASSES = {}


def _remote_object(client, key, type_name, text, is_callable):
    """A stand-in whose class bears the reader's type name (messages name it)."""
    if type_name not in _OBJECT_CLASSES:
        _OBJECT_CLASSES[type_name] = type(type_name, (RemoteObject,), {"__slots__": ()})
    return _OBJECT_CLASSES[type_name](client, key, text, is_callable)


class RemoteModule(RemoteObject):
    """The reader's module (``sol`` in a check): a missing name is a clear verdict."""

    __slots__ = ()


class Client:
    """One grade's connection to the process running the reader's code."""

    def __init__(self, sock, out_path, output_cap, path, source):
        self.sock = sock
        self.out_path = out_path
        self.output_cap = output_cap
        self.path = path
        self.source = source
        self.pid = None
        self.server = None  # the fork server that started it (sandbox.py)
        self.ended = None  # a ProcessEnded, once the process is gone
        self.deadline = None  # the running check's time limit (monotonic)
        self.check_timeout_s = 10.0
        self.what = "loading your file"

    # -- the checks' side ---------------------------------------------------

    def module(self):
        text = f"<your file {os.path.basename(self.path)}>"
        return RemoteModule(self, 0, text, False)

    @contextlib.contextmanager
    def check(self, name, seconds):
        """Time limit for one check: every call it makes shares ``seconds``."""
        self.deadline = time.monotonic() + seconds
        self.check_timeout_s = seconds
        self.what = f"the check '{name}'"
        try:
            yield
        finally:
            self.deadline = None

    def call(self, key, args, kwargs):
        value, after = self._ask(("call", key, args, kwargs))
        for given, new in zip(args, after):  # the reader's function may mutate
            if new is not None:
                _update_in_place(given, new)
        return value

    def request(self, kind, key, *rest):
        value, _ = self._ask((kind, key, *rest))
        return value

    def noticed(self):
        """What the reader's process saw its code try (``confine.py``); {} if gone."""
        if self.ended is not None or self.sock is None:
            return {}
        try:
            value, _ = self._ask(("noticed", 0), limit_s=2.0)
        except BaseException:  # it ended: what it noticed goes with it
            return {}
        return value if isinstance(value, dict) else {}

    def on_ranks(self, worker, world_size, args, timeout_s):
        value, _ = self._ask(("ranks", 0, worker, world_size, args), limit_s=timeout_s)
        return value

    # -- the wire -----------------------------------------------------------

    def _time_left(self, limit_s=None):
        left = (
            self.deadline - time.monotonic()
            if self.deadline is not None
            else self.check_timeout_s
        )
        return max(min(left, limit_s) if limit_s else left, 0.05)

    def _ask(self, request, limit_s=None):
        if self.ended is not None:
            raise self.ended
        seconds = self._time_left(limit_s)
        buf = io.BytesIO()
        _judge_pickler()(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(
            (*request, seconds)
        )
        data = buf.getvalue()
        try:
            self.sock.sendall(wire._HEADER.pack(len(data)) + data)
        except OSError:
            pass  # it is gone: the reply says why
        reply = self.receive(seconds + GRACE_S)
        kind = reply[0]
        if kind == "ok":
            if _deeper_than(reply[1:3], MAX_DEPTH):
                raise _failure(
                    "TypeError",
                    "TypeError",
                    {
                        "status": "error",
                        "message": "your code returned a value nested more than "
                        f"{MAX_DEPTH} levels deep (lists in lists in lists ...): no "
                        "answer of these exercises is; does a loop wrap its result "
                        "in a new list each time round?",
                    },
                )
            return reply[1], reply[2]
        if kind == "missing":
            raise MissingName(reply[1], self.path)
        if kind == "raise":
            _, type_name, base_name, result = reply
            result = dict(result) if isinstance(result, dict) else {}
            if result.get("status") not in ALLOWED_STATUSES:
                result["status"] = "error"
            result["message"] = str(result.get("message", type_name))
            if result["message"].startswith("your code ran past its time limit"):
                result["message"] = (  # the alarm knew the time left, not the limit
                    f"your code ran past the time limit of {self.check_timeout_s:g} s "
                    f"during {self.what}: an infinite loop, or a loop whose end "
                    "condition is never met?"
                )
            raise _failure(str(type_name), str(base_name), result)
        raise self._end("exit", None)

    def receive(self, wait_s):
        """The next frame from the reader's process, decoded as plain data."""
        with _waiting():
            return self._receive(wait_s)

    def _receive(self, wait_s):
        deadline = time.monotonic() + wait_s
        self.sock.settimeout(0.1)
        header = b""
        while True:
            if self._output_size() >= self.output_cap:
                raise self._end("output", None)
            if time.monotonic() > deadline:
                raise self._stuck(wait_s)
            try:
                chunk = self.sock.recv(wire._HEADER.size - len(header))
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                raise self._end("exit", None)
            header += chunk
            if len(header) == wire._HEADER.size:
                break
        self.sock.settimeout(max(deadline - time.monotonic(), 0.5))
        (size,) = wire._HEADER.unpack(header)
        try:
            if size > wire.MAX_FRAME_BYTES:
                raise wire.WireError("a reply too big")
            data = wire._read_exactly(self.sock, size, deadline + 1.0)
            reply = wire.loads_plain(data, self._load)
        except TimeoutError:
            raise self._stuck(wait_s) from None
        except (EOFError, OSError):
            raise self._end("exit", None) from None
        except wire.WireError as e:
            raise self._end("exit", None, f"the process running your code sent {e}")
        if not isinstance(reply, tuple) or not reply:
            raise self._end("exit", None, "the process running your code sent junk")
        if reply[0] == "ended":
            raise self._end("exit", reply[1] if len(reply) > 1 else None)
        return reply

    def _load(self, pid):
        kind = pid[0]
        if kind == "h":
            return _remote_object(self, int(pid[1]), str(pid[2]), str(pid[3]), pid[4])
        if kind == "t":
            return _tensor(pid[1], pid[2], pid[3])
        if kind in ("v", "c"):
            return pid[-1]
        raise wire.WireError(f"an unknown tag {kind!r}")

    def _output_size(self):
        try:
            return os.path.getsize(self.out_path)
        except OSError:
            return 0

    def _stuck(self, waited_s):
        """The process did not answer in time: ask for its stack, then kill it."""
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGUSR1)
            time.sleep(0.5)
        where = _reader_lines(self.printed(), self.path, self.source)
        message = (
            f"your code ran past the time limit of {self.check_timeout_s:g} s during "
            f"{self.what} and did not stop when its alarm rang (does it catch or "
            "ignore SIGALRM?): an infinite loop, or a wait that never ends?"
        )
        result = {"status": "timeout", "message": message, "where": where}
        return self._finish(ProcessEnded("timeout", result))

    def _end(self, kind, returncode, message=None):
        """The process is gone (or must go): say how, in the words of the verdict."""
        if returncode is None:  # it broke the protocol: the judge stops it
            self._wait_for_end()
            returncode = 0 if kind == "exit" else None
            message = message or (
                f"the process running your code stopped answering during {self.what} "
                "(its connection to the judge closed, or something else wrote on "
                "it): does your code call os._exit(), or write to file descriptors "
                "it did not open?"
            )
        if kind == "output" or returncode == -getattr(signal, "SIGXFSZ", 25):
            kind = "output"
            message = (
                f"your code printed more than {self.output_cap // (1024 * 1024)} MB "
                f"during {self.what} and was stopped: is a print inside a loop that "
                "never ends?"
            )
        elif returncode is not None and returncode < 0:
            kind = "crash"
            name = _signal_name(-returncode)
            what = (
                "a segmentation fault (it read or wrote memory it does not own)"
                if name == "SIGSEGV"
                else name
            )
            message = (
                f"the process running your code was killed by {what} during "
                f"{self.what}. What it printed (below) shows the line that crashed"
            )
        elif message is None:
            message = (
                f"the process running your code ended during {self.what} with exit "
                f"status {returncode} before the checks were done: does your code "
                "call sys.exit() or os._exit()?"
            )
        status = {"output": "error", "crash": "error"}.get(kind, "exit")
        result = {"status": status, "message": message}
        return self._finish(ProcessEnded(kind, result, returncode))

    def _finish(self, ended):
        self.ended = ended
        self.close()
        return ended

    def _wait_for_end(self):
        """The exit status the keeper reports once every process is gone."""
        self.kill()
        deadline = time.monotonic() + 5.0
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                data = wire.recv_bytes(self.sock, deadline)
            except (EOFError, OSError):  # TimeoutError is an OSError
                return None
            with contextlib.suppress(wire.WireError):
                reply = wire.loads_plain(data, lambda pid: None)
                if isinstance(reply, tuple) and reply and reply[0] == "ended":
                    return reply[1]
        return None

    def kill(self):
        if self.pid:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)

    def close(self):
        """End the run: the child exits; the keeper kills what is left, then says so."""
        if self.sock is None:
            return
        with contextlib.suppress(OSError):
            wire.send(self.sock, ("bye",))
        self.sock.settimeout(0.1)
        start = time.monotonic()
        killed = False
        try:
            # EOF comes once the child, the keeper and all they left are gone.
            while time.monotonic() - start < 6.0:
                if not killed and time.monotonic() - start > 1.0:
                    self.kill()
                    killed = True
                try:
                    chunk = self.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
        finally:
            self.sock.close()
            self.sock = None

    def printed(self):
        try:
            with open(self.out_path, "rb") as f:
                return f.read(self.output_cap).decode("utf-8", "replace")
        except OSError:
            return ""


def _judge_pickler():
    """The judge's pickler: the reader's objects go as their handles.

    Checks' functions go by name, lambdas by value (cloudpickle, where installed).
    """
    base = cloudpickle.CloudPickler if cloudpickle is not None else pickle.Pickler

    class JudgePickler(base):
        def persistent_id(self, obj):
            if isinstance(obj, RemoteObject):
                return ("h", object.__getattribute__(obj, "_key"))
            return None

    return JudgePickler


def _deeper_than(value, limit):
    """Whether containers nest deeper than ``limit`` in ``value`` (no recursion)."""
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (list, tuple, set, frozenset)):
            children = item
        elif isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        else:
            continue
        if depth >= limit:
            return True
        todo.extend((child, depth + 1) for child in children)
    return False


def _update_in_place(given, new):
    """Make the check's argument hold what the reader's function left in its copy.

    Tensors are copied into, lists and dicts updated item by item, so a check
    that keeps a reference to an inner tensor sees the change too.
    """
    if hasattr(given, "copy_") and hasattr(new, "shape"):
        if tuple(given.shape) == tuple(new.shape):
            given.copy_(new)
    elif isinstance(given, list) and isinstance(new, list):
        if len(given) == len(new):
            for i, (g, n) in enumerate(zip(given, new)):
                if hasattr(g, "copy_") or isinstance(g, (list, dict)):
                    _update_in_place(g, n)
                else:
                    given[i] = n
        else:
            given[:] = new
    elif isinstance(given, dict) and isinstance(new, dict):
        for key in [k for k in given if k not in new]:
            del given[key]
        for key, n in new.items():
            g = given.get(key)
            if key in given and (hasattr(g, "copy_") or isinstance(g, (list, dict))):
                _update_in_place(g, n)
            else:
                given[key] = n
    elif isinstance(given, (set, bytearray)) and type(new) is type(given):
        if isinstance(given, set):
            given.clear()
            given.update(new)
        else:
            given[:] = new


def _tensor(dtype, shape, values):
    # Never imported here: torch is loaded before any grade where tensors belong
    # (a lazy import would find modules the reader's code might have written).
    torch = sys.modules.get("torch")
    if torch is None:
        return values
    return torch.tensor(values, dtype=getattr(torch, str(dtype))).reshape(tuple(shape))


def _reader_lines(text, path, source):
    """The reader's lines in a stack dump: ``line N, in f: code``."""
    lines = source.decode("utf-8", "replace").splitlines()
    out = []
    pattern = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
    dump = text[text.rfind("Stack (most recent call first)") :]
    for filename, lineno, func in pattern.findall(dump):
        if os.path.abspath(filename) == os.path.abspath(path):
            n = int(lineno)
            code = lines[n - 1].strip() if 0 < n <= len(lines) else ""
            out.append(f"    line {n}, in {func}: {code}")
    return "\n".join(reversed(out[:4]))


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
