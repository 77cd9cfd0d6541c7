/* planner.js: the static site's half of mylib.figures.planner.Planner.
 *
 * The planner arrives in the page as its static twin (Planner.static_html):
 * the form as plain HTML inputs, the default plan, and data attributes naming
 * the Python function that renders a plan (data-module, data-function) and
 * the mylib modules it needs (data-modules). Once the page has loaded, this
 * script asks livefig.js's Python worker (window.mylibLivefig.call: Pyodide
 * served by the site itself, no network, running off the page's thread) to load
 * those modules, and on every change of an input calls
 * mylib.figures.planner.render_json there with the form's values: the plan is
 * computed by the book's own Python while the page keeps answering. One
 * computation is in flight at a time; changes made meanwhile are coalesced,
 * the latest values win; the derivations a reader has unfolded stay unfolded.
 *
 * For tests and the curious, the planner carries data-state (static,
 * loading, live, error), data-renders, data-render-ms (the last plan's Python
 * time, in the worker), data-input-ms (from the change to the new plan on
 * screen) and data-python (ready once Python and the modules are in).
 */
(function () {
  "use strict";
  function valuesOf(root) {
    var values = {};
    root.querySelectorAll(".planner-form [name]").forEach(function (el) {
      values[el.name] = el.type === "checkbox" ? el.checked : el.value;
    });
    return values;
  }

  // The plan for these values, computed in the worker: a promise of {result, ms}.
  function compute(root, values) {
    if (!window.mylibLivefig) return Promise.reject(new Error("livefig.js is not loaded"));
    return window.mylibLivefig.call(root.dataset.module, root.dataset.function,
                                    [JSON.stringify(values)], JSON.parse(root.dataset.modules));
  }

  function setStatus(root, state, message) {
    root.dataset.state = state;
    var status = root.querySelector(".planner-status");
    if (status && message) status.textContent = message;
  }

  async function redraw(root) {
    if (root._busy) { root._pending = true; return; }
    root._busy = true;
    try {
      do {
        root._pending = false;
        if (root.dataset.state === "static") setStatus(root, "loading", "Loading Python in your browser...");
        var inputAt = root._inputAt;
        root._inputAt = null;
        var answer = await compute(root, valuesOf(root));
        var out = root.querySelector(".planner-output");
        var open = Array.from(out.querySelectorAll("details[open]")).map(function (d) { return d.dataset.fold; });
        out.innerHTML = answer.result;
        open.forEach(function (fold) {
          var d = out.querySelector('details[data-fold="' + fold + '"]');
          if (d) d.open = true;
        });
        var done = performance.now();
        root.dataset.renderMs = answer.ms.toFixed(2);
        if (inputAt != null) root.dataset.inputMs = (done - inputAt).toFixed(2);
        root.dataset.renders = String(Number(root.dataset.renders || 0) + 1);
        setStatus(root, "live", "Computed in your browser by the book's own Python (" +
                  root.dataset.module + "), " + answer.ms.toFixed(0) + " ms for this plan.");
      } while (root._pending);
    } catch (err) {
      console.error("planner: " + err);
      setStatus(root, "error", "Could not compute the plan in this page: " + err);
    } finally {
      root._busy = false;
    }
  }

  // Sent to the worker at once; changes made while a plan is computed are
  // coalesced into one more, with the values the form has then.
  function schedule(root) {
    if (root._inputAt == null) root._inputAt = performance.now();
    redraw(root);
  }

  function setUp(root) {
    if (root._planner || !root.dataset.module) return;
    root._planner = true;
    var form = root.querySelector(".planner-form");
    form.addEventListener("input", function () { schedule(root); });
    form.addEventListener("change", function () { schedule(root); });
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    root.querySelectorAll(".planner-example").forEach(function (button) {
      button.addEventListener("click", function () {
        var text = form.querySelector("textarea[name=nccl_tests]");
        text.value = button.dataset.example;
        schedule(root);
      });
    });
  }

  // Load Python and compute once, unseen, so that the reader's first change only computes.
  function preload() {
    document.querySelectorAll(".planner[data-module]").forEach(function (root) {
      compute(root, valuesOf(root)).then(function () {
        root.dataset.python = "ready";
      }).catch(function (err) { root.dataset.python = "error"; console.error("planner: " + err); });
    });
  }

  function setUpAll() { document.querySelectorAll(".planner").forEach(setUp); }
  window.mylibPlanner = { redraw: redraw, values: valuesOf };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUpAll);
  else setUpAll();
  if (document.readyState === "complete") preload();
  else window.addEventListener("load", preload);
})();
