"""The setup page's torchrun example (book/setup.md) runs as printed under torchrun.

It runs on the CPU.
"""

import pathlib
import re

import pytest
from torchrun_script import run_torchrun

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_setup_page_torchrun_example(tmp_path):
    text = (ROOT / "book" / "setup.md").read_text(encoding="utf-8")
    script = re.search(r"```python\n(# train\.py\n.*?)```", text, re.S).group(1)
    (tmp_path / "train.py").write_text(script)
    done = run_torchrun("train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(
        r"^2 ranks, last loss on rank 0: \d+\.\d{4}$", done.stdout, re.M
    ), done.stdout
