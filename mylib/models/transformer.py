"""A decoder-only transformer as the planner sees it: shapes, FLOPs, activations.

"Plan your run" needs three things from a model: how many parameters it has
(the memory of chapter 6), how many FLOPs a token costs (the compute that
hides the communication of chapters 3 and 7) and how many bytes of
activations a micro-batch keeps for the backward. All three follow from the
shapes a model's configuration publishes: layers, hidden size, attention
heads (and key/value heads), feed-forward size, vocabulary, sequence length.

* **Parameters**: per block the attention's query, key, value and output
  matrices (keys and values are ``kv_heads / heads`` as wide under grouped-query
  attention), the MLP's matrices (three for a gated SwiGLU MLP, Llama's; two
  for GPT's), two norms; then the embedding, the output layer (unless tied to
  the embedding) and a final norm.
* **FLOPs per token**: ``6`` per weight of a matrix multiplication (2 in the
  forward, 4 in the backward) plus ``12 L h s`` for attention's two
  sequence-long products (the convention of PaLM's MFU, which torchtitan's
  ``get_num_flop_per_token`` and MosaicML's benchmarks follow; causal masking
  is not discounted). The embedding is a lookup, not a product.
* **Activations** (:func:`activation_tensors`): the tensors autograd keeps,
  counted one by one as Korthikanti et al. (2022) do. For their GPT layer
  (two-matrix MLP of ``4h``, as many key/value heads as heads, dropout, no
  flash attention) the count is their ``s b h (34 + 5 a s / h)`` bytes in
  16-bit (``tests/test_planner.py`` checks it). Flash attention keeps no
  ``s x s`` score matrix (it recomputes it in the backward): the ``5 a s / h``
  term goes. Activation checkpointing keeps only each block's input and
  recomputes the block in the backward, one block at a time.

Standard library only: the planner runs in the reader's browser.
"""

from dataclasses import dataclass, replace

from mylib.models.timeline import Layer


@dataclass(frozen=True)
class Transformer:
    """A decoder's shapes. ``kv_heads`` defaults to ``heads`` (no grouped queries).

    ``gated_mlp``: three MLP matrices (SwiGLU) instead of two; ``tied``: the
    output layer is the embedding; ``biases``: every matrix has a bias and
    every norm a shift (GPT-2); ``positions``: rows of a learned position
    embedding (0 for rotary); ``dropout``: the layer drops activations
    (a mask per dropout is kept).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    kv_heads: int = 0
    gated_mlp: bool = True
    tied: bool = False
    biases: bool = False
    positions: int = 0
    dropout: bool = False
    source: str = ""

    def __post_init__(self):
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "kv_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"hidden ({self.hidden}) must divide into {self.heads} heads, and "
                f"heads into {self.kv_heads} key/value heads"
            )
        if self.positions < 0:
            raise ValueError(f"positions must be >= 0, got {self.positions}")

    @property
    def kv_width(self):
        """Width of the key (and of the value) projection: ``kv_heads x head size``."""
        return self.hidden // self.heads * self.kv_heads

    def with_seq(self, seq):
        """The same model trained on sequences of ``seq`` tokens."""
        return replace(self, seq=seq)


# -- parameters ---------------------------------------------------------------


def block_tensors(m):
    """One block's parameters in the order DDP sees their gradients (backward order).

    ``(name, elements)`` pairs: the MLP (down, up, gate), its norm, the
    attention (output, value, key, query), its norm; for ``nn.Linear`` the bias
    before the weight (:class:`mylib.models.timeline.Layer`).
    """
    h, f, kv = m.hidden, m.ffn, m.kv_width
    linears = [("mlp.down", f, h), ("mlp.up", h, f)]
    if m.gated_mlp:
        linears.append(("mlp.gate", h, f))
    attention = [("attn.o", h, h), ("attn.v", h, kv), ("attn.k", h, kv)]
    attention.append(("attn.q", h, h))
    out = []
    for group, norm in ((linears, "norm2"), (attention, "norm1")):
        for name, n_in, n_out in group:
            if m.biases:
                out.append((f"{name}.bias", n_out))
            out.append((f"{name}.weight", n_in * n_out))
        out += _norm(m, norm)
    return out


def _norm(m, name):
    return [(f"{name}.bias", m.hidden)] * m.biases + [(f"{name}.weight", m.hidden)]


def edge_tensors(m):
    """``(output side, input side)``: parameters outside the blocks, backward order.

    The output side (output layer, unless tied, and the final norm) gets its
    gradients first; the input side (embedding, learned positions) last.
    """
    output = [] if m.tied else [("output.weight", m.vocab * m.hidden)]
    inputs = [("embedding.weight", m.vocab * m.hidden)]
    if m.positions:
        inputs.append(("positions.weight", m.positions * m.hidden))
    return output + _norm(m, "norm"), inputs


def num_params(m):
    """Every parameter of the model."""
    output, inputs = edge_tensors(m)
    block = sum(n for _, n in block_tensors(m))
    return m.layers * block + sum(n for _, n in output + inputs)


def matmul_params(m):
    """Weights that multiply activations: the blocks' matrices and the output layer.

    A tied output layer multiplies by the embedding; norms, biases and the
    embedding lookup do not count (a fraction of a percent).
    """
    h = m.hidden
    mlp = (3 if m.gated_mlp else 2) * h * m.ffn
    return m.layers * (2 * h * h + 2 * h * m.kv_width + mlp) + m.vocab * h


# -- compute -------------------------------------------------------------------


def model_flops_per_token(m):
    """FLOPs of a forward and backward per token: ``6 P_matmul + 12 L h s``."""
    return 6 * matmul_params(m) + 12 * m.layers * m.hidden * m.seq


def block_forward_flops(m, tokens):
    """FLOPs of one block's forward over ``tokens`` tokens (sequences of ``m.seq``)."""
    per_token = model_flops_per_token(m) - 6 * m.vocab * m.hidden
    return per_token / m.layers / 3 * tokens


