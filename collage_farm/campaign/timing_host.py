"""Where a campaign's own end-to-end timings run, against the devices its runners measure on.

A campaign times some things itself, in its own process: the hand-off and cut-cost probes
(chains of the model's chunks, and in profile mode every target's whole model, the time base
each profile share is scaled to), refinement, the never-worse run and its second run (the
written plan's measured figures and the decision between a mix and the best single
toolchain). Candidates and profiles are measured by the farm's runners. On an embedded local
Ray, or any campaign whose process shares a host with its runners, both are the same device.
On a cluster they need not be: ``ray job submit`` runs ``tune`` on the head node unless the
job asks for a node's resources (`cluster.yaml`: the head is another instance type with no
measurement slot, and has no GPU), and a campaign started on a laptop with ``--address
ray://HEAD:10001`` times its plans on the laptop. Then the plan's end-to-end figures and the
never-worse decision come from a device its candidates were not measured on.

`plan_timing_host` compares, per measured target (simulated toolchains have no timing), the
device this process would time the target on (its toolchain's ``device_description`` here)
with the device the service's runner reports for it (`MeasurementService.describe`, the
device every cost row of the target carries): the same kind, model, core count and driver
(`same_device`; not the description's ``config``, which for a GPU is the process's
``CUDA_VISIBLE_DEVICES``: a Ray GPU worker sees ``0``, the campaign's process all). A
mismatch is a `HostMatch.DIFFERENT`: the campaign says so in one warning line and in
``--json`` (``plan_timing_host``), and in profile mode the cut-cost probe's whole-model time
does not become that target's time base (its profile's own unprofiled whole-model time, taken
on the runner, does). The timings are not moved: a campaign that must decide on the runners'
device runs where the runners are (the README's cluster section places the job on a
``coordinator`` node of the measurement nodes' instance type).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from collage_farm.core.target import Target
from collage_farm.execute import SIMULATED_TOOLCHAINS
from estimators.sources import MeasurementService
from runners.base import DeviceDescription
from runners.registry import get_toolchain

__all__ = ["HostMatch", "PlanTimingHost", "TargetHost", "device_here", "plan_timing_host",
           "same_device"]


class HostMatch(enum.Enum):
    """How a target's device here compares with its runner's."""

    SAME = "same"  #: this process times the target on the device its runner measures on
    DIFFERENT = "different"  #: another device (another CPU model or core count, no GPU here)
    UNKNOWN = "unknown"  #: no runner described the target (nothing serves it)


@dataclass(frozen=True)
class TargetHost:
    """One measured target: its device here, its runner's, and how they compare."""

    target: str
    here: str
    runner: str | None
    match: HostMatch

    def to_json(self) -> dict[str, Any]:
        return {"here": self.here, "runner": self.runner, "match": self.match.value}


@dataclass(frozen=True)
class PlanTimingHost:
    """Every measured target's `TargetHost`, in the campaign's target order."""

    targets: tuple[TargetHost, ...] = ()

    @property
    def different(self) -> tuple[str, ...]:
        """The targets this process times on another device than their runners."""
        return tuple(t.target for t in self.targets if t.match is HostMatch.DIFFERENT)

    def warning(self) -> str | None:
        """One line for the summary when some target's device differs, else None."""
        diff = [t for t in self.targets if t.match is HostMatch.DIFFERENT]
        if not diff:
            return None
        what = "; ".join(f"{t.target}: here {t.here}, runner {t.runner}" for t in diff)
        return ("warning: this campaign's own end-to-end timings (cut-cost probe, refinement, "
                "never-worse run, the written plan's measured figures) ran on another device "
                f"than the runners that measured its costs ({what}); the decision between a "
                "mix and the best single toolchain is this machine's. Run the campaign on a "
                "node of the runners' type (README, 'On a cluster')")

    def to_json(self) -> dict[str, Any]:
        return {"targets": {t.target: t.to_json() for t in self.targets},
                "different": list(self.different), "warning": self.warning()}


def same_device(a: DeviceDescription, b: DeviceDescription) -> bool:
    """Whether two descriptions name one device: kind, model, cores and driver agree (the
    ``config`` field says what a process is shown of it, not what it is)."""
    return (a.kind, a.name, a.cores, a.driver) == (b.kind, b.name, b.cores, b.driver)


def device_here(target: Target) -> DeviceDescription:
    """The device this process would time ``target`` on (its toolchain's description);
    a toolchain that cannot even describe it here says so in the name."""
    try:
        return get_toolchain(target.toolchain).device_description(target)
    except Exception as e:  # a missing library or device: not this runner's device either
        return DeviceDescription(target.device.kind, f"unavailable ({type(e).__name__}: {e})"[:160])


def plan_timing_host(targets: Sequence[Target], service: MeasurementService,
                     here: Callable[[Target], DeviceDescription] = device_here
                     ) -> PlanTimingHost:
    """Each measured target of ``targets`` (module docstring): its device ``here`` against
    the one ``service``'s runner reports. Never raises for a target: a runner that does not
    describe it is `HostMatch.UNKNOWN`."""
    out: list[TargetHost] = []
    for t in dict.fromkeys(targets):
        if t.toolchain in SIMULATED_TOOLCHAINS:
            continue
        mine = here(t)
        got = service.describe(t)
        theirs = got[0] if got is not None else None
        match = (HostMatch.UNKNOWN if theirs is None
                 else HostMatch.SAME if same_device(mine, theirs) else HostMatch.DIFFERENT)
        out.append(TargetHost(t.id, mine.describe(),
                              theirs.describe() if theirs is not None else None, match))
    return PlanTimingHost(tuple(out))
