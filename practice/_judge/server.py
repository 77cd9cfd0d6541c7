"""The fork server: one process that has imported torch once, forking a child per grade.

The judge starts it (``python server.py FD MODULE...``) with one end of a
socket pair. It imports the modules named (torch, torch.distributed, ...),
then for each job the judge sends (a socket for the job, the output file,
the working folder) it forks a *keeper*, which forks the *child* that runs
the reader's code (``child.py``). ``watch`` keeps one server for all its
grades and ``all`` one for all its exercises, so a rank exercise does not
pay for importing torch again.

No process outlives a grade: on Linux the server and every keeper are child
subreapers (``prctl(PR_SET_CHILD_SUBREAPER)``), so a process the reader's
code detaches (double fork, ``setsid``) is re-parented to the keeper, not to
init; when the child ends, the keeper kills every process below it, reports
the child's exit status on the job's socket, and exits. The judge reads
that report as the end of the run.
"""

import contextlib
import ctypes
import os
import pickle
import signal
import socket
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Orphans below this process come to it, not to init. Linux only; else False."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root):
    """Every process below ``root`` (from /proc; empty where there is no /proc)."""
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
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
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def kill_descendants(root=None):
    """SIGKILL every process below ``root`` (default: this one); reap what we can."""
    root = os.getpid() if root is None else root
    for _ in range(100):
        pids = descendants(root)
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


def serve(ctl):
    become_subreaper()
    signal.signal(signal.SIGCHLD, lambda *_: None)
    keepers = set()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 4)
        except InterruptedError:
            continue
        if not data:
            break
        job = pickle.loads(data)
        pid = os.fork()
        if pid == 0:
            ctl.close()
            _keeper(fds[0], job)  # never returns
        keepers.add(pid)
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
        from _judge import wire

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
        from _judge import child

        child.main(fd)
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


def main(argv):
    ctl = socket.socket(fileno=int(argv[1]))
    for name in argv[2:]:
        with contextlib.suppress(Exception):
            __import__(name)
    serve(ctl)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv)
