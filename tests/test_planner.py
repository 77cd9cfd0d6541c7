"""The planner's numbers are the chapters' functions, on random inputs.

Every output of :func:`mylib.models.planner.plan` is recomputed here with the
function the chapter uses (chapter 6's ``memory_per_rank`` and ``RECIPES``,
chapter 7's ``step_traffic``, chapter 3's ``simulate``, chapter 4's
``accumulation_step``, chapter 6's ``zero3_step``, chapter 9's Daly interval)
and must come out the same; plus the model shapes against their published
parameter counts, and the activation count against Korthikanti et al.'s
formula.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib.models import checkpoint_interval as ci
from mylib.models import plan_advice
from mylib.models import plan_strategies as ps
from mylib.models import transformer as tf
from mylib.models.buckets import MB
from mylib.models.cluster import ALL_GATHER, ALL_REDUCE, Cluster, ring, ring_alpha_beta
from mylib.models.hardware import NODES, NodeType
from mylib.models.memory import (
    RECIPES,
    fsdp_params_after_forward,
    memory_per_rank,
)
from mylib.models.planner import PlanError, Training, micro_step, plan
from mylib.models.scaling import llama_like_layers
from mylib.models.step_traffic import (
    ddp_traffic,
    fsdp_traffic,
    hsdp_traffic,
    step_totals,
)
from mylib.models.timeline import Layer, Link, simulate
from mylib.models.timeline_accum import accumulation_step
from mylib.models.timeline_zero3 import zero3_step

# -- shapes -------------------------------------------------------------------


def test_presets_have_their_published_parameter_counts():
    counts = {name: tf.num_params(m) for name, m in tf.MODELS.items()}
    assert counts["Llama 3 8B"] == 8_030_261_248
    assert counts["Llama 3 70B"] == 70_553_706_496
    assert counts["Llama 3 405B"] == 405_853_388_800
    assert counts["GPT-2 124M"] == 124_439_808  # Hugging Face's gpt2
    # nanoGPT prints 10.65M: it leaves the position embedding out
    nano = tf.MODELS["nanoGPT Shakespeare"]
    assert round((tf.num_params(nano) - 256 * 384) / 1e6, 2) == 10.65


def test_llama3_ffn_sizes_follow_the_reference_rule():
    # torchtitan's compute_ffn_hidden_dim: int(8 d / 3), times the multiplier,
    # rounded up to a multiple
    for name, mult, multiple in (("8B", 1.3, 1024), ("70B", 1.3, 4096)):
        m = tf.MODELS[f"Llama 3 {name}"]
        hidden = int(mult * int(2 * 4 * m.hidden / 3))
        assert m.ffn == multiple * ((hidden + multiple - 1) // multiple)
    m = tf.MODELS["Llama 3 405B"]
    assert m.ffn == 4096 * ((int(1.2 * int(8 * m.hidden / 3)) + 4095) // 4096)


SHAPES = st.builds(
    lambda layers, head, heads, group, ffn, vocab, seq, gated: tf.Transformer(
        "random", layers, head * heads, heads, ffn, vocab, seq,
        kv_heads=heads // group, gated_mlp=gated,
    ),
    st.integers(1, 6), st.sampled_from([8, 16, 64]), st.sampled_from([2, 4, 8]),
    st.sampled_from([1, 2]), st.integers(8, 512), st.integers(16, 4000),
    st.sampled_from([64, 256, 1024]), st.booleans(),
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    h=st.sampled_from([64, 128, 512]),
    f=st.integers(32, 2048),
    layers=st.integers(1, 8),
    vocab=st.integers(16, 5000),
    nbytes=st.sampled_from([2, 4]),
    backward=st.floats(0.01, 10),
)
def test_timeline_layers_are_chapter_7s_llama_layers(
    h, f, layers, vocab, nbytes, backward
):
    # with as many key/value heads as heads and no attention FLOPs, the
    # planner's layers are chapter 7's llama_like_layers, tensor for tensor
    m = tf.Transformer("x", layers, h, 8, f, vocab, 64)
    ours = tf.timeline_layers(m, nbytes, 1.0, 1.0)
    theirs = llama_like_layers(backward, h, f, layers, vocab, nbytes)
    assert [x.param_bytes for x in ours] == [x.param_bytes for x in theirs]
    assert [x.name for x in ours] == [x.name for x in theirs]


@settings(max_examples=60, deadline=None)
@given(
    s=st.integers(1, 4096),
    b=st.integers(1, 8),
    h=st.sampled_from([256, 1024]),
    a=st.sampled_from([4, 8, 16]),
)
def test_activations_are_korthikantis_count_for_their_layer(s, b, h, a):
    gpt = tf.Transformer("GPT", 1, h, a, 4 * h, 1000, s, gated_mlp=False, dropout=True)
    kept = sum(n for _, n in tf.activation_tensors(gpt, b, flash=False))
    assert kept == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-12)
    # flash attention removes the 5 a s / h term, and keeps a log-sum-exp
    flash = sum(n for _, n in tf.activation_tensors(gpt, b, flash=True))
    assert flash == pytest.approx(34 * s * b * h + 4 * a * s * b, rel=1e-12)


def test_checkpointing_keeps_block_inputs_and_one_block():
    m = tf.MODELS["Llama 3 8B"]
    block = sum(n for _, n in tf.activation_tensors(m, 2))
    edge = tf.edge_activation_bytes(m, 2)
    full = tf.activation_bytes(m, 2, checkpointing=False)
    ckpt = tf.activation_bytes(m, 2, checkpointing=True)
    assert full == m.layers * block + edge
    assert ckpt == m.layers * 2 * m.seq * 2 * m.hidden + block + edge


def test_flops_per_token_is_torchtitans_count():
    # torchtitan: 6 * (params - embedding) + 12 * l * h * q * t; the norms are
    # the only difference
    m = tf.MODELS["Llama 3 8B"]
    titan = 6 * (tf.num_params(m) - m.vocab * m.hidden) + 12 * 32 * 4096 * m.seq
    norms = (2 * m.layers + 1) * m.hidden
    assert tf.model_flops_per_token(m) == titan - 6 * norms


# -- memory ---------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    psi=st.floats(1e6, 1e12),
    nodes=st.integers(1, 64),
    g=st.sampled_from([1, 4, 8]),
    strategy=st.sampled_from(ps.STRATEGIES),
)
def test_state_memory_is_chapter_6s(psi, nodes, g, strategy):
    ranks = nodes * g
    got = ps.state_memory(strategy, psi, ranks, g)
    n = min(ranks, g) if strategy == "HSDP" else ranks
    want = memory_per_rank(psi, n, ps.STAGE[strategy], 8, 4, 4)
    assert (got.params, got.grads, got.optimizer) == (
        want.params, want.grads, want.optimizer,
    )  # fmt: skip
    # the bytes PyTorch keeps are chapter 6's recipes
    if strategy == "DDP":
        assert got == RECIPES["DDP + autocast, bucket view"].memory(psi, ranks)
    if strategy == "ZeRO-3":
        assert got == RECIPES["FSDP2 bf16, reduce fp32"].memory(psi, ranks)


# -- the whole plan, against the chapters' functions ----------------------------------

NODE = st.builds(
    lambda g, nics, nic, links, mem: NodeType(
        "random", NODES["DGX H100"].gpu.__class__("gpu", mem * 1e9, 5e14, 5e13, ""),
        lambda n, g=g, nics=nics, nic=nic, links=links: Cluster(
            "random", n, g, links * 20e9, nics, nic * 1e9
        ),
        "",
    ),
    st.sampled_from([1, 2, 8]), st.sampled_from([1, 2, 8]), st.floats(5, 60),
    st.integers(4, 18), st.floats(1, 200),
)  # fmt: skip
TRAINING = st.builds(
    lambda m, mb, prec, opt, ckpt, flash, eff: dict(
        micro_steps=m, micro_batch=mb, precision=prec, optimizer=opt,
        checkpointing=ckpt, flash_attention=flash, efficiency=eff,
    ),
    st.integers(1, 6), st.integers(1, 4), st.sampled_from(["bf16", "fp32"]),
    st.sampled_from(["adam", "sgd-momentum"]), st.booleans(), st.booleans(),
    st.floats(0.05, 1.0),
)  # fmt: skip


def random_plan(m, node, nodes, t):
    cluster = node.cluster(nodes)
    tokens = t.pop("micro_steps") * cluster.ranks * t["micro_batch"] * m.seq
    return plan(m, node, nodes, Training(global_batch_tokens=tokens, **t))


@settings(max_examples=40, deadline=None)
@given(m=SHAPES, node=NODE, nodes=st.integers(1, 6), t=TRAINING)
def test_every_output_is_the_chapters_function(m, node, nodes, t):
    p = random_plan(m, node, nodes, t)
    t, c, psi = p.training, p.cluster, tf.num_params(m)
    steps, bytes_ = p.micro_steps, ps.wire_bytes(t.precision)
    k = ps.OPTIMIZER_BYTES[t.optimizer]
    step = micro_step(m, node.gpu, t)

    def fsdp_step(link, reshard_after_forward):
        """Chapter 6's timeline of one micro-step, prefetching, on ``link``."""
        return zero3_step(
            list(step.fsdp_layers),
            link,
            prefetch=True,
            reshard_after_forward=reshard_after_forward,
            forward_ratio=step.forward_ratio,
        )

    # accumulation (chapter 2): B = m x micro-batch x sequence x GPUs
    assert p.values["run.global_batch"].value == steps * t.micro_batch * m.seq * c.ranks
    # memory (chapter 6)
    act = tf.activation_bytes(
        m,
        t.micro_batch,
        checkpointing=t.checkpointing,
        element_bytes=bytes_.activation,
        flash=t.flash_attention,
    )
    for s in ps.STRATEGIES:
        n = min(c.ranks, c.gpus_per_node) if s == "HSDP" else c.ranks
        state = memory_per_rank(psi, n, ps.STAGE[s], k, 4, 4)
        for part in ("params", "grads", "optimizer"):
            assert p.values[f"mem.{s}.{part}"].value == getattr(state, part)
        assert p.values[f"mem.{s}.activations"].value == act
        total = state.total + act + p.costs[s].buffers
        assert p.values[f"mem.{s}.total"].value == total
        assert p.fits[s] == (total <= node.gpu.memory)
        # the smallest-fit search prices the same buffers
        assert plan_advice.fsdp_buffer_bytes(m, bytes_, s) == pytest.approx(
            p.costs[s].buffers, rel=1e-12
        )
    # DDP: chapter 7's traffic, chapter 3's timeline at every cap, chapter 4's
    # accumulation
    # DDP fills fp32 buckets and sends them in the wire's dtype (chapter 5):
    # layers and caps both scaled by the wire's share
    link = Link(c.ranks, *ring_alpha_beta(c, c.ranks))
    share = bytes_.reduce / 4
    assert [x.param_bytes for x in step.ddp_layers] == [
        x.param_bytes for x in tf.timeline_layers(m, bytes_.reduce, 1, 1)
    ]
    sims = {
        cap: simulate(step.ddp_layers, cap * MB * share, link,
                      first_cap_bytes=cap * MB * share, forward_s=step.forward_s)
        for cap in ps.CAPS_MB
    }  # fmt: skip
    best = min(ps.CAPS_MB, key=lambda cap: (sims[cap].step_s, cap))
    ddp = p.costs["DDP"]
    assert ddp.cap_mb == best
    accum = accumulation_step(
        list(step.ddp_layers), best * MB * share, link, steps,
        forward_s=step.forward_s, first_cap_bytes=best * MB * share,
    )  # fmt: skip
    assert ddp.step_s == pytest.approx(accum.step_s, rel=1e-9)
    assert ddp.exposed_s == pytest.approx(accum.exposed_comm_s, rel=1e-9, abs=1e-15)
    traffic = step_totals(ddp_traffic(c, psi * bytes_.reduce))
    assert p.values["comm.DDP.gpu_bytes"].value == pytest.approx(
        traffic["gpu_bytes"], rel=1e-12
    )
    assert p.values["comm.DDP.nic_bytes"].value == pytest.approx(
        traffic["nic_bytes"], rel=1e-12
    )
    default = simulate(step.ddp_layers, 25 * MB * share, link, first_cap_bytes=MB
                       * share, forward_s=step.forward_s)  # fmt: skip
    assert ddp.default_exposed_s == default.exposed_comm_s
    # ZeRO-1: the all-gather of the fp32 parameters after the step, exposed
    gather = ring(c, ALL_GATHER, psi * 4).seconds
    assert p.costs["ZeRO-1"].step_s == pytest.approx(ddp.step_s + gather, rel=1e-12)
    # ZeRO-2 and ZeRO-3: chapter 6's timeline per micro-step, chapter 7's traffic
    for s, reshard in (("ZeRO-2", False), ("ZeRO-3", True)):
        one = fsdp_step(link, reshard)
        assert p.costs[s].step_s == pytest.approx(steps * one.step_s, rel=1e-12)
        traffic = step_totals(
            fsdp_traffic(
                c,
                psi,
                gather_bytes=bytes_.gather,
                reduce_bytes=bytes_.reduce,
                reshard_to=None if reshard else 1,
            )
        )
        assert p.values[f"comm.{s}.gpu_bytes"].value == pytest.approx(
            steps * traffic["gpu_bytes"], rel=1e-12
        )
        assert p.costs[s].exposed_s == pytest.approx(steps * one.waiting_s, rel=1e-12)
        assert p.costs[s].comm_s == pytest.approx(steps * traffic["seconds"], rel=1e-12)
    # ZeRO-2 holds the whole model gathered: chapter 6's count
    whole = fsdp_params_after_forward(psi, c.ranks, 1, bytes_.gather)
    largest = max(x.nbytes for x in step.fsdp_layers) / bytes_.gather * bytes_.reduce
    assert p.costs["ZeRO-2"].buffers == pytest.approx(whole + largest, rel=1e-12)
    hsdp = step_totals(
        hsdp_traffic(c, psi, gather_bytes=bytes_.gather, reduce_bytes=bytes_.reduce)
    )
    assert p.values["comm.HSDP.nic_bytes"].value == pytest.approx(
        steps * hsdp["nic_bytes"], rel=1e-12
    )
    # HSDP: chapter 6's timeline on one node, plus the exposed tail of chapter 3's
    # timeline of the gradient shards' all-reduce on the ring of one GPU per node
    g = c.gpus_per_node
    node_link = Link(g, *ring_alpha_beta(c.with_nodes(1), g))
    inside = fsdp_step(node_link, True)
    tail = 0.0
    if c.nodes > 1:
        probe = ring(c, ALL_REDUCE, 1.0, 1)
        cross = Link(c.nodes, probe.latency_s / (2 * (c.nodes - 1)), probe.peak_busbw)
        shards = [
            Layer(x.name, x.backward_s, [x.nbytes / bytes_.gather * bytes_.reduce / g])
            for x in step.fsdp_layers
        ]
        tail = simulate(shards, 0, cross, forward_s=step.forward_s).exposed_comm_s
    assert p.costs["HSDP"].step_s == pytest.approx(
        steps * (inside.step_s + tail), rel=1e-12
    )
    assert p.costs["HSDP"].exposed_s == pytest.approx(
        steps * (inside.waiting_s + tail), rel=1e-12, abs=1e-15
    )
    # one micro-step's compute: the model's FLOPs at the expected efficiency
    tokens = t.micro_batch * m.seq
    blocks = m.layers * tf.block_forward_flops(m, tokens)
    out = tf.output_forward_flops(m, tokens)
    flops = blocks * (4 if t.checkpointing else 3) + 3 * out
    assert p.values["run.compute_s"].value == pytest.approx(
        flops / (node.gpu.peak_flops(t.precision) * t.efficiency), rel=1e-12
    )
    if not p.recommended:
        assert p.advice.startswith("Nothing fits")
        return
    s = p.recommended
    fitting = [x for x in ps.STRATEGIES if p.fits[x]]
    assert p.costs[s].step_s == min(p.costs[x].step_s for x in fitting)
    batch = p.values["run.global_batch"].value
    assert p.values["run.tokens_s"].value == batch / p.costs[s].step_s
    mfu = batch / p.costs[s].step_s / c.ranks * tf.model_flops_per_token(m)
    assert p.values["run.mfu"].value == pytest.approx(
        mfu / node.gpu.peak_flops(t.precision), rel=1e-12
    )
    # scaling against one node: the same strategy and cap on one node, doing
    # the nodes' micro-steps one after another
    one_node = c.with_nodes(1)
    if s in ("DDP", "ZeRO-1"):
        cap = p.costs[s].cap_mb * MB * share
        alone = accumulation_step(
            list(step.ddp_layers),
            cap,
            Link(one_node.ranks, *ring_alpha_beta(one_node, one_node.ranks)),
            steps * nodes,
            forward_s=step.forward_s,
            first_cap_bytes=cap,
        ).step_s
        if s == "ZeRO-1":
            alone += ring(one_node, ALL_GATHER, psi * 4).seconds
        assert p.values["run.scaling"].value == pytest.approx(
            alone / (nodes * p.costs[s].step_s), rel=1e-9
        )
    elif s in ("ZeRO-2", "ZeRO-3"):
        one_link = Link(one_node.ranks, *ring_alpha_beta(one_node, one_node.ranks))
        alone = fsdp_step(one_link, s == "ZeRO-3").step_s
        assert p.values["run.scaling"].value == pytest.approx(
            steps * nodes * alone / (nodes * p.costs[s].step_s), rel=1e-12
        )
    # DDP's bucket cap is shown whichever strategy wins
    family = s if s in ("DDP", "ZeRO-1") else "DDP"
    assert p.values["run.bucket_cap_mb"].value == p.costs[family].cap_mb
    assert p.values["run.exposed_default"].value == p.costs[family].default_exposed_s
    # checkpoints (chapter 9)
    mtbf = ci.job_mtbf(t.node_mtbf_days * 86400, nodes)
    daly = ci.daly_interval(t.checkpoint_write_s, mtbf)
    assert p.values["run.checkpoint_every"].value == daly
    assert p.values["run.checkpoint_steps"].value == max(
        1, round(daly / p.costs[s].step_s)
    )
    w = ci.waste_per_work(daly, t.checkpoint_write_s, mtbf, t.restart_s)
    assert p.values["run.lost"].value == ci.lost_fraction(
        daly, t.checkpoint_write_s, mtbf, t.restart_s
    )
    assert p.values["run.lost"].value == pytest.approx(w / (1 + w), rel=1e-12)
    # every number shown has its derivation
    for d in p.values.values():
        assert d.formula and d.chapter and d.text


