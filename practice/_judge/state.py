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


class Progress:
    """The progress file: one record per exercise id. Never raises on a damaged file."""

    def __init__(self, path=PROGRESS_FILE):
        self.path = path
        self.warning = None
        self.data = {"version": 1, "exercises": {}}
        try:
            with open(path, encoding="utf-8") as f:
                loaded = json.load(f)
            if isinstance(loaded, dict) and isinstance(loaded.get("exercises"), dict):
                self.data = loaded
            else:
                raise ValueError("unexpected layout")
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            self.warning = (
                f"ignored a damaged progress file {path} ({e}); it will be rewritten"
            )

    def record(self, exercise_id):
        """The record of one exercise (an empty one if never graded)."""
        return self.data["exercises"].setdefault(exercise_id, {})

    def passed(self, exercise_id):
        return self.data["exercises"].get(exercise_id, {}).get("state") == "passed"

    def note_grade(self, exercise, report):
        rec = self.record(exercise.id)
        rec["state"] = "passed" if report.passed else "failed"
        rec["verdict"] = report.verdict
        rec["attempts"] = rec.get("attempts", 0) + 1
        rec["graded_at"] = datetime.datetime.now().isoformat(timespec="seconds")
        if os.path.exists(exercise.workspace):
            rec["graded_hash"] = file_hash(exercise.workspace)
        if report.passed and "first_passed_at" not in rec:
            rec["first_passed_at"] = rec["graded_at"]
        self.save()

    def note_hint(self, exercise_id, shown):
        self.record(exercise_id)["hints_seen"] = shown
        self.save()

    def save(self):
        """Write atomically: a crash mid-write never leaves half a file."""
        directory = os.path.dirname(self.path)
        fd, tmp = tempfile.mkstemp(prefix=".progress-", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=2, sort_keys=True)
        os.replace(tmp, self.path)


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
