"""The book's MyST, rewritten into what JupyterLab (jupyterlab-myst) resolves by itself.

jupyterlab-myst renders each Markdown cell (or Markdown file) on its own: it knows
no glossary, no other notebook's labels, no ``{glue}`` values and no bibliography,
and does not know the ``{exercise}`` directive. The site (Sphinx) resolves all of
them. So the copies ``make lab`` opens (book/_ext/lab_copies.py) get, in their
Markdown, what the site shows:

* ``{term}`` -> a link to the term in ``book/glossary.md`` (its own rewritten copy);
* ``{ref}``, ``{numref}`` -> a link to the label (``#label`` in the same notebook,
  ``other.ipynb#label`` or ``../book/page.md#label`` elsewhere), with the text the
  site shows (the heading's title, "Exercise (The best cap)", "3.1 · Assign ...");
* ``{doc}`` -> a link to the notebook or page, titled as on the site;
* ``{cite}`` -> "(Author Year)" linking to the entry in ``book/references.md``;
* ``{glue:text}`` -> the value the notebook glued, formatted as the site formats it;
* ``[text](label)`` (MyST's link to a label) -> a link to it, as ``{ref}``;
* ``{exercise}``/``{solution}`` -> an admonition titled as the site titles it,
  "Exercise (The best cap)", and a dropdown "Solution to Exercise (The best cap)".
  A chapter's own exercises carry a title, not a number: numbers are the graded
  exercises' ids (3.1 is the practice page's "Assign parameters to buckets").

jupyterlab-myst gives an element the id of the ``(label)=`` before it when that
element is a heading or a paragraph (checked in JupyterLab 4.6 with jupyterlab-myst
2.7), so every target written here is one of those.
"""

import json
import posixpath
import re

