"""Drawing figures as SVG text, with the standard library only.

The book's interactive figures are drawn by Python functions that return an
SVG string. The same function draws the figure in Jupyter (an ipywidgets
redraw), in the stored notebook output, and in the reader's browser on the
static site, where it runs unchanged under Pyodide. That is why this module,
and every renderer built on it, imports nothing outside the standard library.

Usage::

    fig = Svg(400, 120)
    fig.rect(10, 10, 100, 20, fill=PALETTE["compute"], title="layer 3 backward")
    fig.text(10, 50, "step time 12.3 ms")
    svg_text = fig.to_string()
"""

import functools
import math
from xml.sax.saxutils import escape, quoteattr

# One palette for the whole book, so a colour means the same thing in every chapter.
PALETTE = {
    "forward": "#9ecae1",
    "compute": "#4292c6",
    "optimizer": "#807dba",
    "comm": "#f16913",
    "comm_alt": "#fdae6b",
    "exposed": "#d62728",
    "idle": "#d9d9d9",
    "text": "#222222",
    "muted": "#6b6b6b",
    "grid": "#e6e6e6",
    "accent": "#2ca02c",
}

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


@functools.lru_cache(maxsize=4096, typed=True)  # a redraw repeats most coordinates
def _num(x):
    """A coordinate as short text: at most two decimals, no trailing zeros."""
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


_NEEDS_QUOTING = set("&<>\"'\n\r\t")
_NAMES = {}  # keyword -> attribute name: stroke_width -> stroke-width


def _attrs(attrs):
    parts = []
    for key, value in attrs.items():
        if value is None:
            continue
        name = _NAMES.get(key)
        if name is None:
            name = _NAMES[key] = key.rstrip("_").replace("_", "-")
        if isinstance(value, float):  # a number needs no quoting
            parts.append(f' {name}="{_num(value)}"')
            continue
        text = str(value)
        # Most values are numbers and colours: quote directly, escape only if needed.
        parts.append(
            f" {name}={quoteattr(text)}"
            if _NEEDS_QUOTING.intersection(text)
            else f' {name}="{text}"'
        )
    return "".join(parts)


@functools.lru_cache(maxsize=64)  # a drawing has a handful of colours
def _fill_attr(fill):
    return _attrs({"fill": fill})


def _escape(text):
    """``escape(text)``, skipped for the usual text with nothing to escape."""
    return escape(text) if "&" in text or "<" in text or ">" in text else text


class Svg:
    """An SVG document built element by element; ``to_string()`` gives the text.

    Keyword arguments of the drawing methods become attributes, with ``_`` in
    a name turned into ``-`` (``stroke_width=2`` gives ``stroke-width="2"``,
    ``data_metric="step_s"`` gives ``data-metric="step_s"``). ``title`` adds a
    tooltip (an SVG ``<title>`` child) that browsers show on hover.
    """

    def __init__(self, width, height, *, font_size=12, label=None):
        self.width = width
        self.height = height
        self.font_size = font_size
        self.label = label
        self.parts = []

    def rect(self, x, y, width, height, *, fill, title=None, **attrs):
        """A filled rectangle (zero or negative widths are drawn as nothing)."""
        if width <= 0 or height <= 0:
            return
        # the numbers and the fill written directly: rectangles are most of a drawing
        tag = (
            f'<rect x="{_num(float(x))}" y="{_num(float(y))}" '
            f'width="{_num(float(width))}" height="{_num(float(height))}"'
            + _fill_attr(fill)
            + (_attrs(attrs) if attrs else "")
        )
        if title:
            self.parts.append(f"{tag}><title>{_escape(title)}</title></rect>")
        else:
            self.parts.append(f"{tag}/>")

    def line(self, x1, y1, x2, y2, *, stroke=PALETTE["muted"], stroke_width=1, **attrs):
        """A straight line."""
        # written directly, as rect: a live figure redraws dozens of lines and texts
        self.parts.append(
            f'<line x1="{_num(float(x1))}" y1="{_num(float(y1))}" '
            f'x2="{_num(float(x2))}" y2="{_num(float(y2))}" stroke="{stroke}" '
            f'stroke-width="{stroke_width}"' + (_attrs(attrs) if attrs else "") + "/>"
        )

    def text(
        self,
        x,
        y,
        content,
        *,
        size=None,
        anchor="start",
        weight=None,
        fill=PALETTE["text"],
        **attrs,
    ):
        """Text on baseline ``y`` that starts at, is centred on or ends at ``x``.

        ``anchor`` says which: ``"start"``, ``"middle"`` or ``"end"``.
        """
        self.parts.append(
            f'<text x="{_num(float(x))}" y="{_num(float(y))}" '
            f'font-size="{size or self.font_size}" text-anchor="{anchor}"'
            + (f' font-weight="{weight}"' if weight else "")
            + _fill_attr(fill)
            + (_attrs(attrs) if attrs else "")
            + f">{_escape(str(content))}</text>"
        )

    def raw(self, markup):
        """Insert ready-made SVG markup (for example another figure's elements)."""
        self.parts.append(markup)

    def to_string(self):
        """The complete ``<svg>`` element, scalable: it fills its container's width."""
        label = f' role="img" aria-label={quoteattr(self.label)}' if self.label else ""
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {_num(self.width)} {_num(self.height)}" '
            f'width="100%" style="max-width:{_num(self.width)}px;height:auto" '
            f"font-family={quoteattr(FONT)}{label}>" + "".join(self.parts) + "</svg>"
        )


