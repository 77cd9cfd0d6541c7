"""The names of each collective, at every layer of ``torch.distributed``.

One collective is reached by many names: its function in ``torch.distributed``
(and an older name, for some), a method of the process group and of its
backend, a functional collective, and the c10d operator every one of them
ends in. :mod:`spy` counts and refuses a collective under its
``torch.distributed`` name, whichever of these a call was made by.
"""

# One collective, several names: torch 2.13 renamed all_gather_into_tensor and
# reduce_scatter_tensor to the *_single names (the old ones warn and call the new),
# and _all_gather_base / _reduce_scatter_base are older still. A check may name
# any of them; the spy forbids and counts the collective under its new name.
ALIASES = {
    "all_gather_into_tensor": "all_gather_single",
    "_all_gather_base": "all_gather_single",
    "reduce_scatter_tensor": "reduce_scatter_single",
    "_reduce_scatter_base": "reduce_scatter_single",
}


def canonical(name):
    """The name the spy records a collective under (``all_gather_single``, ...)."""
    return ALIASES.get(name, name)


# The c10d operators every path to a collective ends in, and the name each has in
# torch.distributed (torch/csrc/distributed/c10d/Ops.cpp; _functional_collectives).
C10D_NAMES = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather_single",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather_single",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_single",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single",
    "gather_": "gather",
    "scatter_": "scatter",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "barrier": "barrier",
    "monitored_barrier_": "barrier",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather_single",
    "all_gather_into_tensor_out": "all_gather_single",
    "all_gather_into_tensor_coalesced": "all_gather_single",
    "reduce_scatter_tensor": "reduce_scatter_single",
    "reduce_scatter_tensor_out": "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "isend": "send",
    "irecv": "recv",
}
# The operator namespaces whose operators are collectives (c10d's, and the
# functional collectives' with and without autograd).
C10D_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
# torch.distributed._functional_collectives, by torch.distributed name.
FUNCTIONAL_NAMES = {
    "all_reduce": "all_reduce",
    "all_reduce_inplace": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_single": "all_gather_single",
    "all_gather_single_autograd": "all_gather_single",
    "all_gather_single_coalesced": "all_gather_single",
    "all_gather_tensor": "all_gather_single",
    "all_gather_tensor_autograd": "all_gather_single",
    "all_gather_tensor_inplace": "all_gather_single",
    "all_gather_into_tensor_coalesced": "all_gather_single",
    "all_gather_inplace": "all_gather",
    "reduce_scatter_single": "reduce_scatter_single",
    "reduce_scatter_single_autograd": "reduce_scatter_single",
    "reduce_scatter_single_coalesced": "reduce_scatter_single",
    "reduce_scatter_tensor": "reduce_scatter_single",
    "reduce_scatter_tensor_autograd": "reduce_scatter_single",
    "reduce_scatter_tensor_inplace": "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single",
    "all_to_all_single": "all_to_all_single",
    "all_to_all_single_autograd": "all_to_all_single",
    "all_to_all_inplace": "all_to_all_single",
    "broadcast": "broadcast",
}
# Methods of ProcessGroup and its backends, and their torch.distributed names.
METHOD_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather_single": "all_gather_single",
    "all_gather_single_coalesced": "all_gather_single",
    "_allgather_base": "all_gather_single",
    "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather_single",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter_single",
    "reduce_scatter_single_coalesced": "reduce_scatter_single",
    "_reduce_scatter_base": "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_all_single": "all_to_all_single",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
}


def collective(op):
    """The torch.distributed name of a c10d operator (packet or overload), or None."""
    qualified = getattr(op, "_qualified_op_name", None)
    if qualified is None:
        schema = getattr(op, "_schema", None)
        qualified = getattr(schema, "name", "")
    namespace, _, name = qualified.partition("::")
    return C10D_NAMES.get(name) if namespace in C10D_NAMESPACES else None
