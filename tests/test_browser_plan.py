"""The "Plan your run" page in a real browser: live, exact, fast, narrow, offline.

On the built site, with no kernel and no network, changing an input must
redraw the plan with the numbers Python computes for the same inputs (the
page runs the very same ``mylib.figures.planner.render``). A benchmark, not a
timed assertion, prints how long each redraw took after each input changed
(the target: a median under 16 ms, one frame) and writes them to
``_build/planner-timings.json``: in ``make test`` two changes an input, on the
page the other checks at 1280 px use (each leaves every input at its default;
loading the page and its Python costs 8-12 CPU-s); with ``LIVEFIG_BENCH=1`` it
has a page of its own and eight changes an input. At 390 px wide the page must not
scroll sideways and must still redraw.

Needs the site built (``make book``) and Chromium. Run with ``-s`` to see the
benchmark: ``LIVEFIG_BENCH=1 pytest tests/test_browser_plan.py -m browser -s``.
"""

import contextlib
import json
import statistics

import pytest
import site_timing
from conftest import SITE
from test_planner_page import parsed

from mylib.figures import planner as page
from mylib.models import plan_inputs as inputs

pytestmark = pytest.mark.browser

browser = pytest.importorskip("browser", reason="tests/browser.py is missing")

PAGE = "notebooks/10_plan_your_run.html"
RESULTS = SITE.parent / "planner-timings.json"

READ_JS = """root => Object.fromEntries(Array.from(
    root.querySelectorAll('.planner-output [data-key]')).map(
    e => [e.dataset.key, e.dataset.value]))"""

SET_JS = """([root, name, value]) => {
    const el = root.querySelector(`.planner-form [name="${name}"]`);
    if (el.type === 'checkbox') el.checked = value; else el.value = String(value);
    el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true}));
}"""


@pytest.fixture(scope="module")
def built():
    if not (SITE / PAGE).exists():
        pytest.skip(f"no {PAGE} in {SITE}: build the site first with `make book`")


@pytest.fixture(scope="module")
def planner(built, site, chromium):
    """The page at 1280 px, for the checks that leave every input at its default."""
    with open_planner(chromium, site) as page:
        yield page


@contextlib.contextmanager
def open_planner(chromium, site, viewport=(1280, 900)):
    """The page with its Python ready: yields ``(tab, root, problems)``."""
    url = f"{site}/{PAGE}"
    with browser.open_page(chromium, url, viewport=viewport) as (tab, problems):
        root = tab.locator(".planner[data-module]").first
        root.scroll_into_view_if_needed()
        tab.wait_for_function(
            "el => el.dataset.python === 'ready' || el.dataset.python === 'error'",
            arg=root.element_handle(),
            timeout=180_000,
        )
        assert root.get_attribute("data-python") == "ready", problems
        yield tab, root, problems


def set_input(tab, root, name, value):
    """Change one input as a reader would; wait for the redraw; its time (ms)."""
    renders = int(root.get_attribute("data-renders") or 0)
    tab.evaluate(SET_JS, [root.element_handle(), name, value])
    tab.wait_for_function(
        "([el, n]) => Number(el.dataset.renders) > n || el.dataset.state === 'error'",
        arg=[root.element_handle(), renders],
        timeout=120_000,
    )
    assert root.get_attribute("data-state") == "live", root.inner_text()[:500]
    return float(root.get_attribute("data-render-ms"))


def python_keys(values):
    return parsed(page.render(values)).shown


def same(shown, values):
    """The page's numbers are Python's: equal keys, values to 1e-12.

    Not bit for bit: the page's Python is newer (CPython 3.14 in Pyodide), and
    since 3.12 ``sum()`` of floats adds with compensation, so the last bits of
    a sum can differ.
    """
    want = python_keys(values)
    assert set(shown) == set(want)
    for key, value in want.items():
        assert float(shown[key]) == pytest.approx(float(value), rel=1e-12, abs=1e-15), (
            key
        )
    return True


