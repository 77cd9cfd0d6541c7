"""What the planner tells the reader: the lines to run, or what would fit.

:func:`run_lines` writes the ``torchrun`` command and the lines of a training
script that set up the plan's strategy with its settings: DDP's
``bucket_cap_mb`` and ``no_sync()``, or FSDP2's ``fully_shard`` with its
``reshard_after_forward`` and mixed-precision policy (torch 2.13's
``torch.distributed.fsdp``). :func:`smallest_fit` answers a plan in which no
strategy fits: the fewest nodes (and, failing that, the settings) at which
one would. The number formats every front end shows live here too.

Standard library only: the planner runs in the reader's browser.
"""

from dataclasses import replace

from mylib.models import plan_strategies as ps
from mylib.models import transformer as tf
from mylib.models.memory import min_ranks_to_fit

GB = 1e9
DAY_S = 86400.0


def gb(x):
    """Bytes as GB (10^9) with the digits that matter."""
    v = x / GB
    if v == 0:
        return "0 GB"
    return f"{v:,.0f} GB" if v >= 100 else f"{v:.1f} GB" if v >= 1 else f"{v:.2f} GB"


def secs(x):
    """Seconds with the digits that matter."""
    if x >= 100:
        return f"{x:,.0f} s"
    if x >= 1:
        return f"{x:.2f} s"
    return f"{x * 1e3:.1f} ms" if x >= 1e-3 else f"{x * 1e6:.0f} µs"


def duration(x):
    """A long interval: minutes, hours or days."""
    if x < 3600:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.1f} h" if x < 3 * DAY_S else f"{x / DAY_S:.1f} days"


def run_lines(p):
    """The command and the code that run ``p``'s strategy, as a list of lines."""
    s, t, cluster = p.recommended, p.training, p.cluster
    nodes, g, steps = cluster.nodes, cluster.gpus_per_node, p.micro_steps
    lines = [
        f"torchrun --nnodes={nodes} --nproc-per-node={g} --rdzv-backend=c10d \\",
        "    --rdzv-endpoint=$HEAD_NODE:29500 --rdzv-id=$JOB_ID train.py",
        "",
    ]
    if s in ("DDP", "ZeRO-1"):
        lines += [
            "model = DistributedDataParallel(",
            f"    model, device_ids=[local_rank], bucket_cap_mb={p.costs[s].cap_mb},",
            "    gradient_as_bucket_view=True)",
        ]
        if s == "ZeRO-1":
            lines += [
                "optimizer = ZeroRedundancyOptimizer(",
                "    model.parameters(), optimizer_class=torch.optim.AdamW)",
            ]
        if t.precision == "bf16":
            lines += [
                "model.register_comm_hook(None, default_hooks.bf16_compress_hook)",
                '# forward under torch.autocast("cuda", dtype=torch.bfloat16)',
            ]
        if steps > 1:
            lines.append(
                f"# {steps} micro-steps a step, the first {steps - 1} in no_sync()"
            )
    else:
        args = [f"reshard_after_forward={s != 'ZeRO-2'}"]
        if s == "HSDP":
            lines.append(
                f'mesh = init_device_mesh("cuda", ({nodes}, {g}), '
                'mesh_dim_names=("replicate", "shard"))'
            )
            args.append("mesh=mesh")
        if t.precision == "bf16":
            # reduce_dtype left unset: the gradients are reduced in bf16 too
            lines.append("mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)")
            args.append("mp_policy=mp")
        lines += [
            "for block in model.layers:",
            f"    fully_shard(block, {', '.join(args)})",
            f"fully_shard(model, {', '.join(args)})",
        ]
        if steps > 1:
            lines.append(f"# {steps} micro-steps a step")
    if t.checkpointing:
        lines.append(
            "# each block: torch.utils.checkpoint.checkpoint(block, x, "
            "use_reentrant=False)"
        )
    every = p.values["run.checkpoint_steps"].value
    lines.append(f"# save a checkpoint every {every} steps")
    return lines


