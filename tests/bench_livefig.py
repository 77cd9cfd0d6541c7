"""`make bench`: how fast the site's live figures answer a reader, in headless Chromium.

Runs tests/test_browser_livefig_timing.py with ``LIVEFIG_BENCH=1`` on the built site
(``make book`` first; Chromium from ``apt-get install -y chromium``): per chapter
page, the key pressed 0.3 s after the load (while Python loads in its worker), the
long tasks of the page's main thread in the 10 s after the load, the right arrow to
the next chapter pressed 0.3 s after the load, and 12 warm redraws of every slider
of every live figure, each key pressed once the last drawing is on screen. Target:
no long task, warm redraws under 16 ms (one frame at 60 Hz) from the key's input
event to the drawing in place. Nothing is asserted.

    python tests/bench.py livefig
"""

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TIMINGS = os.path.join(ROOT, "_build", "livefig-timings.json")
FRAME_MS = 16


def _measure():
    if not os.path.exists(os.path.join(ROOT, "_build", "html", "index.html")):
        sys.exit("bench livefig: no built site in _build/html: run `make book` first")
    if os.path.exists(TIMINGS):
        os.remove(TIMINGS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "browser"]
        + [
            "-p",
            "no:cacheprovider",
            os.path.join(HERE, "test_browser_livefig_timing.py"),
        ],
        cwd=ROOT,
        env={**os.environ, "LIVEFIG_BENCH": "1"},
        timeout=1800,
    )
    if done.returncode != 0 or not os.path.exists(TIMINGS):
        sys.exit(f"bench livefig: the browser visits failed (exit {done.returncode})")
    with open(TIMINGS) as f:
        return json.load(f)


def run():
    """Per chapter page: loading and warm redraws; the result of tests/bench.py."""
    timings = _measure()
    rows, medians = [], []
    for page, seen in sorted(timings.items()):
        sliders = seen["warm redraw, every slider"]
        page_medians = [s["input to drawn median ms"] for s in sliders.values()]
        medians += page_medians
        rows.append(
            [
                page.split("/")[-1][: -len(".html")],
                seen["long tasks after load"],
                seen["move 0.3 s after load: key answered (ms)"],
                seen["move 0.3 s after load: drawn after (ms)"],
                seen["right arrow 0.3 s after load: next page after (ms)"],
                seen["Pyodide load (ms)"],
                len(sliders),
                statistics.median(page_medians),
                max(page_medians),
                sum(m < FRAME_MS for m in page_medians),
            ]
        )
    under = sum(m < FRAME_MS for m in medians)
    return {
        "title": "Live figures in the browser: loading and redraws",
        "summary": (
            f"Headless Chromium at 1280 x 900 on the built site; per slider, the "
            f"median of 12 warm redraws from the key's input event to the drawing in "
            f"place. Over the {len(medians)} sliders of {len(rows)} chapters: median "
            f"{statistics.median(medians):.1f} ms, {under} sliders under "
            f"{FRAME_MS} ms (one frame), slowest {max(medians):.1f} ms."
        ),
        "tables": [
            {
                "title": "Per chapter (times in ms)",
                "columns": [
                    "chapter",
                    "long tasks in 10 s after load",
                    "key 0.3 s after load answered",
                    "that move drawn",
                    "next chapter's arrow key",
                    "Pyodide load",
                    "sliders",
                    "warm redraw median (of slider medians)",
                    "slowest slider median",
                    f"sliders under {FRAME_MS} ms",
                ],
                "rows": rows,
                "note": "Every slider's medians: _build/livefig-timings.json.",
            }
        ],
    }
