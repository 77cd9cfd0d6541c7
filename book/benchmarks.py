"""Sphinx extension behind the benchmarks page.

Its directive ``{bench-results}`` shows ``make bench``'s figures.

``make bench`` measures on the reader's machine and writes one JSON file per
benchmark into ``bench-results/`` (gitignored). The page must show figures
measured, not numbers typed, so the directive reads the files at build time.
A reference run, made by ``make bench`` on the machine the book is tested on
and committed in ``book/bench-reference/`` (same format, with its machine and
date), is always shown, so that the published site has figures; the reader's
own run, when ``bench-results/`` exists, is shown beside it, benchmark by
benchmark. Without one, the page says how to make it.

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
import math
import os
import re

from docutils import nodes
from docutils.parsers.rst import Directive, directives

RESULTS_DIR = "bench-results"
REFERENCE_DIR = "book/bench-reference"


def _significant(value, digits):
    """``value`` to ``digits`` significant digits, never in exponent notation.

    Thousands are separated: 11753.67 -> "11,754", 0.07308 -> "0.0731" (3).
    """
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def _fmt(value, column=""):
    """Format a cell for its column.

    Times (ms, us, µs) to 4 significant digits, percentages to one decimal,
    ratios and other measures to 3 significant digits, a ``|diff|`` as the
    bound it is under ("below 1e-8": rounding differs between machines), other
    floats to 4 significant digits; never an exponent. Booleans read yes or
    no, None "-", everything else as text.
    """
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    if not isinstance(value, float):
        return str(value)
    column = column.lower()
    if "|diff|" in column:
        return "0" if value == 0 else f"below 1e{math.ceil(math.log10(abs(value)))}"
    if "(%)" in column:
        return f"{value:.1f}"
    if re.search(r"\((ms|us|µs|s)\)", column):
        return _significant(value, 4)
    if column:
        return _significant(value, 3)
    text = _significant(value, 4)  # a machine's figure: 8.19, not 8.190
    return text.rstrip("0").rstrip(".") if "." in text else text


def _header(column):
    """A column's title as the page prints it: microseconds as µs."""
    return re.sub(r"\(us\)", "(µs)", column)


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
    head += _row([_header(c) for c in columns])
    body = nodes.tbody()
    group += body
    for row in rows:
        body += _row(row, columns)
    return table


def _row(cells, columns=()):
    row = nodes.row()
    for i, cell in enumerate(cells):
        entry = nodes.entry()
        column = columns[i] if i < len(columns) else ""
        entry += nodes.paragraph(text=_fmt(cell, column))
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


def _title(result, filename):
    return result.get("title") or os.path.splitext(filename)[0].replace("_", " ")


def render_result(result, filename, document, results_dir=RESULTS_DIR):
    """One benchmark result as a section: summary, machine, tables."""
    section = nodes.section(
        ids=[nodes.make_id("bench-" + os.path.splitext(filename)[0])]
    )
    section += nodes.title(text=_title(result, filename))
    for node in render_run(result, filename, results_dir):
        section += node
    document.note_implicit_target(section)
    return section


def render_run(result, filename, results_dir=RESULTS_DIR):
    """One run's nodes: summary, machine and date, tables."""
    out = []
    if result.get("summary"):
        out.append(nodes.paragraph(text=result["summary"]))
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
    about["file"] = f"{results_dir}/{filename}"
    out.append(_field_list(about))
    for table_title, columns, rows, note in _tables_of(result):
        out.append(_table(columns, rows, table_title))
        if note:
            out.append(nodes.paragraph(text=note))
    return out


def _text_with_commands(text):
    """A paragraph of ``text`` whose `backticked` words are set as code."""
    paragraph = nodes.paragraph()
    for i, part in enumerate(text.split("`")):
        if part:
            paragraph += nodes.literal(text=part) if i % 2 else nodes.Text(part)
    return paragraph


def read_results(directory):
    """``{benchmark name: (filename, result dict or error text)}`` of a folder."""
    if not os.path.isdir(directory):
        return {}
    found = {}
    for filename in sorted(f for f in os.listdir(directory) if f.endswith(".json")):
        try:
            with open(os.path.join(directory, filename)) as f:
                found[filename[: -len(".json")]] = (filename, json.load(f))
        except (OSError, ValueError) as exc:
            found[filename[: -len(".json")]] = (filename, f"could not be read ({exc})")
    return found


class BenchResults(Directive):
    """``{bench-results}``: every ``bench-results/*.json`` of the book, rendered."""

    has_content = False
    option_spec = {"dir": directives.unchanged}

    def run(self):
        env = self.state.document.settings.env
        env.bench_results_docs = getattr(env, "bench_results_docs", set()) | {
            env.docname
        }
        mine_dir = self.options.get("dir", RESULTS_DIR)
        runs = [
            (
                "Your machine",
                mine_dir,
                read_results(os.path.join(env.app.confdir, mine_dir)),
            ),
            (
                "Reference run (committed with the book)",
                REFERENCE_DIR,
                read_results(os.path.join(env.app.confdir, REFERENCE_DIR)),
            ),
        ]
        for _, folder, found in runs:
            for filename, _ in found.values():
                env.note_dependency(os.path.join(env.app.confdir, folder, filename))
        out = []
        if not runs[0][2]:
            note = nodes.admonition(classes=["note"])
            note += nodes.title(text="Your own measurements")
            note += _text_with_commands(
                "Below is the reference run, measured on the machine the book is "
                "tested on. To see your machine's figures beside it, run "
                "`make bench` and then `make book`."
            )
            out.append(note)
        names = sorted(set(runs[0][2]) | set(runs[1][2]))
        if not names:
            out.append(
                _text_with_commands(
                    f"No measurements: {REFERENCE_DIR}/ is empty. Run `make bench`."
                )
            )
        for name in names:
            section = nodes.section(ids=[nodes.make_id("bench-" + name)])
            first = next(found[name] for _, _, found in runs if name in found)
            section += nodes.title(
                text=_title(first[1], first[0]) if isinstance(first[1], dict) else name
            )
            for label, folder, found in runs:
                if name not in found:
                    continue
                filename, result = found[name]
                section += nodes.rubric(text=label)
                if isinstance(result, str):
                    section += _text_with_commands(
                        f"{folder}/{filename} {result}; run `make bench` again."
                    )
                else:
                    for node in render_run(result, filename, folder):
                        section += node
            self.state.document.note_implicit_target(section)
            out.append(section)
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
