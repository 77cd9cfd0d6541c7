"""What compression does to a DDP step's timeline: fewer bytes on the wire.

A communication hook changes what each bucket's all-reduce carries, not
when the bucket is ready. So chapter 3's model (:mod:`mylib.models.timeline`)
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

Standard library only: the chapter's slider figure
(:mod:`mylib.figures.timeline_compress`) runs it in the browser.
"""

from mylib.models import timeline as tl


def wire_bytes(rows, cols, scheme, rank=1, min_compression_rate=2.0):
    """Bytes one rank puts into the all-reduce for a ``rows x cols`` fp32 gradient.

    ``cols = 1`` is a vector.
    """
    if scheme == "fp32":
        return 4 * rows * cols
    if scheme in ("bf16", "fp16"):
        return 2 * rows * cols
    if scheme == "powersgd":
        r = min(rows, cols, rank)
        compressed = (rows + cols) * r
        return 4 * (
            compressed
            if compressed * min_compression_rate < rows * cols
            else rows * cols
        )
    raise ValueError(f"scheme must be fp32, bf16, fp16 or powersgd, got {scheme!r}")


def uncompressed_from_rank(rows, cols, min_compression_rate=2.0):
    """The lowest PowerSGD rank at which a ``rows x cols`` matrix goes uncompressed.

    Below it, :func:`wire_bytes` sends P and Q, ``(rows + cols) r`` numbers;
    from it on, ``(rows + cols) r x min_compression_rate`` has reached
    ``rows x cols`` and the matrix is all-reduced as it is. Returns None if
    every rank up to ``min(rows, cols)`` compresses it.
    """
    full = wire_bytes(rows, cols, "fp32")
    for rank in range(1, min(rows, cols) + 1):
        if wire_bytes(rows, cols, "powersgd", rank, min_compression_rate) == full:
            return rank
    return None


def compressed_layers(n_layers, hidden, backward_ms_per_layer, scheme, rank=1):
    """``n_layers`` x Linear(hidden, hidden) in backward order, in wire bytes.

    Each parameter's bytes are those ``scheme`` sends (:func:`wire_bytes`).
    """
    sizes = (
        wire_bytes(hidden, 1, scheme, rank),  # bias
        wire_bytes(hidden, hidden, scheme, rank),  # weight
    )
    return tl.uniform_layers(n_layers, sizes, backward_ms_per_layer * 1e-3)