CASES = [
    {"node": "cloud, 1 NIC"},
    {"model": "Llama 3 8B", "nodes": 2, "checkpointing": False},
    {"model": "GPT-2 124M", "nodes": 1, "micro_batch": 8, "precision": "fp32"},
    {"model": "custom", "layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 4},
    {"node": "custom", "gpus_per_node": 4, "nics_per_node": 1, "nic_gbit_s": 100},
    {"model": "Llama 3 405B"},  # nothing fits: the smallest configuration
]


def test_the_page_plans_what_python_plans(planner):
    tab, root, problems = planner
    assert same(tab.evaluate(READ_JS, root.element_handle()), {})
    values = {}
    for case in CASES:
        values = {**inputs.defaults(), **case}
        for name, value in case.items():
            set_input(tab, root, name, value)
        shown = tab.evaluate(READ_JS, root.element_handle())
        assert same(shown, values), case
        text = root.locator(".planner-output").inner_text()
        assert ("Nothing fits" in text) == (case.get("model") == "Llama 3 405B")
        for name in case:  # back to the defaults for the next case
            set_input(tab, root, name, inputs.defaults()[name])
    assert not problems, "\n".join(problems)


def test_calibration_from_a_paste_and_its_errors(built, site, chromium):
    with open_planner(chromium, site) as (tab, root, problems):
        renders = int(root.get_attribute("data-renders") or 0)
        root.locator(".planner-example").click()
        tab.wait_for_function(
            "([el, n]) => Number(el.dataset.renders) > n",
            arg=[root.element_handle(), renders],
            timeout=60_000,
        )
        out = root.locator(".planner-output")
        assert out.locator("[data-calibrated]").count() == 1
        assert "DGX H100, calibrated" in out.inner_text()
        set_input(tab, root, "nccl_tests", "Collective: Alltoall\n 65536 262144 76.4")
        assert "no all_reduce_perf table found" in out.inner_text()
        assert not problems, "\n".join(problems)


def test_an_open_derivation_stays_open_across_redraws(planner):
    tab, root, problems = planner
    fold = root.locator(".planner-output details").first
    fold.locator("summary").click()
    set_input(tab, root, "nodes", 16)
    assert root.locator(".planner-output details").first.evaluate("d => d.open")
    assert root.locator("[data-derivation]").count() > 40
    fold.locator("summary").click()  # as it was: folded, and 8 nodes
    set_input(tab, root, "nodes", inputs.defaults()["nodes"])
    assert not problems, "\n".join(problems)


# The values each input takes in turn: new ones where the input allows it, so
# that the planner's remembered timelines do not help; two-valued inputs
# (precision, optimizer, the checkboxes) go back and forth.
BENCH = {
    "model": ["Llama 3 8B", "GPT-2 124M", "nanoGPT Shakespeare", "Llama 3 405B",
              "Llama 3 70B", "Llama 3 8B", "GPT-2 124M", "Llama 3 70B"],
    "seq": [1024, 2048, 3072, 4096, 6144, 12288, 16384, 0],
    "layers": [40, 41, 42, 43, 44, 45, 46, 80],
    "node": ["cloud, 2 NICs", "DGX A100", "DGX H200", "cloud, 1 NIC", "DGX H100",
             "cloud, 2 NICs", "DGX A100", "DGX H100"],
    "nodes": [9, 10, 11, 12, 13, 14, 15, 8],
    "global_batch_mtokens": [5, 6, 7, 8, 9, 10, 11, 4],
    "micro_batch": [2, 3, 4, 5, 6, 7, 8, 1],
    "precision": ["fp32", "bf16"] * 4,
    "optimizer": ["sgd-momentum", "adam"] * 4,
    "checkpointing": [False, True] * 4,
    "flash_attention": [False, True] * 4,
    "efficiency_pct": [41, 42, 43, 44, 45, 46, 47, 40],
    "node_mtbf_days": [100, 101, 102, 103, 104, 105, 106, 264],
    "checkpoint_write_s": [61, 62, 63, 64, 65, 66, 67, 60],
    "restart_s": [301, 302, 303, 304, 305, 306, 307, 300],
}  # fmt: skip


def test_redraw_benchmark(built, request, site, chromium):
    with contextlib.ExitStack() as own_page:
        if site_timing.BENCH:  # a page of its own, every value
            tab, root, problems = own_page.enter_context(open_planner(chromium, site))
            changes = len(BENCH["model"])
        else:  # the shared page: a new value, then back to the default
            tab, root, problems = request.getfixturevalue("planner")
            changes = 2
        per_input, every = {}, []
        for name, values in BENCH.items():
            times = [set_input(tab, root, name, value) for value in values[-changes:]]
            per_input[name] = {
                "median ms": round(statistics.median(times), 2),
                "max ms": round(max(times), 2),
            }
            every += times
        result = {
            "page": PAGE,
            "changes": len(every),
            "median redraw (ms)": round(statistics.median(every), 2),
            "inputs with a median under 16 ms": sum(
                v["median ms"] < 16 for v in per_input.values()
            ),
            "inputs": len(per_input),
            "per input": per_input,
        }
        print("\nplanner timing: " + json.dumps(result))
        RESULTS.write_text(json.dumps(result, indent=1))
        assert not problems, "\n".join(problems)


def test_works_at_390_px_wide(built, site, chromium):
    with open_planner(chromium, site, viewport=(390, 844)) as (tab, root, problems):
        wide = tab.evaluate("() => document.documentElement.scrollWidth")
        assert wide <= 390, f"the page scrolls sideways: {wide} px"
        outside = root.evaluate(
            """r => Array.from(r.querySelectorAll('.planner-form [name]'))
            .filter(e => e.getBoundingClientRect().right > 391).map(e => e.name)"""
        )
        assert not outside, f"inputs past the screen's edge: {outside}"
        set_input(tab, root, "node", "cloud, 1 NIC")
        assert same(
            tab.evaluate(READ_JS, root.element_handle()), {"node": "cloud, 1 NIC"}
        )
        assert tab.evaluate("() => document.documentElement.scrollWidth") <= 390
        browser_shot = SITE.parent / "screenshots" / "plan_your_run_390.png"
        browser_shot.parent.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(browser_shot))
        assert not problems, "\n".join(problems)