def output_forward_flops(m, tokens):
    """FLOPs of the output layer's forward: ``2 V h`` a token."""
    return 2 * m.vocab * m.hidden * tokens


def hardware_flops_per_token(m, checkpointing):
    """What the GPU computes per token: the model's FLOPs, plus a recomputed forward.

    With activation checkpointing each block runs its forward again in the
    backward: ``+1/3`` of the blocks' FLOPs (the output layer is not
    recomputed).
    """
    extra = block_forward_flops(m, 1) * m.layers if checkpointing else 0.0
    return model_flops_per_token(m) + extra


def timeline_layers(m, bytes_per_param, block_backward_s, output_backward_s):
    """The model as chapter 3's timeline sees it: layers in backward order.

    Each :class:`~mylib.models.timeline.Layer` holds its gradients' bytes
    (``bytes_per_param`` each) in the order they become ready: the output
    layer and the final norm first, each block from the last, the embedding
    (a lookup: no compute) last. Blocks take ``block_backward_s`` each.
    """
    output, inputs = edge_tensors(m)
    block = [n * bytes_per_param for _, n in block_tensors(m)]
    return (
        [Layer("output", output_backward_s, [n * bytes_per_param for _, n in output])]
        + [Layer(f"block{i}", block_backward_s, block) for i in range(m.layers)][::-1]
        + [Layer("embedding", 0.0, [n * bytes_per_param for _, n in inputs])]
    )


# -- activations ----------------------------------------------------------------


def activation_tensors(m, micro_batch, *, element_bytes=2, flash=True):
    """Bytes one block keeps for its backward, tensor by tensor: ``[(what, bytes)]``.

    Korthikanti et al. (2022), section 4.1, for ``micro_batch`` sequences of
    ``m.seq`` tokens in ``element_bytes`` a number (dropout masks: 1 byte).
    """
    s, b, f, a = m.seq, micro_batch, m.ffn, m.heads
    e, sbh, kv = element_bytes, m.seq * micro_batch * m.hidden, m.kv_width / m.hidden
    out = [
        ("attention norm input", e * sbh),
        ("query/key/value input", e * sbh),
        ("queries", e * sbh),
        ("keys", e * sbh * kv),
        ("values", e * sbh * kv),
    ]
    if flash:
        out.append(("flash attention log-sum-exp (fp32)", 4 * a * s * b))
    else:
        out.append(("softmax output (a s^2 b)", e * a * s * s * b))
        if m.dropout:
            out += [("softmax dropout mask", a * s * s * b)]
            out += [("softmax dropout output", e * a * s * s * b)]
    out.append(("attention output (output projection input)", e * sbh))
    out += [("attention dropout mask", sbh)] * m.dropout
    out += [("MLP norm input", e * sbh), ("MLP input", e * sbh)]
    sbf = s * b * f
    if m.gated_mlp:
        out += [("gate output", e * sbf), ("up output", e * sbf)]
        out += [("SiLU(gate)", e * sbf), ("SiLU(gate) x up (down input)", e * sbf)]
    else:
        out += [("activation input", e * sbf), ("activation output", e * sbf)]
    out += [("MLP dropout mask", sbh)] * m.dropout
    return out


