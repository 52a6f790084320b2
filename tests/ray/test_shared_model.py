"""Large models go through Ray's object store once per bytes object: the profile requests of
a campaign (one per target, the same whole model) share one copy; what each runner measured
is what it would have measured with the model inside the request."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.target import BUILTIN_TARGETS
from collage_farm.farm.ray_calls import SHARED_MODEL_BYTES
from runners.base import BuildInput, MeasureConfig, MeasureRequest, Status

FAST = MeasureConfig(warmup_runs=1, rounds=3, min_round_runs=3, min_round_s=0.002, timeout_s=60)


def _matmul_model() -> bytes:
    """Y = X @ W with W [512, 600] float32 (1.2 MB): over the shared-model threshold."""
    w = np.random.default_rng(0).standard_normal((512, 600)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "mm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 512])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 600])],
        [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m.SerializeToString()


def test_requests_holding_one_model_share_one_object(make_farm: Any) -> None:
    farm = make_farm(toolchains=["ort-cpu"])
    ort = BUILTIN_TARGETS["ort-cpu"]
    data = _matmul_model()
    assert len(data) >= SHARED_MODEL_BYTES
    onnx.checker.check_model(onnx.load_from_string(data))
    reqs = [MeasureRequest(BuildInput(f"shared-{i}", ort, data), FAST) for i in range(3)]
    results = list(farm.measure(reqs))
    assert sorted(r.fingerprint for r in results) == ["shared-0", "shared-1", "shared-2"]
    assert all(r.status is Status.OK and r.seconds > 0 for r in results), \
        [r.error for r in results]
    calls = farm._calls
    assert calls.puts == 1  # three requests, one copy in the object store
    other = bytes(bytearray(data))  # the same content in another object: put again
    (res,) = farm.measure([MeasureRequest(BuildInput("shared-3", ort, other), FAST)])
    assert res.status is Status.OK and calls.puts == 2
    assert calls.shared is not None and calls.shared[0] is other
    farm.close()
    assert calls.shared is None
