"""Chapter 8. The collective ledger: where ranks that hang parted ways (call in a rank).

:class:`CollectiveLedger` numbers every collective each rank calls and, on a
timeout or a mismatch, prints per rank the last call all ranks agree on and
where they parted (operation, sizes, dtype, the line): a small flight recorder
that runs on gloo. :func:`ledger_report` is that report.
"""

import json
import linecache
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

LEDGER_OPS = (  # the group collectives it records, by their torch.distributed names
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_single",  # all_gather_into_tensor, its old name, calls it
    "reduce_scatter",
    "reduce_scatter_single",  # so does reduce_scatter_tensor
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
)
_LEDGERS = [0]  # ledgers started in this process: each rank's n-th shares a name


class CollectiveHang(RuntimeError):
    """Ranks parted ways in their collectives; ``.report`` says where."""

    def __init__(self, report):
        super().__init__(report)
        self.report = report


class CollectiveLedger:
    """Records every collective this rank calls and stops where the ranks part.

    Inside ``with CollectiveLedger(timeout_s):`` each collective of
    :data:`LEDGER_OPS` (on any group; point-to-point calls are not numbered)
    gets a sequence number (``seq``, from 1: the flight recorder's
    ``collective_seq_id``) and is noted with its operation, the sizes and dtype
    of its first tensor, and the calling line. Before it runs, each rank
    publishes the entry to the group's store, which answers even when the
    collectives do not, and reads the other ranks' entry of the same number.
    When one differs, or a rank left the block, or none comes within
    ``timeout_s``, every rank that sees it raises :class:`CollectiveHang`
    before calling the collective: instead of a hang, or gloo aborting on
    mismatched sizes, a report of where each rank is (:func:`ledger_report`).
    With ``compare_lines``, calls agree only if they come from the same line
    too, which catches two same-shaped collectives swapped (which neither
    the sizes nor ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` tell apart). It costs a
    store round trip per collective: a tool for debugging, not for training.
    Every rank must enter it, in the same order. The report is printed to
    stderr too, where each rank's log keeps it.

    What it does not see: it replaces the functions of ``torch.distributed``
    (and ``distributed_c10d``) by those names, so a collective that does not
    go through them runs unrecorded. That is DDP's own communication (the
    constructor's all-gather of the parameters' shapes and broadcast of the
    weights, and the reducer's bucket all-reduces, all issued in C++), unless
    a communication hook that calls ``dist.all_reduce`` carries the buckets
    (PyTorch's ``allreduce_hook`` does); the functional collectives
    (``torch.distributed._functional_collectives``, which DTensor uses); the
    ``*_coalesced`` calls; a process group's own methods (``group.allreduce``);
    a name imported before the block (``from torch.distributed import
    all_reduce``); and point-to-point calls. PyTorch's flight recorder, which
    records inside the process group, sees DDP's and the functional
    collectives (on gloo too: ``tests/test_pitfalls.py``).
    """

    def __init__(self, timeout_s=10.0, group=None, compare_lines=False):
        self.timeout_s = timeout_s
        self.group = group
        self.compare_lines = compare_lines
        self.entries = []  # this rank's: dicts of seq, op, sizes, dtype, line
        self._saved = []

    def __enter__(self):
        _LEDGERS[0] += 1
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.store = dist.PrefixStore(
            f"ledger{_LEDGERS[0]}/", c10d._get_default_store()
        )
        for name in LEDGER_OPS:
            wrapped = self._wrap(name, getattr(dist, name))
            for module in (dist, c10d):
                self._saved.append((module, name, getattr(module, name)))
                setattr(module, name, wrapped)
        return self

    def __exit__(self, kind, value, tb):
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()
        if not isinstance(value, CollectiveHang):  # that one said where it stopped
            raised = f" (raised {kind.__name__})" if kind else ""
            left = f"left after #{len(self.entries)}{raised}"
            self.store.set(f"{self.rank}/state", left)
        return False

    def _wrap(self, name, original):
        def recorded(*args, **kwargs):
            entry = self._record(name, args, kwargs)
            parted = self._parted(entry)
            if parted:
                self.store.set(f"{self.rank}/state", f"stopped at #{entry['seq']}")
                report = f"collective ledger, rank {self.rank}: {parted}\n"
                report += ledger_report(self._gather(), self.compare_lines)
                print(report, file=sys.stderr, flush=True)
                raise CollectiveHang(report)
            return original(*args, **kwargs)

        recorded.__wrapped__ = original
        return recorded

    def _record(self, name, args, kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if _is_tensor(a)]
        tensors += [t for a in args if isinstance(a, list) for t in a if _is_tensor(t)]
        entry = {
            "seq": len(self.entries) + 1,
            "op": name,
            "sizes": [list(t.shape) for t in tensors[:1]],
            "dtype": str(tensors[0].dtype).replace("torch.", "") if tensors else "",
            "line": _calling_line(),
        }
        self.entries.append(entry)
        self.store.set(f"{self.rank}/{entry['seq']}", json.dumps(entry))
        return entry

    def _parted(self, entry):
        """Why this call cannot pair with the other ranks' call #seq, or ''."""
        import time

        deadline = time.monotonic() + self.timeout_s
        waiting = set(range(self.world)) - {self.rank}
        while waiting:
            for r in sorted(waiting):
                seq = entry["seq"]
                has_call = self.store.check([f"{r}/{seq}"])
                if has_call:
                    other = json.loads(self.store.get(f"{r}/{seq}"))
                    if _key(other, self.compare_lines) != _key(
                        entry, self.compare_lines
                    ):
                        return f"call #{seq} differs on rank {r}"
                if self.store.check([f"{r}/state"]):  # it stopped, or left
                    # A rank records its call before it says it stopped: the call
                    # may have come since `has_call` was read; compare it next pass.
                    if not has_call and self.store.check([f"{r}/{seq}"]):
                        continue
                    how = "stopped at its call" if has_call else "makes no call"
                    return f"rank {r} {how} #{seq}"
                if has_call:
                    waiting.discard(r)
            if time.monotonic() > deadline:
                return (
                    f"no call #{entry['seq']} from rank {min(waiting)} within "
                    f"{self.timeout_s:g} s"
                )
            time.sleep(0.001)
        return ""

    def _gather(self):
        """Every rank's ledger and where it is, from the store.

        It waits up to ``timeout_s`` for each rank to say where it stopped.
        """
        import time

        deadline = time.monotonic() + self.timeout_s
        states = {}
        while len(states) < self.world and time.monotonic() < deadline:
            for r in set(range(self.world)) - set(states):
                if self.store.check([f"{r}/state"]):
                    states[r] = self.store.get(f"{r}/state").decode()
            time.sleep(0.005)
        ledgers = {}
        for r in range(self.world):
            entries, seq = [], 1
            while self.store.check([f"{r}/{seq}"]):
                entries.append(json.loads(self.store.get(f"{r}/{seq}")))
                seq += 1
            ledgers[r] = {"entries": entries, "state": states.get(r, "no word")}
        return ledgers


