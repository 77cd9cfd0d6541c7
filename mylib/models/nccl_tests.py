"""Calibrate the planner from the reader's own cluster: nccl-tests' ``all_reduce_perf``.

NVIDIA's nccl-tests print one table row per message size (``src/util.cu``,
``writeBenchmarkLinePreamble`` and ``writeBenchmarkLineBody``)::

    #       size         count      type   redop    root     time   algbw   busbw ...
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s) ...
         1048576        262144     float     sum      -1    28.15   37.25   65.19 ...

the size in bytes, the element count, type, reduction and root, then the
out-of-place and the in-place run, each as time (microseconds), algorithm
bandwidth ``algbw = S / t`` and bus bandwidth ``busbw = algbw x 2(n-1)/n``
(GB/s, 10^9 bytes; ``doc/PERFORMANCE.md``) and the count of wrong values. Before
the table: the devices, one ``#  Rank r ... on HOST device d`` line per GPU;
after it, ``# Avg bus bandwidth``. Older versions print no ``root`` column
(before 2022) or no ``redop`` either, and ``error`` where newer ones print
``#wrong``: :func:`parse` reads the columns from the header.

:func:`fit` fits chapter 1's alpha-beta ring (``2(n-1) alpha + 2(n-1)/n S /
beta``, with :func:`mylib.models.costmodel.fit_alpha_beta`) to the small and
to the large sizes separately: NCCL changes protocol and algorithm with the
size (its tuner picks among them per call), so one line rarely fits 8 bytes and
8 GB alike. The small-size regime gives the latency per ring step; the
large-size one the bus bandwidth that buckets and layers see.
:func:`calibrated_cluster` puts that link into a cluster preset: the measured
bus bandwidth becomes the nodes' NICs (a run across nodes) or NVLink (a run
inside one node). :func:`format_table` writes the table as nccl-tests prints
it, from times the model gives: the tests use it to check that :func:`fit`
recovers the link the output was made from.

Standard library only: the planner's page parses the reader's paste in the
browser.
"""

from dataclasses import dataclass, replace

from mylib.models.costmodel import fit_alpha_beta

GB = 1e9
#: How the header line starts: since 2019, and in the first version (2017).
HEADERS = (["size", "count"], ["bytes", "N"])
HINT = (
    "paste everything that nccl-tests' all_reduce_perf prints, e.g. from "
    "`all_reduce_perf -b 8 -e 8G -f 2 -g 8` (one line per message size, between "
    "the '#  size  count  type ...' header and '# Avg bus bandwidth')"
)


@dataclass(frozen=True)
class Row:
    """One size: bytes, and the out-of-place time (s) and bandwidths (bytes/s)."""

    nbytes: int
    seconds: float
    algbw: float
    busbw: float


@dataclass(frozen=True)
class Table:
    """A parsed ``all_reduce_perf`` run: its rows, ranks and nodes (hosts)."""

    rows: tuple
    ranks: int
    nodes: object  # hosts named in the device lines, or None if none were pasted


