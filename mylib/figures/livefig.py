"""Interactive figures that work in Jupyter *and* on the static site.

A figure is a render function, ``render(**values) -> str`` (an SVG or HTML
fragment), written with the standard library only in a mylib module, plus the
sliders that choose its arguments::

    from mylib.figures.livefig import LiveFigure, Slider
    from mylib.figures.timeline import bucketing_figure

    LiveFigure(bucketing_figure, [
        Slider("n_layers", "layers", min=2, max=96, step=1, default=24),
        Slider("bucket_cap_mb", "bucket cap", default=25.0,
               options=[("0 (per parameter)", 0.0), ("25 MB", 25.0)]),
    ])

A figure module keeps its sliders as plain dicts of these arguments, written
with :func:`steps` (a range) and :func:`choices` (a list of values).

Displayed in Jupyter, it is an ipywidgets box: moving a slider calls ``render``
in the kernel and replaces the drawing (``redraw_s`` keeps how long each redraw
took). The same display also carries a ``text/html`` *static twin*: the default
drawing, plain HTML range inputs, and data attributes naming the render
function and the sliders. The book's build prefers that twin over the widget
(``nb_mime_priority_overrides`` in ``_config.yml``), so the page shows the
default figure at once; ``_static/livefig.js`` starts a Web Worker
(``_static/livefig-worker.js``) once the page has loaded, which loads Pyodide,
copies the mylib modules the function needs (see :mod:`mylib.figures.browser`)
into it and, on each slider move, calls :func:`render_positions` with the
slider positions: the very same Python draws the figure, off the page's thread,
and the page puts the returned SVG in place. JupyterLab shows the same twin
for a cell it has not run (see :meth:`LiveFigure.static_html`): there it is a
picture of the default drawing.

Only the standard library is imported at module level: this file also runs in
the browser. ipywidgets is imported when a widget is first built.
"""

import base64
import html
import importlib
import inspect
import json
import re
import time
import types

from mylib.figures import browser


class Slider:
    """One control: a number range (``min``/``max``/``step``) or a list of ``options``.

    ``options`` holds values, or ``(label, value)`` pairs; values must be
    JSON numbers, strings, booleans or None (they travel to the browser).
    A range is of ints when ``min``, ``max``, ``step`` and ``default`` all are.
    """

    def __init__(
        self,
        name,
        label=None,
        *,
        min=None,
        max=None,
        step=None,
        default=None,
        options=None,
        unit="",
    ):
        self.name, self.label, self.unit = name, label or name, unit
        if not name.isidentifier():
            raise ValueError(
                f"slider name {name!r} must be the name of a render() argument"
            )
        if options is not None:
            pairs = [
                o if isinstance(o, (tuple, list)) else (str(o), o) for o in options
            ]
            if not pairs:
                raise ValueError(
                    f"slider {name!r}: options is empty; give at least one value"
                )
            self.labels = [str(label_) for label_, _ in pairs]
            self.options = [value for _, value in pairs]
            # raises TypeError on values the browser cannot receive
            json.dumps(self.options)
            self.kind, self.default = (
                "options",
                self.options[0] if default is None else default,
            )
            if self.default not in self.options:
                raise ValueError(
                    f"slider {name!r}: default {default!r} "
                    f"is not one of the options {self.options}"
                )
            return
        if None in (min, max, step):
            raise ValueError(
                f"slider {name!r} needs min, max and step, or options=[...]"
            )
        if not (step > 0 and max > min):
            raise ValueError(
                f"slider {name!r}: need step > 0 and max > min, "
                f"got min={min}, max={max}, step={step}"
            )
        default = min if default is None else default
        is_int = all(
            isinstance(v, int) and not isinstance(v, bool)
            for v in (min, max, step, default)
        )
        self.kind = "int" if is_int else "float"
        self.decimals = (
            0 if is_int else len(f"{float(step):.10f}".rstrip("0").split(".")[1])
        )
        # ends on the step's decimals, so that 3 * 0.1 is 0.3 here and in the browser
        if not is_int:
            min, max, step = (
                round(float(min), self.decimals),
                round(float(max), self.decimals),
                float(step),
            )
            default = round(float(default), self.decimals)
        self.min, self.max, self.step = min, max, step
        if not (min <= default <= max):
            raise ValueError(
                f"slider {name!r}: default {default} is outside [{min}, {max}]"
            )
        self.default = self.value_at(default)

    def value_at(self, position):
        """The value at a slider position.

        The position is an option's index, or a number that is snapped to the
        step and range. Jupyter and the browser both pass their raw positions
        through here, so both call ``render`` with exactly the same values.
        """
        if self.kind == "options":
            return self.options[
                max(0, min(int(round(float(position))), len(self.options) - 1))
            ]
        k = round((float(position) - self.min) / self.step)
        value = min(max(self.min + k * self.step, self.min), self.max)
        return (
            int(round(value))
            if self.kind == "int"
            else round(float(value), self.decimals)
        )

    def position_of(self, value):
        """The slider position that shows ``value``."""
        return self.options.index(value) if self.kind == "options" else value

    def text(self, value):
        """How the value reads next to the slider."""
        if self.kind == "options":
            return self.labels[self.options.index(value)]
        number = f"{value:d}" if self.kind == "int" else f"{value:.{self.decimals}f}"
        return f"{number} {self.unit}".strip()

    def spec(self):
        """The slider as JSON-ready data, for the browser.

        :meth:`from_spec` rebuilds it.
        """
        if self.kind == "options":
            return {
                "name": self.name,
                "label": self.label,
                "kind": "options",
                "default": self.default,
                "options": [
                    [label, value] for label, value in zip(self.labels, self.options)
                ],
            }
        return {
            "name": self.name,
            "label": self.label,
            "kind": self.kind,
            "min": self.min,
            "max": self.max,
            "step": self.step,
            "default": self.default,
            "decimals": self.decimals,
            "unit": self.unit,
        }

    @classmethod
    def from_spec(cls, spec):
        """A Slider from :meth:`spec` data."""
        if spec["kind"] == "options":
            return cls(
                spec["name"],
                spec["label"],
                options=[tuple(o) for o in spec["options"]],
                default=spec["default"],
            )
        return cls(
            spec["name"],
            spec["label"],
            min=spec["min"],
            max=spec["max"],
            step=spec["step"],
            default=spec["default"],
            unit=spec.get("unit", ""),
        )

    def __repr__(self):
        return f"Slider({self.name!r}, default={self.default!r})"


