"""Showing mylib's own source in a chapter.

The book never re-types library code: a chapter calls ``show_source`` on the
object it explains, so the code the reader reads is the code the tests test.
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
