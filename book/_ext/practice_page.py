"""Sphinx extension: the book's practice page, generated from ``practice/exercises/``.

One source: the page lists the exercises from the same metadata the judge
reads (``practice/_judge/catalog.py``), so a new exercise appears in the
judge's table and in the book at once.

* ``source-read``: in ``book/practice.md`` the line
  ``<!-- practice-exercises -->`` becomes a table of every exercise and one
  section per exercise (its statement, its chapter, its difficulty), each
  with the label ``practice-<slug>`` (e.g. ``practice-assign-buckets``) that
  chapters use to link their graded exercises:
  ``{ref}`practice-assign-buckets```. Exercises that need only the standard
  library get an editor and a Grade button; the others say how to grade them
  locally.
* ``build-finished``: writes ``_static/practice/bundle.json``: the
  judge's standard-library modules and each browser exercise's checks,
  starter and hints (as Markdown and as HTML), which ``_static/practice.js`` and
  ``practice-worker.js`` run in Pyodide.

Enabled in ``_config.yml``: ``sphinx: local_extensions: {practice_page: book/_ext/}``.
"""

import html
import json
import os
import re
import sys

from sphinx.util import logging

logger = logging.getLogger(__name__)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRACTICE = os.path.join(ROOT, "practice")
PAGE = "book/practice"
MARKER = "<!-- practice-exercises -->"
# The judge's modules the browser needs (standard library only).
BROWSER_JUDGE_FILES = (
    "__init__.py",
    "checking.py",
    "running.py",
    "loading.py",
    "browser.py",
)


def _catalog():
    if PRACTICE not in sys.path:
        sys.path.insert(0, PRACTICE)
    from _judge import catalog

    return catalog


def _chapter_doc(app, chapter):
    """The chapter's notebook doc name, if that chapter is in the book yet."""
    prefix = f"notebooks/{chapter:02d}_"
    matches = sorted(d for d in app.env.found_docs if d.startswith(prefix))
    return matches[0] if matches else None


