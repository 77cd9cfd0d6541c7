"""The "Plan your run" page: the plan as HTML, the form, and the Jupyter widget.

:func:`render` turns the form's values into the plan's HTML: a summary, the
memory and communication tables, the run, the lines to paste, and beside
every table a fold with each number's derivation (formula, inputs, chapter).
It calls :func:`mylib.models.plan_inputs.run`, as the terminal planner does.

:class:`Planner` is what the page's notebook displays. In Jupyter, an
ipywidgets form whose every change redraws the plan in the kernel. On the
built site, its static twin (:meth:`Planner.static_html`): the form as
plain HTML inputs and the default plan; ``book/_static/planner.js`` loads
the book's Python in the page (Pyodide, through ``livefig.js``) and calls
:func:`render_json` on every change, so the site runs this very code.

Standard library only at module level: the site runs this file in the page.
"""

import html
import json
import time

from mylib.figures import browser
from mylib.models import nccl_tests
from mylib.models import plan_inputs as inputs
from mylib.models.cluster import ALL_REDUCE, ring
from mylib.models.hardware import NODES
from mylib.models.plan_advice import gb
from mylib.models.planner import PlanError

E = html.escape
NOTE = {  # what each table's derivations fold says it holds
    "Memory per GPU": "How each GPU's memory is derived",
    "Communication per step": "How the bytes and the times are derived",
    "The run": "How the run's numbers are derived",
}


def render(values=None):
    """The plan for the form's ``values`` (defaults for the rest), as HTML."""
    try:
        p, fit = inputs.run(dict(values or {}))
    except PlanError as err:
        return (
            '<div class="planner-result planner-error" role="alert" '
            f'data-error="{E(str(err))}"><p><strong>Cannot plan this:</strong> '
            f"{E(str(err))}</p></div>"
        )
    return plan_html(p, fit)


def render_json(values_json):
    """:func:`render` for the browser: the values as a JSON object."""
    return render(json.loads(values_json))


def _cell(p, key):
    if key not in p.values:
        return f"<td>{E(key)}</td>"
    d = p.values[key]
    return f'<td data-key="{E(key)}" data-value="{d.value!r}">{E(d.text)}</td>'


def _how(d):
    inputs_ = f" <span class='planner-inputs'>{E(d.inputs)}.</span>" if d.inputs else ""
    return (
        f'<li data-derivation="{E(d.key)}"><b>{E(d.label)}</b> = {E(d.text)}: '
        f"{E(d.formula)}.{inputs_} <span class='planner-chapter'>Chapter "
        f"{E(d.chapter)}.</span></li>"
    )


def _table(p, title, header, rows):
    head = "".join(f"<th>{E(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(_cell(p, c) if c in p.values else f"<th>{E(c)}</th>" for c in row)
        + "</tr>"
        for row in rows
    )
    keys = [c for row in rows for c in row if c in p.values]
    folds = "".join(_how(p.values[k]) for k in keys)
    return (
        f'<section class="planner-section"><h4>{E(title)}</h4>'
        f'<div class="planner-scroll"><table class="planner-table"><thead><tr>{head}'
        f"</tr></thead><tbody>{body}</tbody></table></div>"
        f'<details class="planner-derivations" data-fold="{E(title)}"><summary>'
        f"{E(NOTE[title])}</summary><ul>{folds}</ul></details></section>"
    )


def _span(p, key):
    d = p.values[key]
    return f'<span data-key="{E(key)}" data-value="{d.value!r}">{E(d.text)}</span>'


def summary_html(p):
    """One sentence: the strategy, its memory, its step, its throughput."""
    if not p.recommended:
        return f'<p class="planner-summary planner-advice">{E(p.advice)}</p>'
    s = p.recommended
    return (
        f'<p class="planner-summary"><strong>{E(s)}</strong> fits: '
        f"{_span(p, f'mem.{s}.total')} of {E(gb(p.node.gpu.memory))} a GPU; a step "
        f"of {_span(p, 'run.step_s')}, {_span(p, 'run.tokens_s_gpu')} tokens/s a "
        f"GPU, MFU {_span(p, 'run.mfu')}; checkpoint every "
        f"{_span(p, 'run.checkpoint_every')}. {_span(p, 'run.accumulation')} "
        "micro-steps of "
        f"{p.training.micro_batch} x {p.model.seq:,} tokens a step.</p>"
    )


def _regime_of(fit, nbytes):
    inside = [r for r in fit.regimes if r.min_bytes <= nbytes <= r.max_bytes]
    return inside[0] if inside else fit.regimes[-1]


