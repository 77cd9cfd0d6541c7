"""The plan's numbers, each with its derivation: memory, traffic, the run.

:func:`mylib.models.planner.plan` calls these in turn. Each records its
numbers with :meth:`~mylib.models.planner.Plan.add`: the value, how it
reads, and ``(formula, inputs, chapter)``, which the page folds beside the
number. The physics is :mod:`mylib.models.plan_strategies`'; here it is
named and explained.

Standard library only: the planner runs in the reader's browser.
"""

from mylib.models import checkpoint_interval as ci
from mylib.models import plan_strategies as ps
from mylib.models import transformer as tf
from mylib.models.plan_advice import DAY_S, duration, gb, secs


def memory(p, step):
    t, m, cluster, gpu = p.training, p.model, p.cluster, p.node.gpu
    bytes_ = ps.wire_bytes(t.precision)
    act = tf.activation_bytes(
        m,
        t.micro_batch,
        checkpointing=t.checkpointing,
        element_bytes=bytes_.activation,
        flash=t.flash_attention,
    )
    kept = (
        "each block's input, and one block's tensors while it is recomputed"
        if t.checkpointing
        else "every block's tensors"
    )
    flash = "; flash attention keeps no s x s scores" if t.flash_attention else ""
    k = ps.OPTIMIZER_BYTES[t.optimizer]
    for s in ps.STRATEGIES:
        state = ps.state_memory(
            s, step.psi, cluster.ranks, cluster.gpus_per_node, t.optimizer
        )
        n = min(cluster.ranks, cluster.gpus_per_node) if s == "HSDP" else cluster.ranks
        where = f"Ψ = {step.psi / 1e9:.2f} B parameters, N = {n} GPUs"
        for part, nbytes, per in (
            ("params", state.params, 4),
            ("grads", state.grads, 4),
            ("optimizer", state.optimizer, k),
        ):
            split = s != "DDP" and (s != "ZeRO-1" or part == "optimizer")
            p.add(
                f"mem.{s}.{part}",
                nbytes,
                gb(nbytes),
                (
                    f"{per} Ψ{' / N' if split else ''} bytes (fp32"
                    f"{', sharded over N' if split else ''})",
                    where,
                    "6",
                ),
            )
        p.add(
            f"mem.{s}.activations",
            act,
            gb(act),
            (
                f"Korthikanti et al. (2022), tensor by tensor: {kept}{flash}",
                f"micro-batch {t.micro_batch} x {m.seq} tokens, "
                f"{bytes_.activation}-byte activations, fp32 logits",
                "6, Plan your run",
            ),
        )
        cost = p.costs[s] = ps.strategy_cost(s, step, cluster, bytes_, p.micro_steps)
        held = (
            "none: with gradient_as_bucket_view=True the buckets are the gradients"
            if s in ("DDP", "ZeRO-1")
            else "chapter 6's ZeRO-3 timeline: the gathered layers at their peak ("
            + (
                "all of them, kept to the backward"
                if s == "ZeRO-2"
                else "two, with prefetch"
            )
            + "), plus the largest layer's gradient"
        )
        p.add(
            f"mem.{s}.buffers",
            cost.buffers,
            gb(cost.buffers),
            (
                held,
                f"{bytes_.gather}-byte parameters, {bytes_.reduce}-byte gradients",
                "3, 6",
            ),
        )
        total = state.total + act + cost.buffers
        p.add(
            f"mem.{s}.total",
            total,
            gb(total),
            (
                "parameters + gradients + optimizer state + activations + buffers",
                "",
                "6",
            ),
        )
        free = gpu.memory - total
        p.fits[s] = free >= 0
        p.add(
            f"mem.{s}.free",
            free,
            gb(free) if free >= 0 else "does not fit",
            ("GPU memory - total", f"{gpu.name}: {gb(gpu.memory)}", "6"),
        )


WHAT = {
    "DDP": "a ring all-reduce of the gradients as the wire carries them (2 Ψ "
    "bytes in bf16 with bf16_compress_hook, 4 Ψ bytes in fp32)",
    "ZeRO-1": "DDP's all-reduce, then each rank broadcasts its updated fp32 shard "
    "(ZeroRedundancyOptimizer; an all-gather's bytes, 4 Ψ bytes)",
    "ZeRO-2": "an all-gather of the parameters, a reduce-scatter of the gradients",
    "ZeRO-3": "two all-gathers of the parameters, a reduce-scatter of the gradients",
    "HSDP": "the gathers and the reduce-scatter inside the node, an all-reduce of "
    "each GPU's gradient shard across the nodes",
}


