"""The sweep of `make bench` times the models its page describes (tests/bench_sweep.py).

No timing here: the models' shapes only. The benchmarks page says the decoder has the
shapes and the parameter count of the planner's Llama 3 8B with every width divided
by 32, and as many parameter tensors as the full model.
"""

import os
import sys

from mylib.models import transformer as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sweep  # noqa: E402


def _tensor_count(m):
    output, inputs = tf.edge_tensors(m)
    return m.layers * len(tf.block_tensors(m)) + len(output) + len(inputs)


def test_the_decoder_is_llama_3_8b_with_every_width_divided_by_32():
    small, full = bench_sweep.LLAMA_SMALL, tf.MODELS["Llama 3 8B"]
    assert small.layers == full.layers
    for name in ("hidden", "ffn", "vocab", "kv_width"):
        assert getattr(small, name) * 32 == getattr(full, name), name
    assert small.heads // small.kv_heads == full.heads // full.kv_heads
    params = list(bench_sweep._Decoder(small).parameters())
    assert len(params) == _tensor_count(small) == _tensor_count(full)
    assert sum(p.numel() for p in params) == tf.num_params(small)


def test_the_mlps_have_16_200_and_800_parameter_tensors():
    for tensors, width in ((16, 512), (200, 128), (800, 64)):
        params = list(bench_sweep._mlp(tensors, width).parameters())
        assert len(params) == tensors
        assert {p.shape[-1] for p in params} == {width}
