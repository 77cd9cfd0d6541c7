"""Chapter 6's tables, in multiples of psi bytes, agree with the memory model.

And every chapter writes a multiple of psi with its unit (bytes, elements).

The chapter writes every byte count with its factor of psi, the number of
parameters (``2 psi`` bytes: psi parameters in bf16), in two tables: the ZeRO
paper's accounting per stage, and PyTorch's mixed-precision setups. Each cell
is read back (``a psi``, ``b psi/N`` and sums of them) and compared with
:mod:`mylib.models.memory` at several N: the bytes kept, and the bytes sent per
step for large N. Chapter 6's figures, its calculator's readout and its printed
outputs get the same rule (Ψ, a count; every multiple of it says bytes or
elements), and K, wherever it is set, names its optimizer.
"""

import json
import pathlib
import re

import pytest

from mylib.models.memory import (
    RECIPES,
    STAGE_NAMES,
    comm_per_step,
    memory_per_rank,
)

CHAPTER = pathlib.Path(__file__).resolve().parent.parent / "notebooks/06_zero.ipynb"
COLUMNS = ["parameters", "gradients", "optimizer state", "total", "sent per step"]
TERM = re.compile(r"^(\d+(?:\.\d+)?)\\Psi(/N)?$")


def tables():
    """``{first header cell: {row name: [cells]}}`` of the chapter's tables."""
    found = {}
    for cell in json.loads(CHAPTER.read_text())["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        rows = [
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in "".join(cell["source"]).splitlines()
            if line.startswith("|")
        ]
        if rows and rows[0][1:] == COLUMNS:
            body = {r[0]: r[1:] for r in rows[2:]}
            assert rows[0][0] not in found, "two tables of the same kind"
            found[rows[0][0]] = body
    return found


def value(cell, n):
    """``$a\\Psi + b\\Psi/N$`` at psi = 1 and N = ``n``."""
    total = 0.0
    for term in cell.strip("$").split("+"):
        match = TERM.match(term.strip())
        assert match, f"not in psi units: {cell!r}"
        total += float(match[1]) / (n if match[2] else 1)
    return total


def model_row(memory, sent):
    return [memory.params, memory.grads, memory.optimizer, memory.total, sent]


@pytest.mark.parametrize("n", [2, 8, 64])
def test_the_stage_table_is_the_papers_accounting(n):
    table = tables()["stage"]
    assert list(table) == list(STAGE_NAMES.values())
    for stage, name in STAGE_NAMES.items():
        memory = memory_per_rank(1.0, n, stage)
        # large N: (N-1)/N -> 1
        sent = sum(comm_per_step(1.0, n, stage).values()) * n / (n - 1)
        want = model_row(memory, sent)
        got = [value(cell, n) for cell in table[name]]
        assert got == pytest.approx(want), name


@pytest.mark.parametrize("n", [2, 8, 64])
def test_the_setup_table_is_the_recipes(n):
    table = tables()["setup"]
    assert set(table) <= set(RECIPES) and len(table) >= 5
    for name, cells in table.items():
        recipe = RECIPES[name]
        want = model_row(recipe.memory(1.0, n), recipe.sent_per_param())
        got = [value(cell, n) for cell in cells]
        assert got == pytest.approx(want), name


# -- one unit per symbol, in every chapter ------------------------------------------

NOTEBOOKS = CHAPTER.parent
PSI_SPAN = re.compile(r"\$([^$]*\\Psi[^$]*)\$")
# a multiple of psi (2\Psi, K\Psi, (4+K)\Psi/N ...), not psi alone
MULTIPLE = re.compile(r"[\dK)]\s*\\Psi|\\Psi\s*/")
UNIT = re.compile(r"\b(bytes?|elements?|parameters?|numbers?|FLOPs?)\b")


# ... and written out: 2Ψ, KΨ, 12Ψ/N (the glossary, the planner's text)
PSI_TEXT = re.compile(r"[\dK)]\s*Ψ(?:\s*/\s*N)?")
PAGES = sorted(NOTEBOOKS.glob("*.ipynb")) + sorted(
    (NOTEBOOKS.parent / "book").glob("*.md")
)


