"""The exercises' files, checked against a committed list of their hashes.

``practice/exercises/MANIFEST.sha256`` holds the sha256 of every file of
every exercise (``sha256sum`` format). Before grading, the judge checks the
exercise's files against it and refuses a changed ``checks.py`` (or
starter, statement, ...) by name, with the command that restores it: code
that rewrote a check, by accident or not, never grades anything.

Regenerate it after changing an exercise: ``make practice-manifest``
(``python practice/_judge/manifest.py``).
"""

import hashlib
import os
import sys

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXERCISES_DIR = os.path.join(PRACTICE_DIR, "exercises")
MANIFEST = os.path.join(EXERCISES_DIR, "MANIFEST.sha256")


class Tampered(Exception):
    """An exercise file differs from the manifest (the message names it)."""


def exercise_files(exercises_dir=EXERCISES_DIR):
    """Every file the manifest covers, as paths relative to ``exercises_dir``."""
    out = []
    for folder in sorted(os.listdir(exercises_dir)):
        full = os.path.join(exercises_dir, folder)
        if folder.startswith((".", "_")) or not os.path.isdir(full):
            continue
        for name in sorted(os.listdir(full)):
            if os.path.isfile(os.path.join(full, name)) and not name.endswith(".pyc"):
                out.append(f"{folder}/{name}")
    if os.path.isfile(os.path.join(exercises_dir, "chapters.toml")):
        out.append("chapters.toml")
    return out


def digest(data):
    return hashlib.sha256(data).hexdigest()


def render(exercises_dir=EXERCISES_DIR):
    lines = []
    for rel in exercise_files(exercises_dir):
        with open(os.path.join(exercises_dir, rel), "rb") as f:
            lines.append(f"{digest(f.read())}  {rel}\n")
    return "".join(lines)


def read(path=MANIFEST):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    table = {}
    for line in text.splitlines():
        if line.strip():
            value, rel = line.split(None, 1)
            table[rel.strip()] = value
    return table


def verified(exercise, name):
    """The bytes of ``exercise``'s file ``name``, read once and checked.

    The manifest is the one beside the exercise's folder. Raises
    :class:`Tampered` naming the file and the fix.
    """
    manifest_path = os.path.join(os.path.dirname(exercise.dir), "MANIFEST.sha256")
    rel = f"{os.path.basename(exercise.dir)}/{name}"
    path = os.path.join(exercise.dir, name)
    with open(path, "rb") as f:
        data = f.read()
    table = read(manifest_path)
    shown = os.path.relpath(path)
    if table is None:
        raise Tampered(
            f"{os.path.relpath(manifest_path)} is missing: restore it with "
            f"`git checkout -- {os.path.relpath(manifest_path)}`"
        )
    if rel not in table:
        raise Tampered(
            f"{shown} is not in the manifest of the exercises: a maintainer adding "
            "an exercise runs `make practice-manifest`"
        )
    if digest(data) != table[rel]:
        raise Tampered(
            f"{shown} has been changed (its hash differs from "
            "practice/exercises/MANIFEST.sha256), so this exercise cannot be "
            f"graded: restore it with `git checkout -- {shown}`"
        )
    return data


def write(exercises_dir=EXERCISES_DIR):
    path = os.path.join(exercises_dir, "MANIFEST.sha256")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(exercises_dir))
    return path


def main():
    path = write()
    print(f"wrote {os.path.relpath(path)} ({len(exercise_files())} files)")


if __name__ == "__main__":
    sys.exit(main())