def sizes_html(fit):
    """Every pasted size: its time, algorithm and bus bandwidth, and the fit's time."""
    factor, rows = 2 * (fit.ranks - 1) / fit.ranks, []
    for row in fit.rows:
        r = _regime_of(fit, row.nbytes)
        model = 2 * (fit.ranks - 1) * r.alpha_s + factor * row.nbytes / r.busbw
        rows.append(
            f"<tr><td>{row.nbytes:,}</td><td>{row.seconds * 1e6:,.2f}</td>"
            f"<td>{row.algbw / 1e9:.2f}</td><td>{row.busbw / 1e9:.2f}</td>"
            f"<td>{model * 1e6:,.2f}</td></tr>"
        )
    return (
        '<details class="planner-derivations" data-fold="sizes"><summary>The pasted '
        "sizes: algorithm bandwidth S / t, bus bandwidth S / t x 2(n-1)/n, and the "
        "fitted time</summary><div class='planner-scroll'><table class='planner-table'>"
        "<thead><tr><th>bytes</th><th>time (us)</th><th>algbw (GB/s)</th>"
        "<th>busbw (GB/s)</th><th>fit (us)</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div></details>"
    )


def fit_html(fit, cluster):
    """The calibration: each size regime's latency and bandwidth, and the link used."""
    rows = "".join(
        f"<tr><td>{r.min_bytes:,} to {r.max_bytes:,}</td><td>{r.alpha_s * 1e6:.2f} µs"
        f"</td><td>{r.busbw / 1e9:.1f} GB/s</td><td>{r.max_error:.1%}</td></tr>"
        for r in fit.regimes
    )
    link = (
        f"NICs at {cluster.nic_bw / 1e9:.1f} GB/s each way, NVLink at "
        f"{cluster.nvlink_bw / 1e9:.0f} GB/s, {cluster.nic_latency_s * 1e6:.2f} µs "
        "a ring step"
    )
    return (
        '<section class="planner-section" data-calibrated="1"><h4>Calibrated from '
        f"your all_reduce_perf ({fit.ranks} GPUs)</h4><div class='planner-scroll'>"
        "<table class='planner-table'><thead><tr><th>sizes (bytes)</th><th>latency a "
        "ring step</th><th>bus bandwidth</th><th>worst error</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div><p>Planned on {E(cluster.name)}: "
        f"{E(link)}. Chapter 1's ring, 2(n-1) alpha + 2(n-1)/n S / beta, fitted "
        "to each size regime (least squares on relative error); the bus bandwidth "
        "is the algorithm bandwidth S / t times 2(n-1)/n.</p>"
        + sizes_html(fit)
        + "</section>"
    )


def plan_html(p, fit=None):
    """The whole plan as HTML (every number with its derivation one click away)."""
    parts = [summary_html(p)]
    if fit is not None:
        parts.append(fit_html(fit, p.cluster))
    for title, header, rows in p.tables():
        if rows:
            parts.append(_table(p, title, header, rows))
    if p.lines:
        code = E("\n".join(p.lines))
        parts.append(
            '<section class="planner-section"><h4>The lines to run it</h4>'
            f'<pre class="planner-lines"><code>{code}</code></pre></section>'
        )
    return (
        f'<div class="planner-result" data-recommended="{E(p.recommended or "")}">'
        + "".join(parts)
        + "</div>"
    )


# -- the form -------------------------------------------------------------------

GROUPS = ("model", "custom shapes", "cluster", "custom node", "training", "failures")
GROUPS += ("calibration",)


def _control(f):
    name, value = E(f.name), f.default
    if f.kind == "choice":
        options = "".join(
            f'<option value="{E(v)}"{" selected" if v == value else ""}>{E(label)}'
            "</option>"
            for label, v in f.options
        )
        return f'<select name="{name}">{options}</select>'
    if f.kind == "bool":
        return f'<input type="checkbox" name="{name}"{" checked" if value else ""}>'
    if f.kind == "text":
        return (
            f'<textarea name="{name}" rows="5" spellcheck="false" placeholder="'
            '# nccl-tests version ... (paste the whole output)"></textarea>'
        )
    limits = "".join(
        f' {attr}="{v}"'
        for attr, v in (("min", f.minimum), ("max", f.maximum), ("step", f.step))
        if v is not None
    )
    step = (
        "" if f.step is not None else ' step="1"' if f.kind == "int" else ' step="any"'
    )
    return f'<input type="number" name="{name}" value="{value}"{limits}{step}>'


