/* livefig.js: the static site's half of mylib.figures.livefig.LiveFigure.
 *
 * A live figure arrives in the page as its "static twin" (written by
 * LiveFigure.static_html): the default drawing, HTML range inputs, and data
 * attributes naming the Python render function (data-module, data-function),
 * the sliders (data-sliders) and the mylib modules it needs (data-modules).
 * The drawing is there at once. Python runs in a Web Worker
 * (livefig-worker.js): it loads Pyodide from the site itself (_static/pyodide/,
 * no network), copies those mylib modules (_static/mylib/, put there at build
 * time by book/_ext/mylib_static.py) into Pyodide's file system, and calls
 * mylib.figures.livefig.render_positions: the very same Python that draws the
 * figure in Jupyter draws it here. The page's own thread only puts the returned
 * SVG in place, so the page scrolls and answers keys while Python loads.
 *
 * The worker starts loading Python once the page has loaded, with the modules
 * of every figure on the page, and draws each figure once, unseen, so that a
 * reader's first slider move finds Python ready. A slider moved before that
 * updates its readout at once and is drawn as soon as Python is ready. Each
 * figure has at most one redraw in flight; moves made meanwhile are coalesced,
 * the latest positions win, so a fast drag never queues stale redraws.
 *
 * For tests and the curious, each figure carries data-state (static, loading,
 * live, error), data-renders (how many redraws so far), data-positions (the
 * slider positions of the drawing shown), data-render-ms (the last redraw's
 * Python time, in the worker), data-draw-ms (from sending the positions to the
 * drawing in place), data-place-ms (putting the returned SVG in place) and
 * data-input-ms (from the slider's input event to that drawing in place);
 * <html data-livefig-python> says idle, loading, ready or
 * error, window.mylibLivefig.loadMs how long Python took to load, and
 * window.mylibLivefig.run(script, globals, modules) runs Python in the worker
 * (a promise of the script's last value, converted to JavaScript).
 */