def parse(text):
    """The rows of an ``all_reduce_perf`` output; ``ValueError`` says what is wrong."""
    lines = text.splitlines()
    header = next(
        (i for i, line in enumerate(lines) if _tokens(line)[:2] in HEADERS),
        None,
    )
    tool = _tool(text)
    if tool and tool != "all_reduce_perf":
        raise ValueError(
            f"this is the output of nccl-tests' {tool}, not of all_reduce_perf: {HINT}"
        )
    if header is None:
        raise ValueError(f"no all_reduce_perf table found: {HINT}")
    columns = _tokens(lines[header])
    if "cputime" in columns:
        # -C 1 times the host's launch, before the GPUs finish (src/common.cu).
        raise ValueError(
            "this table's time column is 'cputime' (all_reduce_perf -C 1): the "
            "host's time to launch each collective, not its duration; run "
            "all_reduce_perf without -C"
        )
    preamble = columns.index("time")
    rows, hosts, ranks = [], set(), 0
    for line in lines[:header]:
        words = line.lstrip("#").split()
        if words[:1] == ["Rank"] and "on" in words:
            ranks += 1
            hosts.add(words[words.index("on") + 1])
    for number, line in enumerate(lines[header + 1 :], header + 2):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) < preamble + 8 or not words[0].isdigit():
            raise ValueError(
                f"line {number} is cut short or is not a table row ({line.strip()!r}): "
                f"the table looks truncated; {HINT}"
            )
        op = next((c for c in ("redop", "op") if c in columns), None)
        if op and words[columns.index(op)] == "none":
            raise ValueError(
                "these rows have no reduction (redop 'none'): they are "
                f"not an all-reduce; {HINT}"
            )
        time_us, algbw, busbw, wrong = words[preamble : preamble + 4]
        if wrong not in ("N/A",) and float(wrong) != 0:
            raise ValueError(
                f"line {number} reports {wrong} wrong values: the run is "
                "broken, fix it before calibrating on it"
            )
        rows.append(
            Row(
                int(words[0]),
                float(time_us) * 1e-6,
                float(algbw) * GB,
                float(busbw) * GB,
            )
        )
    if not any("Avg bus bandwidth" in line for line in lines[header:]):
        raise ValueError(
            "the table stops without nccl-tests' closing '# Avg bus "
            f"bandwidth' line: it looks truncated; {HINT}"
        )
    sizes = {row.nbytes for row in rows}
    if len(sizes) < 2:
        raise ValueError(
            f"only {len(sizes)} message size in the table: a latency and a bandwidth "
            "need sizes far apart; run all_reduce_perf over a range of sizes "
            "(-b 8 -e 8G -f 2)"
        )
    if not ranks:
        ranks = _ranks_from_ratio(rows)
    if ranks < 2:
        raise ValueError(
            "the run has one GPU: an all-reduce over one rank sends nothing"
        )
    return Table(
        tuple(sorted(rows, key=lambda r: r.nbytes)),
        ranks,
        len(hosts) if hosts else None,
    )


def _tokens(line):
    return line.lstrip("#").split()


def _tool(text):
    for line in text.splitlines():
        if "Collective test starting:" in line:
            return line.split(":", 1)[1].strip()
    return None


def _ranks_from_ratio(rows):
    """Ranks from ``busbw / algbw = 2(n-1)/n`` at the largest size (no device lines)."""
    big = max(rows, key=lambda r: r.nbytes)
    ratio = big.busbw / big.algbw if big.algbw else 0.0
    if not 1.0 <= ratio < 2.0:
        raise ValueError(
            f"busbw / algbw is {ratio:.3f}; an all-reduce's is 2(n-1)/n, between 1 "
            f"and 2: these rows are not an all-reduce's; {HINT}"
        )
    return round(2 / (2 - ratio))


# -- the fit --------------------------------------------------------------------


@dataclass(frozen=True)
class Regime:
    """One size range and chapter 1's ring fitted to it."""

    min_bytes: int
    max_bytes: int
    alpha_s: float  # latency per ring step
    busbw: float  # the ring's bus bandwidth, bytes/s
    max_error: float  # largest |model - measured| / measured over its sizes


@dataclass(frozen=True)
class Fit:
    """The regimes, small sizes first; the link the planner uses."""

    ranks: int
    nodes: object
    regimes: tuple
    rows: tuple = ()  # the measured sizes it was fitted to

    @property
    def alpha_s(self):
        """Latency per ring step: the small-size regime's."""
        return self.regimes[0].alpha_s

    @property
    def busbw(self):
        """Bus bandwidth of large messages: the large-size regime's."""
        return self.regimes[-1].busbw


def fit(table, min_sizes=3, one_line_within=0.05):
    """Chapter 1's ring fitted to the small and the large sizes of ``table``.

    One line for every size if it fits each within ``one_line_within``;
    otherwise every split of the sizes into a small and a large range (each at
    least ``min_sizes`` sizes) is fitted and the split with the smallest
    largest error wins.
    """
    rows, n = table.rows, table.ranks
    whole = _regime(rows, n)
    best = (whole.max_error, (whole,))
    if whole.max_error > one_line_within:
        for k in range(min_sizes, len(rows) - min_sizes + 1):
            parts = (_regime(rows[:k], n), _regime(rows[k:], n))
            worst = max(part.max_error for part in parts)
            if worst < best[0]:
                best = (worst, parts)
    return Fit(n, table.nodes, best[1], rows)


