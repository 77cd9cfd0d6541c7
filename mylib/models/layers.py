"""The layer shapes of the book's what-if figures, in backward order.

Every figure that plays out a step (chapters 3 to 6) needs a model to play
it on. Two shapes serve them all, both with fp32 gradients (4 bytes a number):

* :func:`transformer_blocks`: GPT-2-style transformer blocks of width 1024
  (GPT-2 medium's), each split into its six sub-layers so that gradients
  become ready through the block, not all at its end (chapter 3);
* :func:`linear_layers`: a stack of ``Linear(hidden, hidden)`` (chapters 4
  and 5, where one weight per layer keeps the picture readable).
"""

from mylib.models.timeline import Layer, uniform_layers

WIDTH = 1024  # the transformer's width: GPT-2 medium's

# One block's parameters, as (sub-layer, gradient bytes of its parameters in
# backward order: bias, then weight), in backward order: the MLP first, then
# the attention. 12 tensors, 12.6 M parameters, 48 MB.
BLOCK = (
    ("mlp.c_proj", (4 * WIDTH, 4 * 4 * WIDTH * WIDTH)),
    ("mlp.c_fc", (4 * 4 * WIDTH, 4 * 4 * WIDTH * WIDTH)),
    ("ln_2", (4 * WIDTH, 4 * WIDTH)),
    ("attn.c_proj", (4 * WIDTH, 4 * WIDTH * WIDTH)),
    ("attn.c_attn", (4 * 3 * WIDTH, 4 * 3 * WIDTH * WIDTH)),
    ("ln_1", (4 * WIDTH, 4 * WIDTH)),
)
BLOCK_BYTES = sum(sum(sizes) for _, sizes in BLOCK)


def transformer_blocks(n_layers, backward_ms_per_layer):
    """``n_layers`` transformer blocks (:data:`BLOCK`), in backward order.

    A sub-layer's share of the block's backward time is its share of the
    parameters (the matmul FLOPs).
    """
    ms = backward_ms_per_layer * 1e-3
    return [
        Layer(f"block{i}.{name}", ms * sum(sizes) / BLOCK_BYTES, sizes)
        for i in reversed(range(int(n_layers)))
        for name, sizes in BLOCK
    ]


def linear_layers(n_layers, hidden, backward_ms_per_layer, bytes_per_number=4):
    """``n_layers`` x ``Linear(hidden, hidden)`` in backward order (bias, weight)."""
    sizes = (bytes_per_number * hidden, bytes_per_number * hidden * hidden)
    return uniform_layers(n_layers, sizes, backward_ms_per_layer * 1e-3)
