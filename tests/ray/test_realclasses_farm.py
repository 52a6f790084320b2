"""The one measured farm campaign of the real-export classes: a QDQ model on three toolchains.

`zoo:qdq_mnist` (ONNX Runtime's ``quantize_static`` in QDQ format) is tuned on the shared Ray
cluster with ORT CPU, OpenVINO and LiteRT runners, every cost a farm measurement (a short
measurement config: what runs matters here, not how fast), and the never-worse step times the
plan against each whole model. The written plan is then run on the real runtimes and checked
against the whole model at int8 tolerance (the model quantizes itself). A candidate a toolchain
cannot build or run must be a failed row, not a lost campaign. The other classes are tuned on
local measured costs in tests/unit/test_realclasses.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.core.target import parse_targets
from collage_farm.costtable import CostTable, TableStore
from collage_farm.execute import PlanExecutor
from estimators.measured import FarmEstimator
from runners.base import MeasureConfig

pytest.importorskip("openvino")
pytest.importorskip("ai_edge_litert")

QUICK = MeasureConfig(warmup_runs=1, rounds=1, min_round_runs=2, min_round_s=0.0, mode="warm")


def test_qdq_model_measured_on_three_toolchains_runs_and_verifies(make_farm: Any,
                                                                  tmp_path: Path) -> None:
    targets = tuple(parse_targets("ort-cpu,openvino-cpu,litert-cpu"))
    farm = make_farm(toolchains=["ort-cpu", "openvino", "litert"])
    est = FarmEstimator(farm, TableStore(tmp_path / "costs"), model="qdq_mnist",
                        measure_config=QUICK, close_farm=False)
    try:
        s = run_tune(TuneOptions(model="zoo:qdq_mnist", targets=targets, out=tmp_path / "out",
                                 refine_trials=0, confirm_rounds=0, cut_costs=False,
                                 verify_rounds=3, verify_extend_rounds=0, report=False),
                     estimator=est)
    finally:
        est.close()
    assert s["estimator"] != "mock" and s["measured"] > 100
    assert s["plan_measured_s"] > 0 and s["best_single_target"] in {t.id for t in targets}
    assert set(s["failed_by_status"]) <= {"unsupported", "build_failed", "runtime_error"}
    rows = CostTable(tmp_path / "costs").read()
    assert set(rows.column("target").to_pylist()) == {t.id for t in targets}
    ex = PlanExecutor(tmp_path / "out")
    assert ex.precision == "int8"
    assert set(ex.check()) == {"Plus214_Output_0"}
