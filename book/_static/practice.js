// The practice page's in-browser grading (book/practice.md, book/_ext/practice_page.py).
//
// Each exercise that needs only Python has an editor (a textarea kept in
// localStorage), a Grade button, hints and a reset. Grading runs the judge's
// own checks (_static/practice/bundle.json) on Pyodide inside a Web Worker
// (practice-worker.js): the page stays responsive, and code that runs past the
// time limit is stopped by terminating the worker, as the terminal judge kills
// its child process. The report is the judge's: same lines, same words.
(function () {
  "use strict";

  const STATIC = new URL(".", document.currentScript.src); // .../_static/
  const BUNDLE_URL = new URL("practice/bundle.json", STATIC).href;
  const WORKER_URL = new URL("practice-worker.js", STATIC).href;
  const STORE = "dpfs-practice:";
  // Seconds a grading may run once Python is loaded (the judge's per-exercise limit is 60 s;
  // these exercises take well under a second). Tests may lower it.
  const timeLimitS = () => window.PRACTICE_TIME_LIMIT_S || 20;

  let bundle = null;
  let worker = null;
  let nextId = 1;
  const pending = new Map();

  function loadBundle() {
    if (!bundle) {
      bundle = fetch(BUNDLE_URL).then((r) => {
        if (!r.ok) throw new Error(`cannot load ${BUNDLE_URL}: HTTP ${r.status}`);
        return r.json();
      });
    }
    return bundle;
  }

  function getWorker() {
    if (!worker) {
      worker = new Worker(WORKER_URL, { type: "module" });
      worker.onmessage = (e) => {
        const job = pending.get(e.data.id);
        if (job) job.onMessage(e.data);
      };
      worker.onerror = (e) => {
        for (const job of pending.values()) job.onMessage({ id: job.id, error: e.message || "the worker failed" });
      };
    }
    return worker;
  }

  function stopWorker() {
    if (worker) worker.terminate();
    worker = null;
  }

  // Grade `code` for `exercise`; calls onStage("loading" | "running") and resolves with the report.
  function grade(exercise, code, onStage) {
    return new Promise((resolve) => {
      const id = nextId++;
      let timer = null;
      let running = null; // the check that is running, for the timeout message
      const finish = (report) => {
        clearTimeout(timer);
        pending.delete(id);
        resolve(report);
      };
      pending.set(id, {
        id,
        onMessage(data) {
          if (data.stage === "running") {
            onStage("running");
            timer = setTimeout(() => {
              stopWorker();
              const during = running ? ` during the check '${running}'` : "";
              finish({
                verdict: "timeout",
                message: `your code ran past the time limit of ${timeLimitS()} s${during} and was stopped: ` +
                  "an infinite loop, or a wait that never ends?",
                lines: [],
              });
            }, timeLimitS() * 1000);
          } else if (data.stage === "check") {
            running = data.name;
          } else if (data.error) {
            finish({ verdict: "error", message: `the in-page judge failed: ${data.error}`, lines: [] });
          } else if (data.report) {
            finish(data.report);
          }
        },
      });
      onStage("loading");
      getWorker().postMessage({ id, exercise, code, bundleUrl: BUNDLE_URL });
    });
  }

  function render(pre, report) {
    pre.textContent = "";
    const add = (text, cls) => {
      const span = document.createElement("span");
      span.className = cls;
      span.textContent = text + "\n";
      pre.appendChild(span);
    };
    const lines = report.lines && report.lines.length ? report.lines
      : [["verdict", `${report.verdict.toUpperCase()}  ${report.message}`]];
    for (const [kind, text] of lines) add(text, `practice-line practice-${kind.replace(/\s+/g, "-")}`);
    if (report.verdict !== "passed" && report.printed && report.printed.trim()) {
      add("", "practice-line");
      add("What your code printed:", "practice-line practice-verdict");
      add(report.printed.replace(/\s+$/, ""), "practice-line practice-printed");
    }
    pre.dataset.verdict = report.verdict;
  }

  function insertSpaces(textarea, e) {
    if (e.key !== "Tab" || e.shiftKey || e.ctrlKey || e.metaKey || e.altKey) return;
    e.preventDefault();
    const { selectionStart: start, selectionEnd: end, value } = textarea;
    textarea.value = value.slice(0, start) + "    " + value.slice(end);
    textarea.selectionStart = textarea.selectionEnd = start + 4;
    textarea.dispatchEvent(new Event("input"));
  }

  function setUp(box) {
    const exercise = box.dataset.exercise;
    const textarea = box.querySelector(".practice-code");
    const status = box.querySelector(".practice-status");
    const result = box.querySelector(".practice-result");
    const hintsBox = box.querySelector(".practice-hints");
    const gradeButton = box.querySelector(".practice-grade");
    const key = STORE + exercise;
    let saved = null;
    try {
      saved = localStorage.getItem(key);
    } catch (e) { /* storage disabled: the editor still works, unsaved */ }
    if (saved !== null) textarea.value = saved;
    textarea.addEventListener("input", () => {
      try {
        localStorage.setItem(key, textarea.value);
      } catch (e) { /* full or disabled */ }
    });
    textarea.addEventListener("keydown", (e) => insertSpaces(textarea, e));

    gradeButton.addEventListener("click", async () => {
      gradeButton.disabled = true;
      result.textContent = "";
      delete result.dataset.verdict;
      const report = await grade(exercise, textarea.value, (stage) => {
        status.textContent = stage === "loading" ? "Loading Python in the page (a few seconds the first time)..."
          : "Grading...";
      });
      render(result, report);
      status.textContent = report.verdict === "passed" ? "Passed." : "Not yet: see below.";
      status.dataset.verdict = report.verdict;
      gradeButton.disabled = false;
    });

    box.querySelector(".practice-hint").addEventListener("click", async () => {
      const entry = (await loadBundle()).exercises[exercise];
      const hints = entry.hints_html || entry.hints;
      const shown = hintsBox.children.length;
      if (shown >= hints.length) {
        status.textContent = "That was the last hint.";
        return;
      }
      const div = document.createElement("div");
      div.className = "practice-hint-text";
      const head = document.createElement("strong");
      head.textContent = `Hint ${shown + 1} of ${hints.length}:`;
      div.appendChild(head);
      // The hint's Markdown, rendered at build time (book/_ext/practice_page.py,
      // raw HTML escaped): code as code, no hard line breaks.
      const body = document.createElement("div");
      if (entry.hints_html) body.innerHTML = hints[shown];
      else body.textContent = hints[shown];
      div.appendChild(body);
      hintsBox.appendChild(div);
    });

    box.querySelector(".practice-reset").addEventListener("click", async () => {
      const starter = (await loadBundle()).exercises[exercise].starter;
      if (textarea.value !== starter) {
        try {
          localStorage.setItem(key + ":backup", textarea.value); // the previous code is not lost
        } catch (e) { /* ignore */ }
      }
      textarea.value = starter;
      textarea.dispatchEvent(new Event("input"));
      result.textContent = "";
      status.textContent = "Back to the starter (your previous code is kept as a backup in this browser).";
    });
  }

  function start() {
    document.querySelectorAll(".practice-editor").forEach(setUp);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
