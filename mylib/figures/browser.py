"""Which mylib modules can run in the reader's browser.

The static site runs some of mylib's Python in the page with Pyodide (CPython
compiled to WebAssembly, with the standard library and nothing else). A module
can go there when everything it imports at module level is the standard
library or another such mylib module; imports inside functions are allowed
(they run only when called, e.g. ``ipywidgets`` in :mod:`mylib.livefig`).

The book's Sphinx extension (``book/_ext/mylib_static.py``) copies every such
module into the built site (``_static/mylib/``); :class:`mylib.livefig.LiveFigure`
names the modules its render function needs. The extension loads this file by
path, without importing the ``mylib`` package (whose ``__init__`` imports torch),
so it imports the standard library only.
"""

import ast
import os
import sys

PACKAGE = "mylib"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def module_imports(path, package_dir=PACKAGE_DIR):
    """Module-level imports of a source file: ``(mylib modules, other top-level packages)``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    mylib_names, others = set(), set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _classify(alias.name, None, mylib_names, others, package_dir)
            elif isinstance(node, ast.ImportFrom):
                base = PACKAGE if node.level else node.module  # ``from . import x`` is ours
                if node.level and node.module:
                    base = f"{PACKAGE}.{node.module}"
                for alias in node.names:
                    _classify(base, alias.name, mylib_names, others, package_dir)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # still module level
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []) or []:
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(tree.body)
    return mylib_names, others


def _classify(module, name, mylib_names, others, package_dir):
    parts = module.split(".")
    if parts[0] != PACKAGE:
        others.add(parts[0])
    elif len(parts) > 1:
        mylib_names.add(parts[1])
    elif name is not None and os.path.exists(os.path.join(package_dir, f"{name}.py")):
        mylib_names.add(name)  # from mylib import timeline
    else:
        mylib_names.add("__init__")  # from mylib import run_ranks: needs the package itself


def _scan(package_dir):
    found = {}
    for filename in sorted(os.listdir(package_dir)):
        if filename.endswith(".py"):
            found[filename[:-3]] = module_imports(os.path.join(package_dir, filename), package_dir)
    return found


def browser_modules(package_dir=PACKAGE_DIR):
    """Names of the mylib modules that import only the standard library and each other (sorted).

    ``__init__`` is never one of them: in the browser ``mylib`` is a bare
    package, so a module must import its siblings as ``mylib.x``.
    """
    imports = _scan(package_dir)
    stdlib = set(sys.stdlib_module_names)
    ok = {name for name, (_, others) in imports.items() if name != "__init__" and others <= stdlib}
    changed = True
    while changed:  # drop modules whose mylib imports are not browser modules, until nothing changes
        changed = False
        for name in sorted(ok):
            if not imports[name][0] <= ok:
                ok.discard(name)
                changed = True
    return sorted(ok)


def module_closure(module_name, package_dir=PACKAGE_DIR):
    """The mylib modules that ``mylib.<module>`` needs in the browser, itself included (sorted).

    Raises ``ValueError`` naming the import to remove when one of them needs
    more than the standard library.
    """
    name = module_name.split(".", 1)[1] if module_name.startswith(PACKAGE + ".") else module_name
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
            culprit = "the package mylib itself" if current == "__init__" else ", ".join(sorted(others - stdlib))
            raise ValueError(
                f"{PACKAGE}.{name} cannot run in the browser: {PACKAGE}.{current} imports {culprit} at "
                f"module level. Import only the standard library and other mylib modules by their full "
                f"name (`from mylib import timeline`), or move that import inside the function that needs it."
            )
        todo.extend(mylib_names - needed)
    return sorted(needed)
