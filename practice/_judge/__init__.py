"""The judge's parts: catalog (the exercises), sandbox and child (running the reader's
code safely), checking (the checks' vocabulary) and running (running checks, wording
verdicts), both also used in the browser with loading and browser; state
(the reader's files and progress), report (printing), watch (re-grading on save),
ranks (running checks on torch.distributed ranks)."""
