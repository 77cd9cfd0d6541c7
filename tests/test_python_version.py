"""The Python version the book needs is stated once, right, and everywhere alike.

The floor is ``requires-python`` in pyproject.toml. It must be the newest floor
among the packages the lock installs (their ``Requires-Python``, read from the
installed distributions, so no network), since pip refuses the lock below it;
README.md and book/setup.md must state it; the judge's own floor (the standard
library's tomllib, Python 3.11) must not be above it; and ``make setup`` must
refuse an older Python at once, with a sentence naming the floor
(book/_ext/python_version.py).
"""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECK = ROOT / "book" / "_ext" / "python_version.py"


def stated_floor():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^requires-python = ">=([0-9.]+)"$', text, re.M).group(1)


def lock_floor():
    """The lowest CPython 3 release every installed distribution accepts."""
    specs = [
        SpecifierSet(d.metadata.get("Requires-Python"))
        for d in importlib.metadata.distributions()
        if d.metadata.get("Requires-Python")
    ]
    for minor in range(8, 20):
        for micro in range(0, 30):
            version = Version(f"3.{minor}.{micro}")
            if all(version in spec for spec in specs):
                return str(version)
    raise AssertionError("no Python 3 release satisfies every installed package")


def test_pyproject_states_the_locks_floor():
    assert stated_floor() == lock_floor(), (
        f"pyproject.toml says >={stated_floor()}, the lock's packages need "
        f">={lock_floor()}"
    )


def test_readme_and_setup_page_state_it():
    floor = stated_floor()
    for page in ("README.md", "book/setup.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert f"Python {floor} or newer" in text, f"{page} does not say Python {floor}"
        others = set(re.findall(r"Python (3\.\d+(?:\.\d+)?)\+? or newer", text))
        assert others == {floor}, f"{page} states other versions: {others}"
        assert not re.search(r"Python 3\.1\d\+", text), f"{page}: a bare 3.x+"


def test_judge_needs_no_newer_python():
    catalog = (ROOT / "practice" / "_judge" / "catalog.py").read_text(encoding="utf-8")
    judge = re.findall(r"needs Python (3\.\d+) or newer", catalog)
    assert judge, "the judge's version message moved; update this test"
    for version in judge:
        assert Version(version) <= Version(stated_floor())


def run_check(version):
    env = {**os.environ, "PYTHON_VERSION_AS": version}
    return subprocess.run(
        [sys.executable, str(CHECK)], env=env, capture_output=True, text=True
    )


def test_setup_refuses_an_older_python_in_a_sentence():
    floor = stated_floor()
    major, minor, micro = (int(p) for p in floor.split("."))
    older = f"{major}.{minor}.{micro - 1}" if micro else f"{major}.{minor - 1}.12"
    refused = run_check(older)
    assert refused.returncode == 1
    assert f"needs Python {floor} or newer" in refused.stderr
    assert "make setup PYTHON=" in refused.stderr
    assert run_check(floor).returncode == 0
    assert run_check("3.14.0").returncode == 0


def test_make_setup_runs_the_check_first():
    dry = subprocess.run(
        # no "Entering directory" line when this test runs under make itself
        ["make", "--no-print-directory", "-n", "-W", "pyproject.toml", "setup"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    lines = [line for line in dry.stdout.splitlines() if line.strip()]
    assert lines and "book/_ext/python_version.py" in lines[0], dry.stdout[:500]