class SvgFigure:
    """An SVG string that Jupyter displays as a picture (``image/svg+xml``).

    Its text repr is fixed, so stored notebook outputs do not change between
    runs (nbval compares text, not pictures). It also offers a Markdown image of
    itself, which JupyterLab draws in a notebook it has not run yet (it draws no
    ``image/svg+xml`` there; see :func:`mylib.figures.livefig.svg_markdown`).
    """

    def __init__(self, svg, name="figure"):
        self.svg = svg
        self.name = name

    def _repr_svg_(self):
        return self.svg

    def _repr_markdown_(self):
        from mylib.figures.livefig import svg_markdown

        return svg_markdown(self.svg, self.name)

    def __repr__(self):
        return f"<SVG {self.name}>"


class Axes:
    """A plot panel of ``width`` by ``height`` at ``(x, y)`` on ``svg``.

    A subclass says where a data point goes: its ``px(value)`` gives the x,
    its ``py(value)`` the y (the drawing methods here call both).
    """

    def __init__(self, svg, x, y, width, height):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, width, height

    def frame(self, x_ticks, x_format, x_label, y_ticks, y_format, y_label):
        """Grid lines at the ticks, each labelled, a border and the two axis labels."""
        s = self.svg
        for v in x_ticks:
            s.line(
                self.px(v), self.y, self.px(v), self.y + self.h, stroke=PALETTE["grid"]
            )
            s.text(
                self.px(v),
                self.y + self.h + 14,
                x_format(v),
                size=10,
                anchor="middle",
                fill=PALETTE["muted"],
            )
        for v in y_ticks:
            s.line(
                self.x, self.py(v), self.x + self.w, self.py(v), stroke=PALETTE["grid"]
            )
            s.text(
                self.x - 4,
                self.py(v) + 3,
                y_format(v),
                size=10,
                anchor="end",
                fill=PALETTE["muted"],
            )
        s.rect(self.x, self.y, self.w, self.h, fill="none", stroke=PALETTE["muted"])
        s.text(
            self.x + self.w / 2, self.y + self.h + 30, x_label, size=11, anchor="middle"
        )
        s.text(self.x, self.y - 8, y_label, size=11)

    def band(self, x0, x1, fill):
        """Shade the panel from ``x0`` to ``x1`` (pixels), bottom to top."""
        self.svg.rect(x0, self.y, x1 - x0, self.h, fill=fill)

    def corner_label(self, text, fill, anchor="start"):
        """Text in the panel's top left corner, or top right with ``anchor="end"``."""
        x = self.x + 6 if anchor == "start" else self.x + self.w - 6
        self.svg.text(x, self.y + 16, text, size=11, anchor=anchor, fill=fill)

    def curve(self, points, stroke=PALETTE["text"], width=2, dash="none", metric=None):
        """A line through ``points``, ``(x, y)`` pairs in data units.

        ``metric`` names it in a ``data-metric`` attribute.
        """
        coords = " ".join(f"{self.px(a):.1f},{self.py(b):.1f}" for a, b in points)
        extra = f' data-metric="{metric}"' if metric else ""
        self.svg.raw(
            f'<polyline points="{coords}" fill="none" stroke="{stroke}" '
            f'stroke-width="{width}" stroke-dasharray="{dash}"{extra}/>'
        )

    def marker(self, x_value, y_value):
        """A dot at ``(x_value, y_value)`` on a dashed line across the panel."""
        self.svg.line(
            self.px(x_value),
            self.y,
            self.px(x_value),
            self.y + self.h,
            stroke=PALETTE["text"],
            stroke_dasharray="2 3",
        )
        self.svg.raw(
            f'<circle cx="{self.px(x_value):.1f}" cy="{self.py(y_value):.1f}" r="5" '
            f'fill="{PALETTE["comm"]}" stroke="{PALETTE["text"]}"/>'
        )


