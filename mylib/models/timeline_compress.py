"""What compression does to a DDP step's timeline: chapter 3's model with fewer bytes on the wire.

A communication hook changes what each bucket's all-reduce carries, not
when the bucket is ready. So chapter 3's model (:mod:`mylib.timeline`)
answers "what does compression buy?" once each layer's gradient bytes are
replaced by the bytes its hook sends:

* fp32 (the default hook): 4 bytes per number;
* bf16 or fp16: 2 bytes per number;
* PowerSGD at rank ``r``: an ``n x m`` weight sends ``(n + m) r`` numbers
  (its P and Q) when that is less than ``n m / 2`` (PyTorch's
  ``min_compression_rate`` of 2), else all of it; vectors go as they are.

The model leaves out what PowerSGD costs besides bytes: three all-reduces
per bucket instead of one (the second waits for the first), and the
matrix products that make P and Q. On a fast link those can eat the gain;
chapter 5 measures the bytes, the model shows when bytes are what matters.

Standard library only: the chapter's slider figure runs it in the browser.
"""

from mylib import timeline as tl
from mylib.buckets import MB
from mylib.svg import format_bytes
from mylib.timeline_svg import draw_timelines


def wire_bytes(rows, cols, scheme, rank=1, min_compression_rate=2.0):
    """Bytes one rank puts into the all-reduce for an ``rows x cols`` fp32 gradient (``cols = 1``: a vector)."""
    if scheme == "fp32":
        return 4 * rows * cols
    if scheme in ("bf16", "fp16"):
        return 2 * rows * cols
    if scheme == "powersgd":
        r = min(rows, cols, rank)
        compressed = (rows + cols) * r
        return 4 * (compressed if compressed * min_compression_rate < rows * cols else rows * cols)
    raise ValueError(f"scheme must be fp32, bf16, fp16 or powersgd, got {scheme!r}")


def compressed_layers(n_layers, hidden, backward_ms_per_layer, scheme, rank=1):
    """``n_layers`` x Linear(hidden, hidden) in backward order, each parameter's bytes as ``scheme`` sends them."""
    sizes = (wire_bytes(hidden, 1, scheme, rank), wire_bytes(hidden, hidden, scheme, rank))  # bias, weight
    return tl.uniform_layers(n_layers, sizes, backward_ms_per_layer * 1e-3)


def compression_timelines(n_layers=12, hidden=4096, rank=4, ranks=16, bandwidth_gb_s=10.0, backward_ms_per_layer=8.0,
                          latency_us=20.0, bucket_cap_mb=25.0):
    """One DDP step three ways: fp32, bf16 and PowerSGD at ``rank`` on the wire (chapter 3's model)."""
    link = tl.Link(ranks, latency_us * 1e-6, bandwidth_gb_s * 1e9)
    rows = []
    for scheme, label in (("fp32", "fp32 (default hook)"), ("bf16", "bf16 hook"),
                          ("powersgd", f"PowerSGD, rank {rank}")):
        layers = compressed_layers(n_layers, hidden, backward_ms_per_layer, scheme, rank)
        sent = sum(layer.nbytes for layer in layers)
        rows.append(tl.simulate(layers, bucket_cap_mb * MB, link,
                                name=f"{label}: {format_bytes(sent)} into the all-reduces"))
    return rows


def compression_figure(n_layers=12, hidden=4096, rank=4, ranks=16, bandwidth_gb_s=10.0, backward_ms_per_layer=8.0):
    """Chapter 5's figure: the step's timeline with fp32, bf16 and PowerSGD on the wire (an SVG string)."""
    rows = compression_timelines(n_layers, hidden, rank, ranks, bandwidth_gb_s, backward_ms_per_layer)
    title = (f"{n_layers} x Linear({hidden}, {hidden}), {ranks} ranks, {bandwidth_gb_s:g} GB/s, "
             f"{backward_ms_per_layer:g} ms of backward per layer")
    return draw_timelines(rows, title=title)


COMPRESSION_SLIDERS = [
    dict(name="n_layers", label="layers", min=2, max=48, step=1, default=12),
    dict(name="hidden", label="layer width", options=[(str(h), h) for h in (1024, 2048, 4096, 8192)], default=4096),
    dict(name="rank", label="PowerSGD rank", options=[(str(r), r) for r in (1, 2, 4, 8, 16, 32, 64)], default=4),
    dict(name="ranks", label="ranks", options=[(str(n), n) for n in (2, 4, 8, 16, 64, 256)], default=16),
    dict(name="bandwidth_gb_s", label="bandwidth",
         options=[(f"{b:g} GB/s", b) for b in (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 400.0)], default=10.0),
    dict(name="backward_ms_per_layer", label="backward per layer", min=1.0, max=20.0, step=1.0, default=8.0,
         unit="ms"),
]
"""The sliders of the chapter's ``LiveFigure(compression_figure, COMPRESSION_SLIDERS)``."""
