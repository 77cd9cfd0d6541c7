"""Chapter 9's failures, on purpose: a process that exits, a machine that freezes,
or one that is busy outside any collective.

:func:`mylib.experiments.checkpoint_resume.train` calls :meth:`Fault.strike`
after every step. A fault strikes once (a marker file in the run's folder
remembers it), so a restarted process that redoes the step goes on.
"""

import os
import time

import torch.distributed as dist


class StopTraining(Exception):
    """Raised by a ``"stop"`` fault: a crash simulated inside one process."""


class Fault:
    """A failure that strikes once, after ``step``, on one machine or rank.

    ``node`` picks the agent (its ``ELASTIC_NODE``), else ``rank`` the rank,
    else every rank. ``action``:

    * ``"exit"``: ``os._exit(1)``, a crashed process on a live machine;
    * ``"freeze"``: log ``freeze`` and wait, outside any collective, for the
      caller to stop the machine (:meth:`mylib.experiments.elastic.Agents.freeze`);
    * ``"busy"``: work for up to ``busy_s`` seconds outside any collective
      (a long step, a rank waiting on its GPU): healthy, and slow;
    * ``"stop"``: raise :class:`StopTraining` (a crash simulated in one process).

    A marker file in ``out`` makes it strike once, whatever the restarts.
    """

    ACTIONS = ("exit", "freeze", "busy", "stop")

    def __init__(self, step, action, node=None, rank=None, busy_s=30.0):
        if action not in self.ACTIONS:
            raise ValueError(f"action must be one of {self.ACTIONS}, not {action!r}")
        self.step, self.action, self.node, self.rank = step, action, node, rank
        self.busy_s = busy_s

    @classmethod
    def parse(cls, text):
        """``"13:B:exit"`` (step, machine, action), as the scripts take it."""
        step, node, action = text.split(":")
        return cls(int(step), action, node=node)

    def strike(self, out, step, log):
        """Strike if this is the step and this the rank, and it has not yet.

        ``log(out, event, **fields)`` records it first.
        """
        if step != self.step or not self._here():
            return
        who = self.node or f"rank{dist.get_rank()}"
        marker = os.path.join(out, f"fault-{self.action}-{step}-{who}")
        if os.path.exists(marker):
            return
        open(marker, "w").close()
        log(out, self.action, step=step)
        if self.action == "exit":
            os._exit(1)
        if self.action == "stop":
            raise StopTraining(step)
        time.sleep(self.busy_s)  # freeze, busy: until stopped or killed

    def _here(self):
        if self.node is not None:
            return os.environ.get("ELASTIC_NODE") == self.node
        return self.rank is None or dist.get_rank() == self.rank
