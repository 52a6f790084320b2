"""The estimator interface, re-exported from the core where the search that uses it lives.

`CostEstimator` and `EstimatorStats` are defined in `collage_farm.core.estimator` because the
Dijkstra search (core) calls them and the core imports nothing above it; every estimator in this
package implements that interface.
"""

from collage_farm.core.estimator import CostEstimator, EstimatorStats

__all__ = ["CostEstimator", "EstimatorStats"]