def _regime(rows, n):
    fitted = fit_alpha_beta([r.nbytes for r in rows], [r.seconds for r in rows], n)
    return Regime(
        rows[0].nbytes,
        rows[-1].nbytes,
        fitted.alpha,
        fitted.beta,
        fitted.max_relative_error,
    )


def calibrated_cluster(cluster, fitted):
    """``cluster`` with the fitted link: the planner then plans on it.

    A run across nodes measured the NICs: each carries ``busbw / NICs per
    node``. A run inside one node measured NVLink: a GPU sends ``busbw``. The
    latency of every ring step, NVLink or network, is the fitted one.
    """
    g = cluster.gpus_per_node
    across = fitted.nodes > 1 if fitted.nodes is not None else fitted.ranks > g
    link = (
        {"nic_bw": fitted.busbw / cluster.nics_per_node}
        if across
        else {"nvlink_bw": fitted.busbw}
    )
    return replace(
        cluster,
        name=f"{cluster.name}, calibrated",
        nvlink_latency_s=fitted.alpha_s,
        nic_latency_s=fitted.alpha_s,
        **link,
    )


# -- the table as nccl-tests prints it ------------------------------------------------


#: Column widths of nccl-tests' table (``writeResultHeader``, ``src/util.cu``).
WIDTHS = (10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6)


def _header(cells):
    return "# " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS)) + " "


def _float(value, width):
    """nccl-tests' ``getFloatStr``: 2 decimals, fewer if they do not fit the width."""
    for decimals in (2, 1, 0):
        text = f"{value:{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


def format_table(sizes, seconds, ranks, hosts=("node0",), gpu="NVIDIA H100 80GB HBM3"):
    """``all_reduce_perf`` output for these times, in nccl-tests 2.19's format.

    ``sizes`` in bytes (float32 elements), ``seconds`` the out-of-place time
    of each (the in-place run is given the same); ``ranks`` GPUs spread evenly
    over ``hosts``.
    """
    per_host = ranks // len(hosts)
    out = [
        "# nccl-tests version 2.19.6 nccl-headers=22807 nccl-library=22807",
        "# Collective test starting: all_reduce_perf",
        f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: "
        "2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 "
        "unalign: 0",
        "#",
        "# Using devices",
    ]
    for rank in range(ranks):
        host, device = hosts[rank // per_host], rank % per_host
        out.append(
            f"#  Rank {rank:2d} Group {0:2d} Pid {1000 + rank:6d} on {host:>10s} "
            f"device {device:2d} [{0:04x}:{0x18 + device:02x}:{0:02x}] {gpu}"
        )
    out += [
        "#",
        "# "
        + "  ".join(f"{'':>{w}}" for w in WIDTHS[:5])
        + "           out-of-place                       in-place          ",
        _header(
            ("size", "count", "type", "redop", "root")
            + ("time", "algbw", "busbw", "#wrong") * 2
        ),
        _header(
            ("(B)", "(elements)", "", "", "") + ("(us)", "(GB/s)", "(GB/s)", "") * 2
        ),
    ]
    factor, total = 2 * (ranks - 1) / ranks, 0.0
    for nbytes, t in zip(sizes, seconds):
        algbw = nbytes / GB / t
        total += algbw * factor
        time_, alg, bus = (
            _float(t * 1e6, 7),
            _float(algbw, 6),
            _float(algbw * factor, 6),
        )
        body = f"  {time_:>7}  {alg:>6}  {bus:>6}  {0:6g}"
        out.append(
            f"{nbytes:12d}  {nbytes // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
            + body * 2
        )
    out += [
        f"# {'Out of bounds values':<20} : 0 OK",
        f"# {'Avg bus bandwidth':<20} : {total / len(sizes):g} ",
        "#",
        "# Collective test concluded: all_reduce_perf",
        "#",
        "",
    ]
    return "\n".join(out)
