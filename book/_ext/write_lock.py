"""``make lock``: the exact versions of everything ``requirements.txt`` brings in.

``requirements.txt`` names the book's direct dependencies (with ranges);
``requirements-lock.txt`` pins every package they pull in, so that
``make book`` and ``make test`` install the same environment on any machine,
next year too. The resolving is pip's own: ``make lock`` runs

    pip install --dry-run --ignore-installed --report REPORT -r requirements.txt

(pip's resolver, the one that installs, with this machine's pip
configuration: it finds the on-disk CPU wheel ``torch-2.13.0+cpu`` and so no
CUDA libraries), keeping the versions the current lock pins (``-c``) unless
``make lock UPGRADE=1``. This script turns pip's JSON installation report
(https://pip.pypa.io/en/stable/reference/installation-report/) into a
requirements file of ``name==version`` lines, and checks that a lock still
covers ``requirements.txt``:

    python book/_ext/write_lock.py REPORT.json > requirements-lock.txt
    python book/_ext/write_lock.py --check requirements.txt requirements-lock.txt

Standard library only (it runs before anything is installed), except the check,
which uses ``packaging`` (installed by then).
"""

import json
import platform
import sys

HEADER = """\
# requirements-lock.txt: every package requirements.txt brings in, exactly.
# Written by `make lock` (book/_ext/write_lock.py) from pip's installation report
# (pip {pip} resolving requirements.txt on CPython {python}, {system} {machine}).
# `make book` and `make test` install from this file; edit requirements.txt and
# run `make lock` to change it (`make lock UPGRADE=1` takes the newest versions).
# torch is the CPU build, 2.13.0+cpu: where pip does not find that wheel on disk,
# PyTorch's CPU index provides it (see book/setup.md, Troubleshooting).
"""


def lock_lines(report):
    """Sorted ``name==version`` lines of a pip installation report."""
    pins = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in report["install"]
    }
    return [f"{name}=={pins[name]}" for name in sorted(pins)]


def check(requirements_path, lock_path):
    """Raise SystemExit naming each requirement the lock does not satisfy."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    with open(lock_path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, version = line.split("==")
                pins[canonicalize_name(name)] = version
    missing = []
    with open(requirements_path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            req = Requirement(line)
            pinned = pins.get(canonicalize_name(req.name))
            if pinned is None or not req.specifier.contains(pinned, prereleases=True):
                missing.append(f"{line} (lock: {pinned or 'absent'})")
    if missing:
        sys.exit(
            f"{lock_path} does not satisfy {requirements_path}: "
            + "; ".join(missing)
            + ". Run `make lock`."
        )


def main(argv):
    if argv[:1] == ["--check"]:
        check(*argv[1:3])
        return
    with open(argv[0], encoding="utf-8") as f:
        report = json.load(f)
    sys.stdout.write(
        HEADER.format(
            pip=report.get("pip_version", "?"),
            python=platform.python_version(),
            system=platform.system(),
            machine=platform.machine(),
        )
    )
    sys.stdout.write("\n".join(lock_lines(report)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