def caption_lines(svg, x, y, line_h, lines):
    """Lines of text from baseline ``y`` down, the first in bold.

    ``lines`` holds ``(text, metric)``; the metric goes in a ``data-metric``
    attribute, so that a test can find the line.
    """
    for i, (text, metric) in enumerate(lines):
        svg.text(
            x,
            y + line_h * i,
            text,
            size=12,
            weight="bold" if i == 0 else None,
            data_metric=metric,
        )


def nice_step(span, target_ticks=5):
    """A round tick spacing giving about ``target_ticks`` ticks.

    Round means 1, 2 or 5 times a power of ten.
    """
    if span <= 0:
        return 1.0
    raw = span / max(target_ticks, 1)
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return factor * power
    return 10 * power


def ticks(lo, hi, target_ticks=5):
    """Round tick positions covering ``[lo, hi]``."""
    step = nice_step(hi - lo, target_ticks)
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def format_seconds(seconds, digits=3):
    """A duration in the unit that reads best: ``12.3 ms``, ``850 µs``, ``1.20 s``."""
    # floats remembered, as the lanes of one figure repeat their times; but 0.0 and
    # -0.0 are one key to a cache and print "0 µs" and "-0 µs"
    if type(seconds) is float and seconds:
        return _seconds_text(seconds, digits)
    return _format(seconds, digits)


def _format(seconds, digits):
    magnitude = abs(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if magnitude >= scale or unit == "µs":
            value = seconds / scale
            decimals = (
                max(digits - 1 - int(math.floor(math.log10(abs(value)))), 0)
                if value
                else 0
            )
            return f"{value:.{decimals}f} {unit}"
    raise AssertionError("unreachable")


_seconds_text = functools.lru_cache(maxsize=4096, typed=True)(_format)


def time_axis(fig, x_of, t_max, top, grid_bottom, label_y):
    """Vertical grid lines at round times, from ``top`` to ``grid_bottom``.

    Each is labelled at height ``label_y``. The time axis every timeline drawing
    shares; ``x_of`` maps seconds to x.
    """
    for tick in ticks(0, t_max):
        fig.line(x_of(tick), top, x_of(tick), grid_bottom, stroke=PALETTE["grid"])
        fig.text(
            x_of(tick),
            label_y,
            format_seconds(tick, digits=2) if tick else "0",
            anchor="middle",
            size=10,
            fill=PALETTE["muted"],
        )


def format_bytes(nbytes, digits=3):
    """A size in binary units: ``512 B``, ``16.0 KB``, ``25.0 MB``, ``1.50 GB``.

    1 MB is 2**20 bytes.
    """
    value = float(nbytes)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            if unit == "B":
                return f"{int(value)} B"
            decimals = (
                max(digits - 1 - int(math.floor(math.log10(abs(value)))), 0)
                if value
                else 0
            )
            return f"{value:.{decimals}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
