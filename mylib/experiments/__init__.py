"""The chapters' experiments: runs on real ranks that check and measure mylib.

Each module holds the worker functions one chapter (and its tests) run with
:func:`mylib.run_ranks`: the library against one process on the whole batch
and against PyTorch's own implementation, and the measurements the chapters
print. ``common`` holds what they share: the models, the batches and the
comparison of two models' parameters. Two are instruments rather than runs:
``tracer`` records a real step's timeline from MyDDP's events, and
``emulated_link`` delivers a CPU machine's all-reduces on a cluster link's
clock (chapter 3). Nothing in the library or in
``mylib.models`` imports from here.
"""
