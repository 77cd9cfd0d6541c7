"""Showing mylib's own source in a chapter, and numbers at the precision they have.

The book never re-types library code: a chapter calls ``show_source`` on the
object it explains, so the code the reader reads is the code the tests test.

A chapter prints a rounding-level difference as the bound its claim makes
(``below``): its last digits are decided by the CPU's kernels, and another
machine prints others.
"""

import inspect
import os


def source_of(obj):
    """The source text of a function, class, method or module, and where it lives."""
    target = inspect.unwrap(obj)
    lines, start = inspect.getsourcelines(target)
    path = inspect.getsourcefile(target)
    # the repository: mylib/figures/show.py is three folders down
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    where = os.path.relpath(path, root)
    first = max(start, 1)
    return "".join(lines), f"{where}, lines {first}-{first + len(lines) - 1}"


def show_source(obj):
    """Display ``obj``'s source as a highlighted code block with its file and lines.

    In Jupyter and in the built book it renders as Markdown (a fenced Python
    block); elsewhere it prints.
    """
    text, where = source_of(obj)
    try:
        from IPython.display import Markdown, display
    except ImportError:  # a plain script
        print(f"# {where}\n{text}")
        return
    display(Markdown(f"`{where}`\n\n```python\n{text.rstrip()}\n```"))


def below(value, bound):
    """``'below 1e-12'``: a difference that is rounding only, as its claim says it.

    Two computations that add the same numbers in another order differ in the
    last bits, and which bits depends on the CPU: its SIMD width, its BLAS code
    path, its thread count (8.3e-17 on one machine, 1.9e-16 on the next). What
    holds on every machine is the bound, so that is what a page prints. Raises
    ``AssertionError`` when ``value`` is not below ``bound``.
    """
    if not value < bound:  # NaN fails too
        raise AssertionError(f"{value!r} is not below {bound:g}")
    return f"below {bound:.0e}".replace("e-0", "e-").replace("e+0", "e+")