def test_micro_steps_multiply_the_fsdp_step():
    one = plan("Llama 3 8B", "DGX H100", 2, Training(global_batch_tokens=16 * 8192))
    four = plan("Llama 3 8B", "DGX H100", 2, Training(global_batch_tokens=64 * 8192))
    assert (one.micro_steps, four.micro_steps) == (1, 4)
    assert four.costs["ZeRO-3"].step_s == pytest.approx(4 * one.costs["ZeRO-3"].step_s)


def test_llama3_70b_on_8_dgx_h100_fits_only_zero3():
    p = plan("Llama 3 70B", "DGX H100", 8)
    assert [s for s in ps.STRATEGIES if p.fits[s]] == ["ZeRO-3"]
    assert p.recommended == "ZeRO-3" and p.micro_steps == 8
    assert "    fully_shard(block, reshard_after_forward=True, mp_policy=mp)" in p.lines
    assert p.lines[0].startswith("torchrun --nnodes=8 --nproc-per-node=8")


def test_a_share_is_never_rounded_up_to_a_whole():
    from mylib.models.plan_numbers import percent

    assert percent(0.9996) == "> 99.9%" and percent(0.999) == "99.9%"
    assert percent(1.0) == "100.0%" and percent(0.301) == "30.1%"


def test_scaling_against_one_node_is_not_claimed_for_a_model_one_node_cannot_hold():
    big = plan("Llama 3 70B", "DGX H100", 8)
    assert big.values["run.scaling"].text == "n/a: too big for one node"
    t = Training(global_batch_tokens=2**19, micro_batch=8, checkpointing=False)
    small = plan("GPT-2 124M", "DGX H100", 2, t)
    assert small.values["run.scaling"].text.endswith("%")


