"""CUDA and TensorRT toolchains on a real GPU; skipped where there is none.

Run on a GPU node after ``pip uninstall -y onnxruntime && pip install -e .[cuda]``:
``pytest -m device tests/device``.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.graph import random_inputs
from collage_farm.core.target import CPU0, CUDA0, Target
from runners.base import BuildInput, MeasureConfig, MeasureInput, Status
from runners.registry import get_toolchain

pytestmark = pytest.mark.device

CFG = MeasureConfig(warmup_runs=3, rounds=3, min_round_runs=10, min_round_s=0.005,
                    timeout_s=300)


def _skip_unless(name: str) -> None:
    why = get_toolchain(name).available()
    if why:
        pytest.skip(f"{name}: {why}")


def conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32),
                                "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 56, 56])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 56, 56])],
                          [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def test_cuda_unavailable_reason_is_clean_without_gpu() -> None:
    for name in ("ort-cuda", "ort-tensorrt"):
        why = get_toolchain(name).available()
        assert why is None or (isinstance(why, str) and why)


def test_ort_cuda_build_measure_and_outputs() -> None:
    _skip_unless("ort-cuda")
    tc = get_toolchain("ort-cuda")
    t = Target.make("ort-cuda", "ort-cuda", CUDA0)
    m = conv_model()
    b = tc.build(BuildInput("cuda0001", t, m.SerializeToString()))
    assert b.ok, b.error
    assert "CUDAExecutionProvider" in str(b.detail("providers"))
    r = tc.measure(MeasureInput(b, CFG))
    assert r.status is Status.OK, r.error
    assert dict(r.details)["bind_device"] == "cuda" and dict(r.details)["iobinding"] is True
    assert r.device.kind == "cuda" and r.device.name
    feeds = random_inputs(m, 0)
    cpu = get_toolchain("ort-cpu")
    ref = cpu.run_outputs(cpu.build(BuildInput("cuda0001", Target.make(
        "ort-cpu", "ort-cpu", CPU0), m.SerializeToString())), feeds)
    got = tc.run_outputs(b, feeds)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-3, atol=1e-3)


def test_iobinding_keeps_copies_out_of_the_timing() -> None:
    _skip_unless("ort-cuda")
    tc = get_toolchain("ort-cuda")
    data = conv_model().SerializeToString()
    b_io = tc.build(BuildInput("cuda0002", Target.make("a", "ort-cuda", CUDA0), data))
    b_plain = tc.build(BuildInput("cuda0003", Target.make("b", "ort-cuda", CUDA0,
                                                          {"iobinding": False}), data))
    io = tc.measure(MeasureInput(b_io, CFG))
    plain = tc.measure(MeasureInput(b_plain, CFG))
    assert io.ok and plain.ok
    assert io.seconds < plain.seconds  # plain run() copies 200 KB in and 400 KB out per call


@pytest.mark.parametrize("fp16", [False, True])
def test_tensorrt_build_measure_with_engine_cache(fp16: bool, tmp_path: os.PathLike) -> None:
    _skip_unless("ort-tensorrt")
    tc = get_toolchain("ort-tensorrt")
    t = Target.make("trt", "ort-tensorrt", CUDA0, {"fp16": fp16,
                                                   "engine_cache_dir": str(tmp_path)})
    b = tc.build(BuildInput(f"trt000{int(fp16)}", t, conv_model().SerializeToString()))
    assert b.ok, b.error
    assert "TensorrtExecutionProvider" in str(b.detail("providers"))
    r = tc.measure(MeasureInput(b, CFG))
    assert r.status is Status.OK, r.error
    assert os.listdir(str(tmp_path)), "engine cache is empty"


@pytest.mark.parametrize("mode", ["network", "flush"])
def test_cuda_candidates_evict_the_gpu_l2_not_the_host(mode: str) -> None:
    _skip_unless("ort-cuda")
    tc = get_toolchain("ort-cuda")
    b = tc.build(BuildInput(f"cudafl{mode[0]}", Target.make("ort-cuda", "ort-cuda", CUDA0),
                            conv_model().SerializeToString()))
    assert b.ok, b.error
    cfg = MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=5, min_round_s=0.002,
                        mode=mode, network_bytes=32 << 20, timeout_s=300)
    r = tc.measure(MeasureInput(b, cfg))
    assert r.status is Status.OK, r.error
    evicts = str(dict(r.details)["evicts"])
    assert evicts.startswith("gpu l2 "), evicts
    nbytes, l2 = (int(x) for x in evicts.removeprefix("gpu l2 ").removesuffix(" B").split(" of "))
    assert l2 >= 256 << 10, l2  # the wrong device attribute (89) answered 1 here
    assert nbytes == (min(32 << 20, 2 * l2) if mode == "network" else 2 * l2)


def test_host_cuda_copies_are_measured_both_ways() -> None:
    _skip_unless("ort-cuda")
    from collage_farm.core.target import CPU0
    from runners.transitions import measure_copies

    rows = list(measure_copies([(CPU0, CUDA0), (CUDA0, CPU0)],
                               MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=5,
                                             min_round_s=0.002), sizes=(4096, 1 << 22)))
    assert len(rows) == 4 and all(r.ok for r in rows), [r.error for r in rows]
    by = {r.fingerprint: r.seconds for r in rows}
    print({k: f"{v * 1e6:.1f} us" for k, v in by.items()})
    assert all(0 < v < 1.0 for v in by.values())