(function () {
  "use strict";
  var script = document.currentScript;
  var STATIC = script ? new URL(".", script.src).href : "_static/";
  var worker = null;
  var requests = {};  // id -> {resolve, reject}
  var nextId = 1;
  var api = {};

  function setPythonState(state) { document.documentElement.dataset.livefigPython = state; }

  function startWorker() {
    if (worker) return worker;
    setPythonState("loading");
    try {
      worker = new Worker(STATIC + "livefig-worker.js", { type: "module" });
    } catch (err) {  // file:// pages cannot start a module worker
      worker = { failed: err, postMessage: function () {} };
      setPythonState("error");
      return worker;
    }
    worker.onmessage = function (e) {
      var msg = e.data;
      if (msg.op === "ready") { api.loadMs = msg.loadMs; return; }
      var request = requests[msg.id];
      if (!request) return;
      delete requests[msg.id];
      if (msg.error) request.reject(new Error(msg.error));
      else request.resolve(msg);
    };
    worker.onerror = function (e) {
      var err = new Error("the Python worker failed: " + (e.message || "could not start"));
      worker.failed = err;
      setPythonState("error");
      Object.keys(requests).forEach(function (id) { requests[id].reject(err); delete requests[id]; });
    };
    return worker;
  }

  // Send one request to the worker; a promise of {result, ms}.
  // Where the worker finds Pyodide and the mylib modules: the site itself
  // (_static/pyodide/ from book/vendor.sh, _static/mylib/ from mylib_static.py).
  var WHERE = { pyodide: STATIC + "pyodide/pyodide.mjs", mylib: STATIC + "mylib/" };

  function ask(message) {
    var w = startWorker();
    if (w.failed) return Promise.reject(w.failed);
    return new Promise(function (resolve, reject) {
      var id = nextId++;
      requests[id] = { resolve: resolve, reject: reject };
      message.id = id;
      message.where = WHERE;
      w.postMessage(message);
    });
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

  // On a phone the drawing keeps its natural width (its text stays readable)
  // and scrolls inside its box: livefig.css reads the width from --livefig-width.
  function keepNaturalWidth(fig) {
    var svg = fig.querySelector(".livefig-figure svg");
    var box = svg && svg.viewBox && svg.viewBox.baseVal;
    if (box && box.width) fig.style.setProperty("--livefig-width", box.width + "px");
  }

  // mylib.figures.livefig.render_positions(module, function, sliders, positions),
  // in the worker: the figure's drawing for these slider positions.
  function renderRequest(fig, positions) {
    return {
      op: "call", module: "mylib.figures.livefig", function: "render_positions",
      args: [fig.dataset.module, fig.dataset.function, fig.dataset.sliders,
             JSON.stringify(positions)],
      modules: JSON.parse(fig.dataset.modules),
    };
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
        var positions = positionsOf(fig);
        var inputAt = fig._inputAt;
        fig._inputAt = null;
        var sent = performance.now();
        var answer = await ask(renderRequest(fig, positions));
        var arrived = performance.now();
        fig.querySelector(".livefig-figure").innerHTML = answer.result;
        keepNaturalWidth(fig);
        var done = performance.now();
        fig.dataset.positions = JSON.stringify(positions);
        fig.dataset.renderMs = answer.ms.toFixed(1);
        fig.dataset.drawMs = (done - sent).toFixed(1);
        fig.dataset.placeMs = (done - arrived).toFixed(1);
        if (inputAt != null) fig.dataset.inputMs = (done - inputAt).toFixed(1);
        fig.dataset.renders = String(Number(fig.dataset.renders || 0) + 1);
        setStatus(fig, "live", "Live: drawn by " + where + " running in your browser (Pyodide), " +
                  answer.ms.toFixed(0) + " ms per redraw.");
      } while (fig._pending);
    } catch (err) {
      console.error("livefig: " + where + ": " + err);
      var hint = location.protocol === "file:"
        ? " Interactive figures need the site served over HTTP, e.g. python -m http.server -d _build/html"
        : "";
      setStatus(fig, "error", "Could not redraw in this page: " + err.message + "." + hint);
    } finally {
      fig._busy = false;
    }
  }

  // A move is sent to the worker at once; moves made while a redraw is in
  // flight (a drag sends many) are coalesced into one more redraw, with the
  // positions the sliders have when that one is sent.
  function scheduleRedraw(fig) {
    if (fig._inputAt == null) fig._inputAt = performance.now();
    redraw(fig);
  }

  function setUp(fig) {
    if (fig._livefig) return;
    fig._livefig = true;
    keepNaturalWidth(fig);
    if (!fig.dataset.module) return;  // a figure without a browser render function stays static
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

  // Load Python and the modules of every figure on the page, and draw each
  // figure once, unseen (in the worker): its modules are imported and its code
  // has run, so the reader's first move costs what any later one does.
  function preload() {
    var figures = document.querySelectorAll(".livefig[data-module]");
    if (!figures.length) return;
    var names = {};
    figures.forEach(function (fig) {
      JSON.parse(fig.dataset.modules).forEach(function (n) { names[n] = true; });
    });
    ask({ op: "load", modules: Object.keys(names) }).then(function () {
      return Promise.all(Array.prototype.map.call(figures, function (fig) {
        return ask(renderRequest(fig, {}));
      }));
    }).then(function () { setPythonState("ready"); })
      .catch(function (err) { setPythonState("error"); console.error("livefig: " + err); });
  }

  function setUpAll() { document.querySelectorAll(".livefig").forEach(setUp); }

  // For tests, the planner and the curious: Python in the worker.
  // run(script, globals, modules): a promise of the script's last value.
  api.run = function (scriptText, globals, modules) {
    return ask({ op: "run", script: scriptText, globals: globals || {}, modules: modules || [] })
      .then(function (answer) { return answer.result; });
  };
  // call(module, function, args, modules): a promise of {result, ms}; args are strings.
  api.call = function (module, fn, args, modules) {
    return ask({ op: "call", module: module, function: fn, args: args || [], modules: modules || [] });
  };
  api.redraw = redraw;
  window.mylibLivefig = api;
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUpAll);
  else setUpAll();
  setPythonState("idle");
  if (document.readyState === "complete") preload();
  else window.addEventListener("load", preload);
})();
