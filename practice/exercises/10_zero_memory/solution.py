"""Exercise 6.1, reference solution."""


def _validate(n_params, stage):
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3, got {stage!r}")
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}")


def per_rank_bytes(n_params, world_size, stage, k=12):
    """Bytes each rank holds for weights, gradients and optimizer state at a ZeRO stage.

    Stage 0 is plain DDP.
    """
    _validate(n_params, stage)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    psi, n = n_params, world_size
    weights, grads, state = 2 * psi, 2 * psi, k * psi
    if stage >= 1:
        state /= n
    if stage >= 2:
        grads /= n
    if stage >= 3:
        weights /= n
    return weights + grads + state


def comm_elements_per_step(n_params, stage):
    """Elements each rank sends per training step at a ZeRO stage (0 = DDP)."""
    _validate(n_params, stage)
    return 3 * n_params if stage == 3 else 2 * n_params
