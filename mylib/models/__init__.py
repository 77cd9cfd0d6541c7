"""What-if models: the arithmetic behind the book's figures and predictions.

Every module here imports the standard library and other ``mylib.models``
modules only (``tests/test_layering.py`` checks it), so the same files run in
a notebook, in the tests and in the reader's browser (Pyodide) on the static
site. A model never draws: its figure lives in ``mylib.figures`` under the
same name (``models/timeline.py`` is drawn by ``figures/timeline.py``).

* ``buckets``: the bucketing rule, shared by :class:`mylib.MyDDP` and the
  timeline (chapter 3)
* ``costmodel``: the alpha-beta cost of a message and of ring collectives (1)
* ``cluster``: nodes of GPUs, NVLink inside, NICs out; NCCL's ring, tree and
  the hierarchical schedule priced on them (1, 6, 7), with ``double_tree``
  (NCCL's double binary tree) and ``nccl_published`` (measurements to check
  it against)
* ``sharding``: who reads which sample under ``DistributedSampler`` (2, 8)
* ``timeline``: one data-parallel step, layer by layer and bucket by bucket (3)
* ``timeline_accum``: an optimizer step of m micro-steps (4)
* ``timeline_compress``: fewer bytes on the wire (5)
* ``memory``: bytes per rank under DDP and ZeRO (6)
* ``timeline_zero3``: ZeRO-2 and ZeRO-3 steps with their all-gathers (6)
* ``step_traffic``: a DDP, FSDP or HSDP step's bytes per GPU, NIC and node (6, 7)
* ``scaling``: what the n-th rank buys (7)
* ``checkpoint_interval``: how often to checkpoint, Young and Daly (9)
"""
