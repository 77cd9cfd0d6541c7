#!/usr/bin/env bash
# Fetch the JavaScript the static site serves itself, so that no page needs a
# CDN: require.js and the ipywidgets embed manager (widgets render offline),
# and Pyodide (Python in the browser for the interactive figures and the
# in-page exercises), and MathJax (math renders offline). Sources: the npm
# registry, pinned versions.
set -euo pipefail
dest=${1:-vendor}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent requirejs@2.3.4 @jupyter-widgets/html-manager@1.0.6 pyodide@314.0.7 mathjax@3.2.2 >/dev/null)
mkdir -p "$dest/widgets" "$dest/pyodide"
tar -xzf "$tmp"/requirejs-2.3.4.tgz -C "$tmp" && cp "$tmp"/package/require.js "$dest/widgets/require.js" && rm -rf "$tmp/package"
tar -xzf "$tmp"/jupyter-widgets-html-manager-1.0.6.tgz -C "$tmp" && cp "$tmp"/package/dist/embed-amd.js "$dest/widgets/embed-amd.js"
# The widget manager's icon fonts (webpack names them by hash); book/_ext/book_site.py points
# window.__jupyter_widgets_assets_path__ at _static/widgets/ so pages fetch them from the site.
cp "$tmp"/package/dist/*.woff2 "$tmp"/package/dist/*.woff "$tmp"/package/dist/*.ttf "$tmp"/package/dist/*.eot "$tmp"/package/dist/*.svg "$dest/widgets/" && rm -rf "$tmp/package"
tar -xzf "$tmp"/pyodide-314.0.7.tgz -C "$tmp"
for f in pyodide.mjs pyodide.js pyodide.asm.mjs pyodide.asm.js pyodide.asm.wasm python_stdlib.zip pyodide-lock.json; do
  if [ -f "$tmp/package/$f" ]; then cp "$tmp/package/$f" "$dest/pyodide/"; fi
done
rm -rf "$tmp/package"
tar -xzf "$tmp"/mathjax-3.2.2.tgz -C "$tmp" && rm -rf "$dest/mathjax" && cp -r "$tmp"/package/es5 "$dest/mathjax" && rm -rf "$tmp/package"
echo "vendored into $dest: $(du -sh "$dest" | cut -f1)"