def compute(p, step):
    """One micro-step's forward and backward on one GPU, as the timelines play it."""
    t, m = p.training, p.model
    tokens = t.micro_batch * m.seq
    peak = p.node.gpu.peak_flops(t.precision)
    forward = m.layers * tf.block_forward_flops(m, tokens) + tf.output_forward_flops(
        m, tokens
    )
    recompute = " + the blocks' forward again" if t.checkpointing else ""
    p.add(
        "run.compute_s",
        step.compute_s,
        secs(step.compute_s),
        (
            f"forward FLOPs x (1 + 2 for the backward{recompute}) / (peak x "
            "efficiency)",
            f"{tokens:,} tokens: {forward / 1e12:,.1f} TFLOP forward; peak "
            f"{peak / 1e12:.0f} TFLOP/s x {t.efficiency:.0%}",
            "7",
        ),
        "compute per micro-step",
    )


def communication(p, step):
    c_ = p.cluster
    on = f"{c_.nodes} x {c_.name}: {c_.gpus_per_node} GPUs, {c_.nics_per_node} NICs"
    compute = f"compute {secs(step.compute_s)} a micro-step (run.compute_s)"
    for s, c in p.costs.items():
        ddp = s in ("DDP", "ZeRO-1")
        micro = "" if ddp else f", x {p.micro_steps} micro-steps"
        timeline = (
            "chapter 3's bucketed timeline of the last micro-step (the others "
            "in no_sync())"
            if ddp
            else "chapter 6's ZeRO-3 timeline with prefetch, every micro-step"
        )
        timeline += {
            "ZeRO-1": ", + the all-gather after the step",
            "HSDP": " inside the node, + the cross-node all-reduce's "
            "exposed tail (an upper bound)",
        }.get(s, "")
        rows = (
            ("gpu_bytes", c.gpu_bytes, gb(c.gpu_bytes), WHAT[s] + micro, "1, 6, 7"),
            (
                "nic_bytes",
                c.nic_bytes,
                gb(c.nic_bytes),
                "the busiest NIC's bytes: each "
                "node sends its rings' share, spread over its NICs" + micro,
                "1, 7",
            ),
            (
                "comm_s",
                c.comm_s,
                secs(c.comm_s),
                "per collective: latency + the "
                "busiest link's bytes / its rate; back to back" + micro,
                "1, 7",
            ),
            ("exposed_s", c.exposed_s, secs(c.exposed_s), timeline, "3, 4, 6"),
            (
                "step_s",
                c.step_s,
                ("at most " if c.step_bound else "") + secs(c.step_s),
                "m micro-steps of compute + the exposed communication",
                "3, 4, 6, 7",
            ),
        )
        for part, value, text, formula, chapter in rows:
            inputs = compute if part in ("exposed_s", "step_s") else on
            p.add(f"comm.{s}.{part}", value, text, (formula, inputs, chapter))