def prose(path):
    """The Markdown paragraphs of a notebook or page, display math and tables out."""
    if path.suffix == ".md":
        texts = [path.read_text()]
    else:
        cells = json.loads(path.read_text())["cells"]
        texts = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    for text in texts:
        text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
        for paragraph in re.split(r"\n\s*\n", text):
            lines = [ln for ln in paragraph.splitlines() if not ln.startswith("|")]
            yield " ".join(lines)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_multiple_of_psi_says_its_unit(path):
    """``2\\Psi`` is ambiguous (bytes? elements?): the words around it must say.

    Every chapter and every page of the book, the glossary included.
    """
    bare = []
    for paragraph in prose(path):
        spans = [s for s in PSI_SPAN.finditer(paragraph) if MULTIPLE.search(s[1])]
        spans += list(PSI_TEXT.finditer(paragraph))
        for span in spans:
            around = paragraph[max(0, span.start() - 60) : span.end() + 60]
            if not UNIT.search(around):
                bare.append(around)
    assert not bare, "a multiple of psi with no unit near it:\n" + "\n".join(bare)


def test_psi_is_defined_once_as_the_parameter_count():
    text = "".join(
        "".join(cell["source"])
        for cell in json.loads(CHAPTER.read_text())["cells"]
        if cell["cell_type"] == "markdown"
    )
    assert text.count("Throughout this chapter $\\Psi$") == 1
    assert "$\\Psi$ parameters" in text
    glossary = (CHAPTER.parent.parent / "book/glossary.md").read_text()
    assert "\npsi\n  $\\Psi$, the number of parameters of the model" in glossary


def printed(start):
    """What the chapter's code cell whose source starts with ``start`` printed."""
    for cell in json.loads(CHAPTER.read_text())["cells"]:
        if cell["cell_type"] == "code" and "".join(cell["source"]).startswith(start):
            return "".join(
                "".join(out.get("text", "")) for out in cell.get("outputs", [])
            )
    raise AssertionError(f"no code cell starts with {start!r}")


def test_the_communication_lines_give_elements_and_bytes_of_the_model():
    """``DDP 2Ψ elements, 4Ψ bytes: all_reduce 29.5 GB`` and the like, per stage."""
    from mylib.models.memory import GB, STAGES, comm_volume_in_psi

    text = printed('print("bytes each rank sends per step')
    line = re.compile(r"^\s+(\S+)\s+(\d+)Ψ elements, (\d+)Ψ bytes: (.*)$", re.M)
    rows = {m[1]: m for m in line.finditer(text)}
    assert list(rows) == [STAGE_NAMES[s] for s in STAGES]
    psi, n = 7.5e9, 64
    for stage in STAGES:
        m = rows[STAGE_NAMES[stage]]
        elements, nbytes = int(m[2]), int(m[3])
        assert elements == comm_volume_in_psi(stage)
        assert nbytes == 2 * elements  # bf16: 2 bytes an element
        sent = comm_per_step(psi, n, stage)
        shown = dict(part.rsplit(" ", 2)[:2] for part in m[4].split(", "))
        assert shown == {op: f"{b / GB:.1f}" for op, b in sent.items()}
        # the bytes of the label, times (N-1)/N: what a ring sends
        assert sum(sent.values()) == pytest.approx(nbytes * psi * (n - 1) / n)


def test_the_measured_section_keeps_the_unit_and_changes_the_factors():
    """float32 training: 4Ψ + 4Ψ + 8Ψ bytes (K = 8), 16Ψ bytes in all for DDP."""
    memory = memory_per_rank(1.0, 1, 0, k=8, param_bytes=4, grad_bytes=4)
    assert (memory.params, memory.grads, memory.optimizer) == (4, 4, 8)
    assert memory.total == 16
    text = "".join(
        "".join(cell["source"])
        for cell in json.loads(CHAPTER.read_text())["cells"]
        if cell["cell_type"] == "markdown"
    )
    assert "$4\\Psi$ bytes of parameters, $4\\Psi$ bytes of gradients" in " ".join(
        text.split()
    )


# -- chapter 6's figures and readouts: Ψ is a count, a size says its unit ------------

PSI_IN_TEXT = re.compile(r"(\d+(?:\.\d+)?|K)\s*Ψ(/N)?(?!\w)")
SIZE = re.compile(r"(\d+(?:\.\d+)?|K)\s*Ψ(/N)?\s+(bytes|elements)\b")


def figure_texts(svg):
    """Every text and tooltip of an SVG, as strings."""
    import xml.etree.ElementTree as ET

    return ["".join(e.itertext()) for e in ET.fromstring(svg).iter() if e.text]