def edge_activation_bytes(m, micro_batch, element_bytes=2):
    """Activations outside the blocks: token ids, final norm, output input, logits.

    The logits are kept in fp32 for the loss (``4 s b V`` bytes: Korthikanti
    et al.'s cross-entropy term), token ids as int64 (``8 s b``).
    """
    sb, e = m.seq * micro_batch, element_bytes
    dropout = sb * m.hidden if m.dropout else 0
    return 8 * sb + dropout + 2 * e * sb * m.hidden + 4 * sb * m.vocab


def activation_bytes(m, micro_batch, *, checkpointing, element_bytes=2, flash=True):
    """Activation bytes of one micro-batch at their peak, at the start of the backward.

    Without checkpointing every block keeps :func:`activation_tensors`; with
    it, every block keeps its input (``e s b h``) and one block at a time
    holds its tensors again while it is recomputed. Plus
    :func:`edge_activation_bytes`.
    """
    block = sum(
        n
        for _, n in activation_tensors(
            m, micro_batch, element_bytes=element_bytes, flash=flash
        )
    )
    if checkpointing:
        kept = m.layers * element_bytes * m.seq * micro_batch * m.hidden + block
    else:
        kept = m.layers * block
    return kept + edge_activation_bytes(m, micro_batch, element_bytes)


# -- published shapes -------------------------------------------------------------

_LLAMA3 = (
    "the Llama 3 paper's Table 3 (Llama Team, 2024) and torchtitan's "
    "torchtitan/models/llama3/__init__.py (dim, n_layers, n_heads, n_kv_heads, "
    "vocab 128,256; FFN from compute_ffn_hidden_dim)"
)

#: The planner's model menu: published shapes, each with where it is written.
MODELS = {
    "Llama 3 8B": Transformer(
        "Llama 3 8B", 32, 4096, 32, 14336, 128256, 8192, kv_heads=8, source=_LLAMA3
    ),
    "Llama 3 70B": Transformer(
        "Llama 3 70B", 80, 8192, 64, 28672, 128256, 8192, kv_heads=8, source=_LLAMA3
    ),
    "Llama 3 405B": Transformer(
        "Llama 3 405B", 126, 16384, 128, 53248, 128256, 8192, kv_heads=8, source=_LLAMA3
    ),
    "GPT-2 124M": Transformer(
        "GPT-2 124M",
        12,
        768,
        12,
        3072,
        50257,
        1024,
        gated_mlp=False,
        tied=True,
        biases=True,
        positions=1024,
        dropout=True,
        source="GPT-2 small (Radford et al., 2019), the configuration of Hugging "
        "Face's gpt2: n_layer 12, n_embd 768, n_head 12, vocab 50,257, "
        "n_positions 1,024, dropout 0.1, biases, tied output layer",
    ),
    "nanoGPT Shakespeare": Transformer(
        "nanoGPT Shakespeare",
        6,
        384,
        6,
        1536,
        65,
        256,
        gated_mlp=False,
        tied=True,
        biases=False,
        positions=256,
        dropout=True,
        source="nanoGPT's config/train_shakespeare_char.py (n_layer 6, n_head 6, "
        "n_embd 384, block_size 256, 65 characters, bias False), the 'baby GPT' its "
        "README trains on one GPU in minutes",
    ),
    "nanoGPT Shakespeare (CPU)": Transformer(
        "nanoGPT Shakespeare (CPU)",
        4,
        128,
        4,
        512,
        65,
        64,
        gated_mlp=False,
        tied=True,
        biases=False,
        positions=64,
        dropout=False,
        source="nanoGPT's README, the same configuration shrunk for a CPU "
        "(--n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --dropout=0.0)",
    ),
}
