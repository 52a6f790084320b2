"""The estimator interface, re-exported from the core where the search that uses it lives.

`CostEstimator`, `EstimatorKind` and `EstimatorStats` are defined in
`collage_farm.core.estimator` because the Dijkstra search (core) calls them and the core imports
nothing above it; every estimator in this package implements that interface.
"""

from collage_farm.core.estimator import CostEstimator, EstimatorKind, EstimatorStats

__all__ = ["CostEstimator", "EstimatorKind", "EstimatorStats"]
