"""What a tuning campaign is asked to do: `TuneOptions`, the `CostSource` its costs come from,
the cost table it reads and writes, and the post-search options derived from them."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.pins import PinSet
from collage_farm.core.rules import RuleOptions
from collage_farm.core.target import Target
from collage_farm.core.transition import TransitionModel
from collage_farm.postsearch.decide import PostSearchOptions
from estimators.profiled import (
    DEFAULT_TOLERANCE,
)

DEFAULT_REFINE_TRIALS = 6


class CostSource(str, enum.Enum):
    """Where a campaign's candidate costs come from (`TuneOptions.estimator`).

    ``FARM``: measured on the Ray farm (`collage_farm.farm.Farm`), recorded in the cost table.
    ``LOCAL``: measured by the toolchains' own isolated runners in this process, no Ray (the
    simulated Ethos-U boards, whose costs are deterministic), recorded in the cost table.
    ``OFFLINE``: read from an existing cost table only; nothing is measured.
    ``MOCK``: a deterministic analytic stand-in (`estimators.mock.MockEstimator`); no table.
    """

    FARM = "farm"
    LOCAL = "local"
    OFFLINE = "offline"
    MOCK = "mock"

    @property
    def measures(self) -> bool:
        """Whether candidates are measured (and recorded) now."""
        return self in (CostSource.FARM, CostSource.LOCAL)


@dataclass(frozen=True)
class TuneOptions:
    model: str  # a path, zoo:NAME or pkg:NAME
    targets: tuple[Target, ...]
    out: Path
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    layers: int | None = None  # zoo models only
    estimator: CostSource = CostSource.FARM  # a `CostSource` or its value ("mock", ...)
    cost_table: Path | None = None
    address: str | None = None
    allow_analytic: bool = False
    prune: bool = True
    retry_failed: bool = False  # failed rows never answer: measure them all again
    reconfirm: bool = False  # the table's confirmations do not count: re-measure the path
    rule_options: RuleOptions = RuleOptions()
    transition: TransitionModel | None = None
    pins: object = None  # collage_farm.core.pins.PinSet, when given
    campaign_id: str = ""
    strictness: str = "exact"
    num_cpus: int | None = None
    slots: int | None = None  # CPU runners per host, forced (default: one per LLC domain)
    # after the search (measured campaigns only; see `post_search`)
    verify: bool = True  # never worse: plan vs each single toolchain, measured end to end
    refine_trials: int = DEFAULT_REFINE_TRIALS  # measured local moves; 0 disables
    refine_time_s: float = 120.0
    verify_rounds: int = 7
    # a mix that looks faster (ratio < 1 - 3%) but not beyond noise gets this many more
    # interleaved rounds against the best single before the decision; 0 disables
    verify_extend_rounds: int = 14
    measure_mode: str = ""  # candidates' MeasureConfig.mode; "" = runners.base.CANDIDATE_MODE
    cut_costs: bool = True  # measure this model's cut cost per target (collage_farm.probes.cutcost)
    confirm_rounds: int = 3  # re-measure the chosen path, re-search (`confirm`); 0 disables
    report: bool = True  # report.html + PNGs beside the plan
    # a plan that can hold int8 partitions is checked as `run` checks it, and searched once
    # more with 16-bit activations (NPU, then host) while it fails
    # (`collage_farm.campaign.accuracy`)
    accuracy_check: bool = True
    # how candidates get costs (`MeasureStrategy`): "profile" (in-network operator profiles,
    # `estimators.profiled`), "exhaustive" (every candidate measured in isolation) or ""
    # (the cost source's default, `measure_strategy`)
    measure: str = ""
    profile_tolerance: float = DEFAULT_TOLERANCE  # profile sum vs whole model: else fall back
    # plans whose uncertain candidates are measured in isolation (`screen`); 0: none, as an
    # isolated cost mixed into profile shares misprices mixed plans (estimators.profiled)
    screen_rounds: int = 0
    # mixed plans the search chose whose partitions are priced inside the running plan
    # (`collage_farm.postsearch.inchain`, profile mode); 0: none
    inchain_rounds: int = 4
    inputs: Mapping[str, object] = field(default_factory=dict)  # fixed input values (--input)
    # samples int8 builds are calibrated on (--calibration-data); None: seeded random
    calibration: CalibrationData | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "estimator", CostSource(self.estimator))
        except ValueError:
            raise ValueError(f"unknown estimator {self.estimator!r} "
                             f"({', '.join(m.value for m in CostSource)})") from None


def campaign_table(opts: TuneOptions) -> Path | None:
    """The cost-table directory a campaign reads and writes: ``--cost-table``, else
    ``OUT/costs`` (where a farm campaign with this ``--out`` left it); mock campaigns have
    none."""
    if opts.cost_table is not None:
        return Path(opts.cost_table)
    return opts.out / "costs" if opts.estimator is not CostSource.MOCK else None


def post_search_options(opts: TuneOptions) -> PostSearchOptions:
    """What `collage_farm.postsearch.decide.post_search` needs of the campaign's options."""
    pins = PinSet.of(opts.pins) if opts.pins is not None else None  # type: ignore[arg-type]
    return PostSearchOptions(
        targets=tuple(opts.targets), pins=pins,
        verify=opts.verify, refine_trials=opts.refine_trials, refine_time_s=opts.refine_time_s,
        verify_rounds=opts.verify_rounds, verify_extend_rounds=opts.verify_extend_rounds,
        report=opts.report, calibration=opts.calibration)
