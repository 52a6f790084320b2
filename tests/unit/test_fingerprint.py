"""Fingerprints: repeated layers collide, shapes and targets separate, models share."""

from __future__ import annotations

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.rules import RuleOptions, all_candidates, default_spec
from collage_farm.core.target import BUILTIN_TARGETS as T

SMALL = {"width": 32, "heads": 2, "vocab": 50, "seq_len": 8}


def _fps(layers: int, **kw):
    g = load_graph(zoo.build("gpt2", layers=layers, **{**SMALL, **kw}))
    specs = [default_spec(T["ort-cpu"], lambda n, gr: True, "graph",
                          RuleOptions(max_depth=3, segments=False))]
    cands = all_candidates(g, specs)
    return g, cands, {c.fingerprint for c in cands}


def test_repeated_layers_share_fingerprints():
    _, c2, f2 = _fps(2)
    _, c4, f4 = _fps(4)
    assert len(c4) > len(c2) * 1.5  # twice the layers, about twice the candidates ...
    assert f4 == f2  # ... and exactly the same distinct measurements
    # the same candidate in layer 0 and layer 1 of one model
    by_fp: dict[str, set[str]] = {}
    for c in c4:
        by_fp.setdefault(c.fingerprint, set()).add(c.node_names[0].split("/")[0])
    assert any(len(layers) >= 4 for layers in by_fp.values())


def test_shapes_and_targets_separate():
    _, _, f8 = _fps(2)
    _, _, f16 = _fps(2, seq_len=16)
    assert not f8 & f16  # every candidate's shapes changed
    g = load_graph(zoo.build("mnist"))
    a = all_candidates(g, [default_spec(T["ort-cpu"], lambda n, gr: True)])
    b = all_candidates(g, [default_spec(T["openvino-cpu"], lambda n, gr: True)])
    assert not {c.fingerprint for c in a} & {c.fingerprint for c in b}
    # same structure, different weights (seed): same fingerprints
    g1 = load_graph(zoo.build("mnist", seed=1))
    a1 = all_candidates(g1, [default_spec(T["ort-cpu"], lambda n, gr: True)])
    assert {c.fingerprint for c in a} == {c.fingerprint for c in a1}