def test_the_cpu_preset_is_nanogpts_readme_shrunk_for_a_cpu():
    m = tf.MODELS["nanoGPT Shakespeare (CPU)"]
    assert (m.layers, m.hidden, m.heads, m.seq) == (4, 128, 4, 64)
    assert m.vocab == tf.MODELS["nanoGPT Shakespeare"].vocab == 65


def test_a_small_model_gets_ddp_and_its_bucket_cap():
    t = Training(global_batch_tokens=2**19, micro_batch=8, checkpointing=False)
    p = plan("GPT-2 124M", "DGX H100", 2, t)
    assert p.recommended in ("DDP", "ZeRO-2", "ZeRO-3")
    cap = p.costs["DDP"].cap_mb
    assert cap in ps.CAPS_MB and p.values["mem.DDP.free"].value > 0
    p = plan("GPT-2 124M", "DGX H100", 2, t)
    if p.recommended == "DDP":
        assert f"bucket_cap_mb={cap}," in " ".join(p.lines)


# -- what does not fit, and what cannot be planned ----------------------------------


def test_a_model_that_fits_nowhere_names_the_smallest_configuration():
    p = plan("Llama 3 405B", "DGX H100", 8)
    assert p.recommended is None and not p.lines
    assert "Nothing fits on 8 nodes of DGX H100" in p.advice
    n, s = plan_advice.fewest_nodes(p.model, p.node, p.training)
    assert f"{s} on {n} nodes" in p.advice
    big = Training(global_batch_tokens=n * 8 * 8192 * 2)
    assert plan("Llama 3 405B", "DGX H100", n, big).fits[s]
    assert not any(plan("Llama 3 405B", "DGX H100", n - 1, big).fits.values())