def run(p, step, batch):
    s, t, cluster, m = p.recommended, p.training, p.cluster, p.model
    cost, ranks = p.costs[s], cluster.ranks
    p.add(
        "run.strategy",
        0,
        s,
        (
            "the shortest step among the strategies that fit",
            ", ".join(x for x in ps.STRATEGIES if p.fits[x]),
            "6",
        ),
        "strategy",
    )
    # DDP's bucket cap is worth knowing whichever strategy wins: the reader who
    # runs DDP anyway (a smaller model, more nodes) starts from it.
    family = s if s in ("DDP", "ZeRO-1") else "DDP"
    bucketed = p.costs[family]
    aside = "" if p.fits[family] else f"; {family} does not fit: for comparison"
    p.add(
        "run.bucket_cap_mb",
        bucketed.cap_mb,
        f"{bucketed.cap_mb} MiB",
        (
            f"the shortest {family} step of chapter 3's timeline over "
            f"bucket_cap_mb in {ps.CAPS_MB}{aside}",
            "",
            "3",
        ),
        f"best bucket_cap_mb ({family})",
    )
    p.add(
        "run.exposed_best",
        bucketed.exposed_s,
        secs(bucketed.exposed_s),
        (f"chapter 3's timeline at bucket_cap_mb={bucketed.cap_mb}{aside}", "", "3"),
        f"{family}'s exposed time at that cap",
    )
    p.add(
        "run.exposed_default",
        bucketed.default_exposed_s,
        secs(bucketed.default_exposed_s),
        (
            "chapter 3's timeline with bucket_cap_mb left unset: 25 MiB buckets, "
            f"the first one 1 MiB{aside}",
            "",
            "3",
        ),
        f"{family}'s exposed time, bucket_cap_mb unset",
    )
    p.add(
        "run.step_s",
        cost.step_s,
        secs(cost.step_s),
        (f"{s}'s step (communication table)", "", "3, 6, 7"),
        "step time",
    )
    tps = batch / cost.step_s
    p.add(
        "run.tokens_s",
        tps,
        f"{tps:,.0f}",
        ("global batch / step time", f"{batch:,} tokens", "7"),
        "tokens per second",
    )
    p.add(
        "run.tokens_s_gpu",
        tps / ranks,
        f"{tps / ranks:,.0f}",
        ("tokens per second / GPUs", f"{ranks} GPUs", "7"),
        "tokens per second per GPU",
    )
    flops, peak = tf.model_flops_per_token(m), p.node.gpu.peak_flops(t.precision)
    mfu = tps / ranks * flops / peak
    p.add(
        "run.mfu",
        mfu,
        f"{mfu:.1%}",
        (
            "tokens/s per GPU x (6 P_matmul + 12 L h s) / peak",
            f"{flops / 1e9:.1f} GFLOP a token, peak {peak / 1e12:.0f} TFLOP/s",
            "7",
        ),
        "MFU of the step",
    )
    one = ps.strategy_cost(
        s,
        step,
        cluster.with_nodes(1),
        ps.wire_bytes(t.precision),
        p.micro_steps * cluster.nodes,
        cost.cap_mb,
    )
    eff = one.step_s / (cluster.nodes * cost.step_s)
    # On one node the shards are larger: the state is sharded over one node's GPUs.
    one_state = ps.state_memory(
        s, step.psi, cluster.gpus_per_node, cluster.gpus_per_node, t.optimizer
    )
    act = p.values[f"mem.{s}.activations"].value
    one_total = one_state.total + act + one.buffers
    held = one_total <= p.node.gpu.memory
    p.add(
        "run.scaling",
        eff,
        percent(eff) if held else "n/a: too big for one node",
        (
            "T(one node, m x nodes micro-steps) / (nodes x T)",
            f"one node: {secs(one.step_s)} a step"
            + (
                ""
                if held
                else f", if it could hold {s} ({gb(one_total)} a GPU): {percent(eff)}"
            ),
            "7",
        ),
        "scaling efficiency against one node",
    )


def percent(x):
    """A share to 0.1%, never rounded up to a whole 100.0%."""
    text = f"{x:.1%}"
    return "> 99.9%" if text == "100.0%" and x < 1 else text


def checkpoint(p, nodes):
    t = p.training
    mtbf = ci.job_mtbf(t.node_mtbf_days * DAY_S, nodes)
    p.add(
        "run.mtbf",
        mtbf,
        duration(mtbf),
        ("node MTBF / nodes", f"{t.node_mtbf_days:g} days a node, {nodes} nodes", "9"),
        "job MTBF",
    )
    daly = ci.daly_interval(t.checkpoint_write_s, mtbf)
    p.add(
        "run.checkpoint_every",
        daly,
        duration(daly),
        (
            "Daly (2006): sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + C / 18M) - C",
            f"C = {secs(t.checkpoint_write_s)}, M = {duration(mtbf)}",
            "9",
        ),
        "checkpoint every",
    )
    every = max(1, round(daly / p.costs[p.recommended].step_s))
    p.add(
        "run.checkpoint_steps",
        every,
        f"{every}",
        ("Daly's interval / step time, rounded", "", "9"),
        "checkpoint every (steps)",
    )
    lost = ci.lost_fraction(daly, t.checkpoint_write_s, mtbf, t.restart_s)
    p.add(
        "run.lost",
        lost,
        f"{lost:.1%}",
        (
            "w / (1 + w), with w = C / T + (R + T / 2) / M lost per second of work",
            f"restart R = {secs(t.restart_s)}",
            "9",
        ),
        "time lost to failures and saving",
    )
