"""The exercises: what ``practice/exercises/*/exercise.toml`` says, read once.

One source of truth: the judge's table, the grading and the book's practice
page (``book/_ext/practice_page.py``) all read the exercises through
:func:`load_exercises`.

An exercise is a folder ``practice/exercises/NN_slug/`` holding
``exercise.toml`` (title, chapter, difficulty, ...), ``README.md`` (the
statement), ``starter.py`` (the pristine file the reader starts from),
``checks.py``, ``hints.md`` and ``solution.py``. The reader edits their own
copy of the starter, ``practice/workspace/NN_slug.py``.
"""

import dataclasses
import os
import re

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXERCISES_DIR = os.path.join(PRACTICE_DIR, "exercises")
# The reader's own files live under JUDGE_HOME (default: practice/), so tests can use a
# scratch folder.
JUDGE_HOME = os.environ.get("JUDGE_HOME") or PRACTICE_DIR
WORKSPACE_DIR = os.path.join(JUDGE_HOME, "workspace")
DIFFICULTIES = ("easy", "medium", "hard")
# Every exercise's time limits, times this: for a slow or busy machine, where a right
# answer on ranks can take longer than the limit (the judge's own tests set it: they
# run beside the book's other tests, several processes to a core).
TIME_SCALE = float(os.environ.get("JUDGE_TIME_SCALE") or 1)
FILES = (
    "exercise.toml",
    "README.md",
    "starter.py",
    "checks.py",
    "hints.md",
    "solution.py",
)


class CatalogError(Exception):
    """A malformed exercise folder, or an id that names no exercise.

    A malformed folder is a maintainer's error.
    """


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise, as its folder and ``exercise.toml`` describe it."""

    # the folder name, e.g. "06_assign_buckets": stable, used on the command line
    id: str
    number: str  # "06"
    slug: str  # "assign_buckets"; the book's label is practice-<slug>
    title: str
    chapter: int
    chapter_title: str
    difficulty: str
    summary: str
    ranks: bool  # needs torch.distributed ranks (runs only locally)
    browser: bool  # gradable in the book's page (standard library only)
    time_limit_s: float
    check_timeout_s: float
    dir: str
    index: int = 0  # its place in its chapter, by folder number: 1, 2, ...
    # a bug hunt: the starter is a script with one bug a real project shipped, and
    # runs (it fails the checks rather than saying "not written yet")
    bug_hunt: bool = False

    @property
    def short(self):
        """The id readers see everywhere: chapter and place in the chapter (``3.1``).

        The place is the folder order within the chapter (``index``), so the ids
        are generated, never typed; a test checks every text that names one.
        """
        return f"{self.chapter}.{self.index}"

    @property
    def order(self):
        """Where it comes in the book: its chapter, then its place in the chapter."""
        return (self.chapter, self.index)

    def path(self, name):
        """The path of one of the exercise's own files.

        Such as ``README.md`` or ``starter.py``.
        """
        return os.path.join(self.dir, name)

    @property
    def workspace(self):
        """The reader's copy of the starter: the file they edit and the judge grades."""
        return os.path.join(WORKSPACE_DIR, self.id + ".py")

    @property
    def label(self):
        """The cross-reference label of this exercise on the book's practice page."""
        return "practice-" + self.slug.replace("_", "-")

    def hints(self):
        """The hints, in order: the ``## Hint`` sections of ``hints.md``."""
        with open(self.path("hints.md"), encoding="utf-8") as f:
            text = f.read()
        parts = re.split(r"^## .*$", text, flags=re.M)[1:]
        return [p.strip() for p in parts if p.strip()]


def load_exercises(exercises_dir=EXERCISES_DIR):
    """Every exercise, in the book's order: by chapter, then place in the chapter.

    Raises :class:`CatalogError` naming a malformed folder.
    """
    if tomllib is None:
        raise CatalogError(
            "the judge needs Python 3.11 or newer (it reads TOML with tomllib)"
        )
    chapters = _read_toml(os.path.join(exercises_dir, "chapters.toml"))
    out = []
    for name in sorted(os.listdir(exercises_dir)):
        folder = os.path.join(exercises_dir, name)
        if not os.path.isdir(folder) or name.startswith((".", "_")):
            continue
        out.append(_load_one(folder, chapters))
    seen = {}
    numbered = []
    for ex in out:
        seen[ex.chapter] = seen.get(ex.chapter, 0) + 1
        numbered.append(dataclasses.replace(ex, index=seen[ex.chapter]))
    return sorted(numbered, key=lambda ex: ex.order)


def _read_toml(path):
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise CatalogError(f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{path} is not valid TOML: {e}") from None


def _load_one(folder, chapters):
    name = os.path.basename(folder)
    m = re.fullmatch(r"(\d\d)_([a-z0-9_]+)", name)
    if not m:
        raise CatalogError(
            f"exercise folder {name!r} must be named "
            "NN_slug (two digits, lower-case slug)"
        )
    missing = [f for f in FILES if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise CatalogError(f"exercise {name} lacks {', '.join(missing)}")
    meta = _read_toml(os.path.join(folder, "exercise.toml"))
    for key in ("title", "chapter", "difficulty", "summary"):
        if key not in meta:
            raise CatalogError(f"{name}/exercise.toml lacks the key {key!r}")
    if meta["difficulty"] not in DIFFICULTIES:
        raise CatalogError(
            f"{name}/exercise.toml: difficulty must be one of {DIFFICULTIES}, "
            f"got {meta['difficulty']!r}"
        )
    chapter = int(meta["chapter"])
    ranks = bool(meta.get("ranks", False))
    return Exercise(
        id=name,
        number=m.group(1),
        slug=m.group(2),
        title=meta["title"],
        chapter=chapter,
        chapter_title=chapters.get("titles", {}).get(
            str(chapter), f"Chapter {chapter}"
        ),
        difficulty=meta["difficulty"],
        summary=meta["summary"],
        ranks=ranks,
        browser=bool(meta.get("browser", False)),
        time_limit_s=TIME_SCALE * float(meta.get("time_limit_s", 240 if ranks else 60)),
        check_timeout_s=TIME_SCALE
        * float(meta.get("check_timeout_s", 12 if ranks else 10)),
        dir=folder,
        bug_hunt=bool(meta.get("bug_hunt", False)),
    )


def find(exercises, query):
    """The exercise that ``query`` names.

    ``query`` is its id (``3.1``: chapter 3, first exercise), or, as before
    the ids, its folder number (``6`` or ``06``), its folder name or slug, or a
    unique prefix.
    """
    q = str(query).strip().lower().rstrip("/")
    if re.fullmatch(r"\d+\.\d+", q):
        for ex in exercises:
            if q == ex.short:
                return ex
        shorts = ", ".join(ex.short for ex in exercises)
        raise CatalogError(
            f"there is no exercise '{query}'. The exercises are {shorts}; "
            f"run `python practice/judge.py` to see them all"
        )
    q = os.path.basename(q)
    if q.endswith(".py"):
        q = q[:-3]
    for ex in exercises:
        if q in (ex.id, ex.slug) or (q.isdigit() and int(q) == int(ex.number)):
            return ex
    matches = [ex for ex in exercises if ex.id.startswith(q) or ex.slug.startswith(q)]
    if len(matches) == 1:
        return matches[0]
    ids = ", ".join(ex.short for ex in exercises)
    if matches:
        raise CatalogError(
            f"'{query}' could mean "
            f"{', '.join(ex.id for ex in matches)}: give the number"
        )
    raise CatalogError(
        f"there is no exercise '{query}'. The exercises are {ids}; "
        f"run `python practice/judge.py` to see them all"
    )
