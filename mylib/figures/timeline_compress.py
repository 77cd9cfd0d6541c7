"""Chapter 5's figure: a DDP step with fp32, bf16 and PowerSGD on the wire.

:func:`compression_figure` plays chapter 3's model with each layer's bytes
replaced by what its hook sends (:mod:`mylib.models.timeline_compress`), and
draws the three timelines on one time axis. Standard library only: it runs
in the reader's browser.
"""

from mylib.figures.livefig import choices, settings, steps
from mylib.figures.svg import format_bytes
from mylib.figures.timeline import bandwidth_choices, draw_timelines
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.timeline_compress import compressed_layers


def compression_timelines(latency_us=20.0, bucket_cap_mb=25.0, **values):
    """One DDP step three ways: fp32, bf16 and PowerSGD at ``rank`` on the wire.

    Each is played out by chapter 3's model (:func:`mylib.models.timeline.simulate`)
    for the figure's slider values; a value left out takes its slider's default
    (:data:`COMPRESSION_SLIDERS`).
    """
    s = settings(COMPRESSION_SLIDERS, values)
    link = tl.Link(s.ranks, latency_us * 1e-6, s.bandwidth_gb_s * 1e9)
    rows = []
    for scheme, label in (
        ("fp32", "fp32 (default hook)"),
        ("bf16", "bf16 hook"),
        ("powersgd", f"PowerSGD, rank {s.rank}"),
    ):
        layers = compressed_layers(
            s.n_layers, s.hidden, s.backward_ms_per_layer, scheme, s.rank
        )
        sent = sum(layer.nbytes for layer in layers)
        name = f"{label}: {format_bytes(sent)} into the all-reduces"
        rows.append(tl.simulate(layers, bucket_cap_mb * MB, link, name=name))
    return rows


def compression_figure(**values):
    """Chapter 5's figure (SVG): the step with fp32, bf16 and PowerSGD on the wire.

    ``values`` are slider values (:data:`COMPRESSION_SLIDERS`).
    """
    s = settings(COMPRESSION_SLIDERS, values)
    title = [
        f"{s.n_layers} x Linear({s.hidden}, {s.hidden})",
        f"{s.ranks} ranks",
        f"{s.bandwidth_gb_s:g} GB/s",
        f"{s.backward_ms_per_layer:g} ms of backward per layer",
    ]
    return draw_timelines(compression_timelines(**vars(s)), title=", ".join(title))


COMPRESSION_SLIDERS = [
    steps("n_layers", "layers", 2, 48, 1, 12),
    choices("hidden", "layer width", (1024, 2048, 4096, 8192), 4096),
    choices("rank", "PowerSGD rank", (1, 2, 4, 8, 16, 32, 64), 4),
    choices("ranks", "ranks", (2, 4, 8, 16, 64, 256), 16),
    bandwidth_choices((1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 400.0), 10.0),
    steps("backward_ms_per_layer", "backward per layer", 1.0, 20.0, 1.0, 8.0, "ms"),
]
"""The sliders of ``LiveFigure(compression_figure, COMPRESSION_SLIDERS)``."""
