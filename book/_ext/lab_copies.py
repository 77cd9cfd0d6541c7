"""The copies of the book that ``make lab`` opens in JupyterLab (``.lab/``, ignored).

JupyterLab is one of the book's three ways in, and it should show the book as the
site does, without touching the tracked files:

* **Copies, not the tracked notebooks.** A reader who only reads and runs must not
  modify the repository: running a cell changes a notebook's outputs, JupyterLab
  saves them (autosave, every 120 s), and chapters 0 and 9 write their scripts
  (``%%writefile scripts/...``). ``make lab`` opens ``.lab/notebooks/``, copies of
  ``notebooks/*.ipynb`` and ``notebooks/scripts/``, so all of that lands in the
  copies. A copy is written again when its source changed, unless the reader
  changed the copy (ran or edited it: then it is kept and named; ``make lab
  FRESH=1`` replaces every copy).
* **MyST resolved as on the site** (book/_ext/lab_myst.py): glossary terms,
  labels, cross-references, citations and ``{glue}`` numbers become links and
  text; exercises carry the site's titles. The pages the chapters link to
  (glossary, setup, practice, benchmarks, references, introduction) are copied
  to ``.lab/book/*.md``, rewritten the same way; JupyterLab opens a linked
  ``.md`` rendered (Markdown preview, drawn by jupyterlab-myst).
* **Folded cells that show they run**: JupyterLab shows ``[*]`` only on a cell's
  input prompt, which a folded input hides. ``.lab/.ipython/`` holds an IPython
  start-up file (``make lab`` points the kernels at it with ``IPYTHONDIR``) that
  prints "running (folded cell)..." in a folded cell's output while it runs, and
  how long it took once done (the folded cells' ids are in ``folded-cells.json``).

    python book/_ext/lab_copies.py [--fresh] [DEST]    # DEST defaults to .lab
"""

import hashlib
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_myst  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ("intro", "setup", "glossary", "practice", "benchmarks", "references")
MANIFEST = ".copies.json"
STARTUP = '''"""make lab: a folded cell (input hidden) says in its output that it runs.

Written by book/_ext/lab_copies.py; IPYTHONDIR points here only under `make lab`.
"""

import json
import pathlib
import time

from IPython import get_ipython
from IPython.display import display

_FOLDED = set(
    json.loads(pathlib.Path(__file__).with_name("folded-cells.json").read_text())
)
_running = {}


def _before(info):
    if getattr(info, "cell_id", None) in _FOLDED:
        _running["handle"] = display(
            {"text/plain": "running (folded cell)..."}, raw=True, display_id=True
        )
        _running["start"] = time.perf_counter()


def _after(result):
    handle = _running.pop("handle", None)
    if handle is not None:
        took = time.perf_counter() - _running.pop("start")
        handle.update({"text/plain": f"(folded cell) ran in {took:.1f} s"}, raw=True)


get_ipython().events.register("pre_run_cell", _before)
get_ipython().events.register("post_run_cell", _after)
'''


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def glossary_markdown(text, index):
    """book/glossary.md with its ``{glossary}`` block as labelled paragraphs."""
    match = re.search(r"^```\{glossary\}\n(.*?)^```\s*$", text, re.M | re.S)
    if not match:
        return text
    out, term, body = [], None, []

    def flush():
        if term is None:
            return
        paragraphs = "\n".join(
            line[2:] if line.startswith("  ") else line for line in body
        )
        first, _, rest = paragraphs.strip().partition("\n\n")
        out.append(f"({lab_myst.slug(term)})=\n**{term}**: {first}\n")
        if rest:
            out.append(rest + "\n")

    for line in match.group(1).splitlines():
        if line and not line.startswith(" "):
            flush()
            term, body = line.strip(), []
        else:
            body.append(line)
    flush()
    return text[: match.start()] + "\n".join(out) + text[match.end() :]


def index_terms(glossary_text, index):
    block = re.search(r"^```\{glossary\}\n(.*?)^```", glossary_text, re.M | re.S)
    for line in (block.group(1) if block else "").splitlines():
        if line and not line.startswith(" "):
            index.terms[line.strip().lower()] = lab_myst.slug(line.strip())


