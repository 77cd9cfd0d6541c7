"""The judge's last line: were its own files changed while the reader's code ran?

``confine.py`` keeps the reader's process from writing anything but its work
folder. Where it cannot (no Landlock, and code that calls the C library
itself), the judge looks for itself: :func:`take` records, before the grade,
every file and folder that decides what a grade does, and :func:`changes`
lists what differs after it. A grade with changes is refused, and
:func:`undo` removes what it created and puts back what it changed, so that
nothing it wrote survives into a later grade:

* the judge (``practice/judge.py``, ``practice/_judge/`` with its
  ``__pycache__``), the exercises and their manifest: contents kept, so they
  can be restored;
* ``practice/`` itself and every folder on the judge's ``sys.path`` (a new
  module there, or a ``.pth`` file that Python runs at start-up, is removed)
  and every module file the judge has imported (size, times and inode: a
  program cannot set a file's ``ctime`` back).

Standard library only.
"""

import contextlib
import os
import shutil
import sys

JUDGE_DIR = os.path.dirname(os.path.abspath(__file__))
KEEP_BYTES = 8 * 1024 * 1024  # the judge and the exercises: under a megabyte
# The reader's own files beside the judge (state.py): the judge writes them itself.
READERS = ("workspace", ".backup", ".progress")
CODE = (".py", ".pyc", ".pth", ".so", ".zip", ".egg-link")  # what Python may import


def _stat(path):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _tree(root):
    """``root``, and every folder and file below it."""
    folders, files = [root], []
    for folder, dirs, names in os.walk(root):
        folders += [os.path.join(folder, d) for d in dirs]
        files += [os.path.join(folder, n) for n in names]
    return folders, files


class Snapshot:
    """What :func:`take` saw."""

    def __init__(self):
        self.meta = {}  # path -> _stat(path), for every file watched
        self.contents = {}  # path -> bytes, for the judge's own files
        self.listings = {}  # folder -> the names in it
        self.own_folders = set()  # folders of the judge and the exercises


def take(exercises_dir):
    """Record the judge's files, the exercises, ``sys.path`` and imported modules."""
    snap = Snapshot()
    exercises_dir = os.path.abspath(exercises_dir)
    practice = os.path.dirname(exercises_dir)
    own_files = [os.path.join(os.path.dirname(JUDGE_DIR), "judge.py")]
    for root in (JUDGE_DIR, exercises_dir):
        folders, files = _tree(root)
        snap.own_folders.update(folders)
        own_files += files
    others = {practice, os.path.dirname(JUDGE_DIR)}
    others.update(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p))
    modules = []
    for module in list(sys.modules.values()):
        for attr in ("__file__", "__cached__"):
            path = getattr(module, attr, None)
            if isinstance(path, str):
                modules.append(path)
    for path in (*own_files, *modules):
        snap.meta[path] = _stat(path)
    total = 0
    for path in own_files:
        if total < KEEP_BYTES:
            with contextlib.suppress(OSError), open(path, "rb") as f:
                snap.contents[path] = f.read()
                total += len(snap.contents[path])
    for folder in snap.own_folders | others:
        with contextlib.suppress(OSError):
            snap.listings[folder] = set(os.listdir(folder))
    return snap


def changes(before):
    """What differs from ``before``: (created, changed), sorted lists of paths."""
    changed = [p for p, was in before.meta.items() if _stat(p) != was]
    created = []
    for folder, names in before.listings.items():
        try:
            now = set(os.listdir(folder))
        except OSError:
            continue
        own = folder in before.own_folders
        created += [
            os.path.join(folder, n)
            for n in now - names
            if own or (not n.startswith(READERS) and _importable(folder, n))
        ]
    return sorted(created), sorted(changed)


def _importable(folder, name):
    """A file Python could import, or a package (a folder with ``__init__.py``)."""
    path = os.path.join(folder, name)
    return name.endswith(CODE) or os.path.isfile(os.path.join(path, "__init__.py"))


def undo(before, created, changed):
    """Remove what was created, restore what was changed; return what is left.

    In the judge's own folders everything new goes; elsewhere (``practice/``,
    ``sys.path``) only what Python could import is ever listed (:func:`changes`).
    """
    left = []
    for path in created:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            left.append(path)
    for path in changed:
        if path not in before.contents:
            left.append(path)
            continue
        try:
            tmp = path + ".judge-restore"
            with open(tmp, "wb") as f:
                f.write(before.contents[path])
            os.replace(tmp, path)
        except OSError:
            left.append(path)
    return left
