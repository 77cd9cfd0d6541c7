"""Exercise 6.1: per-rank memory of DDP and the ZeRO stages (chapter 6).

Read practice/exercises/10_zero_memory/README.md, write both functions,
then grade them:  python practice/judge.py 6.1
"""


def per_rank_bytes(n_params, world_size, stage, k=12):
    """Bytes each rank holds for weights, gradients and optimizer state at a ZeRO stage.

    Stage 0 is plain DDP.
    """
    raise NotImplementedError("write per_rank_bytes")


def comm_elements_per_step(n_params, stage):
    """Elements each rank sends per training step at a ZeRO stage (0 = DDP)."""
    raise NotImplementedError("write comm_elements_per_step")
