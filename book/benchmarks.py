"""Sphinx extension behind the benchmarks page.

Its directive ``{bench-results}`` shows ``make bench``'s figures.

``make bench`` measures on the reader's machine and writes one JSON file per
benchmark into ``bench-results/`` (gitignored). The page must show those
figures, not numbers typed by an author on another machine, so the directive
reads the files at build time and renders each as a section: the machine it
ran on, and its tables. With no results yet it says how to make them.

Result file format (what ``tests/bench.py`` writes)::

    {"title": "MyDDP against PyTorch's DDP",
     "summary": "one or two sentences on what was measured and the verdict",
     "machine": {"cpu": "...", "cores": 2, "torch": "2.13.0+cpu", ...},
     "date": "2026-01-01T12:00:00",
     "tables": [{"title": "...", "columns": ["cap (MB)", "ratio"],
                 "rows": [[1, 1.02], ...],
                 "note": "optional text under the table"}]}

Any other key whose value is a scalar is listed with the machine; a key
whose value is a list of dicts becomes a table, so a new benchmark needs
no change here.

The page is re-read on every build (results change without any source changing).
"""

import json
import os

from docutils import nodes
from docutils.parsers.rst import Directive, directives

RESULTS_DIR = "bench-results"


def _fmt(value):
    """Format a cell: floats to 4 significant digits, everything else as text."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "-"
    return str(value)


def _table(columns, rows, title=None):
    """A docutils table node with a header row."""
    table = nodes.table(classes=["bench-table"])
    if title:
        table += nodes.title(text=title)
    group = nodes.tgroup(cols=len(columns))
    table += group
    for _ in columns:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    group += head
    head += _row(columns)
    body = nodes.tbody()
    group += body
    for row in rows:
        body += _row(row)
    return table


def _row(cells):
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += nodes.paragraph(text=_fmt(cell))
        row += entry
    return row


def _field_list(mapping):
    fields = nodes.field_list()
    for key, value in mapping.items():
        field = nodes.field()
        field += nodes.field_name(text=str(key))
        body = nodes.field_body()
        body += nodes.paragraph(text=_fmt(value))
        field += body
        fields += field
    return fields


def _tables_of(result):
    """The tables of a result: its ``tables`` list, plus any list-of-dicts value."""
    tables = []
    for t in result.get("tables", []):
        tables.append((t.get("title"), t["columns"], t["rows"], t.get("note")))
    for key, value in result.items():
        if (
            key != "tables"
            and isinstance(value, list)
            and value
            and all(isinstance(v, dict) for v in value)
        ):
            columns = list(dict.fromkeys(k for row in value for k in row))
            tables.append(
                (
                    key.replace("_", " "),
                    columns,
                    [[row.get(c) for c in columns] for row in value],
                    None,
                )
            )
    return tables


def render_result(result, filename, document):
    """One benchmark result as a section: summary, machine, tables."""
    title = result.get("title") or os.path.splitext(filename)[0].replace("_", " ")
    section = nodes.section(
        ids=[nodes.make_id("bench-" + os.path.splitext(filename)[0])]
    )
    section += nodes.title(text=title)
    if result.get("summary"):
        section += nodes.paragraph(text=result["summary"])
    about = {}
    if result.get("date"):
        about["measured"] = result["date"]
    for key, value in result.get("machine", {}).items():
        about[key] = value
    for key, value in result.items():
        if key not in (
            "title",
            "summary",
            "date",
            "machine",
            "tables",
        ) and not isinstance(value, (list, dict)):
            about[key] = value
    about["file"] = f"{RESULTS_DIR}/{filename}"
    section += _field_list(about)
    for table_title, columns, rows, note in _tables_of(result):
        section += _table(columns, rows, table_title)
        if note:
            section += nodes.paragraph(text=note)
    document.note_implicit_target(section)
    return section


class BenchResults(Directive):
    """``{bench-results}``: every ``bench-results/*.json`` of the book, rendered."""

    has_content = False
    option_spec = {"dir": directives.unchanged}

    def run(self):
        env = self.state.document.settings.env
        env.bench_results_docs = getattr(env, "bench_results_docs", set()) | {
            env.docname
        }
        results_dir = os.path.join(
            env.app.confdir, self.options.get("dir", RESULTS_DIR)
        )
        files = (
            sorted(f for f in os.listdir(results_dir) if f.endswith(".json"))
            if os.path.isdir(results_dir)
            else []
        )
        if not files:
            note = nodes.admonition(classes=["note"])
            note += nodes.title(text="No measurements yet")
            note += nodes.paragraph(
                text="This copy of the book was built before `make bench` ran. "
                "Run `make bench` and then `make book`: this page then shows the "
                "figures measured on your machine."
            )
            return [note]
        out = []
        for filename in files:
            path = os.path.join(results_dir, filename)
            env.note_dependency(path)
            try:
                with open(path) as f:
                    result = json.load(f)
            except (OSError, ValueError) as exc:
                error = nodes.paragraph(
                    text=f"{RESULTS_DIR}/{filename} could not be read ({exc}); "
                    "run `make bench` again."
                )
                out.append(error)
                continue
            out.append(render_result(result, filename, self.state.document))
        return out


def _always_reread(app, env, added, changed, removed):
    # New result files appear without any source file changing.
    return sorted(getattr(env, "bench_results_docs", set()) - set(removed))


def _merge(app, env, docnames, other):
    env.bench_results_docs = getattr(env, "bench_results_docs", set()) | getattr(
        other, "bench_results_docs", set()
    )


def setup(app):
    app.add_directive("bench-results", BenchResults)
    app.connect("env-get-outdated", _always_reread)
    app.connect("env-merge-info", _merge)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