ROLE = re.compile(r"\{(term|ref|numref|doc|cite(?::[pt])?|glue:text)\}`([^`]*)`")
LABEL_LINK = re.compile(r"\]\(([A-Za-z][A-Za-z0-9_:-]*)\)")
LABEL = re.compile(r"^\((?P<label>[A-Za-z0-9_.:-]+)\)=\s*$", re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
EXERCISE = re.compile(
    r"^(?P<fence>:{3,})\{exercise\}(?P<title>[^\n]*)\n(?P<opts>(?::[a-z-]+:[^\n]*\n)*)"
    r"(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.M | re.S,
)
SOLUTION = re.compile(
    r"^(?P<fence>:{3,})\{solution\}\s*(?P<label>\S+)\s*\n(?P<opts>(?::[a-z-]+:[^\n]*\n)*)",
    re.M,
)


def slug(text):
    """A term's anchor, as Sphinx makes it: ``term-all-reduce``."""
    return "term-" + re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def split_target(content):
    """``text <target>`` -> (text, target); ``target`` -> (None, target)."""
    match = re.match(r"^(.*?)\s*<([^<>]+)>\s*$", content, re.S)
    if match and match.group(1):
        return match.group(1), match.group(2)
    return None, content.strip()


def headings_and_labels(markdown):
    """``[(label, title)]``: each ``(label)=`` and the heading or text after it."""
    found = []
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        match = LABEL.match(line)
        if not match:
            continue
        title = None
        for after in lines[i + 1 :]:
            if after.strip():
                heading = HEADING.match(after)
                title = heading.group(2) if heading else None
                break
        found.append((match.group("label"), title))
    return found


def first_heading(markdown):
    for line in markdown.splitlines():
        heading = HEADING.match(line)
        if heading and len(heading.group(1)) == 1:
            return heading.group(2)
    return None


def exercise_labels(markdown):
    """The ``:label:`` of each ``{exercise}``, in page order."""
    return [label for label, _ in exercises(markdown)]


def exercises(markdown):
    """``[(label, heading)]`` of each ``{exercise}``: "Exercise (its title)"."""
    found = []
    for match in EXERCISE.finditer(markdown):
        label = re.search(r"^:label:\s*(\S+)", match.group("opts"), re.M)
        title = match.group("title").strip()
        found.append(
            (
                label.group(1) if label else None,
                f"Exercise ({title})" if title else "Exercise",
            )
        )
    return found


class Index:
    """What the site knows across pages: labels, titles, terms, citations.

    ``labels``: label -> (path of the page in the copies, link text);
    ``titles``: page path -> title; ``terms``: lower-case term -> anchor;
    ``cite``: key -> "Author Year"; ``exercises``: exercise label -> its heading,
    "Exercise (The best cap)".
    """

    def __init__(self):
        self.labels, self.titles, self.terms, self.cite, self.exercises = (
            {},
            {},
            {},
            {},
            {},
        )

    def add_page(self, path, markdown):
        """Index one page (a notebook's Markdown cells joined, or a .md file)."""
        self.titles.setdefault(path, first_heading(markdown) or path)
        for label, title in headings_and_labels(markdown):
            self.labels.setdefault(label, (path, title or label))
        for label, heading in exercises(markdown):
            if label:
                self.exercises[label] = heading
                self.labels[label] = (path, heading)


def rewrite(markdown, path, index, glue=None, problems=None):
    """``markdown`` of the page at ``path`` (in the copies), rewritten for JupyterLab.

    ``glue``: name -> text/plain of the values this notebook glued. What cannot
    be resolved is left as plain text and reported in ``problems``.
    """
    problems = [] if problems is None else problems
    here = posixpath.dirname(path)

    def link(target_path, anchor=""):
        rel = "" if target_path == path else posixpath.relpath(target_path, here)
        return rel + (f"#{anchor}" if anchor else "")

    def role(match):
        kind, content = match.group(1), match.group(2)
        text, target = split_target(content)
        if kind == "term":
            anchor = index.terms.get(target.lower())
            if anchor is None:
                problems.append(f"{path}: no glossary term {target!r}")
                return text or target
            return f"[{text or target}]({link('book/glossary.md', anchor)})"
        if kind in ("ref", "numref"):
            found = index.labels.get(target)
            if found is None:
                problems.append(f"{path}: no label {target!r}")
                return text or target
            page, title = found
            return f"[{text or title}]({link(page, target)})"
        if kind == "doc":
            page = doc_path(target, path)
            if page not in index.titles:
                problems.append(f"{path}: no page {target!r}")
                return text or target
            return f"[{text or index.titles[page]}]({link(page)})"
        if kind.startswith("cite"):
            keys = [k.strip() for k in target.split(",")]
            missing = [k for k in keys if k not in index.cite]
            if missing:
                problems.append(f"{path}: no reference {missing}")
            cited = "; ".join(
                f"[{index.cite[k]}]({link('book/references.md', k)})"
                for k in keys
                if k in index.cite
            )
            return f"({cited})" if cited else target
        if kind == "glue:text":
            return glued(target, glue or {}, path, problems)
        return match.group(0)

    def label_link(match):  # [text](label): MyST's link to a label
        found = index.labels.get(match.group(1))
        if found is None:
            return match.group(0)
        return f"]({link(found[0], match.group(1))})"

    markdown = exercises_as_admonitions(markdown, index, path, problems)
    return LABEL_LINK.sub(label_link, ROLE.sub(role, markdown))


def doc_path(target, path):
    """A ``{doc}`` target (relative to the page at ``path``, or absolute): its copy."""
    if target.startswith("/"):
        name = target.lstrip("/")
    else:
        name = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return name + (".ipynb" if name.startswith("notebooks/") else ".md")


def glued(content, glue, path, problems):
    """``{glue:text}`name:fmt``` -> the value, formatted as myst-nb formats it."""
    from myst_nb.core.variables import format_plain_text

    name, fmt = content.rsplit(":", 1) if ":" in content else (content, "")
    if name not in glue:
        problems.append(f"{path}: nothing glued as {name!r}")
        return content
    return format_plain_text(glue[name], fmt)


def exercises_as_admonitions(markdown, index, path, problems):
    """``{exercise}`` -> an "Exercise (title)" admonition; ``{solution}`` -> a dropdown.

    The label goes on the exercise's first paragraph, which jupyterlab-myst gives
    the id.
    """

    def exercise(match):
        label = re.search(r"^:label:\s*(\S+)", match.group("opts"), re.M)
        label = label.group(1) if label else None
        title = match.group("title").strip()
        heading = f"Exercise ({title})" if title else "Exercise"
        fence = match.group("fence")
        body = match.group("body").lstrip("\n")
        target = f"({label})=\n" if label else ""
        return f"{fence}{{admonition}} {heading}\n:class: tip\n{target}{body}{fence}"

    def solution(match):
        label = match.group("label")
        heading = index.exercises.get(label)
        if heading is None:
            problems.append(f"{path}: a solution to no exercise {label!r}")
            heading = "Exercise"
        return f"{match.group('fence')}{{dropdown}} Solution to [{heading}](#{label})\n"

    return SOLUTION.sub(solution, EXERCISE.sub(exercise, markdown))


def glue_values(notebook):
    """name -> text/plain of each value the notebook glued (myst_nb.glue outputs)."""
    values = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            scrap = output.get("metadata", {}).get("scrapbook")
            if not scrap:
                continue
            prefix = scrap.get("mime_prefix", "")
            data = output.get("data", {}).get(prefix + "text/plain")
            if data is not None:
                values[scrap["name"]] = (
                    "".join(data) if isinstance(data, list) else data
                )
    return values


def markdown_of(notebook):
    return "\n\n".join(
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in notebook["cells"]
        if c["cell_type"] == "markdown"
    )


def load_notebook(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
