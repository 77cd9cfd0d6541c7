"""The judge's parts: catalog (the exercises), sandbox and child (running the reader's
code safely), checking (the checks' vocabulary, also used in the browser), state
(the reader's files and progress), report (printing), watch (re-grading on save),
ranks (running checks on torch.distributed ranks)."""
