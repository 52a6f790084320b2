"""A simulated (Ethos-U) partition never loses `run`'s process to an int8 kernel that aborts.

LiteRT's int8 reference SOFTMAX aborts the process (SIGABRT) when 512 or more entries of a row
equal the row's maximum: logits below the calibrated range clamp to one value. The runtime gives
such partitions the fp32 stand-in and says why in ``numerics``; shorter rows keep int8.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from runners.runtime import RuntimeInput
from runners.runtime_sim import SOFTMAX_ABORT_ROW, simulated_runtime, softmax_abort_risk

pytest.importorskip("ai_edge_litert")


def _softmax(n: int | str) -> bytes:
    g = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], name="head", axis=-1)], "sm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return m.SerializeToString()


def _run(n: int) -> tuple[str, np.ndarray]:
    inp = RuntimeInput("p0", "ethos-u55-128", _softmax(n), ("x",), ("y",),
                       tensor_ranges=(("x", -4.0, 4.0), ("y", 0.0, 1.0)))
    rt = simulated_runtime(inp, "vela")
    # every logit below the calibrated range: one clamped value, all entries equal the max
    out = rt.plain({"x": np.full((1, n), -10.0, np.float32)})
    return rt.numerics, np.asarray(out["y"])


def test_long_softmax_rows_run_fp32_and_say_why() -> None:
    n = SOFTMAX_ABORT_ROW + 88
    numerics, y = _run(n)  # without the guard this process aborts here
    assert numerics.startswith("ort-cpu fp32 stand-in (int8 not run:"), numerics
    assert "rows of 600" in numerics
    np.testing.assert_allclose(y, 1.0 / n, rtol=1e-5)


def test_short_softmax_rows_keep_int8() -> None:
    numerics, y = _run(300)
    assert numerics.startswith("litert int8"), numerics
    assert abs(float(y.max()) - 1.0 / 300) < 1.0 / 256  # one int8 step of [0, 1]


def test_unknown_row_length_counts_as_a_risk() -> None:
    assert softmax_abort_risk(_softmax(SOFTMAX_ABORT_ROW - 1)) is None
    assert "unknown length" in (softmax_abort_risk(_softmax("n")) or "")
