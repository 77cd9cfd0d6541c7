"""``python -m mylib.plan``: the page's plan in a terminal, and its errors.

The terminal takes the page's inputs (``mylib.models.plan_inputs.FIELDS``)
and prints the same numbers; exit 0 with a plan, 1 when nothing fits (with
the smallest configuration that would), 2 on an input no run can have.
"""

import io
import os
import pathlib
import subprocess
import sys

from mylib.models import plan_inputs as inputs
from mylib.plan.__main__ import main, parser

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "nccl_tests"


def planner(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_terminal_prints_the_pages_numbers():
    code, out, _ = planner("--model", "Llama 3 70B", "--nodes", "8")
    assert code == 0
    p, _ = inputs.run({"model": "Llama 3 70B", "nodes": 8})
    lines = out.splitlines()
    for title, _, rows in p.tables():
        start = lines.index(title)
        section = lines[start : lines.index("", start)]
        for row in rows:
            line = next(x for x in section if x.startswith(row[0]))
            for key in row[1:]:
                assert p.values[key].text in line, (key, line)
    assert "\n".join(p.lines) in out
    assert max(len(x) for x in out.splitlines()) <= 88


def test_explain_prints_every_derivation():
    code, out, _ = planner("--nodes", "8", "--explain", "--node", "cloud, 1 NIC")
    p, _ = inputs.run({"nodes": 8, "node": "cloud, 1 NIC"})
    assert code == 0
    for key, d in p.values.items():
        assert f"{key}: {d.text} =" in out
    assert "(chapter 9)" in out and "(chapter 6)" in out


def test_options_are_the_pages_inputs_with_their_defaults():
    code, out, _ = planner()
    assert code == 0
    p, _ = inputs.run({})
    assert f"Plan: {p.recommended}" in out
    code, out, _ = planner("--list")
    assert code == 0 and "Llama 3 405B" in out and "DGX H200" in out


def test_help_lists_every_input_with_its_default():
    text = parser().format_help()  # argparse raised on the "%" of a label once
    for f in inputs.FIELDS:
        assert f.flag in text, f.flag
    assert "kernel efficiency (% of peak) (default: 40.0)" in " ".join(text.split())


def test_unknown_preset_exits_2_naming_the_presets():
    code, out, err = planner("--model", "Llama 4")
    assert code == 2 and not out
    assert "model: 'Llama 4' is not one of" in err and "Llama 3 8B" in err
    code, _, err = planner("--node", "TPU v5")
    assert code == 2 and "DGX H100" in err


def test_impossible_input_exits_2_with_the_fix():
    code, _, err = planner("--nodes", "64", "--global-batch-mtokens", "0.25")
    assert code == 2
    assert "raise the global batch to at least that" in err
    code, _, err = planner("--nodes", "two")
    assert code == 2 and "number of nodes: 'two' is not a number" in err
    code, _, err = planner("--model", "GPT-2 124M", "--seq", "4096")
    assert code == 2 and "1,024 positions" in err


def test_a_table_too_wide_for_88_columns_is_split_not_cut():
    wide = ("--model", "custom", "--layers", "200", "--hidden", "32768", "--heads")
    wide += ("256", "--ffn", "131072", "--nodes", "1", "--no-checkpointing")
    code, out, _ = planner(*wide)
    assert code == 1
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= 88
    values = {"model": "custom", "layers": 200, "hidden": 32768, "heads": 256}
    values.update(ffn=131072, nodes=1, checkpointing=False)
    p, _ = inputs.run(values)
    _, header, rows = p.tables()[0]
    for row in rows:  # each cell whole, on a line of its row
        for key in row[1:]:
            text = p.values[key].text
            assert any(x.startswith(row[0]) and text in x for x in lines), (key, text)
    assert out.count("does not fit") == len(rows)


def test_a_model_that_fits_nowhere_exits_1_with_the_smallest_fit():
    code, out, _ = planner("--model", "Llama 3 405B", "--nodes", "8")
    assert code == 1
    assert "Nothing fits on 8 nodes of DGX H100" in out
    assert "The smallest configuration that fits: ZeRO-3 on" in out
    assert "torchrun" not in out


def test_calibration_from_a_file(tmp_path):
    code, out, _ = planner(
        "--nccl-tests", str(FIXTURES / "all_reduce_2x8_h100_v2.19.txt")
    )
    assert code == 0 and "calibrated: " in out and "DGX H100, calibrated" in out
    code, _, err = planner("--nccl-tests", str(FIXTURES / "ucc_perftest_not_nccl.txt"))
    assert code == 2 and "no all_reduce_perf table found" in err
    code, _, err = planner("--nccl-tests", str(tmp_path / "missing.txt"))
    assert code == 2 and "cannot read --nccl-tests" in err


def test_python_dash_m_runs_it():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mylib.plan", "--model", "Llama 3 8B", "--nodes", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Memory per GPU" in done.stdout and "Plan: " in done.stdout


def test_a_custom_node_from_the_terminal():
    code, out, _ = planner(
        "--node", "custom", "--gpus-per-node", "4", "--nics-per-node", "1",
        "--nic-gbit-s", "100", "--gpu-memory-gb", "24", "--bf16-tflops", "165",
        "--model", "GPT-2 124M", "--nodes", "4", "--micro-batch", "8",
        "--global-batch-mtokens", "0.5", "--no-checkpointing",
    )  # fmt: skip
    assert code == 0
    assert "on 4 x custom node: 16 x custom GPU" in out