def references(index):
    """book/references.md for JupyterLab: each entry a labelled paragraph.

    Also fills ``index.cite`` with "Author Year" for each key, as the site's
    author-year citations read.
    """
    from pybtex.database import parse_file

    bib = parse_file(os.path.join(ROOT, "book", "references.bib"))
    out = [
        "# References",
        "",
        "The papers and systems the chapters build on, as the site lists them.",
        "",
    ]
    for key, entry in sorted(bib.entries.items(), key=lambda kv: kv[0]):
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        others = any(" ".join(p.last_names) == "others" for p in people)
        people = [p for p in people if " ".join(p.last_names) != "others"]
        last = [" ".join(p.last_names) for p in people]
        if len(last) == 1 and not others:
            who = last[0]
        elif len(last) == 2 and not others:
            who = f"{last[0]} and {last[1]}"
        else:
            who = f"{last[0]} et al." if last else entry.fields.get("organization", key)
        year = entry.fields.get("year", "")
        index.cite[key] = f"{who} {year}".strip()
        title = entry.fields.get("title", "").replace("{", "").replace("}", "")
        where = entry.fields.get("journal") or entry.fields.get("booktitle") or ""
        link = entry.fields.get("doi") and f"https://doi.org/{entry.fields['doi']}"
        link = link or entry.fields.get("url", "")
        authors = ", ".join(str(p) for p in people).rstrip(".") + (
            " et al" if others else ""
        )
        out += [
            f"({key})=",
            " ".join(
                part
                for part in (
                    f"**{who} ({year}).**",
                    f"{authors}." if people else "",
                    f"*{title}*." if title else "",
                    f"{where}." if where else "",
                    f"<{link}>" if link else "",
                )
                if part
            ),
            "",
        ]
    return "\n".join(out)


def practice_markdown(text):
    """book/practice.md with its exercise list, as the site makes it (no editors)."""
    import practice_page

    class App:  # what practice_page.render reads of Sphinx's app
        class env:
            found_docs = {
                "notebooks/" + n[:-6]
                for n in os.listdir(os.path.join(ROOT, "notebooks"))
                if n.endswith(".ipynb")
            }

            @staticmethod
            def note_dependency(path):
                pass

    return text.replace(practice_page.MARKER, practice_page.render(App, editors=False))


def build(fresh=False, dest=None):
    """Write the copies into ``dest``; return (written, kept, problems)."""
    dest = dest or os.path.join(ROOT, ".lab")
    index = lab_myst.Index()
    pages = {}
    for name in PAGES:
        with open(os.path.join(ROOT, "book", f"{name}.md"), encoding="utf-8") as f:
            pages[f"book/{name}.md"] = f.read()
    index_terms(pages["book/glossary.md"], index)
    pages["book/references.md"] = references(index)
    pages["book/practice.md"] = practice_markdown(pages["book/practice.md"])
    pages["book/glossary.md"] = glossary_markdown(pages["book/glossary.md"], index)
    notebooks = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "notebooks"))):
        if name.endswith(".ipynb"):
            path = f"notebooks/{name}"
            notebooks[path] = lab_myst.load_notebook(os.path.join(ROOT, path))
    for path, text in pages.items():
        index.add_page(path, text)
    for path, notebook in notebooks.items():
        index.add_page(path, lab_myst.markdown_of(notebook))

    problems, outputs, folded = [], {}, []
    for path, text in pages.items():
        outputs[path] = lab_myst.rewrite(text, path, index, problems=problems).encode()
    for path, notebook in notebooks.items():
        glue = lab_myst.glue_values(notebook)
        for cell in notebook["cells"]:
            if cell["cell_type"] == "markdown":
                source = "".join(cell["source"])
                new = lab_myst.rewrite(source, path, index, glue, problems)
                cell["source"] = new.splitlines(keepends=True)
            elif cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
                folded.append(cell["id"])
        outputs[path] = (
            json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
        ).encode()
    scripts = os.path.join(ROOT, "notebooks", "scripts")
    for name in sorted(os.listdir(scripts)) if os.path.isdir(scripts) else ():
        with open(os.path.join(scripts, name), "rb") as f:
            outputs[f"notebooks/scripts/{name}"] = f.read()
    startup = ".ipython/profile_default/startup"
    outputs[f"{startup}/00-folded-cells.py"] = STARTUP.encode()
    outputs[f"{startup}/folded-cells.json"] = json.dumps(sorted(folded)).encode()
    return write(dest, outputs, fresh) + (problems,)


def write(dest, outputs, fresh):
    """Write ``outputs`` (path -> bytes) under ``dest``.

    A copy the reader changed since it was written is kept.
    """
    manifest_path = os.path.join(dest, MANIFEST)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = {}
    written, kept = [], []
    for path, data in outputs.items():
        target = os.path.join(dest, path)
        want = _sha(data)
        if os.path.exists(target) and not fresh:
            with open(target, "rb") as f:
                now = _sha(f.read())
            if now == want:
                manifest[path] = want
                continue
            if manifest.get(path) != now:  # changed by the reader: theirs now
                kept.append(path)
                continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
        manifest[path] = want
        written.append(path)
    os.makedirs(dest, exist_ok=True)
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return written, kept


def main(argv):
    fresh = "--fresh" in argv
    args = [a for a in argv if a != "--fresh"]
    dest = os.path.abspath(args[0]) if args else None
    written, kept, problems = build(fresh, dest)
    where = os.path.relpath(dest or os.path.join(ROOT, ".lab"))
    print(f"lab_copies: {len(written)} files written to {where}/")
    if kept:
        print(
            f"lab_copies: kept {len(kept)} copies you changed (FRESH=1 replaces "
            "them): " + ", ".join(kept)
        )
    for (
        problem
    ) in problems:  # shown as plain text in JupyterLab; tests/test_lab.py fails
        print(f"lab_copies: not resolved: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
