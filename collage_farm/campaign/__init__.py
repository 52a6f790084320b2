"""A tuning campaign: phases 1-4 end to end (`run_tune`), with whatever cost source the user
chose.

* `options`: `TuneOptions` (what a campaign is asked to do), `CostSource` (farm, local,
  offline, mock), the cost table it reads and writes;
* `costs`: where its costs come from: the rule trees, the estimator and measure strategy
  (profile or exhaustive), the transition model with measured rows and cut costs;
* `timing_host`: whether this process times plans on the device the runners measure on;
* `decisions`: the verified decision as a cost-table row, found again by re-runs and offline;
* `tune`: `run_tune`, the campaign itself (its module docstring tells the flow).
"""

from collage_farm.campaign.costs import (
    build_specs,
    choose_transition,
    farm_slots,
    make_estimator,
    measure_strategy,
    profiled_estimator,
    with_cut_costs,
)
from collage_farm.campaign.options import (
    DEFAULT_REFINE_TRIALS,
    CostSource,
    TuneOptions,
    campaign_table,
    post_search_options,
)
from collage_farm.campaign.tune import run_tune
from collage_farm.zoo.source import load_source
from estimators.int8_ranges import tensor_ranges_provider

__all__ = ["DEFAULT_REFINE_TRIALS", "CostSource", "TuneOptions", "build_specs", "campaign_table",
           "choose_transition", "farm_slots", "load_source", "make_estimator",
           "measure_strategy", "post_search_options", "profiled_estimator", "run_tune",
           "tensor_ranges_provider", "with_cut_costs"]
