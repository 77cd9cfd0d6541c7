// Web Worker of the practice page: runs the judge's checks on Pyodide, off the page's thread.
//
// Messages in:  {id, exercise, code, bundleUrl}
// Messages out: {id, stage: "running"}  once Python is loaded and grading starts
//               {id, stage: "check", index, name}  as each check starts
//               {id, report}  the judge's report (practice/_judge/browser.py)
//               {id, error}   if the in-page judge itself failed
import { loadPyodide } from "./pyodide/pyodide.mjs";

let ready = null;
let printed = "";

async function setUp(bundleUrl) {
  const pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
  const bundle = await (await fetch(bundleUrl)).json();
  pyodide.FS.mkdirTree("/practice/_judge");
  pyodide.FS.mkdirTree("/practice/workspace");
  for (const [name, text] of Object.entries(bundle.judge)) pyodide.FS.writeFile(`/practice/_judge/${name}`, text);
  for (const [id, ex] of Object.entries(bundle.exercises)) {
    pyodide.FS.mkdirTree(`/practice/exercises/${id}`);
    pyodide.FS.writeFile(`/practice/exercises/${id}/checks.py`, ex.checks);
  }
  const keep = (text) => {
    if (printed.length < 20000) printed += text + "\n";
  };
  pyodide.setStdout({ batched: keep });
  pyodide.setStderr({ batched: keep });
  pyodide.runPython("import sys; sys.path.insert(0, '/practice')");
  return { pyodide, grade: pyodide.pyimport("_judge.browser").grade };
}

self.onmessage = async (e) => {
  const { id, exercise, code, bundleUrl } = e.data;
  try {
    ready = ready || setUp(bundleUrl);
    const { pyodide, grade } = await ready;
    const path = `/practice/workspace/${exercise}.py`;
    pyodide.FS.writeFile(path, code);
    printed = "";
    self.postMessage({ id, stage: "running" });
    const onStart = (index, name) => self.postMessage({ id, stage: "check", index, name });
    const report = JSON.parse(grade(`/practice/exercises/${exercise}`, path, onStart));
    report.printed = printed.length > 3000 ? printed.slice(0, 1500) + "\n...\n" + printed.slice(-1500) : printed;
    self.postMessage({ id, report });
  } catch (err) {
    self.postMessage({ id, error: String(err && err.message ? err.message : err) });
  }
};
