"""Is this Python new enough for the book? ``make setup`` asks before it builds .venv.

The floor is ``requires-python`` in pyproject.toml, the one place it is written:
the newest floor among the packages the lock pins (soupsieve 4.1.3 declares
``Requires-Python >=3.11.5``; tests/test_python_version.py checks that the two
agree, and that README.md and book/setup.md state it). pip would refuse the lock
on an older Python only after a long install, with a message about one package;
this says it at once, in a sentence.

Written for any Python 3 (no tomllib, no newer syntax): it must run on the old
Python it refuses. ``PYTHON_VERSION_AS=3.10.12`` checks as if that version ran
(for the test).
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def floor():
    """``requires-python``'s lower bound, as a tuple of ints: (3, 11, 5)."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    match = re.search(r'^requires-python\s*=\s*">=\s*([0-9.]+)"', text, re.M)
    if not match:
        raise SystemExit('pyproject.toml has no requires-python = ">=X.Y.Z"')
    return tuple(int(part) for part in match.group(1).split("."))


def main():
    pretend = os.environ.get("PYTHON_VERSION_AS")
    if pretend:
        running = tuple(int(part) for part in pretend.split("."))
    else:
        running = tuple(sys.version_info[:3])
    need = floor()
    if running < need:
        sys.stderr.write(
            "The book needs Python {} or newer (the packages of requirements-lock.txt "
            "do); {} is Python {}.\nInstall a newer Python and name it, for example: "
            "make setup PYTHON=python3.12\n".format(
                ".".join(map(str, need)),
                sys.executable,
                ".".join(map(str, running)),
            )
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
