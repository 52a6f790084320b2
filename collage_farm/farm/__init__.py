"""The measurement farm: candidate builds and measurements as Ray work on device-owning runners.

This is the only package of the project that imports ``ray``: everything else talks to the farm
through `Farm.measure` (the `estimators.sources.MeasurementService` contract), which takes
`MeasureRequest`s and yields `MeasureResult`s as they finish, so the search, the estimators and
the tests never see object refs, actors or Ray errors.

Modules, one concept each:

* `messages`: what a runner is and says (`RunnerSpec`, `RunnerInfo`, `RunnerPing`,
  `RunnerStats`), the farm's totals (`FarmStats`) and its error (`FarmError`);
* `resources`: measurement slots: this machine's (`local_resources`) and the runners a
  cluster's nodes can hold (`plan_slots`, `plan_runners`); `topology`, the last-level-cache
  domains of a host (`llc_domains`) and the ``cpu_llc_*`` resources that declare them; `slots`,
  how many CPU runners measure at once per host and why (`SlotPlan`, `SlotReason`), and the
  concurrency-bias records that allow more than one per domain (`BiasRecord`);
* `connect`: joining or starting Ray (`connect`, `shutdown`), token authentication;
* `actor`: the runner actor's body (`RunnerActor`, a `runners.local.LocalRunner` on one slot)
  and `journal`, the call journal that tells which call a dead runner was executing;
* `dispatch`: the dispatch loop as a Ray-free state machine (`Dispatcher`): queues, calls in
  flight, runner death, strikes (`blame`) and retries; `records` holds what it moves about
  (`Runner` records in a `RunnerState`, `Work`); `calls` is the interface through which it
  reaches the runners (`RunnerCalls`), `ray_calls` its Ray implementation;
* `pool`: `Farm`, which starts the runners and hands each `measure` to a `Dispatcher`;
* `progress`: the progress bar or log lines (`Progress`);
* `cluster`: Ray's validation of a cluster launcher config, for ``collage-farm cluster``.

``ray`` is imported inside the functions that use it, never at module level: it costs ~0.7 s,
and the CLI imports this package for every command (``collage-farm --help`` too).
"""

from collage_farm.farm.actor import RunnerActor
from collage_farm.farm.connect import connect, shutdown
from collage_farm.farm.dispatch import blame
from collage_farm.farm.messages import (
    FarmError,
    FarmStats,
    RunnerInfo,
    RunnerPing,
    RunnerSpec,
    RunnerStats,
)
from collage_farm.farm.pool import Farm
from collage_farm.farm.progress import Progress
from collage_farm.farm.records import RunnerState
from collage_farm.farm.resources import (
    LocalResources,
    local_resources,
    plan_runners,
    plan_slots,
    toolchain_kinds,
)
from collage_farm.farm.slots import (
    BIAS_LIMIT,
    BiasRecord,
    SlotPlan,
    SlotReason,
    bias_path,
    load_bias_records,
    save_bias_record,
)
from collage_farm.farm.topology import llc_domains

__all__ = [
    "BIAS_LIMIT",
    "BiasRecord",
    "Farm",
    "FarmError",
    "FarmStats",
    "LocalResources",
    "Progress",
    "RunnerActor",
    "RunnerInfo",
    "RunnerPing",
    "RunnerSpec",
    "RunnerState",
    "RunnerStats",
    "SlotPlan",
    "SlotReason",
    "bias_path",
    "blame",
    "connect",
    "llc_domains",
    "load_bias_records",
    "local_resources",
    "plan_runners",
    "plan_slots",
    "save_bias_record",
    "shutdown",
    "toolchain_kinds",
]
