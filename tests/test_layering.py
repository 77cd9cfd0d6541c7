"""mylib's layers, read from the imports themselves so that they cannot rot.

* the top level is the library a reader builds: at most about 18 modules,
  each docstring naming the chapter that builds it;
* ``mylib.models`` imports only the standard library and ``mylib.models``
  (the browser runs it);
* ``mylib.plan`` (``python -m mylib.plan``, the terminal planner) imports only
  the standard library and ``mylib.models``: a front end, not a chapter's
  module, so it is a subpackage and the top level keeps its count;
* nothing in the library proper or in ``mylib.models`` imports
  ``mylib.figures`` or ``mylib.experiments``;
* a figure of ``models/X.py`` lives at ``figures/X.py``: every figure module
  is named after what it draws (a model, a library module, or an instrument
  of ``experiments``), or is part of the drawing kit;
* no line in ``mylib/`` is longer than 88 characters.

Imports anywhere in a file count, also those inside functions.
"""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

MYLIB = pathlib.Path(__file__).resolve().parent.parent / "mylib"
STDLIB = set(sys.stdlib_module_names)
KIT = {"svg", "livefig", "browser", "show"}  # figures/ that draw nothing themselves
MAX_TOP_LEVEL = 18  # "at most about 18"


def _modules(folder):
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


def _imports(path):
    """Every module a file imports, as dotted names (``mylib.models.timeline``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: use absolute imports"
            found.add(node.module)
            for alias in node.names:  # from mylib.models import timeline
                candidate = MYLIB.parent / (
                    node.module.replace(".", "/") + f"/{alias.name}.py"
                )
                if candidate.exists():
                    found.add(f"{node.module}.{alias.name}")
    return found


def _layer(name):
    parts = name.split(".")
    if parts[0] != "mylib":
        return "stdlib" if parts[0] in STDLIB else "third-party"
    if len(parts) > 1 and parts[1] in ("models", "figures", "experiments"):
        return parts[1]
    return "library"


def test_top_level_is_the_library_each_module_naming_its_chapter():
    top = _modules(MYLIB)
    assert len(top) <= MAX_TOP_LEVEL, [p.name for p in top]
    for path in top:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert re.match(r"Chapter \d+\. ", doc), (
            f"{path.name}: docstring must open 'Chapter N. '"
        )
    subpackages = {
        p.name for p in MYLIB.iterdir() if p.is_dir() and not p.name.startswith("_")
    }
    assert subpackages == {"models", "figures", "experiments", "plan"}


@pytest.mark.parametrize("path", _modules(MYLIB / "models"), ids=lambda p: p.name)
def test_models_import_only_the_standard_library_and_models(path):
    layers = {name: _layer(name) for name in _imports(path)}
    wrong = {
        name for name, layer in layers.items() if layer not in ("stdlib", "models")
    }
    wrong.discard("mylib.models")
    assert not wrong, (
        f"models/{path.name} imports {sorted(wrong)}: models run in the browser"
    )


@pytest.mark.parametrize(
    "path", sorted((MYLIB / "plan").glob("*.py")), ids=lambda p: p.name
)
def test_the_terminal_planner_imports_only_the_standard_library_and_models(path):
    wrong = {
        name
        for name in _imports(path)
        if _layer(name) not in ("stdlib", "models") and name != "mylib.models"
    }
    assert not wrong, f"plan/{path.name} imports {sorted(wrong)}"


@pytest.mark.parametrize(
    "path",
    _modules(MYLIB) + _modules(MYLIB / "models") + [MYLIB / "__init__.py"],
    ids=lambda p: str(p.relative_to(MYLIB)),
)
def test_library_and_models_never_import_figures_or_experiments(path):
    upward = {
        name for name in _imports(path) if _layer(name) in ("figures", "experiments")
    }
    assert not upward, f"{path.relative_to(MYLIB)} imports {sorted(upward)}"


def test_a_figure_is_named_after_what_it_draws():
    drawn = {
        p.stem for sub in ("", "models", "experiments") for p in _modules(MYLIB / sub)
    }
    for path in _modules(MYLIB / "figures"):
        assert path.stem in KIT | drawn, (
            f"figures/{path.name} draws no models/, experiments/ or mylib/"
            f"{path.name}: name a figure after the model, instrument or library "
            "module it draws"
        )


def test_subpackage_inits_are_docstrings_only():
    # the browser ships them: they must import nothing
    for sub in ("models", "figures", "experiments", "plan"):
        tree = ast.parse((MYLIB / sub / "__init__.py").read_text())
        assert ast.get_docstring(tree) and len(tree.body) == 1, sub


def test_no_line_in_mylib_is_longer_than_88():
    long = [
        f"{path.relative_to(MYLIB)}:{n}"
        for path in sorted(MYLIB.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > 88
    ]
    assert not long, f"{len(long)} lines over 88 columns, e.g. {long[:5]}"


def test_the_layering_test_can_fail(tmp_path):
    # the classifier must see an upward import, also one inside a function
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from mylib.figures import svg\n")
    assert {_layer(n) for n in _imports(bad)} >= {"figures"}


def test_what_mylib_exports_comes_from_the_library_itself():
    # mylib/__init__.py imports each exported name on first use (PEP 562)
    import mylib

    for name, module in mylib._EXPORTS.items():
        assert _layer(module) == "library", f"mylib.{name} comes from {module}"
        assert getattr(mylib, name).__module__ == module, name


def test_models_and_the_planner_start_without_torch():
    # standard library only, as in the browser: neither imports torch
    models = [f"mylib.models.{p.stem}" for p in _modules(MYLIB / "models")]
    code = (
        "import runpy, sys\n"
        f"for m in {models!r}:\n"
        "    __import__(m)\n"
        "sys.argv = ['plan', '--help']\n"
        "try:\n"
        "    runpy.run_module('mylib.plan', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=MYLIB.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = done.stdout.strip().splitlines()[-1]
    assert imported == "[]", f"the models or python -m mylib.plan import {imported}"
