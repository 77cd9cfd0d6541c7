"""``make lab``'s copies of the book (book/_ext/lab_copies.py), without a browser.

Every role of the book's MyST that jupyterlab-myst cannot resolve is rewritten
(no ``{term}``, ``{ref}``, ``{doc}``, ``{cite}``, ``{glue:text}``, ``{exercise}`` left);
every link the rewrite makes leads to a file of the copies and, with an anchor, to
a ``(label)=`` there; exercises carry the site's titles ("Exercise (The best
cap)"); writing the copies leaves
the tracked files as they were; and a copy the reader changed is kept.
tests/test_lab.py opens the copies in JupyterLab.
"""

import json
import pathlib
import posixpath
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import lab_copies  # noqa: E402
import lab_myst  # noqa: E402

LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    dest = tmp_path_factory.mktemp("lab")
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    written, kept, problems = lab_copies.build(fresh=True, dest=str(dest))
    after = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert after == status, "writing the copies changed the repository"
    return dest, written, kept, problems


def markdown_files(dest):
    """(path in the copies, Markdown text) of every page and notebook."""
    for page in sorted((dest / "book").glob("*.md")):
        yield f"book/{page.name}", page.read_text(encoding="utf-8")
    for notebook in sorted((dest / "notebooks").glob("*.ipynb")):
        yield (
            f"notebooks/{notebook.name}",
            lab_myst.markdown_of(json.loads(notebook.read_text(encoding="utf-8"))),
        )


def test_everything_resolves(copies):
    dest, written, kept, problems = copies
    assert not problems, "\n".join(problems)
    assert not kept
    texts = dict(markdown_files(dest))
    assert len([p for p in texts if p.startswith("notebooks/")]) == len(
        list((ROOT / "notebooks").glob("*.ipynb"))
    )
    broken = []
    for path, text in texts.items():
        for role in ("{term}", "{ref}", "{numref}", "{doc}", "{cite", "{glue"):
            if role in text:
                broken.append(f"{path}: {role} left")
        for raw in ("{exercise}", "{solution}", "{glossary}", "{bibliography}"):
            if raw in text:
                broken.append(f"{path}: {raw} left")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            page = (
                posixpath.normpath(posixpath.join(posixpath.dirname(path), file))
                if file
                else path
            )
            if page not in texts:
                broken.append(f"{path}: {target} -> no {page}")
            elif anchor and f"({anchor})=" not in texts[page]:
                broken.append(f"{path}: {target} -> no label {anchor} in {page}")
    assert not broken, "\n".join(broken)


def test_exercises_carry_the_sites_titles(copies):
    dest = copies[0]
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        source = lab_myst.markdown_of(json.loads(notebook.read_text(encoding="utf-8")))
        found = lab_myst.exercises(source)
        if not found:
            continue
        copy = (dest / "notebooks" / notebook.name).read_text(encoding="utf-8")
        text = lab_myst.markdown_of(json.loads(copy))
        for label, heading in found:
            assert heading.startswith("Exercise (") and heading.endswith(")"), heading
            assert f"{{admonition}} {heading}\n" in text, (notebook.name, heading)
            assert f"[{heading}](#{label})" in text, (notebook.name, label)


def test_a_copy_the_reader_changed_is_kept(tmp_path):
    lab_copies.build(fresh=True, dest=str(tmp_path))
    mine = tmp_path / "notebooks" / "00_quickstart.ipynb"
    mine.write_text(mine.read_text(encoding="utf-8") + " ", encoding="utf-8")
    other = tmp_path / "notebooks" / "01_collectives.ipynb"
    other.unlink()
    written, kept, _ = lab_copies.build(dest=str(tmp_path))
    assert kept == ["notebooks/00_quickstart.ipynb"]
    assert written == ["notebooks/01_collectives.ipynb"]
    assert mine.read_text(encoding="utf-8").endswith(" ")
    written, kept, _ = lab_copies.build(fresh=True, dest=str(tmp_path))
    assert "notebooks/00_quickstart.ipynb" in written and not kept


def test_folded_cells_are_listed_for_the_kernel(copies):
    dest = copies[0]
    folded = json.loads(
        (dest / ".ipython/profile_default/startup/folded-cells.json").read_text()
    )
    expected = [
        cell["id"]
        for notebook in sorted((ROOT / "notebooks").glob("*.ipynb"))
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden")
    ]
    assert sorted(folded) == sorted(expected) and folded
