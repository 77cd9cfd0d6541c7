"""Sphinx extension: exercises numbered within their chapter (6.1, 6.2, ...).

sphinx-exercise numbers its ``{exercise}`` directives like figures, with
Sphinx's ``numfig``: one count across the whole book, so chapter 6 opened on
"Exercise 16", which reads as if fifteen had been skipped. Sphinx keeps those
numbers in ``env.toc_fignumbers[docname]["exercise"]`` (``{id: (n,)}``, filled
by its toctree collector on ``env-get-updated``); this handler runs after it and
renumbers each chapter's exercises ``(chapter, k)`` in page order, the chapter
being the number that starts the notebook's name (``notebooks/06_zero`` -> 6).
The page titles ("Exercise 6.1"), the solutions' "Solution to Exercise 6.1" and
``{numref}`` all read these numbers. Pages that are not numbered chapters keep
Sphinx's numbers.
"""

import re

CHAPTER = re.compile(r"(?:^|/)(\d+)_[^/]*$")


def chapter_of(docname):
    """The chapter number of a page, or None (``notebooks/06_zero`` -> 6)."""
    match = CHAPTER.search(docname)
    return int(match[1]) if match else None


def per_chapter(numbers, chapter):
    """``{id: (k,)}`` in book order -> ``{id: (chapter, 1..)}`` in the same order."""
    ordered = sorted(numbers, key=lambda label: numbers[label])
    return {label: (chapter, k) for k, label in enumerate(ordered, start=1)}


def renumber(app, env):
    changed = []
    for docname, kinds in env.toc_fignumbers.items():
        chapter = chapter_of(docname)
        exercises = kinds.get("exercise")
        if chapter is None or not exercises:
            continue
        renumbered = per_chapter(exercises, chapter)
        if renumbered != exercises:
            kinds["exercise"] = renumbered
            changed.append(docname)
    return changed


def setup(app):
    # after Sphinx's own numbering (TocTreeCollector, also on env-get-updated)
    app.connect("env-get-updated", renumber, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