def steps(name, label, lo, hi, step, default, unit=""):
    """A range slider as a dict of :class:`Slider` arguments: ``Slider(**spec)``.

    Figure modules keep their sliders as such dicts, which a test or a notebook
    reads as plain data (``spec["default"]``).
    """
    spec = dict(name=name, label=label, min=lo, max=hi, step=step, default=default)
    return {**spec, "unit": unit} if unit else spec


def choices(name, label, values, default, fmt="{:g}"):
    """A slider choosing among ``values``, as a dict of :class:`Slider` arguments.

    Each value reads as ``fmt.format(value)`` (``fmt="{:g} GB/s"`` gives
    ``25 GB/s``); a ``(label, value)`` pair among them keeps its own label.
    """
    options = [v if isinstance(v, tuple) else (fmt.format(v), v) for v in values]
    return dict(name=name, label=label, options=options, default=default)


def node_sliders(nics_per_node):
    """The four sliders of a cluster's nodes, with ``nics_per_node`` NICs by default.

    GPUs per node, NICs per node, a NIC's and a GPU's NVLink rate each way (GB/s):
    what :class:`mylib.models.cluster.Cluster` takes. Chapters 6 and 7's figures
    share them.
    """
    return [
        choices("gpus_per_node", "GPUs per node", (1, 2, 4, 8), 8),
        choices("nics_per_node", "NICs per node", (1, 2, 4, 8), nics_per_node),
        choices("nic_gb_s", "NIC, each way", (12.5, 25, 50, 100), 50, "{:g} GB/s"),
        choices(
            "nvlink_gb_s",
            "NVLink per GPU, each way",
            (160, 240, 360, 720),
            360,
            "{:g} GB/s",
        ),
    ]


def settings(sliders, values):
    """The values a figure draws with: each slider's default, then ``values``.

    A figure with many sliders takes them as keywords (``**values``) and reads
    them here, so that its defaults live in one place, its slider list. A name
    that is no slider's is refused.
    """
    names = [spec["name"] for spec in sliders]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"no slider named {unknown}: the sliders are {names}")
    defaults = {spec["name"]: spec["default"] for spec in sliders}
    return types.SimpleNamespace(**{**defaults, **values})


_SLIDERS = {}  # the browser's figures: specs JSON -> its sliders, parsed once


def render_positions(module, function, specs_json, positions_json):
    """Render ``module.function`` at slider positions given as JSON.

    This is what the browser calls. ``positions_json`` maps slider names to raw
    positions; missing names take their defaults.
    """
    if specs_json not in _SLIDERS:
        _SLIDERS[specs_json] = [Slider.from_spec(s) for s in json.loads(specs_json)]
    sliders = _SLIDERS[specs_json]
    positions = json.loads(positions_json)
    values = {
        s.name: s.value_at(positions[s.name]) if s.name in positions else s.default
        for s in sliders
    }
    return getattr(importlib.import_module(module), function)(**values)


