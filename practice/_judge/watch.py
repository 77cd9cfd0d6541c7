"""``judge.py watch``: re-grade each time the reader saves their file.

File events come from ``watchdog`` when it is installed; otherwise (or with
``--poll``) the file is polled twice a second, which needs no file events
and works on every file system. A change is a new size, modification time
or content hash, so an editor that saves by renaming a temporary file is
seen too. With no id, it watches the next exercise not passed and moves on
to the following one when it passes.
"""

import os
import threading
import time

from _judge import catalog, report, state

POLL_S = 0.5


def watch(args, exercises, console, progress, grade_one):
    """Grade, then re-grade after every save, until Ctrl-C.

    Or until ``JUDGE_WATCH_MAX_GRADES`` grades, when that variable is set.
    """
    max_grades = int(os.environ.get("JUDGE_WATCH_MAX_GRADES", "0")) or None
    follow_next = args.target is None
    ex = (
        catalog.find(exercises, args.target)
        if args.target
        else _next(exercises, progress)
    )
    if ex is None:
        report.print_next(console, exercises, _states(exercises, progress))
        return 0
    grades = 0
    while True:
        path = args.file or state.ensure_workspace(ex)
        graded = _signature(
            path
        )  # taken before grading: a save during grading is not missed
        result = grade_one(args, ex, console, progress)
        grades += 1
        if max_grades and grades >= max_grades:
            return 0 if result.passed else 1
        if result.passed and follow_next:
            nxt = _next(exercises, progress)
            if nxt is None:
                return 0
            if nxt.id != ex.id:
                ex = nxt
                continue
        how = "polling" if args.poll or not _has_watchdog() else "file events"
        console.print(
            report.Text(
                f"Watching {report.rel(path)} ({how}): "
                "save it to grade again, Ctrl-C to stop.",
                style="dim",
            )
        )
        wait_for_change(path, poll=args.poll, since=graded)
        console.print(report.Text("-" * 60, style="dim"))


def _states(exercises, progress):
    return {ex.id: state.state_of(ex, progress) for ex in exercises}


def _next(exercises, progress):
    return report.next_exercise(exercises, _states(exercises, progress))


def _has_watchdog():
    try:
        import watchdog.observers  # noqa: F401

        return True
    except ImportError:
        return False


def _signature(path):
    try:
        st = os.stat(path)
        return (st.st_size, st.st_mtime_ns, state.file_hash(path))
    except OSError:
        return None


def wait_for_change(path, poll=False, since=None):
    """Return once the file at ``path`` differs from ``since`` in content, size or time.

    ``since`` defaults to now.
    """
    before = _signature(path) if since is None else since
    if not poll and _has_watchdog():
        _wait_with_events(path, before)
    else:
        while _signature(path) == before:
            time.sleep(POLL_S)
    time.sleep(0.1)  # let the editor finish writing


def _wait_with_events(path, before):
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    changed = threading.Event()

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event):
            if _signature(path) != before:
                changed.set()

    observer = Observer()
    observer.schedule(Handler(), os.path.dirname(os.path.abspath(path)))
    observer.start()
    try:
        # Events can be missed (network file systems): check the file now and then as
        # well.
        while not changed.wait(2.0):
            if _signature(path) != before:
                break
    finally:
        observer.stop()
        observer.join()
