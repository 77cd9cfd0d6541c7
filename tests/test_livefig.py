"""LiveFigure's Python side: sliders, the static twin and the widget.

Also what the build ships to the browser.
"""

import importlib.util
import json
import os
import re
import types
from html.parser import HTMLParser

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.figures import browser
from mylib.figures.costmodel import allreduce_cost_figure
from mylib.figures.livefig import LiveFigure, Slider, render_positions
from mylib.figures.timeline import BUCKETING_SLIDERS, bucketing_figure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def chapter_figure():
    return LiveFigure(bucketing_figure, BUCKETING_SLIDERS)


class TwinParser(HTMLParser):
    """Collects the static twin's attributes and inputs."""

    def __init__(self):
        super().__init__()
        self.figure, self.inputs, self.svgs = None, [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "livefig" in (attrs.get("class") or "").split() and tag == "div":
            self.figure = attrs
        elif tag == "input":
            self.inputs.append(attrs)
        elif tag == "svg":
            self.svgs += 1


def parse_twin(text):
    parser = TwinParser()
    parser.feed(text)
    return parser


def test_range_slider_snaps_to_its_grid_and_range():
    s = Slider("x", min=0.5, max=10.0, step=0.5, default=3.0, unit="ms")
    assert s.kind == "float" and s.decimals == 1
    assert s.value_at(3.2) == 3.0 and s.value_at(3.3) == 3.5
    assert s.value_at(-4) == 0.5 and s.value_at(99) == 10.0
    assert s.text(3.0) == "3.0 ms"
    i = Slider("n", min=2, max=96, step=2, default=24)
    assert (
        i.kind == "int"
        and i.value_at("24.9") == 24
        and isinstance(i.value_at(25.9), int)
    )
    assert Slider("t", min=0.0, max=1.0, step=0.1).value_at(0.30000000000000004) == 0.3


def test_options_slider():
    s = Slider(
        "cap",
        "bucket cap",
        options=[("0 (per parameter)", 0.0), ("25 MB", 25.0)],
        default=25.0,
    )
    assert s.kind == "options" and s.default == 25.0
    assert s.value_at(0) == 0.0 and s.value_at("1") == 25.0 and s.value_at(7) == 25.0
    assert s.text(0.0) == "0 (per parameter)" and s.position_of(25.0) == 1
    plain = Slider("ranks", options=[2, 4, 8], default=4)
    assert plain.labels == ["2", "4", "8"]


@pytest.mark.parametrize(
    "make, fix",
    [
        (lambda: Slider("x", min=0, max=1), "min, max and step"),
        (lambda: Slider("x", min=1, max=0, step=1), "max > min"),
        (lambda: Slider("x", min=0, max=10, step=1, default=11), "outside"),
        (lambda: Slider("x", options=[1, 2], default=3), "not one of the options"),
        (lambda: Slider("x", options=[]), "at least one"),
        (lambda: Slider("not a name", min=0, max=1, step=1), "name"),
        (lambda: Slider("x", options=[object()]), "JSON serializable"),
    ],
)
def test_bad_sliders_name_the_fix(make, fix):
    with pytest.raises((ValueError, TypeError), match=fix):
        make()


@settings(max_examples=200, deadline=None)
@given(
    lo=st.integers(-50, 50),
    span=st.integers(1, 100),
    step=st.sampled_from([1, 2, 5]),
    frac=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    position=st.floats(-200, 200),
)
def test_value_at_is_idempotent_and_in_range(lo, span, step, frac, position):
    for s in (
        Slider("i", min=lo, max=lo + span * step, step=step),
        Slider("f", min=lo * frac, max=(lo + span) * frac, step=frac),
    ):
        value = s.value_at(position)
        assert s.min <= value <= s.max
        assert s.value_at(s.position_of(value)) == value
        assert (
            Slider.from_spec(json.loads(json.dumps(s.spec()))).value_at(position)
            == value
        )


def test_render_positions_calls_the_same_function_with_the_same_values():
    fig = chapter_figure()
    specs = json.dumps([s.spec() for s in fig.sliders])
    positions = {"n_layers": 50, "bucket_cap_mb": 1, "backward_ms_per_layer": "7.2"}
    got = render_positions(
        "mylib.figures.timeline", "bucketing_figure", specs, json.dumps(positions)
    )
    assert got == fig.svg(
        n_layers=50, bucket_cap_mb=fig.sliders[1].options[1], backward_ms_per_layer=7.0
    )
    assert (
        render_positions("mylib.figures.timeline", "bucketing_figure", specs, "{}")
        == fig.svg()
    )


def test_static_twin_has_default_drawing_inputs_and_what_the_browser_needs():
    fig = chapter_figure()
    bundle = fig._repr_mimebundle_()
    assert set(bundle) == {
        "text/plain",
        "text/html",
        "application/vnd.jupyter.widget-view+json",
    }
    assert bundle["text/plain"] == repr(fig) and "0x" not in repr(fig)
    twin = parse_twin(bundle["text/html"])
    assert twin.svgs >= 1 and fig.svg() in bundle["text/html"]
    assert twin.figure["data-module"] == "mylib.figures.timeline"
    assert twin.figure["data-function"] == "bucketing_figure"
    assert twin.figure["data-state"] == "static"
    specs = json.loads(twin.figure["data-sliders"])
    assert [s["name"] for s in specs] == [s.name for s in fig.sliders]
    modules = json.loads(twin.figure["data-modules"])
    assert {
        "figures.livefig",
        "models.timeline",
        "figures.timeline",
        "figures.svg",
        "models.buckets",
        "models.costmodel",
        "models.layers",
    } <= set(modules)
    assert set(modules) <= set(browser.browser_modules())
    by_name = {i["name"]: i for i in twin.inputs}
    for s in fig.sliders:
        i = by_name[s.name]
        assert i["type"] == "range" and "disabled" not in i
        assert s.value_at(float(i["value"])) == s.default


def test_render_outside_mylib_works_in_jupyter_only():
    def local_render(a=1):
        return f"<svg><text>{a}</text></svg>"

    with pytest.raises(ValueError, match="in_browser=False"):
        LiveFigure(local_render, [Slider("a", min=0, max=3, step=1)])
    fig = LiveFigure(
        local_render, [Slider("a", min=0, max=3, step=1)], in_browser=False
    )
    twin = parse_twin(fig.static_html())
    assert "data-module" not in twin.figure and all(
        "disabled" in i for i in twin.inputs
    )
    assert "Run this chapter in Jupyter" in fig.static_html()


def test_slider_names_must_be_render_arguments():
    with pytest.raises(ValueError, match="no argument"):
        LiveFigure(allreduce_cost_figure, [Slider("bucket_size", min=0, max=3, step=1)])
    # a figure that takes its sliders as **values refuses a name no slider has
    with pytest.raises(ValueError, match="no slider named"):
        LiveFigure(bucketing_figure, [Slider("bucket_size", min=0, max=3, step=1)])
    with pytest.raises(ValueError, match="unique"):
        LiveFigure(
            bucketing_figure,
            [Slider("ranks", options=[2]), Slider("ranks", options=[4])],
        )
    with pytest.raises(ValueError, match="unknown slider"):
        chapter_figure().svg(bandwidth=3)


def test_render_in_a_torch_module_is_refused_with_the_import_named(tmp_path):
    with pytest.raises(ValueError, match="imports torch"):
        browser.module_closure("mylib.ddp")
    assert (
        "ddp" not in browser.browser_modules()
        and "launch" not in browser.browser_modules()
    )
    expected = {"models.buckets", "figures.livefig", "figures.svg", "models.timeline"}
    expected |= {
        "figures.timeline",
        "figures.ddp",
        "figures.browser",
        "models.__init__",
    }
    assert expected <= set(browser.browser_modules())


def test_module_scan_follows_imports(tmp_path):
    (tmp_path / "a.py").write_text("import json\nfrom mylib import b\n")
    (tmp_path / "b.py").write_text(
        "from mylib.c import f\ndef g():\n    import torch\n"
    )
    (tmp_path / "c.py").write_text(
        "try:\n    import numpy\nexcept ImportError:\n    pass\n"
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text('"""A subpackage."""\n')
    (tmp_path / "sub" / "d.py").write_text("from mylib import a\n")
    (tmp_path / "sub" / "e.py").write_text("from mylib.sub import d\n")
    # c imports numpy at module level, and a, b, d, e need c
    assert browser.browser_modules(str(tmp_path)) == ["sub.__init__"]
    (tmp_path / "c.py").write_text("import math\n")
    expected = ["a", "b", "c", "sub.__init__", "sub.d", "sub.e"]
    assert browser.browser_modules(str(tmp_path)) == expected
    assert browser.module_closure("mylib.a", str(tmp_path)) == ["a", "b", "c"]
    closure = browser.module_closure("mylib.sub.e", str(tmp_path))
    assert closure == ["a", "b", "c", "sub.__init__", "sub.d", "sub.e"]
    (tmp_path / "f.py").write_text("from . import a\n")
    with pytest.raises(ValueError, match="absolute imports"):
        browser.browser_modules(str(tmp_path))


def test_widget_redraws_with_the_same_values_as_the_browser():
    fig = chapter_figure()
    box = fig.widget()
    assert fig.widget() is box  # built once
    controls = box.children[0].children
    assert [c.description for c in controls] == [
        f"{s.label} ({s.unit})" if s.unit else s.label for s in fig.sliders
    ]
    by_name = dict(zip((s.name for s in fig.sliders), controls))
    by_name["n_layers"].value = 40
    by_name["bucket_cap_mb"].index = 1
    by_name[
        "backward_ms_per_layer"
    ].value = 7.0000000001  # float noise from a front end snaps to the grid
    assert fig.values["n_layers"] == 40 and fig.values["backward_ms_per_layer"] == 7.0
    assert box.drawing.value == bucketing_figure(**fig.values)
    assert len(fig.redraw_s) == 3 and all(t > 0 for t in fig.redraw_s)
    specs = json.dumps([s.spec() for s in fig.sliders])
    positions = {"n_layers": 40, "bucket_cap_mb": 1, "backward_ms_per_layer": 7}
    assert (
        render_positions(fig.module, fig.function, specs, json.dumps(positions))
        == box.drawing.value
    )


def load_extension():
    path = os.path.join(ROOT, "book", "_ext", "mylib_static.py")
    spec = importlib.util.spec_from_file_location("mylib_static_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_extension_ships_exactly_the_browser_modules(tmp_path):
    ext = load_extension()
    app = types.SimpleNamespace(
        outdir=str(tmp_path), builder=types.SimpleNamespace(format="html")
    )
    ext.copy_mylib(app, None)
    dest = tmp_path / "_static" / "mylib"
    shipped = sorted(
        str(path.relative_to(dest).with_suffix("")).replace(os.sep, ".")
        for path in dest.rglob("*.py")
    )
    assert shipped == sorted(browser.browser_modules() + ["__init__"])
    init = (tmp_path / "_static" / "mylib" / "__init__.py").read_text()
    assert "import" not in init  # the real __init__ names classes that need torch
    for name in browser.browser_modules():
        with open(browser.module_path(name)) as original:
            assert open(browser.module_path(name, dest)).read() == original.read()


def test_the_site_prefers_the_static_twin_over_the_widget():
    from myst_nb.core.render import get_mime_priority

    with open(os.path.join(ROOT, "_config.yml")) as f:
        config = yaml.safe_load(f)
    overrides = [
        tuple(o) for o in config["sphinx"]["config"]["nb_mime_priority_overrides"]
    ]
    priority = get_mime_priority("html", overrides)
    bundle = chapter_figure()._repr_mimebundle_()
    chosen = next(mime for mime in priority if mime in bundle)
    assert chosen == "text/html"
    # A plain widget (no text/html) still renders as a widget on the site.
    assert priority.index("application/vnd.jupyter.widget-view+json") < priority.index(
        "text/plain"
    )
    assert "mylib_static" in config["sphinx"]["local_extensions"]


def test_livefig_js_calls_the_python_entry_point_with_the_twin_attributes():
    with open(os.path.join(ROOT, "book", "_static", "livefig.js")) as f:
        js = f.read()
    assert "render_positions" in js and "pyodide/pyodide.mjs" in js and "mylib/" in js
    for attribute in ("module", "function", "modules", "sliders"):
        assert re.search(rf"dataset\.{attribute}\b", js), attribute
    assert not re.search(
        r"https?://", js
    )  # everything comes from the site itself: no CDN
