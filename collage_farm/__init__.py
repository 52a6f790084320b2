"""collage-farm: the Collage partition search over ONNX models, with a Ray measurement farm.

The coordinator (this package) runs the four Collage phases (RFC 0062): partition rules per
target, candidate partitions over a dataflow graph, a Dijkstra search over covered-node sets, and
a plan written to disk. Costs come from `estimators/`, measurements from `runners/`.
"""

__version__ = "0.1.0"
