"""Confining the process that runs the reader's code to its own work folder.

A graded file must not change what this grade, or any later one, does: no
module written beside the judge's (``practice/cloudpickle.py``), no forged
``__pycache__/*.pyc``, no rewritten ``checks.py`` and manifest, no ``.pth``
file in ``site-packages``. So the process that runs the reader's code (and
every rank it forks) may write only its work folder, a temporary folder the
judge removes after the grade. Two layers, both set up in that process
before the reader's file is loaded:

* :func:`landlock` (Linux 5.13 and later, no privileges needed): the kernel
  refuses every write outside the work folder, whatever makes it (Python,
  a subprocess, C code), and refuses reading the exercises' folder (the
  reference solutions) and the repository's ``.git``. Landlock also keeps
  the process from tracing, or (kernel 6.12 and later) signalling, any
  process outside its sandbox: the judge, the fork server.
* :func:`audit` (every system, PEP 578 audit hooks, which cannot be
  removed once added): opening an exercise's ``solution.py`` or
  ``checks.py`` is refused and noted, so the report can say so. Where
  Landlock is missing, the hook also refuses writes outside the work folder
  and starting programs, through Python's own functions; code that calls
  the C library directly gets past it, and the judge's check of its own
  files after the grade (``tamper.py``) is then the last line.

Standard library only.
"""

import ctypes
import os
import sys

# include/uapi/linux/landlock.h
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every arch
_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
TRUNCATE, IOCTL_DEV = 1 << 14, 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
# Every file-system right each ABI version knows (ABI 2 adds REFER, 3 TRUNCATE,
# 5 IOCTL_DEV): a right the ruleset handles is refused unless a rule allows it.
_FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _Ruleset(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi():
    """The kernel's Landlock ABI version, or 0 where there is none (or not Linux)."""
    if not sys.platform.startswith("linux") or os.environ.get("JUDGE_SANDBOX") == (
        "none"
    ):
        return 0
    try:
        abi = _libc().syscall(_CREATE_RULESET, None, 0, _RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def readable_rules(hidden):
    """Paths to grant reading so that everything is readable except ``hidden``.

    Landlock only allows, so hiding a folder means allowing each sibling along
    the way down to it instead of its parent. Symbolic links on the way are
    skipped (their target is reached through its real path).
    """
    hidden = {os.path.realpath(h) for h in hidden if os.path.exists(h)}
    if not hidden:
        return ["/"]
    rules = []

    def on_the_way(path):
        return any(h == path or h.startswith(path.rstrip("/") + "/") for h in hidden)

    def walk(folder):
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if not on_the_way(real):
                rules.append(path)
            elif real == path and real not in hidden:
                walk(path)

    walk("/")
    return rules


def landlock(work_dir, hidden=()):
    """Confine this thread (and whatever it forks later) with Landlock.

    Reading and executing stay allowed everywhere but under ``hidden``;
    writing only under ``work_dir`` (and ``/dev/null``). Returns the ABI
    version used, or 0 when Landlock is not available (nothing is confined).
    Call it while the process has one thread: rules bind the calling thread
    and its future children only.
    """
    abi = landlock_abi()
    if abi < 1:
        return 0
    libc = _libc()
    fs_rights = _FS_RIGHTS[max(v for v in _FS_RIGHTS if v <= abi)]
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = _Ruleset(
        fs_rights, 0, (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) * (abi >= 6)
    )
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        return 0
    read = (EXECUTE | READ_FILE | READ_DIR | (IOCTL_DEV if abi >= 5 else 0)) & fs_rights
    file_only = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
    try:
        rules = [(path, read) for path in readable_rules(hidden)]
        rules += [
            (work_dir, fs_rights),
            ("/dev/null", READ_FILE | WRITE_FILE | TRUNCATE),
        ]
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    access &= file_only
                rule = _PathBeneath(access & fs_rights, fd)
                if libc.syscall(
                    _ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0
                ):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_RESTRICT_SELF, ruleset, 0):
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


# ----------------------------------------------------------------------------
# The audit hook
# ----------------------------------------------------------------------------

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Audit events that change the file system, and which arguments name the paths.
_CHANGES = {
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
    "shutil.copytree": (1,),
    "shutil.move": (1,),
    "shutil.unpack_archive": (1,),
}
_PROGRAMS = ("os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen")


class Noticed:
    """What the audit hook saw the reader's code try; the report says so."""

    def __init__(self):
        self.read_reference = []  # exercise files it opened (refused)
        self.wrote_outside = []  # writes outside its work folder (refused)


NOTICED = Noticed()


def _path(value):
    if isinstance(value, int) or value is None:
        return None
    try:
        return os.path.realpath(os.fsdecode(value))
    except (TypeError, ValueError):
        return None


def _from_reader(reader_path):
    """Whether a frame of the reader's file is on this thread's stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == reader_path:
            return True
        frame = frame.f_back
    return False


def audit(work_dir, reference_dirs, guard_writes, reader_path=None):
    """Add the audit hook (for good: a hook cannot be removed).

    Opening a file under ``reference_dirs`` (the exercises: their solutions
    and checks) raises ``PermissionError``; so does writing outside
    ``work_dir``. When the reader's code did it (a frame of ``reader_path``
    is on the stack), it is noted in :data:`NOTICED` for the report. Where
    Landlock confines the process (``guard_writes`` false) the kernel refuses
    the writes anyway, whatever makes them; otherwise the hook also refuses
    starting programs, which it cannot follow.
    """
    work = os.path.realpath(work_dir)
    references = tuple(os.path.realpath(d) + os.sep for d in reference_dirs)
    allowed = (work + os.sep, "/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty")
    own = os.path.realpath(reader_path) if reader_path else None

    def outside(path):
        return path is not None and not (path == work or path.startswith(allowed))

    def refuse(what, notes, path):
        if reader_path and _from_reader(reader_path):
            notes.append(path)
        why = (
            "the exercises' solutions and checks are not for graded code"
            if what == "read"
            else "graded code may write only its own work folder"
        )
        raise PermissionError(
            f"the judge does not let graded code {what} {path}: {why}"
        )

    def hook(event, args):
        if event == "open":
            path = _path(args[0])
            if path is None:
                return
            if path.startswith(references) and path != own:
                refuse("read", NOTICED.read_reference, path)
            mode, flags = args[1] or "", args[2] or 0
            if outside(path) and (
                any(c in mode for c in "wax+") or flags & _WRITE_FLAGS
            ):
                refuse("write", NOTICED.wrote_outside, path)
        elif event in _CHANGES:
            for i in _CHANGES[event]:
                if i < len(args) and outside(_path(args[i])):
                    refuse(f"change ({event})", NOTICED.wrote_outside, _path(args[i]))
        elif guard_writes and event.startswith(_PROGRAMS):
            refuse("start a program", NOTICED.wrote_outside, f"({event})")

    sys.addaudithook(hook)
