"""The fork server: one process that has imported torch once, forking a child per grade.

Two ways to run it:

* ``python server.py FD MODULE...``: started by :class:`sandbox.Server` with
  one end of a socket pair, for the grades of one process (the tests, a
  ``grade_file`` call). For each job it is sent, it forks a *keeper*, which
  forks the *child* that runs the reader's code (``child.py``); the checks
  run in the process that started the server.
* ``python server.py --listen PATH --idle S MODULE...``: the *grading
  service* that ``judge.py`` uses. It listens on a Unix socket in a private
  folder and outlives one command briefly (``S`` seconds idle, then it
  exits), so that a second grade within a minute costs no import of torch.
  For each grade a command asks for, it forks a *grader* (the judge's side:
  it loads the verified checks and runs them), which forks the keeper and
  the child. Requests and reports are JSON: nothing a client sends is
  unpickled here.

No process outlives a grade: on Linux the server, every grader and every
keeper are child subreapers (``prctl(PR_SET_CHILD_SUBREAPER)``), so a process
the reader's code detaches (double fork, ``setsid``) is re-parented to the
keeper, not to init; when the child ends, the keeper kills every process
below it, reports the child's exit status on the job's socket, and exits.
The child itself is confined before it loads anything of the reader's
(``confine.py``): it can write only its work folder.
"""

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
_FRAME = struct.Struct("!I")
MAX_REQUEST_BYTES = 1 << 20


def become_subreaper():
    """Orphans below this process come to it, not to init. Linux only; else False."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children_map():
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: parse after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(root):
    """Every process below ``root`` (from /proc; empty where there is no /proc)."""
    children = _children_map()
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def kill_descendants(root=None, spare=()):
    """SIGKILL every process below ``root`` (default: this one); reap what we can.

    The processes in ``spare``, and those below them, are left alone.
    """
    root = os.getpid() if root is None else root
    for _ in range(100):
        pids = [p for p in descendants(root) if p not in spare]
        spared = {q for s in spare for q in descendants(s)}
        pids = [p for p in pids if p not in spared]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        reap()
        time.sleep(0.005)
    reap()


def reap():
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


# ----------------------------------------------------------------------------
# Jobs: a keeper and the child that runs the reader's code
# ----------------------------------------------------------------------------


def fork_keeper(fd, job, close=()):
    """Fork a keeper for ``job`` talking on ``fd``; return its pid."""
    pid = os.fork()
    if pid == 0:
        for other in close:
            with contextlib.suppress(OSError):
                other.close()
        _keeper(fd, job)  # never returns
    return pid


class LocalJobs:
    """Jobs forked from this process: a grader's own (``sandbox.grade_file``)."""

    def __init__(self):
        self.keepers = set()

    def start_job(self, job):
        ours, theirs = socket.socketpair()
        self.keepers.add(fork_keeper(theirs.fileno(), job, close=[ours]))
        theirs.close()
        return ours

    def close(self):
        for pid in list(self.keepers):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self.keepers.discard(pid)


def serve(ctl):
    """Fork a keeper for each job sent on ``ctl`` until it closes."""
    become_subreaper()
    keepers = set()
    # A keeper that ended is reaped at once, not at the next job: a server that
    # outlives many grades (the tests' one) keeps no zombie below it.
    signal.signal(signal.SIGCHLD, lambda *_: _reap_keepers(keepers))
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 4)
        except InterruptedError:
            continue
        if not data:
            break
        job = json.loads(data)
        keepers.add(fork_keeper(fds[0], job, close=[ctl]))
        for fd in fds:
            os.close(fd)
        _reap_keepers(keepers)
    kill_descendants()


def _reap_keepers(keepers):
    for pid in list(keepers):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                keepers.discard(pid)


def _keeper(fd, job):
    from _judge import wire

    status = 0
    try:
        become_subreaper()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        child = os.fork()
        if child == 0:
            _child(fd, job)  # never returns
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:
                continue
        kill_descendants()
        sock = socket.socket(fileno=fd)
        with contextlib.suppress(OSError):
            wire.send(sock, ("ended", os.waitstatus_to_exitcode(status)))
    finally:
        os._exit(0)


