"""How the judge's processes import the judge: from its source files, and nothing else.

``judge.py`` and ``server.py`` run this file (``exec`` of its source, not an
import) before anything else. It

* takes ``practice/`` (and its ``_judge/``, and the repository's root) off
  ``sys.path``: Python puts a script's folder first, so a graded file that
  wrote ``practice/cloudpickle.py`` would otherwise be imported by the next
  ``import cloudpickle`` of the judge;
* imports ``_judge`` and its modules with a finder of its own that compiles
  each one from its ``.py`` file and never reads or writes ``__pycache__``,
  so a forged ``_judge/__pycache__/*.pyc`` (its source's time and size
  copied into it, invisible to ``git status``) is never run.

Standard library only.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

JUDGE_DIR = os.path.dirname(os.path.abspath(__file__))
PRACTICE_DIR = os.path.dirname(JUDGE_DIR)
REPO_DIR = os.path.dirname(PRACTICE_DIR)


class _SourceOnly(importlib.machinery.SourceFileLoader):
    """Compile the module from its source every time: no bytecode cache."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return compile(self.get_data(path), path, "exec", dont_inherit=True)


class JudgeFinder(importlib.abc.MetaPathFinder):
    """Finds ``_judge`` and ``_judge.*`` in ``practice/_judge/`` only."""

    def find_spec(self, name, path=None, target=None):
        if name != "_judge" and not name.startswith("_judge."):
            return None
        parts = name.split(".")
        if len(parts) > 2 or not all(p.isidentifier() for p in parts):
            return None
        if name == "_judge":
            file, search = os.path.join(JUDGE_DIR, "__init__.py"), [JUDGE_DIR]
        else:
            file, search = os.path.join(JUDGE_DIR, parts[1] + ".py"), None
        if not os.path.isfile(file):
            return None
        return importlib.util.spec_from_file_location(
            name,
            file,
            loader=_SourceOnly(name, file),
            submodule_search_locations=search,
        )


def _ours(entry):
    real = os.path.realpath(entry or os.getcwd())
    return real in (JUDGE_DIR, PRACTICE_DIR, REPO_DIR)


def install():
    """Clean ``sys.path`` and put the finder first (once per process)."""
    sys.path[:] = [p for p in sys.path if not _ours(p)]
    if not any(isinstance(f, JudgeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, JudgeFinder())


install()