def ledger_report(ledgers, compare_lines=False):
    """Per rank: the last sequence number all ranks agree on, and where each parted.

    ``ledgers`` maps each rank to ``{"entries": [...], "state": str}`` (what
    :class:`CollectiveLedger` publishes). Two calls agree when their operation,
    sizes and dtype do (and their line, with ``compare_lines``).
    """
    ranks = sorted(ledgers)
    calls = {r: ledgers[r]["entries"] for r in ranks}
    agreed = 0
    while all(len(calls[r]) > agreed for r in ranks) and (
        len({_key(calls[r][agreed], compare_lines) for r in ranks}) == 1
    ):
        agreed += 1
    lines = []
    for r in ranks:
        then = f"#{agreed + 1} " + (
            _shown(calls[r][agreed]) if len(calls[r]) > agreed else "(none)"
        )
        lines.append(
            f"rank {r}: last matching #{agreed}; then {then} [{ledgers[r]['state']}]"
        )
        if len(calls[r]) > agreed:
            lines.append(f"    at {calls[r][agreed]['line']}")
    return "\n".join(lines)


def _key(entry, compare_lines=False):
    line = entry["line"] if compare_lines else ""
    return entry["op"], json.dumps(entry["sizes"]), entry["dtype"], line


def _shown(entry):
    sizes = ", ".join(f"[{', '.join(map(str, s))}]" for s in entry["sizes"])
    return f"{entry['op']} {entry['dtype']} {sizes}".rstrip()


def _is_tensor(value):
    return isinstance(value, torch.Tensor)


def _calling_line():
    """``file:line  code`` of the first frame outside torch and this file."""
    torch_dir = os.path.dirname(torch.__file__)
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(torch_dir) and path != __file__:
            code = linecache.getline(path, frame.f_lineno).strip()
            return f"{os.path.basename(path)}:{frame.f_lineno}  {code}".rstrip()
        frame = frame.f_back
    return "?"
