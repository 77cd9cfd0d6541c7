"""Which mylib modules can run in the reader's browser.

The static site runs some of mylib's Python in the page with Pyodide (CPython
compiled to WebAssembly, with the standard library and nothing else). A module
can go there when everything it imports at module level is the standard
library or another such mylib module; imports inside functions are allowed
(they run only when called, e.g. ``ipywidgets`` in :mod:`mylib.figures.livefig`).

Modules are named relative to the package, with dots: ``"ring"``,
``"models.timeline"``, ``"figures.svg"``. A subpackage's ``__init__.py`` is
the module ``"models.__init__"``; every module of a subpackage needs it.

The book's Sphinx extension (``book/_ext/mylib_static.py``) copies every such
module into the built site (``_static/mylib/``, same folders);
:class:`mylib.figures.livefig.LiveFigure` names the modules its render
function needs. The extension loads this file by path, without importing the
``mylib`` package (whose ``__init__`` names the library's classes, which need
torch), so it imports the standard library only.
"""

import ast
import os
import sys

PACKAGE = "mylib"
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_path(name, package_dir=PACKAGE_DIR):
    """The file of module ``name`` (``"models.timeline"``) under ``package_dir``."""
    return os.path.join(package_dir, *name.split(".")) + ".py"


def module_imports(path, package_dir=PACKAGE_DIR):
    """Module-level imports of a file: ``(mylib modules, other top-level packages)``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    mylib_names, others = set(), set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _classify(alias.name, None, mylib_names, others, package_dir)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    raise ValueError(f"{path}: use absolute imports (from mylib...)")
                for alias in node.names:
                    _classify(node.module, alias.name, mylib_names, others, package_dir)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # still module level
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []) or []:
                        handler = isinstance(child, ast.ExceptHandler)
                        visit(child.body if handler else [child])

    visit(tree.body)
    return mylib_names, others


def _classify(module, name, mylib_names, others, package_dir):
    parts = module.split(".")
    if parts[0] != PACKAGE:
        others.add(parts[0])
        return
    dotted = ".".join(parts[1:])
    if name is not None:
        candidate = f"{dotted}.{name}" if dotted else name
        if os.path.exists(module_path(candidate, package_dir)):
            mylib_names.add(candidate)  # from mylib.models import timeline
            return
    if not dotted:
        mylib_names.add("__init__")  # from mylib import run_ranks: the package itself
    elif os.path.exists(module_path(dotted, package_dir)):
        mylib_names.add(dotted)  # from mylib.models.timeline import Layer
    else:
        mylib_names.add(f"{dotted}.__init__")  # a name defined in a subpackage


def _scan(package_dir):
    """Every module under ``package_dir``: its name and its module-level imports."""
    found = {}
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        prefix = os.path.relpath(folder, package_dir).replace(os.sep, ".")
        for filename in sorted(files):
            if filename.endswith(".py"):
                stem = filename[:-3]
                name = stem if prefix == "." else f"{prefix}.{stem}"
                path = os.path.join(folder, filename)
                mylib_names, others = module_imports(path, package_dir)
                if "." in name:  # a subpackage's module needs its __init__
                    init = name.rsplit(".", 1)[0] + ".__init__"
                    if init != name:
                        mylib_names = mylib_names | {init}
                found[name] = (mylib_names, others)
    return found


def browser_modules(package_dir=PACKAGE_DIR):
    """The mylib modules that import only the standard library and each other.

    Sorted names. ``__init__`` (the package's own) is never one of them: in the
    browser ``mylib`` is a bare package, so a module must import its siblings
    by their full name (``from mylib.models import timeline``).
    """
    imports = _scan(package_dir)
    stdlib = set(sys.stdlib_module_names)
    ok = {
        name
        for name, (_, others) in imports.items()
        if name != "__init__" and others <= stdlib
    }
    changed = True
    while changed:  # drop modules that need a module the browser lacks, until none
        changed = False
        for name in sorted(ok):
            if not imports[name][0] <= ok:
                ok.discard(name)
                changed = True
    return sorted(ok)


def module_closure(module_name, package_dir=PACKAGE_DIR):
    """The mylib modules that ``mylib.<module>`` needs in the browser, itself included.

    Sorted names. Raises ``ValueError`` naming the import to remove when one of
    them needs more than the standard library.
    """
    prefix = PACKAGE + "."
    name = module_name[len(prefix) :] if module_name.startswith(prefix) else module_name
    imports = _scan(package_dir)
    if name not in imports:
        raise ValueError(f"no module {PACKAGE}.{name} in {package_dir}")
    stdlib = set(sys.stdlib_module_names)
    needed, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in needed:
            continue
        needed.add(current)
        mylib_names, others = imports.get(current, (set(), set()))
        if current == "__init__" or not others <= stdlib:
            culprit = (
                "the package mylib itself"
                if current == "__init__"
                else ", ".join(sorted(others - stdlib))
            )
            raise ValueError(
                f"{PACKAGE}.{name} cannot run in the browser: {PACKAGE}.{current} "
                f"imports {culprit} at module level. Import only the standard "
                "library and other mylib modules by their full name (`from "
                "mylib.models import timeline`), or move that import inside the "
                "function that needs it."
            )
        todo.extend(mylib_names - needed)
    return sorted(needed)