def test_activations_that_fit_no_gpu_say_so():
    long = tf.MODELS["Llama 3 70B"].with_seq(131072)
    p = plan(long, "DGX H100", 8, Training(global_batch_tokens=2**24))
    assert "Nothing fits on any number of DGX H100 nodes" in p.advice
    assert "Shorten the sequence" in p.advice


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda: plan("Llama 4", "DGX H100", 8), "unknown model preset 'Llama 4'"),
        (lambda: plan("Llama 3 8B", "DGX B300", 8), "unknown node preset"),
        (lambda: plan("Llama 3 8B", "DGX H100", 0), "node count"),
        (
            lambda: plan(
                "Llama 3 8B", "DGX H100", 64, Training(global_batch_tokens=1000)
            ),
            "raise the global batch",
        ),
        (
            lambda: plan("Llama 3 8B", "DGX H100", 1, Training(efficiency=0)),
            "kernel efficiency",
        ),
        (
            lambda: plan("Llama 3 8B", "DGX H100", 1, Training(micro_batch=0)),
            "micro-batch",
        ),
        (
            lambda: plan("Llama 3 8B", "DGX H100", 1, Training(precision="fp8")),
            "precision",
        ),
    ],
)
def test_impossible_inputs_raise_a_clear_error(call, says):
    with pytest.raises(PlanError, match=says):
        call()


def test_the_default_mtbf_is_llama3s_failure_rate():
    # 419 unexpected interruptions in 54 days on 2,048 nodes (the Llama 3 paper)
    assert round(2048 * 54 / 419) == Training().node_mtbf_days
    # in bf16 the gradients travel in bf16, as the ZeRO paper counts them
    assert math.isclose(ps.wire_bytes("bf16").reduce, 2)