def chapter_figures():
    from mylib.figures.memory import memory_figure, sharding_picture
    from mylib.figures.timeline_zero3 import zero3_timeline_figure
    from mylib.figures.unit_life import unit_life_picture

    yield "sharding picture", sharding_picture(4)
    yield "unit's life", unit_life_picture()
    yield "ZeRO-3 timeline", zero3_timeline_figure()
    for stage in (0, 1, 2, 3):
        for k in (0, 8, 12):
            yield (
                f"calculator, stage {stage}, K = {k}",
                memory_figure(7.5, 64, stage, k),
            )


@pytest.mark.parametrize("name, svg", list(chapter_figures()), ids=lambda x: x[:40])
def test_every_multiple_of_psi_in_a_figure_says_bytes_or_elements(name, svg):
    texts = figure_texts(svg)
    assert not [t for t in texts if re.search(r"\bpsi\b", t, re.I)], name
    for text in texts:
        found = PSI_IN_TEXT.findall(text)
        sized = SIZE.findall(text)
        assert len(found) == len(sized), f"{name}: {text!r}"


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("ranks", [2, 64, 1024])
def test_the_calculators_traffic_readout_gives_elements_and_bytes(stage, ranks):
    """``sends 44.3 GB a step (3Ψ elements, 6Ψ bytes)``: the model's numbers."""
    import xml.etree.ElementTree as ET

    from mylib.figures.memory import memory_figure
    from mylib.models.memory import GB, comm_volume_in_psi

    svg = ET.fromstring(memory_figure(7.5, ranks, stage, 12))
    (readout,) = [e for e in svg.iter() if e.get("data-metric") == "sent_gb"]
    text = "".join(readout.itertext())
    m = re.fullmatch(r"sends (\S+) GB a step \((\d+)Ψ elements, (\d+)Ψ bytes\)", text)
    assert m, text
    elements = comm_volume_in_psi(stage)
    assert (int(m[2]), int(m[3])) == (elements, 2 * elements)  # bf16: 2 bytes each
    sent = sum(comm_per_step(7.5e9, ranks, stage).values())
    assert float(readout.get("data-value")) == pytest.approx(sent / GB)
    # the label's bytes times the ring's (N-1)/N are what is sent
    assert sent == pytest.approx(2 * elements * 7.5e9 * (ranks - 1) / ranks)


def test_the_figures_legends_name_k_and_its_optimizer():
    from mylib.figures.livefig import Slider
    from mylib.figures.memory import MEMORY_SLIDERS, sharding_picture
    from mylib.figures.unit_life import unit_life_picture

    (k,) = [Slider(**s) for s in MEMORY_SLIDERS if s["name"] == "k"]
    assert "optimizer bytes per parameter" in k.label
    assert "optimizer state (KΨ bytes, K = 12)" in figure_texts(sharding_picture(4))
    assert any(
        "mixed-precision Adam (K = 12)" in t for t in figure_texts(unit_life_picture())
    )


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_k_names_its_optimizer(path):
    """K is 12, 8, 4 or 0 by optimizer: wherever a page sets it, it says which.

    Every chapter and page: its prose, and what its cells print.
    """
    texts = list(prose(path)) + printed_lines(path)
    for paragraph in texts:
        for m in re.finditer(r"\bK\s*=\s*(\d+)", paragraph):
            around = paragraph[max(0, m.start() - 200) : m.end() + 200]
            assert re.search(r"Adam|SGD|optimizer", around), f"{path.name}: {around}"


CHAPTERS = sorted(NOTEBOOKS.glob("*.ipynb"))


def printed_lines(path):
    """The lines a notebook's cells print (stored outputs); none for a page."""
    if path.suffix != ".ipynb":
        return []
    outputs = []
    for cell in json.loads(path.read_text())["cells"]:
        for out in cell.get("outputs", []):
            outputs.append("".join(out.get("text", "")))
    return "\n".join(outputs).splitlines()


def test_chapter_6_prints_psi():
    assert any("Ψ" in line for line in printed_lines(CHAPTER))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_printed_outputs_say_bytes_or_elements(path):
    """What each chapter's cells print: every multiple of Ψ with its unit."""
    lines = printed_lines(path)
    text = "\n".join(lines)
    assert not re.search(r"\d\s*psi\b", text), "write Ψ with its unit, not psi"
    for line in lines:
        assert len(PSI_IN_TEXT.findall(line)) == len(SIZE.findall(line)), line