_SVG_SIZE = re.compile(r'width="100%" style="max-width:[^";]*;height:auto"')
_VIEWBOX = re.compile(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)"')


def svg_data_uri(svg):
    """An SVG drawing as a ``data:`` URI, for an ``<img>`` (or Markdown image).

    JupyterLab does not draw ``<svg>`` markup or ``image/svg+xml`` outputs of a
    notebook it does not trust (one it did not run itself): its HTML sanitizer
    drops the ``<svg>`` tags and shows their text. An ``<img>`` whose source is
    a ``data:`` URI passes the sanitizer and shows the picture. An SVG sized
    ``width="100%"`` has no size of its own inside an ``<img>``, so the copy
    gets its viewBox's width and height.
    """
    size = _VIEWBOX.search(svg)
    if size:
        svg = _SVG_SIZE.sub(
            f'width="{size.group(1)}" height="{size.group(2)}"', svg, count=1
        )
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def svg_markdown(svg, alt):
    """``svg`` as Markdown (an ``<img>`` tag): how JupyterLab shows it untrusted.

    A figure's ``_repr_markdown_``: the built site prefers ``image/svg+xml``
    (drawn inline), JupyterLab prefers Markdown, which it renders, sanitized,
    even in a notebook it does not trust (see :func:`svg_data_uri`). A Markdown
    image (``![alt](data:...)``) is not used: MyST refuses ``data:`` links.
    """
    return (
        f'<img src="{svg_data_uri(svg)}" alt="{html.escape(alt)}" '
        'style="max-width:100%;height:auto">'
    )


