"""What goes on a page: SVG figures, live figures with sliders, shown source.

One naming convention: the figure of ``mylib.models.X`` (or of the library's
own ``mylib.X``) lives at ``mylib.figures.X`` (``figures/timeline.py`` draws
``models/timeline.py``; ``figures/ring.py`` draws ``mylib/ring.py``). Beside
those, the drawing kit:

* ``svg``: SVG text with the standard library only
* ``livefig``: :class:`LiveFigure`, sliders that redraw in Jupyter and on the
  static site
* ``browser``: which modules the static site can run in the page
* ``show``: ``show_source``, how a chapter shows mylib's own code

Figures import the standard library, ``mylib.models`` and each other at module
level, so the static site can redraw them in the reader's browser.
"""