def fsdp_buffer_bytes(m, bytes_, strategy):
    """Parameters FSDP holds gathered at the peak, and the largest gradient.

    Per unit (a block, the output layer, the embedding): two units whole with
    prefetch (ZeRO-3, HSDP), every unit (ZeRO-2). The same bytes as the
    ZeRO-3 timeline's ``peak_gathered_bytes`` (``tests/test_planner.py``).
    """
    if strategy in ("DDP", "ZeRO-1"):
        return 0.0
    whole = [layer.nbytes for layer in tf.timeline_layers(m, bytes_.gather, 1, 1)]
    grad = max(whole) / bytes_.gather * bytes_.reduce
    if strategy == "ZeRO-2":
        return sum(whole) + grad
    return max(a + b for a, b in zip(whole, whole[1:])) + grad


def smallest_fit(m, node, nodes, training, max_nodes=4096):
    """What to say when nothing fits: the smallest configuration that would.

    Tries more nodes with the reader's settings, then with activation
    checkpointing and one sequence per micro-batch (memory alone decides
    whether a plan fits); failing both, says why no node count helps.
    """
    g = node.cluster(1).gpus_per_node
    cheaper = replace(training, micro_batch=1, checkpointing=True)
    for settings in (training, cheaper):
        found = fewest_nodes(m, node, settings, max_nodes)
        if found:
            n, s = found
            how = (
                ""
                if settings is training
                else (" with activation checkpointing and one sequence per micro-batch")
            )
            tokens = n * g * settings.micro_batch * m.seq
            return (
                f"Nothing fits on {nodes} node{'s' * (nodes > 1)} of {node.name}. "
                f"The smallest configuration that fits: {s} on {n} node"
                f"{'s' * (n > 1)} ({n * g} GPUs){how}, with a global batch of at "
                f"least {tokens:,} tokens."
            )
    bytes_ = ps.wire_bytes(training.precision)
    act = tf.activation_bytes(
        m,
        1,
        checkpointing=True,
        element_bytes=bytes_.activation,
        flash=training.flash_attention,
    )
    return (
        f"Nothing fits on any number of {node.name} nodes: one sequence of "
        f"{m.seq:,} tokens needs {gb(act)} of activations even with checkpointing, "
        f"against {gb(node.gpu.memory)} a GPU, and data parallelism does not split "
        "activations. Shorten the sequence, use GPUs with more memory, or split "
        "the model (tensor or sequence parallelism)."
    )


def fewest_nodes(m, node, training, max_nodes=4096):
    """``(nodes, strategy)``: the fewest nodes on which a strategy fits, or None.

    Per strategy, chapter 6's :func:`~mylib.models.memory.min_ranks_to_fit`
    with what is left of a GPU once the activations and buffers are in.
    HSDP shards over one node whatever the node count, so it fits everywhere
    or nowhere.
    """
    bytes_ = ps.wire_bytes(training.precision)
    act = tf.activation_bytes(
        m,
        training.micro_batch,
        checkpointing=training.checkpointing,
        element_bytes=bytes_.activation,
        flash=training.flash_attention,
    )
    psi, g = tf.num_params(m), node.cluster(1).gpus_per_node
    k = ps.OPTIMIZER_BYTES[training.optimizer]
    best = None
    for s in ps.STRATEGIES:
        left = node.gpu.memory - act - fsdp_buffer_bytes(m, bytes_, s)
        if left <= 0:
            continue
        if s == "HSDP":
            fits = ps.state_memory(s, psi, g, g, training.optimizer).total <= left
            ranks = g if fits else None
        else:
            kept = ps.KEPT["params"], ps.KEPT["grads"]
            ranks = min_ranks_to_fit(psi, ps.STAGE[s], left, k, *kept)
        if ranks is not None:
            n = max(1, -(-ranks // g))
            if n <= max_nodes and (best is None or n < best[0]):
                best = (n, s)
    return best
