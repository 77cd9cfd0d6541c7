"""The terminal planner: ``python -m mylib.plan --model "Llama 3 70B" --nodes 8``.

The same plan as the book's "Plan your run" page (:mod:`mylib.models.planner`,
with the inputs of :mod:`mylib.models.plan_inputs`), printed as tables;
``--explain`` adds each number's derivation. See ``mylib/plan/__main__.py``.
"""
