"""Runner death on demand: a `RunnerActor` that exits its actor process when a target asks.

Why: the farm's handling of a runner actor process dying mid-call (strikes, retries, the call
journal, the alive-check behind a ``crashed`` result) is tested on real actors, and killing
processes by hand cannot hit the races deterministically. A farm started with
``make_farm(actor=FaultDrillRunner)`` runs this subclass; its ``null``-toolchain targets may
then carry these options (``"*"``, or a substring of the request's fingerprint or label, like
`runners.null`'s own fault options):

* ``farm_exit_on``: the actor process exits when it receives a matching request (every
  incarnation), before building it: a candidate that kills its runner;
* ``farm_exit_after``: it exits right *after* a matching request finished (journaled), before
  the reply leaves: the reply dies with the process (first incarnation only);
* ``farm_killed_on``: it answers a matching request ``crashed`` (as a call whose worker Ray
  killed along with the actor does) and then exits without answering anything else, at the
  next call or ping or 2 s later: ``ray.kill`` mid-call (first incarnation only).

"First incarnation only" makes the request measurable once Ray restarted the runner. The
class lives here, not in the farm: production runners know nothing of these options.
"""

from __future__ import annotations

import os
import threading

from collage_farm.farm import RunnerActor, RunnerPing, RunnerSpec
from runners.base import MeasureRequest, MeasureResult, Status

EXIT_ON = "farm_exit_on"
EXIT_AFTER = "farm_exit_after"
KILLED_ON = "farm_killed_on"
FAULT_EXIT_CODE = 77


def _matches(req: MeasureRequest, option: str) -> bool:
    t = req.target
    if t.toolchain != "null":
        return False
    v = t.option(option)
    if not v:
        return False
    v = str(v)
    return v == "*" or v in req.fingerprint or bool(req.label and v in req.label)


class FaultDrillRunner(RunnerActor):
    """A runner actor whose process exits where a ``null`` target's options say."""

    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        self.dying = False  # `farm_killed_on` fired: nothing is answered any more

    def _first_incarnation(self) -> bool:
        return not self.journal.reopened  # a restarted actor finds its journal

    def ping(self) -> RunnerPing:
        if self.dying:
            os._exit(FAULT_EXIT_CODE)
        return super().ping()

    def run(self, req: MeasureRequest, call: int = 0) -> MeasureResult:
        if self.dying or _matches(req, EXIT_ON):
            os._exit(FAULT_EXIT_CODE)
        res = super().run(req, call)  # journals the call
        if _matches(req, EXIT_AFTER) and self._first_incarnation():
            os._exit(FAULT_EXIT_CODE)
        return res

    def _run(self, req: MeasureRequest) -> MeasureResult:
        if not (_matches(req, KILLED_ON) and self._first_incarnation()):
            return super()._run(req)
        # Ray kills the actor's children first: the call sees its worker die and replies
        # `crashed`; the process executes nothing after it and exits
        self.dying = True
        threading.Timer(2.0, os._exit, args=(FAULT_EXIT_CODE,)).start()
        return MeasureResult.failed(
            req.build, Status.CRASHED, "worker died from SIGKILL (exit code -9) (killed: "
            "possibly the OOM killer); restarted", req.config,
            toolchain_version=self.versions.get(req.target.toolchain, ""))
