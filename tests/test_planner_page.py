"""The planner's HTML (the page and the Jupyter widget) shows the plan's numbers.

Every number on the page sits in an element with ``data-key`` and
``data-value`` and has its derivation (``data-derivation``) in a fold of the
same section; the widget redraws with the same HTML the page computes. The
browser's half is ``tests/test_browser_plan.py``.
"""

import html.parser
import json

from mylib.figures import planner as page
from mylib.models import plan_inputs as inputs


class Keys(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.shown, self.derived, self.fields = {}, set(), set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-key" in a:
            self.shown[a["data-key"]] = a["data-value"]
        if "data-derivation" in a:
            self.derived.add(a["data-derivation"])
        if tag in ("input", "select", "textarea") and "name" in a:
            self.fields.add(a["name"])


def parsed(text):
    keys = Keys()
    keys.feed(text)
    return keys


def test_every_number_shown_has_its_derivation():
    for values in ({}, {"node": "cloud, 1 NIC"}, {"model": "Llama 3 8B", "nodes": 1}):
        p, _ = inputs.run(values)
        keys = parsed(page.render(values))
        assert keys.shown and set(keys.shown) <= keys.derived
        for key, value in keys.shown.items():
            assert float(value) == p.values[key].value
        assert set(keys.derived) == set(p.values) - {"model.params"}


def test_nothing_fits_shows_the_advice_and_no_run():
    text = page.render({"model": "Llama 3 405B"})
    assert "The smallest configuration that fits: ZeRO-3" in text
    assert "torchrun" not in text and 'data-key="run.step_s"' not in text


def test_bad_input_shows_the_error():
    text = page.render({"nodes": "0"})
    assert "planner-error" in text and "number of nodes" in text
    assert "Cannot plan this" in page.render_json(json.dumps({"micro_batch": "x"}))


def test_calibration_shows_the_fitted_regimes():
    text = page.render({"nccl_tests": page.example_output()})
    assert 'data-calibrated="1"' in text and "DGX H100, calibrated" in text


def test_the_twin_carries_every_input_and_the_default_plan():
    twin = page.Planner().static_html()
    assert parsed(twin).fields == {f.name for f in inputs.FIELDS}
    assert page.render() in twin
    assert 'data-function="render_json"' in twin and "planner-jupyter" in twin
    modules = json.loads(
        twin.split('data-modules="')[1].split('"')[0].replace("&quot;", '"')
    )
    assert "figures.planner" in modules and "models.planner" in modules


def test_the_widget_redraws_with_the_pages_html():
    planner = page.Planner()
    view = planner.widget()
    assert view.output.value == page.render()
    nodes = next(
        w
        for box in view.children[0].children
        for w in box.children
        if getattr(w, "description", "") == inputs.BY_NAME["nodes"].label
    )
    nodes.value = 16
    assert view.output.value == page.render({"nodes": 16})
    assert len(planner.redraw_s) == 1


def test_a_custom_node_is_the_cluster_model_of_its_fields():
    from mylib.models.cluster import NVLINK_PAYLOAD_SHARE, nic_each_way

    values = {"node": "custom", "gpus_per_node": 4, "nvlink_gb_s": 100,
              "nics_per_node": 2, "nic_gbit_s": 200, "gpu_memory_gb": 48,
              "bf16_tflops": 300, "model": "Llama 3 8B", "nodes": 3}  # fmt: skip
    p, _ = inputs.run(values)
    c = p.cluster
    assert (c.nodes, c.gpus_per_node, c.nics_per_node) == (3, 4, 2)
    assert c.nvlink_bw == 100e9 * NVLINK_PAYLOAD_SHARE
    assert c.nic_bw == nic_each_way(200)
    assert (p.node.gpu.memory, p.node.gpu.bf16_flops) == (48e9, 300e12)
    assert set(parsed(page.render(values)).shown) <= set(p.values)