def _statement(ex):
    """The README, without its title and the line about the practice page.

    Its headings become rubrics.
    """
    with open(ex.path("README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    # Sub-headings become rubrics: visible, but not thirteen times three entries
    # in the page's contents.
    text = "\n".join(
        f":::{{rubric}} {line.lstrip('#').strip()}\n:::"
        if re.match(r"#{2,5} ", line)
        else line
        for line in lines
    )
    # On this page the reader is already where that sentence points.
    text = re.sub(
        r"\n(This exercise needs|Needs) only Python:[^\n]*(\n[^\n]+)*", "\n", text
    )
    return text.strip()


def _editor(ex):
    with open(ex.path("starter.py"), encoding="utf-8") as f:
        starter = f.read()
    return "\n".join(
        [
            "```{raw} html",
            f'<div class="practice-editor" data-exercise="{ex.id}" '
            f'data-number="{ex.number}">',
            f'<label class="practice-label" for="practice-code-{ex.number}">'
            "Your solution (kept in this browser)</label>",
            f'<textarea id="practice-code-{ex.number}" class="practice-code" '
            'spellcheck="false" wrap="off" rows="18">'
            f"{html.escape(starter)}</textarea>",
            '<div class="practice-buttons">',
            '<button type="button" class="practice-grade">Grade</button>',
            '<button type="button" class="practice-hint">Hint</button>',
            '<button type="button" class="practice-reset">'
            "Reset to the starter</button>",
            '<span class="practice-status" aria-live="polite"></span>',
            "</div>",
            '<div class="practice-hints"></div>',
            '<pre class="practice-result" aria-live="polite"></pre>',
            "</div>",
            "```",
        ]
    )


def _local_note(ex):
    why = (
        "This exercise runs on several `torch.distributed` ranks, so the judge "
        "grades it locally"
        if not ex.browser
        else "The judge grades it on your machine"
    )
    return "\n".join(
        [
            ":::{admonition} Graded on your machine",
            ":class: tip",
            f"{why}: edit `practice/workspace/{ex.id}.py` (created from "
            "the starter on first use) and run "
            f"`python practice/judge.py {ex.short}`. "
            f"Hints: `python practice/judge.py hint {ex.short}`.",
            ":::",
        ]
    )


def render(app, editors=True):
    """The Markdown (MyST) that replaces the marker.

    A table, then one section per exercise. ``editors=False`` (the copy
    JupyterLab shows, book/_ext/lab_copies.py): no in-page editor, every exercise
    says how to grade it locally.
    """
    exercises = _catalog().load_exercises()
    out = ["| # | exercise | chapter | difficulty | graded |", "|---|---|---|---|---|"]
    for ex in exercises:
        where = "in this page or locally" if ex.browser else "locally (ranks)"
        out.append(
            f"| {ex.short} | {{ref}}`{ex.title} <{ex.label}>` "
            f"| {ex.chapter} "
            f"| {ex.difficulty} | {where} |"
        )
    out.append("")
    for ex in exercises:
        for name in (
            "README.md",
            "starter.py",
            "checks.py",
            "hints.md",
            "exercise.toml",
        ):
            app.env.note_dependency(ex.path(name))
        doc = _chapter_doc(app, ex.chapter)
        chapter = (
            f"{{doc}}`Chapter {ex.chapter}, {ex.chapter_title} </{doc}>`"
            if doc
            else f"Chapter {ex.chapter}, {ex.chapter_title}"
        )
        out += [
            f"({ex.label})=",
            f"## {ex.short} · {ex.title}",
            "",
            f"{chapter} · **{ex.difficulty}** · `python practice/judge.py {ex.short}`",
            "",
            _statement(ex),
            "",
            _editor(ex) if ex.browser and editors else _local_note(ex),
            "",
        ]
    return "\n".join(out)


def fill_page(app, docname, source):
    if docname == PAGE and MARKER in source[0]:
        source[0] = source[0].replace(MARKER, render(app))


def add_assets(app, pagename, templatename, context, doctree):
    if pagename == PAGE:  # only the practice page loads the editor's script and style
        app.add_js_file("practice.js")
        app.add_css_file("practice.css")


def _markdown_html(text):
    """A hint's Markdown as HTML (code, emphasis, lists; raw HTML is escaped).

    The page shows it as written: `code` as code, a line break inside a
    paragraph as a space.
    """
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).render(text)


def write_bundle(app, exception):
    """After an HTML build: ``_static/practice/bundle.json`` for the in-page grading."""
    if exception is not None or app.builder.format != "html":
        return
    bundle = {"judge": {}, "exercises": {}}
    for name in BROWSER_JUDGE_FILES:
        with open(os.path.join(PRACTICE, "_judge", name), encoding="utf-8") as f:
            bundle["judge"][name] = f.read()
    for ex in _catalog().load_exercises():
        if not ex.browser:
            continue
        files = {}
        for name in ("checks.py", "starter.py"):
            with open(ex.path(name), encoding="utf-8") as f:
                files[name] = f.read()
        bundle["exercises"][ex.id] = {
            "number": ex.number,
            "title": ex.title,
            "checks": files["checks.py"],
            "starter": files["starter.py"],
            "hints": ex.hints(),
            "hints_html": [_markdown_html(hint) for hint in ex.hints()],
        }
    dest = os.path.join(app.outdir, "_static", "practice")
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "bundle.json"), "w", encoding="utf-8") as f:
        json.dump(bundle, f)
    logger.info(
        f"practice_page: {len(bundle['exercises'])} exercises gradable in the browser"
    )


def always_reread(app, env, added, changed, removed):
    """Re-read the practice page on every build.

    A new exercise folder is no file it depends on yet.
    """
    return [PAGE] if PAGE in env.found_docs else []


def setup(app):
    app.connect("env-get-outdated", always_reread)
    app.connect("source-read", fill_page)
    app.connect("html-page-context", add_assets)
    app.connect("build-finished", write_bundle)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
