"""The notebooks as JupyterLab saves them, so that opening one leaves it unchanged.

JupyterLab marks a notebook modified (the dot on its tab) as soon as the kernel
starts if the notebook's ``metadata.kernelspec`` differs from the kernel it
starts: it writes the kernel's own spec there. Notebooks written by hand or by
other tools say ``"display_name": "Python 3"``; ipykernel's spec says
``"Python 3 (ipykernel)"``. This script gives every notebook the installed
kernel's spec (name, display name, language), and the nbformat version JupyterLab
writes (4.5, with cell ids).

    python book/_ext/lab_notebooks.py notebooks/*.ipynb          # rewrite them
    python book/_ext/lab_notebooks.py --check notebooks/*.ipynb  # exit 1 if one differs

``make notebooks`` runs it after executing the notebooks; ``tests/test_lab.py``
checks that the stored notebooks need no change and that JupyterLab opens them
unmodified. It is not a Sphinx extension; it lives with the book's build helpers.
"""

import json
import sys


def kernelspec(name="python3"):
    """The installed kernel's spec, as a notebook's ``metadata.kernelspec``."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(name)
    return {"display_name": spec.display_name, "language": spec.language, "name": name}


def normalized(notebook, spec):
    """``notebook`` (a dict) with ``spec`` as its kernelspec and nbformat 4.5."""
    import nbformat

    node = nbformat.from_dict(notebook)
    node.metadata["kernelspec"] = dict(spec)
    if node.nbformat_minor < 5:  # adds cell ids
        node = nbformat.v4.upgrade(node, from_version=4, from_minor=node.nbformat_minor)
    return node


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if not paths:
        sys.exit("usage: lab_notebooks.py [--check] NOTEBOOK.ipynb ...")
    import nbformat

    spec, differ = kernelspec(), []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
        want = normalized(stored, spec)
        # compared as nbformat writes them (a string or its list of lines alike)
        if nbformat.writes(want) != nbformat.writes(nbformat.from_dict(stored)):
            differ.append(path)
            if not check:
                nbformat.write(want, path)
    if check and differ:
        sys.exit(
            "JupyterLab would mark these notebooks modified on opening "
            f"(kernelspec or format): {', '.join(differ)}. "
            "Run: python book/_ext/lab_notebooks.py notebooks/*.ipynb"
        )
    if not check:
        print(f"lab_notebooks: {len(differ)} of {len(paths)} notebooks rewritten")


if __name__ == "__main__":
    main(sys.argv[1:])
