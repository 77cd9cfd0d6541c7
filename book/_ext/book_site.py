"""Sphinx extension with the site-wide fixes the book needs (loaded from _config.yml).

* Sphinx 7.4 lists an inline script twice on every page when an extension adds
  it after the builder started (sphinx-thebe does: ``const THEBE_JS_URL = ...``),
  and the second ``const`` declaration is a JavaScript error on every page. We
  drop repeated scripts from each page's context, keeping the first.
"""


def _script_key(script):
    # Sphinx's _JavaScript: the repeat differs only in filename None versus "".
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", None) or {}
    return (str(filename), tuple(sorted((k, str(v)) for k, v in attributes.items())))


def drop_repeated_scripts(app, pagename, templatename, context, doctree):
    """Keep the first of scripts that have the same file and attributes (inline body included)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


def setup(app):
    app.connect("html-page-context", drop_repeated_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
