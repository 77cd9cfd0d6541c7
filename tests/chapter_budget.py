"""What each page of the book asks a reader to read: a budget per chapter.

For every page in ``_toc.yml`` this counts what the built site shows unfolded:

- **words**: prose words of the Markdown cells (fenced code not included);
- **code**: lines of code the reader sees without a click: the non-blank source
  lines of code cells not folded or removed by a tag (``hide-input``,
  ``hide-cell``, ``remove-input``, ``remove-cell``), plus the lines of the library
  listings (``show_source``, a fenced block in a Markdown output) of cells whose
  output is not folded (``hide-output``, ``hide-cell``, ``remove-output``,
  ``remove-cell``), plus fenced code in the Markdown cells and pages;
- **folded**: the code lines one click away (what ``hide-*`` tags fold);
- **figures**: SVG and PNG outputs, live figures, and images in the prose.

It prints one row per page and exits 1 when a page shows more code than its
limit (``LIMIT``, or the page's entry in ``EXCEPTIONS`` with its reason), or a
chapter more prose than ``WORD_LIMIT`` words.

Why 250 lines: a chapter teaches one idea through a few library listings of 20
to 40 lines each (the classes a reader writes in its exercises) and the cells
that run them; at 250 lines the code stays under about a third of a chapter
that a reader finishes in one sitting, and the issue that set the budget (19)
measured the chapters that lost their readers at 520 and 700 visible lines.

Run it: ``python tests/chapter_budget.py`` (``make test`` does); give it another
checkout's root to count that one (``python tests/chapter_budget.py ../main``).
"""

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMIT = 250
# A chapter's visible prose: the point, the picture, the build, the check, practice,
# the interview answer, exercises and a summary fit in about 3,500 words (BOOK.md);
# the evidence behind a claim folds into an "Under the hood" note beside it.
WORD_LIMIT = 3500
# page -> (limit, why it needs more than LIMIT)
EXCEPTIONS = {}

FOLD_INPUT = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
FOLD_OUTPUT = {"hide-output", "hide-cell", "remove-output", "remove-cell"}
REMOVED = {"remove-input", "remove-cell", "remove-output"}
FENCE = re.compile(r"^(```+|~~~+|:::+)\s*(\{?[\w-]*\}?)?")
CODE_FENCES = {"", "python", "bash", "console", "text", "shell", "sh", "{code-cell}"}
FOLDED = {"{solution}", "{dropdown}", "{toggle}"}
# An admonition ({admonition}, {note}...) folds only with ``:class: dropdown``.
IMAGE = re.compile(r"!\[[^\]]*\]\(|<img\b|^```\{(figure|image)\}", re.M)


def toc_pages():
    """The pages of ``_toc.yml`` in reading order (paths without suffix)."""
    pages = []
    for line in (ROOT / "_toc.yml").read_text().splitlines():
        match = re.match(r"\s*(?:-\s*)?(?:file|root):\s*(\S+)", line)
        if match:
            pages.append(match[1])
    return pages


def split_markdown(text):
    """``(prose words, code lines, folded code lines, figures)`` of a Markdown text.

    A block folded on the page (a ``{solution}`` or ``{dropdown}`` directive, or one
    with ``:class: dropdown``) counts its code as folded and its words not at all.
    """
    words = code = folded = 0
    fence = None  # the opening fence while inside a code block
    hidden = []  # the fences of the folded blocks we are in
    opened = []  # the fences of the directives we are in, folded ones included
    for line in re.sub(r"<!--.*?-->", "", text, flags=re.S).splitlines():
        stripped = line.strip()
        match = FENCE.match(stripped)
        if fence is None and opened and stripped == opened[-1]:
            if hidden and hidden[-1] is opened[-1]:
                hidden.pop()
            opened.pop()
            continue
        if fence is None and match and match[2] in CODE_FENCES:
            fence = match[1]
            continue
        if fence is None and match and match[2]:  # a directive opens
            opened.append(match[1])
            if match[2] in FOLDED or hidden:
                hidden.append(opened[-1])
            continue
        option = re.match(r"\s*:(\w+):\s*(.*)", line)
        if option and opened and not hidden and fence is None:
            if option[1] == "class" and "dropdown" in option[2].split():
                hidden.append(opened[-1])  # this admonition folds after all
            continue
        if fence is not None:
            if stripped == fence:
                fence = None
            elif stripped and hidden:
                folded += 1
            elif stripped:
                code += 1
            continue
        if hidden or line.lstrip().startswith(":") and re.match(r"\s*:\w+:", line):
            continue  # folded, or a directive's option (":label: ...")
        words += len(re.findall(r"[\w$\\{}`][^\s]*", line))
    return words, code, folded, len(IMAGE.findall(text))


