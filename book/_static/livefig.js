/* livefig.js: the static site's half of mylib.figures.livefig.LiveFigure.
 *
 * A live figure arrives in the page as its "static twin" (written by
 * LiveFigure.static_html): the default drawing, HTML range inputs, and data
 * attributes naming the Python render function (data-module, data-function),
 * the sliders (data-sliders) and the mylib modules it needs (data-modules).
 * The drawing is there at once. On the first slider move this script loads
 * Pyodide from the site itself (_static/pyodide/, no network), copies those
 * mylib modules (_static/mylib/, put there at build time by
 * book/_ext/mylib_static.py) into Pyodide's file system, and calls
 * mylib.figures.livefig.render_positions: the very same Python that draws the figure
 * in Jupyter draws it here.
 *
 * Pyodide starts loading as soon as the page is idle after its load
 * (requestIdleCallback), with the modules of every figure on the page, so that
 * a reader's first slider move finds Python ready. Slider input events are
 * coalesced to one redraw per animation frame, always with the latest
 * positions: a fast drag never queues stale redraws. Python's cycle collector
 * is off while the page redraws and runs when the page is idle.
 *
 * For tests and the curious, each figure carries data-state (static, loading,
 * live, error), data-renders (how many redraws so far), data-positions (the
 * slider positions of the drawing shown), data-render-ms (the last redraw: Python
 * and the page update) and data-input-ms (from the slider's input event to that
 * drawing on screen); <html data-livefig-python> says idle, loading, ready or
 * error, window.mylibLivefig.loadMs how long Python took to load, and
 * window.mylibLivefig.python(["timeline", ...]) gives the page's Pyodide.
 */
