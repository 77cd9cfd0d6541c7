"""notebooks/scripts/ddp_check.py, the classic DDP check, runs under torchrun on 2 CPU
ranks and prints that MyDDP and PyTorch's DDP both match one process."""

import pathlib
import re

import pytest
from torchrun_script import run_torchrun

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "notebooks" / "scripts" / "ddp_check.py"


@pytest.mark.slow
def test_ddp_check_runs_under_torchrun(tmp_path):
    done = run_torchrun(SCRIPT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "2 ranks on cpu, 3 SGD steps", done.stdout
    # 5 KB cap over the MLP's float64 gradients: three buckets, all sent by hooks
    assert lines[1] == (
        "MyDDP: 3 buckets, all-reduces launched during each backward: [3, 3, 3]"
    )
    for line, who in zip(lines[2:4], ("MyDDP", "DDP  ")):
        found = re.fullmatch(rf"max \|{who} - one process\| = (\S+)", line)
        assert found and float(found.group(1)) < 1e-12, line
    assert lines[4:] == ["both match one process: True"]