def output_counts(output):
    """``(listing lines, figures)`` of one cell output."""
    data = output.get("data", {})
    figures = int(
        "image/svg+xml" in data
        or "image/png" in data
        or "application/vnd.jupyter.widget-view+json" in data
    )
    listing = 0
    markdown = data.get("text/markdown")
    if markdown:
        _, listing, _, _ = split_markdown("".join(markdown))
    return listing, figures


def count_notebook(path):
    row = dict(words=0, code=0, folded=0, figures=0)
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] == "markdown":
            words, code, folded, figures = split_markdown(source)
            row["words"] += words
            row["code"] += code
            row["folded"] += folded
            row["figures"] += figures
            continue
        if cell["cell_type"] != "code":
            continue
        lines = sum(1 for line in source.splitlines() if line.strip())
        if tags & FOLD_INPUT:
            row["folded"] += 0 if tags & REMOVED else lines
        else:
            row["code"] += lines
        for output in cell.get("outputs", []):
            listing, figures = output_counts(output)
            if tags & FOLD_OUTPUT:
                row["folded"] += 0 if tags & REMOVED else listing
            else:
                row["code"] += listing
                row["figures"] += figures
    return row


def count_page(page):
    for suffix in (".ipynb", ".md"):
        path = ROOT / (page + suffix)
        if path.exists():
            break
    else:
        raise SystemExit(f"{page} is in _toc.yml but neither .ipynb nor .md exists")
    if path.suffix == ".ipynb":
        return count_notebook(path)
    words, code, folded, figures = split_markdown(path.read_text())
    return dict(words=words, code=code, folded=folded, figures=figures)


def main():
    global ROOT
    if len(sys.argv) > 1:
        ROOT = pathlib.Path(sys.argv[1]).resolve()
    rows = [(page, count_page(page)) for page in toc_pages()]
    width = max(len(page) for page, _ in rows)
    print(f"{'page':{width}s} {'words':>6s} {'code':>5s} {'folded':>6s} {'figs':>4s}")
    over = []
    for page, row in rows:
        limit, _ = EXCEPTIONS.get(page, (LIMIT, ""))
        too_wordy = page.startswith("notebooks/") and row["words"] > WORD_LIMIT
        flag = "  OVER" if row["code"] > limit or too_wordy else ""
        print(
            f"{page:{width}s} {row['words']:6d} {row['code']:5d} {row['folded']:6d}"
            f" {row['figures']:4d}{flag}"
        )
        if row["code"] > limit:
            over.append(f"{page}: {row['code']} visible code lines > {limit}")
        if too_wordy:
            over.append(f"{page}: {row['words']} visible words > {WORD_LIMIT}")
    for page, (limit, why) in EXCEPTIONS.items():
        print(f"{page} may show {limit} lines: {why}")
    if over:
        print(
            "\n".join(over)
            + "\nFold checks and plumbing (cell tag hide-input), show a smaller"
            " function, or cut prose (fold evidence into an 'Under the hood' dropdown);"
            " see tests/chapter_budget.py."
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
