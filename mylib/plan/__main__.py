"""``python -m mylib.plan``: the book's planner in a terminal.

Every option is one of the page's inputs (:data:`mylib.models.plan_inputs.FIELDS`,
with their defaults); ``--nccl-tests FILE`` calibrates the cluster from an
``all_reduce_perf`` output. Prints the plan as tables, ``--explain`` each
number's derivation, ``--list`` the presets. Exit status: 0 with a plan, 1
when nothing fits (the smallest configuration that would is printed), 2 on
an input no run can have (an unknown preset, an impossible batch).
"""

import argparse
import sys
import textwrap

from mylib.models import plan_inputs as inputs
from mylib.models.hardware import NODES
from mylib.models.planner import PlanError
from mylib.models.transformer import MODELS


def parser():
    """The options: one per planner input."""
    ap = argparse.ArgumentParser(
        prog="python -m mylib.plan",
        description="Plan a data-parallel run: memory, communication, step time, "
        "checkpoints and the lines to run it, every number derived.",
    )
    for f in inputs.FIELDS:
        label = f.label.replace("%", "%%")  # argparse formats help with %
        if f.kind == "bool":
            ap.add_argument(
                f.flag,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=label,
            )
        elif f.name == "nccl_tests":
            ap.add_argument(
                "--nccl-tests",
                metavar="FILE",
                default=None,
                help="calibrate from a file of all_reduce_perf output",
            )
        else:
            ap.add_argument(
                f.flag,
                default=f.default,
                metavar=f.kind.upper(),
                help=f"{label} (default: {f.default})",
            )
    ap.add_argument(
        "--explain", action="store_true", help="print how every number is derived"
    )
    ap.add_argument("--list", action="store_true", help="list the presets")
    return ap


def table(header, rows, width=88):
    """Rows of text as aligned columns (the first left, the rest right).

    A table wider than ``width`` is printed in parts, each repeating the first
    column, so that no cell is cut.
    """
    cols = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    parts, part = [], [1]
    for i in range(2, len(header)):
        if sum(cols[j] + 2 for j in [0, *part, i]) - 2 > width:
            parts.append(part)
            part = []
        part.append(i)
    parts.append(part)

    def lines(keep):
        return [
            "  ".join(
                str(r[i]).ljust(cols[i]) if i == 0 else str(r[i]).rjust(cols[i])
                for i in [0, *keep]
            ).rstrip()
            for r in [header] + rows
        ]

    return "\n\n".join("\n".join(lines(keep)) for keep in parts if keep)


def wrap(text, indent=""):
    """A paragraph at 88 columns, its later lines indented."""
    return textwrap.fill(
        text, 88, initial_indent=indent, subsequent_indent=indent + "    "
    )


def report(p, fit=None, explain=False):
    """The plan as text: what the page shows, in the same words and numbers."""
    m, c = p.model, p.cluster
    params = p.values["model.params"].text
    out = [
        wrap(
            f"{m.name}, {params} parameters, on {c.nodes} x {c.name}: "
            f"{c.ranks} x {p.node.gpu.name}"
        )
    ]
    if fit is not None:
        regimes = "; ".join(
            f"{r.min_bytes:,}-{r.max_bytes:,} B: {r.alpha_s * 1e6:.2f} µs a step, "
            f"{r.busbw / 1e9:.1f} GB/s bus"
            for r in fit.regimes
        )
        out.append(wrap(f"calibrated on {fit.ranks} GPUs: {regimes}"))
    for title, header, rows in p.tables():
        if not rows:
            continue
        cells = [[p.values[k].text if k in p.values else k for k in r] for r in rows]
        out += [
            "",
            title,
            table(header, cells)
            if header[0]
            else table(["", ""], cells).split("\n", 1)[1],
        ]
    out.append("")
    out.append(f"Plan: {p.recommended}" if p.recommended else wrap(p.advice))
    if p.lines:
        out += ["", *p.lines]
    if explain:
        out += ["", "How each number is derived:"]
        out += [
            wrap(
                f"{d.key}: {d.text} = {d.formula}"
                + (f" [{d.inputs}]" if d.inputs else "")
                + f" (chapter {d.chapter})",
                indent="  ",
            )
            for d in p.values.values()
        ]
    return "\n".join(out)


def main(argv=None, stdout=None, stderr=None):
    """Run the planner; the exit status: 0 a plan, 1 nothing fits, 2 a bad input."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    args = parser().parse_args(argv)
    if args.list:
        print(wrap("models: " + "; ".join(MODELS)), file=stdout)
        nodes = "; ".join(f"{k} ({v.about})" for k, v in NODES.items())
        print(wrap("nodes: " + nodes), file=stdout)
        return 0
    values = {f.name: getattr(args, f.name) for f in inputs.FIELDS}
    if args.nccl_tests:
        try:
            with open(args.nccl_tests, encoding="utf-8") as f:
                values["nccl_tests"] = f.read()
        except OSError as err:
            print(f"error: cannot read --nccl-tests: {err}", file=stderr)
            return 2
    else:
        values["nccl_tests"] = ""
    try:
        p, fit = inputs.run(values)
    except PlanError as err:
        print(wrap(f"error: {err}"), file=stderr)
        return 2
    print(report(p, fit, args.explain), file=stdout)
    return 0 if p.recommended else 1


if __name__ == "__main__":
    sys.exit(main())