class LiveFigure:
    """A figure redrawn by sliders: ipywidgets in Jupyter, Pyodide on the static site.

    ``render`` must be a module-level function; for the static site it must
    live in a mylib module that imports only the standard library (checked
    here, with the import to fix named). A render function from elsewhere
    (say a notebook cell) still works in Jupyter; pass ``in_browser=False`` and
    the static page shows its default drawing with the sliders disabled.
    """

    def __init__(self, render, sliders, *, in_browser=True):
        if not callable(render):
            raise TypeError(
                "render must be a function returning an SVG string, "
                f"got {type(render).__name__}"
            )
        self.render = render
        self.sliders = [s if isinstance(s, Slider) else Slider(**s) for s in sliders]
        names = [s.name for s in self.sliders]
        if len(set(names)) != len(names):
            raise ValueError(f"slider names must be unique, got {names}")
        params = inspect.signature(render).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        missing = [n for n in names if n not in params and not takes_any]
        if missing:
            raise ValueError(
                f"{render.__name__}() has no argument(s) {missing}; "
                "name each slider after an argument"
            )
        self.module, self.function = render.__module__, render.__qualname__
        # mylib modules the browser needs; None: no interactivity on the static site
        self.modules = None
        if in_browser:
            if not self.module.startswith("mylib.") or "." in self.function:
                raise ValueError(
                    f"{self.module}.{self.function} cannot run on the static site: "
                    "the render function must be a module-level function in a "
                    "mylib module (standard library only). Move it there, or pass "
                    "in_browser=False to keep it interactive in Jupyter only."
                )
            self.modules = sorted(
                set(browser.module_closure(self.module))
                | set(browser.module_closure(__name__))
            )
        self.values = {s.name: s.default for s in self.sliders}
        if takes_any:  # a render(**values) checks the names itself: draw once now
            self.render(**self.values)
        self.redraw_s = []  # seconds each Jupyter redraw took (render + widget update)
        self._widget = None

    def svg(self, **values):
        """The drawing for the current values, overridden by ``values``.

        The names in ``values`` must be slider names.
        """
        unknown = set(values) - set(self.values)
        if unknown:
            raise ValueError(
                f"unknown slider(s) {sorted(unknown)}; "
                f"the sliders are {list(self.values)}"
            )
        return self.render(**{**self.values, **values})

    def static_html(self):
        """The static twin, an HTML fragment.

        It holds the default drawing, HTML range inputs, and what the browser
        needs to redraw. Two audiences read it:

        * the built site: ``livefig.css`` shows the parts marked
          ``livefig-site`` (inline SVG, range inputs, a note) and hides the
          ``livefig-jupyter`` part; ``livefig.js`` makes the inputs redraw.
        * JupyterLab, before the cell has run (the notebook is untrusted, so the
          widget view is not drawn and this HTML is sanitized): the
          ``livefig-site`` parts carry ``hidden`` (no site CSS there), and the
          ``livefig-jupyter`` part shows the default drawing as an image and
          says how to get the sliders.
        """
        controls = []
        for s in self.sliders:
            default = s.default
            if s.kind == "options":
                rng = (
                    f'min="0" max="{len(s.options) - 1}" step="1" '
                    f'value="{s.options.index(default)}"'
                )
            else:
                rng = f'min="{s.min}" max="{s.max}" step="{s.step}" value="{default}"'
            disabled = "" if self.modules else " disabled"
            controls.append(
                '<label class="livefig-control"><span class="livefig-label">'
                f"{html.escape(s.label)}</span>"
                f'<input type="range" name="{s.name}" {rng}{disabled} '
                f'aria-label="{html.escape(s.label)}">'
                '<output class="livefig-readout">'
                f"{html.escape(s.text(default))}</output></label>"
            )
        if self.modules:
            data = (
                f' data-module="{self.module}" data-function="{self.function}"'
                f' data-modules="{html.escape(json.dumps(self.modules))}"'
            )
            note = (
                "Move a slider (or focus it and use the arrow keys): the book's own "
                f"Python (<code>{self.module}.{self.function}</code>) redraws the "
                "figure in your browser."
            )
        else:
            data, note = "", "Run this chapter in Jupyter to move the sliders."
        specs = html.escape(json.dumps([s.spec() for s in self.sliders]))
        drawing = self.svg()
        settings = "; ".join(f"{s.label} {s.text(s.default)}" for s in self.sliders)
        jupyter = (
            '<div class="livefig-jupyter">'
            f'<img src="{svg_data_uri(drawing)}" alt="{html.escape(settings)}" '
            'style="max-width:100%;height:auto">'
            "<p><em>The figure at its default settings ("
            f"{html.escape(settings)}). Run this cell to get its sliders.</em></p>"
            "</div>"
        )
        return (
            f'<div class="livefig" data-state="static" data-renders="0"{data} '
            f'data-sliders="{specs}">'
            f'<div class="livefig-controls livefig-site" hidden="hidden">'
            f"{''.join(controls)}</div>"
            f'<div class="livefig-figure livefig-site" hidden="hidden">{drawing}</div>'
            f'<p class="livefig-status livefig-site" hidden="hidden">{note}</p>'
            f"{jupyter}</div>"
        )

    def widget(self):
        """The ipywidgets view (built once): sliders above the drawing."""
        if self._widget is not None:
            return self._widget
        import ipywidgets as widgets

        drawing = widgets.HTML(value=self.svg(), layout=widgets.Layout(width="100%"))
        labels = [f"{s.label} ({s.unit})" if s.unit else s.label for s in self.sliders]
        # Wide enough for the longest label (13 px sans-serif: ~0.6 em a letter),
        # so that no label is cut; the slider itself keeps 300 px.
        label_em = round(max(len(label) for label in labels) * 0.6 + 1, 1)
        controls = []
        for s, label in zip(self.sliders, labels):
            common = dict(
                description=label,
                continuous_update=True,
                style={"description_width": f"{label_em}em"},
                layout=widgets.Layout(width=f"calc({label_em}em + 380px)"),
            )
            if s.kind == "options":
                w = widgets.SelectionSlider(
                    options=list(zip(s.labels, s.options)), value=s.default, **common
                )
            elif s.kind == "int":
                w = widgets.IntSlider(
                    min=s.min, max=s.max, step=s.step, value=s.default, **common
                )
            else:
                w = widgets.FloatSlider(
                    min=s.min,
                    max=s.max,
                    step=s.step,
                    value=s.default,
                    readout_format=f".{s.decimals}f",
                    **common,
                )
            w.observe(self._redraw_from(s, w, drawing), names="value")
            controls.append(w)
        self._widget = widgets.VBox(
            [
                widgets.GridBox(
                    controls,
                    layout=widgets.Layout(
                        grid_template_columns=(
                            f"repeat(auto-fill, calc({label_em}em + 390px))"
                        )
                    ),
                ),
                drawing,
            ]
        )
        self._widget.drawing = drawing
        return self._widget

    def _redraw_from(self, slider, control, drawing):
        def redraw(change):
            start = time.perf_counter()
            position = control.index if slider.kind == "options" else change["new"]
            self.values[slider.name] = slider.value_at(position)
            drawing.value = self.svg()
            self.redraw_s.append(time.perf_counter() - start)

        return redraw

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": repr(self), "text/html": self.static_html()}
        try:
            view = self.widget()._repr_mimebundle_(include=include, exclude=exclude)
        except ImportError:  # no ipywidgets: the static twin is all there is
            return bundle
        view.pop("text/plain", None)
        return {**view, **bundle}

    def __repr__(self):
        names = ", ".join(s.name for s in self.sliders)
        return f"LiveFigure({self.module}.{self.function}; sliders: {names})"
