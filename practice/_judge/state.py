"""What the judge remembers: the reader's files and their progress.

* The reader's file for exercise X is ``practice/workspace/X.py``, a copy of
  the exercise's pristine ``starter.py`` made the first time it is needed.
  The judge reads it and never writes it, except on ``reset``, which first
  saves it to ``practice/.backup/``.
* Progress (passed or not, attempts, hints seen) is in
  ``practice/.progress.json``. Both are ignored by git, so pulling a new
  version of the book never conflicts with the reader's work.
  (``JUDGE_HOME`` moves all three somewhere else; the tests use it.)
"""

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import tempfile

from _judge.catalog import JUDGE_HOME

PROGRESS_FILE = os.path.join(JUDGE_HOME, ".progress.json")
BACKUP_DIR = os.path.join(JUDGE_HOME, ".backup")


def ensure_workspace(exercise):
    """The reader's file for ``exercise``, copied from the starter if it is missing."""
    path = exercise.workspace
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(exercise.path("starter.py"), path)
    return path


def is_untouched(exercise):
    """True when the reader's file is missing or still equal to the starter."""
    path = exercise.workspace
    if not os.path.exists(path):
        return True
    return file_hash(path) == file_hash(exercise.path("starter.py"))


def reset(exercise):
    """Put the pristine starter back.

    Returns the backup path of the reader's file, or None.
    """
    path = exercise.workspace
    backup = None
    if os.path.exists(path) and not is_untouched(exercise):
        os.makedirs(BACKUP_DIR, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        backup = os.path.join(BACKUP_DIR, f"{exercise.id}-{stamp}.py")
        shutil.copy2(path, backup)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    shutil.copyfile(exercise.path("starter.py"), path)
    return backup


def file_hash(path):
    """sha256 of a file's bytes (to tell whether it changed since it was graded)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


SEAL_SALT = b"data-parallel-from-scratch judge progress v2\n"


def seal_of(exercises):
    """A digest of the records: a file edited by anything but the judge lacks it.

    There is no secret here (the reader's machine holds everything): it catches
    a progress file written by other code, not one forged on purpose.
    """
    text = json.dumps(exercises, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(SEAL_SALT + text.encode()).hexdigest()


class Progress:
    """The progress file: one record per exercise id. Never raises on a damaged file.

    Every change is a read-modify-write under an exclusive lock
    (``fcntl.flock`` on ``.progress.lock``), written to a temporary file and
    moved into place, so two judges at once (``watch`` beside a grade) lose
    nothing and a crash never leaves half a file.
    """

    def __init__(self, path=PROGRESS_FILE):
        self.path = path
        self.warning = None
        self.data = self._read(warn=True)

    def _read(self, warn=False):
        data = {"version": 2, "exercises": {}}
        try:
            with open(self.path, encoding="utf-8") as f:
                loaded = json.load(f)
            if not (
                isinstance(loaded, dict) and isinstance(loaded.get("exercises"), dict)
            ):
                raise ValueError("unexpected layout")
        except FileNotFoundError:
            return data
        except (OSError, ValueError) as e:
            if warn:
                self.warning = (
                    f"ignored a damaged progress file {self.path} ({e}); "
                    "it will be rewritten"
                )
            return data
        records = loaded["exercises"]
        if loaded.get("seal") != seal_of(records):
            # Keep hints and attempts; drop the passes nobody can vouch for.
            for rec in records.values():
                if isinstance(rec, dict):
                    for key in ("state", "verdict", "graded_hash", "first_passed_at"):
                        rec.pop(key, None)
            if warn:
                self.warning = (
                    f"the progress file {self.path} was changed outside the judge: "
                    "its passes are not counted (grade them again: "
                    "`python practice/judge.py all`)"
                )
        data["exercises"] = {k: v for k, v in records.items() if isinstance(v, dict)}
        return data

    def record(self, exercise_id):
        """The record of one exercise (an empty one if never graded)."""
        return self.data["exercises"].setdefault(exercise_id, {})

    def passed(self, exercise_id):
        return self.data["exercises"].get(exercise_id, {}).get("state") == "passed"

    def note_grade(self, exercise, report, graded_hash=None):
        """Remember a grade of the reader's file; ``graded_hash``: of the snapshot."""

        def change(rec):
            rec["state"] = "passed" if report.passed else "failed"
            rec["verdict"] = report.verdict
            rec["attempts"] = rec.get("attempts", 0) + 1
            rec["graded_at"] = datetime.datetime.now().isoformat(timespec="seconds")
            if graded_hash:
                rec["graded_hash"] = graded_hash
            elif os.path.exists(exercise.workspace):
                rec["graded_hash"] = file_hash(exercise.workspace)
            if report.passed and "first_passed_at" not in rec:
                rec["first_passed_at"] = rec["graded_at"]

        self.update(exercise.id, change)

    def note_hint(self, exercise_id, shown):
        self.update(exercise_id, lambda rec: rec.__setitem__("hints_seen", shown))

    def forget_pass(self, exercise_id):
        """``reset``: the exercise is not passed any more (hints seen are kept)."""

        def change(rec):
            for key in ("state", "verdict", "graded_hash"):
                rec.pop(key, None)

        self.update(exercise_id, change)

    def update(self, exercise_id, change):
        """Apply ``change(record)`` to the file's current record, under the lock."""
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, ".progress.lock"), "a") as lock:
            _lock(lock)
            current = self._read()
            change(current["exercises"].setdefault(exercise_id, {}))
            current["seal"] = seal_of(current["exercises"])
            fd, tmp = tempfile.mkstemp(prefix=".progress-", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(current, f, indent=2, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            current.pop("seal")
            self.data = current


def _lock(f):
    try:
        import fcntl
    except ImportError:  # Windows: no flock; a single judge at a time is fine
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)


def state_of(exercise, progress):
    """The reader's state of one exercise.

    One of 'passed', 'passed, edited since', 'failed', 'edited' or 'not started'.
    """
    rec = progress.data["exercises"].get(exercise.id, {})
    if "state" in rec:
        changed = os.path.exists(exercise.workspace) and rec.get(
            "graded_hash"
        ) != file_hash(exercise.workspace)
        if rec["state"] == "passed":
            return "passed, edited since" if changed else "passed"
        return "edited" if changed else rec["state"]
    return "not started" if is_untouched(exercise) else "edited"
