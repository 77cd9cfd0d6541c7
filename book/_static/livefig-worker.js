// Web Worker of the live figures and the planner: the book's Python (Pyodide) off the page's thread.
//
// livefig.js starts one per page. Loading Pyodide (seconds) and every redraw run
// here, so the page keeps answering keys, scrolling and slider moves while Python
// loads; only putting the returned SVG or HTML in place runs on the page's thread.
//
// Messages in (each with an id and the site's addresses, `where`: {pyodide: the URL of
// pyodide.mjs, mylib: the folder of the mylib modules};
// answered one at a time, in order of arrival):
//   {id, where, op: "load", modules}                       load Python and those mylib modules
//   {id, where, op: "call", modules, module, function, args}   module.function(*args) -> str
//   {id, where, op: "run", modules, script, globals}       runPython(script) with those globals
// Messages out: {id, result, ms} (ms: Python's time for this request) or {id, error};
//               {op: "ready", loadMs} once, when Python is loaded.
const SITE_DIR = "/home/pyodide/site";
let ready = null;
let mylibUrl = null;
const moduleLoads = {};
let collectTimer = 0;

async function fetchText(path) {
  const response = await fetch(mylibUrl + path);
  if (!response.ok) throw new Error(`could not fetch ${path}: HTTP ${response.status}`);
  return response.text();
}

async function setUp(where) {
  const started = performance.now();
  mylibUrl = where.mylib;
  const { loadPyodide } = await import(where.pyodide);
  const py = await loadPyodide({ indexURL: new URL("./", where.pyodide).href });
  py.FS.mkdirTree(SITE_DIR + "/mylib");
  py.FS.writeFile(SITE_DIR + "/mylib/__init__.py", await fetchText("__init__.py"));
  py.runPython(`import sys; sys.path.insert(0, '${SITE_DIR}')`);
  // Python's cycle collector would otherwise run in the middle of a redraw, every
  // few hundred allocations (a redraw makes thousands). The drawings make little
  // cyclic garbage: it is collected when no redraw came for a moment (collectLater).
  py.runPython("import gc; gc.disable()");
  self.postMessage({ op: "ready", loadMs: performance.now() - started });
  return py;
}

function loadModules(py, names) {
  const fresh = (names || []).filter((name) => !moduleLoads[name]);
  if (!fresh.length) return Promise.all((names || []).map((name) => moduleLoads[name]));
  return Promise.all((names || []).map((name) => {
    if (!moduleLoads[name]) {
      // "models.timeline" is mylib/models/timeline.py; its folder may be new
      const path = name.split(".").join("/") + ".py";
      const folder = path.includes("/") ? "/" + path.slice(0, path.lastIndexOf("/")) : "";
      moduleLoads[name] = fetchText(path).then((text) => {
        py.FS.mkdirTree(SITE_DIR + "/mylib" + folder);
        py.FS.writeFile(SITE_DIR + "/mylib/" + path, text);
      });
    }
    return moduleLoads[name];
  })).then(() => py.runPython("import importlib; importlib.invalidate_caches()"));  // new files
}

function collectLater(py) {
  clearTimeout(collectTimer);
  collectTimer = setTimeout(() => py.runPython("import gc; gc.collect()"), 1500);
}

const functions = {};
function pyFunction(py, module, name) {
  const key = module + "." + name;
  if (!functions[key]) functions[key] = py.pyimport(module)[name];
  return functions[key];
}

// One request at a time, in order of arrival: a redraw never interleaves with another.
let queue = Promise.resolve();

async function handle(data) {
  const py = await (ready = ready || setUp(data.where));
  await loadModules(py, data.modules);
  const started = performance.now();
  let result = null;
  if (data.op === "call") {
    result = pyFunction(py, data.module, data.function)(...(data.args || []));
  } else if (data.op === "run") {
    const names = Object.keys(data.globals || {});
    for (const name of names) py.globals.set(name, py.toPy(data.globals[name]));
    const value = py.runPython(data.script);
    result = value && value.toJs ? value.toJs({ dict_converter: Object.fromEntries }) : value;
    if (value && value.destroy) value.destroy();
  } else if (data.op !== "load") {
    throw new Error("unknown request " + data.op);
  }
  const ms = performance.now() - started;
  if (data.op !== "load") collectLater(py);
  return { result, ms };
}

self.onmessage = (e) => {
  const data = e.data;
  queue = queue.then(() => handle(data)).then(
    ({ result, ms }) => self.postMessage({ id: data.id, result, ms }),
    (err) => self.postMessage({ id: data.id, error: String(err && err.message ? err.message : err) }),
  );
};
