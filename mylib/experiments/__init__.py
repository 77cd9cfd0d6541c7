"""The chapters' experiments: runs on real ranks that check and measure mylib.

Each module holds the worker functions one chapter (and its tests) run with
:func:`mylib.run_ranks`: the library against one process on the whole batch
and against PyTorch's own implementation, and the measurements the chapters
print. ``common`` holds what they share: the models, the batches and the
comparison of two models' parameters. Nothing in the library or in
``mylib.models`` imports from here.
"""
