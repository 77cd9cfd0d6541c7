"""Sphinx extension with the site-wide fixes the book needs (loaded from _config.yml).

* Sphinx 7.4 lists an inline script twice on every page when an extension
  adds it after the builder started (sphinx-thebe does:
  ``const THEBE_JS_URL = ...``), and the second ``const`` declaration is a
  JavaScript error on every page. We drop repeated scripts from each page's
  context, keeping the first.
* The ipywidgets manager (``_static/widgets/embed-amd.js``) is only needed
  where a widget view is on the page. A chapter's live figures show their
  static twin instead (``mylib.figures.livefig``), so on most pages the
  manager, its require.js and the saved widget state are dead weight: we
  drop them.
* Where a widget view is shown, the manager fetches its icon fonts from a path
  derived from its AMD module name, relative to the *page*
  (``notebooks/@jupyter-widgets/html-manager/dist/<hash>.woff2``), which does
  not exist. require.js ``paths``, set before require.js loads, map those names
  to ``_static/widgets/``, where ``book/vendor.sh`` puts the fonts.
* The repository, edit-this-page and issues buttons appear only when
  ``_config.yml`` names the repository (``repository: url:``), the one place
  the book writes its address; with none set there is no button pointing at an
  address nobody vouches for.
* The site's ``index.html`` only sends the reader on to the first page. The one
  ``sphinx-external-toc`` writes names no icon, so the browser asks for
  ``/favicon.ico``, a 404 (and, when it answers before the page moves on, an
  error in the console): ours names the book's icon.
"""

import html
from pathlib import Path

REPOSITORY_BUTTONS = (
    "use_repository_button",
    "use_edit_page_button",
    "use_issues_button",
)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# A global ``require`` object defined before require.js loads is its
# configuration. data-content_root on <html> is the relative path from this
# page to the site root. Each module's assets resolve against the folder of its
# require.js URL: map the module names so that every such folder is
# _static/widgets/ ('@jupyter-widgets/controls' -> _static/widgets/controls.js;
# '.../html-manager/dist/libembed-amd' -> _static/widgets/libembed-amd.js).
REQUIREJS_CONFIG_JS = (
    "(function () { var w = new URL('_static/widgets', "
    "new URL(document.documentElement.dataset.content_root || './', "
    "document.baseURI)).href; window.require = {paths: {'@jupyter-widgets': w, "
    "'@jupyter-widgets/html-manager/dist': w}}; })();"
)


def _script_key(script):
    # Sphinx's _JavaScript: the repeat differs only in filename None versus "".
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", None) or {}
    return (str(filename), tuple(sorted((k, str(v)) for k, v in attributes.items())))


def _is_widget_script(script):
    filename = str(getattr(script, "filename", script) or "")
    attributes = getattr(script, "attributes", None) or {}
    return (
        filename.endswith(("widgets/require.js", "widgets/embed-amd.js"))
        or attributes.get("type") == WIDGET_STATE
    )


def drop_repeated_scripts(scripts):
    """Keep the first of scripts that have the same file and attributes.

    An inline script's body counts too.
    """
    seen, unique = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


def fix_page_scripts(app, pagename, templatename, context, doctree):
    """Runs after myst-nb added its scripts to the page (its priority is later)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    drop_repeated_scripts(scripts)
    if any(_is_widget_script(s) for s in scripts):
        if WIDGET_VIEW in context.get("body", ""):
            # before require.js (500)
            app.add_js_file(None, body=REQUIREJS_CONFIG_JS, priority=450)
        else:
            scripts[:] = [s for s in scripts if not _is_widget_script(s)]


def repository_buttons(app, config):
    """The repository buttons on when ``repository.url`` is set, off otherwise."""
    options = config.html_theme_options
    url = (options.get("repository_url") or "").strip()
    for button in REPOSITORY_BUTTONS:
        options[button] = bool(url)


def write_site_index(app, exception):
    """``index.html``: the first page, under the book's icon.

    Runs before sphinx-external-toc's own (priority 500), which then leaves it.
    """
    if exception is not None or app.builder.format != "html":
        return
    icon = Path(app.config.html_favicon or "").name
    first_page = app.builder.get_target_uri(app.config.root_doc)
    Path(app.outdir, "index.html").write_text(
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">\n'
        f"<title>{html.escape(app.config.html_title or app.config.project)}</title>\n"
        + (f'<link rel="icon" href="_static/{icon}">\n' if icon else "")
        + f'<meta http-equiv="Refresh" content="0; url={first_page}">\n'
        "</head></html>\n",
        encoding="utf8",
    )


def setup(app):
    app.connect("config-inited", repository_buttons)
    app.connect("html-page-context", fix_page_scripts, priority=900)
    app.connect("build-finished", write_site_index, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