def _child(fd, job):
    code = 1
    try:
        os.setsid()
        out = os.open(job["out_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(job["cwd"])
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        from _judge import child, confine

        os.environ["TMPDIR"] = job["cwd"]  # tempfile and torch write only here
        import tempfile

        tempfile.tempdir = job["cwd"]
        # One thread here (fork copies only the caller): Landlock binds it and all
        # it forks. Then the audit hook, which no code can remove.
        abi = confine.landlock(job["cwd"], hidden=job.get("hidden", ()))
        confine.audit(
            job["cwd"],
            job.get("references", ()),
            guard_writes=not abi,
            reader_path=job.get("reader_path"),
        )
        if job.get("repo") and job["repo"] not in sys.path:
            sys.path.append(job["repo"])  # mylib, for the reader's code and the workers
        child.main(fd, sandbox_abi=abi)
        code = 0
    except BaseException:
        import traceback

        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# ----------------------------------------------------------------------------
# The grading service
# ----------------------------------------------------------------------------


def send_json(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(_FRAME.pack(len(data)) + data)


def recv_json(sock, timeout_s):
    """One JSON frame; ``None`` if the peer closed, stalled or sent junk."""
    sock.settimeout(timeout_s)
    try:
        header = _read(sock, _FRAME.size)
        (size,) = _FRAME.unpack(header)
        if size > MAX_REQUEST_BYTES:
            return None
        return json.loads(_read(sock, size))
    except (OSError, EOFError, ValueError):
        return None


def _read(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _peer_ok(conn, server_pid):
    """The same user, and not a process below this server (the reader's code).

    Where the system cannot say who is on the other end (no ``SO_PEERCRED``,
    as on macOS), the socket's folder, which only this user can enter, is the
    check.
    """
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    try:
        creds = conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
        )
    except OSError:
        return False
    pid, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid() and pid not in descendants(server_pid)


def _grader(conn, request):
    """One grade, in a fork of the service: the checks run here, the code below."""
    become_subreaper()
    from _judge import catalog, sandbox

    _stop_when_gone(conn)
    try:
        exercises = catalog.load_exercises(request["exercises_dir"])
        exercise = catalog.find(exercises, request["id"])
        jobs = LocalJobs()
        report = sandbox.grade_file(
            exercise,
            request["path"],
            time_limit_s=request.get("time_limit_s"),
            check_timeout_s=request.get("check_timeout_s"),
            server=jobs,
        )
        jobs.close()
        send_json(conn, {"report": sandbox.report_to_plain(report)})
    except Exception as e:  # the judge's own failure: said, not hidden
        with contextlib.suppress(OSError):
            send_json(conn, {"error": f"{type(e).__name__}: {e}"})
    finally:
        kill_descendants()


def bind(path):
    """The service's listening socket at ``path``; None if another service has it."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
    except OSError:
        server.close()
        return None
    server.listen(16)  # clients may connect now; they wait while torch is imported
    return server


def _stop_when_gone(conn):
    """A command stopped with Ctrl-C closes its socket: the grade stops too."""
    import threading

    def watch():
        with contextlib.suppress(OSError):
            select.select([conn], [], [])
            if not conn.recv(1, socket.MSG_PEEK):
                kill_descendants()
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def listen(server, path, idle_s, owner=None):
    """Serve grades on ``server`` (bound at ``path``) until idle for ``idle_s`` s.

    With ``owner`` (a pid), also stop once that process is gone.
    """
    become_subreaper()
    me = os.getpid()
    bound = os.stat(path).st_ino
    graders = set()
    last = time.monotonic()
    try:
        while True:
            _reap_keepers(graders)
            for pid in set(_children_map().get(me, [])) - graders:
                kill_descendants(pid)  # an orphan (a grader that died): stop it
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            reap()
            now = time.monotonic()
            if graders:
                last = now
            elif now - last > idle_s or (owner and not _alive(owner)):
                break
            try:
                readable, _, _ = select.select([server], [], [], 0.25)
            except InterruptedError:
                continue
            if not readable:
                continue
            conn, _ = server.accept()
            last = time.monotonic()
            with conn:
                if not _peer_ok(conn, me):
                    continue
                request = recv_json(conn, 10.0)
                if not isinstance(request, dict):
                    continue
                op = request.get("op")
                if op == "ping":
                    send_json(conn, {"pid": me, "idle_s": idle_s})
                elif op == "stop":
                    send_json(conn, {"pid": me})
                    break
                elif op == "grade":
                    _import(request.get("preload", ()))  # once, for later grades too
                    pid = os.fork()
                    if pid == 0:
                        code = 0
                        try:
                            server.close()
                            _grader(conn, request)
                        except BaseException:
                            code = 1
                        finally:
                            os._exit(code)
                    graders.add(pid)
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == bound:
                os.unlink(path)
                os.unlink(path + ".lock")  # the clients' lock for starting it
        server.close()
        kill_descendants()


def _import(names):
    """Import what an exercise's checks list (module names of torch), here, once."""
    for name in names:
        if (
            isinstance(name, str)
            and name not in sys.modules
            and all(part.isidentifier() for part in name.split("."))
        ):
            with contextlib.suppress(Exception):
                __import__(name)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


EAGER = (  # the judge's modules and what they import lazily: all before any grade
    "_judge.wire",
    "_judge.catalog",
    "_judge.manifest",
    "_judge.checking",
    "_judge.running",
    "_judge.loading",
    "_judge.remote",
    "_judge.ranks",
    "_judge.sandbox",
    "_judge.child",
    "_judge.confine",
    "_judge.tamper",
    "json",
    "tomllib",
    "traceback",
    "cloudpickle",
)


def main(argv):
    if argv[1] == "--listen":
        path, idle_s = argv[2], float(argv[4])
        owner = int(argv[6]) if len(argv) > 6 and argv[5] == "--owner" else None
        modules = argv[7:] if owner else argv[5:]
        listening = bind(path)
        if listening is None:
            return  # another service took the address first: the client uses it
    else:
        ctl = socket.socket(fileno=int(argv[1]))
        modules = argv[2:]
    for name in (*EAGER, *modules):
        with contextlib.suppress(Exception):
            __import__(name)
    if argv[1] == "--listen":
        listen(listening, path, idle_s, owner)
    else:
        serve(ctl)


if __name__ == "__main__":
    _boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot.py")
    with open(_boot, "rb") as _f:
        exec(
            compile(_f.read(), _boot, "exec"), {"__file__": _boot, "__name__": "_boot"}
        )
    main(sys.argv)