(function () {
  "use strict";
  var script = document.currentScript;
  var STATIC = script ? new URL(".", script.src).href : "_static/";
  var SITE_DIR = "/home/pyodide/site";
  var pythonReady = null;   // one Pyodide for every figure on the page
  var moduleLoads = {};     // mylib module name -> promise of it being in Pyodide's file system
  var renderer = null;      // mylib.figures.livefig.render_positions, once imported
  var api = {};

  function fetchText(path) {
    return fetch(STATIC + path).then(function (response) {
      if (!response.ok) throw new Error("could not fetch " + path + ": HTTP " + response.status);
      return response.text();
    });
  }

  function setPythonState(state) { document.documentElement.dataset.livefigPython = state; }

  function loadPython() {
    if (!pythonReady) {
      var started = performance.now();
      setPythonState("loading");
      pythonReady = (async function () {
        var pyodideModule = await import(STATIC + "pyodide/pyodide.mjs");
        var py = await pyodideModule.loadPyodide({ indexURL: STATIC + "pyodide/" });
        py.FS.mkdirTree(SITE_DIR + "/mylib");
        py.FS.writeFile(SITE_DIR + "/mylib/__init__.py", await fetchText("mylib/__init__.py"));
        py.runPython("import sys; sys.path.insert(0, '" + SITE_DIR + "')");
        // Python's cycle collector would otherwise run in the middle of a
        // redraw, every few hundred allocations (a redraw makes thousands).
        // The drawings make little cyclic garbage: collect it when the page
        // is idle instead (collectWhenIdle).
        py.runPython("import gc; gc.disable()");
        return py;
      })();
      pythonReady.then(function () {
        api.loadMs = performance.now() - started;
      }, function (err) {
        setPythonState("error");
        console.error("livefig: could not load Python: " + err);
      });
    }
    return pythonReady;
  }
  function loadModules(py, names) {
    return Promise.all(names.map(function (name) {
      if (!moduleLoads[name]) {
        // "models.timeline" is mylib/models/timeline.py; its folder may be new
        var path = name.split(".").join("/") + ".py";
        var folder = path.lastIndexOf("/") > 0 ? "/" + path.slice(0, path.lastIndexOf("/")) : "";
        moduleLoads[name] = fetchText("mylib/" + path).then(function (text) {
          py.FS.mkdirTree(SITE_DIR + "/mylib" + folder);
          py.FS.writeFile(SITE_DIR + "/mylib/" + path, text);
        });
      }
      return moduleLoads[name];
    })).then(function () { py.runPython("import importlib; importlib.invalidate_caches()"); });
  }

  // What the readout next to a slider says; the drawing itself always comes from Python.
  function readout(spec, raw) {
    if (spec.kind === "options") {
      var i = Math.max(0, Math.min(Math.round(raw), spec.options.length - 1));
      return spec.options[i][0];
    }
    var k = Math.round((raw - spec.min) / spec.step);
    var value = Math.min(Math.max(spec.min + k * spec.step, spec.min), spec.max);
    var text = spec.kind === "int" ? String(Math.round(value)) : value.toFixed(spec.decimals);
    return spec.unit ? text + " " + spec.unit : text;
  }

  function setStatus(fig, state, message) {
    fig.dataset.state = state;
    var status = fig.querySelector(".livefig-status");
    if (status && message) status.textContent = message;
  }

  function positionsOf(fig) {
    var positions = {};
    fig.querySelectorAll(".livefig-controls input[type=range]").forEach(function (input) {
      positions[input.name] = Number(input.value);
    });
    return positions;
  }

  function renderPositions(py) {
    if (!renderer) renderer = py.pyimport("mylib.figures.livefig").render_positions;
    return renderer;
  }

  async function redraw(fig) {
    if (fig._busy) { fig._pending = true; return; }  // redraw once more with the latest positions afterwards
    fig._busy = true;
    var where = fig.dataset.module + "." + fig.dataset.function;
    try {
      do {
        fig._pending = false;
        if (fig.dataset.state === "static") {
          setStatus(fig, "loading", "Loading Python in your browser...");
        }
        var py = await loadPython();
        await loadModules(py, JSON.parse(fig.dataset.modules));
        var positions = positionsOf(fig);
        var inputAt = fig._inputAt;
        fig._inputAt = null;
        var started = performance.now();
        var drawing = renderPositions(py)(fig.dataset.module, fig.dataset.function,
                                          fig.dataset.sliders, JSON.stringify(positions));
        fig.querySelector(".livefig-figure").innerHTML = drawing;
        var done = performance.now();
        var ms = done - started;
        fig.dataset.positions = JSON.stringify(positions);
        fig.dataset.renderMs = ms.toFixed(1);
        if (inputAt != null) fig.dataset.inputMs = (done - inputAt).toFixed(1);
        fig.dataset.renders = String(Number(fig.dataset.renders || 0) + 1);
        setStatus(fig, "live", "Live: drawn by " + where + " running in your browser (Pyodide), " +
                  ms.toFixed(0) + " ms per redraw.");
        collectWhenIdle(py);
      } while (fig._pending);
    } catch (err) {
      console.error("livefig: " + where + ": " + err);
      var hint = location.protocol === "file:"
        ? " Interactive figures need the site served over HTTP, e.g. python -m http.server -d _build/html"
        : "";
      setStatus(fig, "error", "Could not redraw in this page: " + err + "." + hint);
    } finally {
      fig._busy = false;
    }
  }

  var collectPending = false;
  function collectWhenIdle(py) {
    if (collectPending) return;
    collectPending = true;
    var collect = function () {
      collectPending = false;
      py.runPython("import gc; gc.collect()");
    };
    if (window.requestIdleCallback) requestIdleCallback(collect, { timeout: 5000 });
    else setTimeout(collect, 500);
  }

  // Many input events can arrive between two frames (a drag): draw once per
  // frame, with the positions the sliders have then.
  function scheduleRedraw(fig) {
    if (fig._inputAt == null) fig._inputAt = performance.now();
    if (fig._frame) return;
    fig._frame = requestAnimationFrame(function () {
      fig._frame = 0;
      redraw(fig);
    });
  }

  function setUp(fig) {
    if (!fig.dataset.module || fig._livefig) return;  // a figure without a browser render function stays static
    fig._livefig = true;
    var specs = {};
    JSON.parse(fig.dataset.sliders).forEach(function (spec) { specs[spec.name] = spec; });
    fig.querySelectorAll(".livefig-controls input[type=range]").forEach(function (input) {
      input.addEventListener("input", function () {
        var out = input.parentElement.querySelector(".livefig-readout");
        if (out) out.textContent = readout(specs[input.name], Number(input.value));
        scheduleRedraw(fig);
      });
    });
  }

  // Load Python, the modules of every figure on the page, and import them, so
  // that the first slider move only draws.
  function preload() {
    var figures = document.querySelectorAll(".livefig[data-module]");
    if (!figures.length) return;
    var names = {};
    figures.forEach(function (fig) {
      JSON.parse(fig.dataset.modules).forEach(function (n) { names[n] = true; });
    });
    loadPython().then(function (py) {
      return loadModules(py, Object.keys(names)).then(function () {
        // Draw each figure once, unseen: its modules are imported and its code
        // has run, so the reader's first move costs what any later one does.
        figures.forEach(function (fig) {
          renderPositions(py)(fig.dataset.module, fig.dataset.function, fig.dataset.sliders, "{}");
        });
        setPythonState("ready");
      });
    }).catch(function (err) { setPythonState("error"); console.error("livefig: " + err); });
  }

  function setUpAll() { document.querySelectorAll(".livefig").forEach(setUp); }
  // For tests and the curious: the page's Python (a promise of the Pyodide instance, mylib loaded).
  api.python = function (modules) {
    return loadPython().then(function (py) { return loadModules(py, modules || []).then(function () { return py; }); });
  };
  api.redraw = redraw;
  window.mylibLivefig = api;
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUpAll);
  else setUpAll();
  setPythonState("idle");
  function whenIdle() {
    if (window.requestIdleCallback) requestIdleCallback(preload, { timeout: 2000 });
    else setTimeout(preload, 200);
  }
  if (document.readyState === "complete") whenIdle();
  else window.addEventListener("load", whenIdle);
})();