def example_output():
    """An ``all_reduce_perf`` output of 2 DGX H100 nodes, made by the cluster model."""
    cluster = NODES["DGX H100"].cluster(2)
    sizes = [8 * 2**i for i in range(31)]
    seconds = [ring(cluster, ALL_REDUCE, s).seconds for s in sizes]
    return nccl_tests.format_table(sizes, seconds, cluster.ranks, ("node0", "node1"))


def form_html():
    """The inputs, grouped, as plain HTML (the site's half of the planner)."""
    fieldsets = []
    for group in GROUPS:
        fields = [f for f in inputs.FIELDS if f.group == group]
        controls = "".join(
            f'<label class="planner-field planner-{f.kind}"><span>{E(f.label)}</span>'
            f"{_control(f)}</label>"
            for f in fields
        )
        extra = ""
        if group == "calibration":
            extra = (
                '<button type="button" class="planner-example" data-example="'
                f'{E(example_output())}">Paste an example (2 DGX H100 nodes, '
                "made by the cluster model)</button>"
            )
        fieldsets.append(
            f'<fieldset class="planner-group" data-group="{E(group)}"><legend>'
            f"{E(group)}</legend>{controls}{extra}</fieldset>"
        )
    return (
        '<form class="planner-form planner-site" hidden="hidden">'
        f"{''.join(fieldsets)}</form>"
    )


class Planner:
    """The planner on a page: a widget in Jupyter, HTML inputs on the site."""

    module, function = __name__, "render_json"

    def __init__(self):
        self.values = inputs.defaults()
        self.redraw_s = []  # seconds each Jupyter redraw took
        self._widget = None

    def html(self, **values):
        """The plan for the current values, overridden by ``values``."""
        return render({**self.values, **values})

    def static_html(self):
        """The twin: the form (shown on the site), the default plan, a Lab note."""
        modules = html.escape(json.dumps(browser.module_closure(self.module)))
        return (
            f'<div class="planner" data-state="static" data-renders="0" '
            f'data-module="{self.module}" data-function="{self.function}" '
            f'data-modules="{modules}">{form_html()}'
            '<p class="planner-status planner-site" hidden="hidden">The plan below is '
            "computed in your browser by the book's own Python "
            f"(<code>{self.module}.render</code>) whenever an input changes.</p>"
            f'<div class="planner-output">{self.html()}</div>'
            '<p class="planner-jupyter"><em>The plan at its default inputs. Run this '
            "cell for the planner's inputs.</em></p></div>"
        )

    def widget(self):
        """The ipywidgets view (built once): the inputs above the plan."""
        if self._widget is not None:
            return self._widget
        import ipywidgets as widgets

        out = widgets.HTML(value=self.html(), layout=widgets.Layout(width="100%"))
        boxes, style = [], {"description_width": "17em"}
        for group in GROUPS:
            controls = []
            for f in (f for f in inputs.FIELDS if f.group == group):
                w = _widget_for(widgets, f, style)
                w.observe(self._redraw_from(f, out), names="value")
                controls.append(w)
            boxes.append(widgets.VBox([widgets.HTML(f"<b>{E(group)}</b>")] + controls))
        self._widget = widgets.VBox(
            [
                widgets.GridBox(
                    boxes,
                    layout=widgets.Layout(
                        grid_template_columns="repeat(auto-fill, minmax(30em, 1fr))"
                    ),
                ),
                out,
            ]
        )
        self._widget.output = out
        return self._widget

    def _redraw_from(self, field, out):
        def redraw(change):
            start = time.perf_counter()
            self.values[field.name] = change["new"]
            out.value = self.html()
            self.redraw_s.append(time.perf_counter() - start)

        return redraw

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": repr(self), "text/html": self.static_html()}
        try:
            view = self.widget()._repr_mimebundle_(include=include, exclude=exclude)
        except ImportError:
            return bundle
        view.pop("text/plain", None)
        return {**view, **bundle}

    def __repr__(self):
        return f"Planner({self.module}.render; {len(inputs.FIELDS)} inputs)"


def _widget_for(widgets, f, style):
    common = dict(description=f.label, style=style, layout=widgets.Layout(width="29em"))
    if f.kind == "choice":
        return widgets.Dropdown(options=list(f.options), value=f.default, **common)
    if f.kind == "bool":
        return widgets.Checkbox(value=f.default, indent=False, **common)
    if f.kind == "text":
        return widgets.Textarea(
            value="", placeholder="paste all_reduce_perf output", **common
        )
    if f.kind == "int":
        return widgets.IntText(value=f.default, **common)
    return widgets.FloatText(value=f.default, **common)
