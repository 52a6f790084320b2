"""Measurement modes: recorded in every row, old rows read as warm, each mode's action runs.

Which mode is faster is a fact of the machine (bench/additive.py prints it), not asserted here;
what is asserted: the mode travels into the row and back, the between-run action of each mode
runs outside the timed region (fake clock), ``network`` re-reads the candidate's own bound
inputs, and the flushing modes stop a round on wall time, not on timed time alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runners.measure as measure
from collage_farm.core.target import get_target
from collage_farm.costtable import CostTable, CostTableWriter, row_from_result
from runners.base import (
    DEFAULT_MODE,
    MEASURE_MODES,
    BuildInput,
    MeasureConfig,
    MeasureInput,
    canonical_mode,
)
from runners.cpu import OpenVinoToolchain, OrtCpuToolchain
from runners.measure import InputToucher, flush_for, private_cache_bytes, time_callable


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter_ns", c)
    return c


def _matmul(k: int) -> bytes:
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((k, k)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m.SerializeToString()


def test_mode_names_aliases_and_legacy_rows() -> None:
    assert MeasureConfig().mode == DEFAULT_MODE and DEFAULT_MODE in MEASURE_MODES
    assert canonical_mode("isolated") == "warm" and canonical_mode("cache_flush") == "flush"
    with pytest.raises(ValueError, match="network"):
        canonical_mode("hot")
    old = {k: v for k, v in json.loads(MeasureConfig().to_json()).items()
           if k not in ("mode", "flush_bytes")}
    legacy = MeasureConfig.from_json(json.dumps(old))  # a row written before modes existed
    assert legacy.mode == "warm" and legacy.flush_bytes == 0
    assert MeasureConfig.from_json(MeasureConfig(mode="network").to_json()).mode == "network"


@pytest.mark.parametrize("mode", MEASURE_MODES)
def test_each_mode_is_recorded_in_rows_and_read_back(tmp_path, mode: str) -> None:
    for tc, target in ((OrtCpuToolchain(), get_target("ort-cpu")),
                       (OpenVinoToolchain(), get_target("openvino-cpu"))):
        b = tc.build(BuildInput("a0de0001", target, _matmul(64)))
        cfg = MeasureConfig(warmup_runs=1, rounds=2, min_round_runs=3, min_round_s=0.0,
                            mode=mode)
        r = tc.measure(MeasureInput(b, cfg))
        assert r.ok and r.summary.n == 6
        with CostTableWriter(tmp_path / mode) as w:
            w.append(row_from_result(r, campaign_id="m", model="t", nodes=[], op_types=[]))
    rows = CostTable(tmp_path / mode).rows()
    assert len(rows) == 2
    assert {json.loads(r.measure_config)["mode"] for r in rows} == {mode}
    assert {r.config.measure_mode for r in rows} == {mode}


def test_between_run_actions_are_untimed_and_flush_rounds_stop_on_wall_time(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class FakeFlusher:
        def __init__(self, size: int, pool: object = None) -> None:
            self.size_bytes = size

        def __call__(self) -> None:
            calls.append("flush")
            clock.now += 1_000_000  # 1 ms eviction: never in a sample

    monkeypatch.setattr(measure, "_DEFAULT_FLUSHER", FakeFlusher(64 << 20))
    monkeypatch.setattr(measure, "CacheFlusher", FakeFlusher)
    monkeypatch.setattr(measure, "_FLUSHERS", {})

    def fn() -> None:
        calls.append("run")
        clock.now += 10_000  # 10 us candidate

    # min_round_s = 5 ms: warm rounds need 500 runs of 10 us; flushing rounds stop after
    # ~5 runs because each run is charged its 1 ms eviction too
    base = dict(warmup_runs=0, rounds=2, min_round_runs=2, min_round_s=0.005, max_samples=2000)
    warm, _ = time_callable(fn, MeasureConfig(mode="warm", **base))
    assert len(warm) == 1000 and "flush" not in calls
    calls.clear()
    flushed, _ = time_callable(fn, MeasureConfig(mode="flush", **base))
    assert samples_are(flushed, 10e-6) and 4 <= len(flushed) // 2 <= 6
    assert calls[:4] == ["flush", "run", "flush", "run"]
    calls.clear()
    netw, _ = time_callable(fn, MeasureConfig(mode="network", **base))
    assert samples_are(netw, 10e-6) and calls[:2] == ["flush", "run"]
    assert measure._FLUSHERS[2 * private_cache_bytes()].size_bytes == 2 * private_cache_bytes()


def samples_are(samples: list[float], value: float) -> bool:
    return all(s == pytest.approx(value) for s in samples)


def test_network_mode_rereads_the_bound_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    touched: list[int] = []
    real = InputToucher.__call__

    def spy(self: InputToucher) -> int:
        touched.append(sum(v.size for v in self._views))
        return real(self)

    monkeypatch.setattr(InputToucher, "__call__", spy)
    x = np.ones((1, 4096), np.float32)  # 16 KiB: 256 cache lines
    action = flush_for(MeasureConfig(mode="network", flush_bytes=1 << 16), [x])
    assert action is not None
    action()
    assert touched == [256]
    assert flush_for(MeasureConfig(mode="warm"), [x]) is None
    # through a toolchain: the arrays it binds are the ones re-read
    tc, target = OrtCpuToolchain(), get_target("ort-cpu")
    b = tc.build(BuildInput("a0de0002", target, _matmul(256)))
    touched.clear()
    r = tc.measure(MeasureInput(b, MeasureConfig(warmup_runs=0, rounds=1, min_round_runs=2,
                                                 min_round_s=0.0, mode="network",
                                                 flush_bytes=1 << 16)))
    assert r.ok and touched and set(touched) == {256 * 4 // 64}


def test_network_eviction_is_the_rest_of_the_network_clamped() -> None:
    """network mode evicts what the rest of the network touches, at most 2 x LLC."""
    from runners.measure import llc_bytes, network_eviction_bytes

    l2, llc = private_cache_bytes(), llc_bytes()
    assert network_eviction_bytes(MeasureConfig(mode="network")) == 2 * l2
    # a tiny network leaves the candidate's data in L2: evict only what it touches
    assert network_eviction_bytes(MeasureConfig(mode="network", network_bytes=1)) == 1
    assert network_eviction_bytes(MeasureConfig(mode="network", network_bytes=l2 // 4)) == l2 // 4
    mid = (2 * l2 + 2 * llc) // 2
    assert network_eviction_bytes(MeasureConfig(mode="network", network_bytes=mid)) == mid
    assert network_eviction_bytes(MeasureConfig(mode="network", network_bytes=10**12)) == 2 * llc
    assert network_eviction_bytes(
        MeasureConfig(mode="network", network_bytes=mid, flush_bytes=12345)) == 12345


def test_flushers_of_every_size_share_one_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-candidate eviction sizes must not allocate (and page-fault) a buffer each."""
    monkeypatch.setattr(measure, "_FLUSHERS", {})
    monkeypatch.setattr(measure, "_POOL", [])
    big = measure._flusher_of(4 << 20)
    small = measure._flusher_of(1 << 20)
    pool = measure._POOL[0]
    assert big.size_bytes == 4 << 20 and small.size_bytes == 1 << 20
    assert np.shares_memory(big._buf, pool) and np.shares_memory(small._buf, pool)
    assert small._buf.nbytes == 1 << 20 and big._buf.nbytes == 4 << 20
    before = int(pool[0])
    small()
    assert int(pool[0]) == before + 1  # the eviction really writes the shared lines
    measure._flusher_of(8 << 20)  # larger: the pool grows once, views are rebuilt
    assert len(measure._POOL[0]) * 8 >= 8 << 20
    assert np.shares_memory(measure._flusher_of(1 << 20)._buf, measure._POOL[0])


class _DeviceEvicting(OrtCpuToolchain):
    """An ORT CPU toolchain whose prepared artifact brings its own eviction (as a GPU's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.device_flushes = 0

    def prepare(self, build, config, feeds=None, _handle=None):  # type: ignore[no-untyped-def]
        prepared = super().prepare(build, config, feeds, _handle)

        def flush() -> None:
            self.device_flushes += 1

        prepared.flush = flush
        return prepared


@pytest.mark.parametrize("mode", ["network", "flush", "warm"])
def test_a_devices_own_eviction_replaces_the_hosts(monkeypatch: pytest.MonkeyPatch,
                                                   mode: str) -> None:
    """A CUDA candidate's data is in device memory: its runner evicts the GPU's L2, and the
    host's caches are left alone; ``warm`` evicts nothing anywhere."""
    host = {"n": 0}

    def host_flush(config, inputs=()):  # type: ignore[no-untyped-def]
        if config.measure_mode == "warm":
            return None

        def evict_host() -> None:
            host["n"] += 1

        return evict_host

    monkeypatch.setattr(measure, "flush_for", host_flush)
    tc = _DeviceEvicting()
    data = _matmul(64)
    b = tc.build(BuildInput("devflush", get_target("ort-cpu"), data))
    cfg = MeasureConfig(warmup_runs=1, rounds=2, min_round_runs=3, min_round_s=0.0,
                        mode=mode, network_bytes=1 << 20)
    r = tc.measure(MeasureInput(b, cfg))
    assert r.ok, r.error
    if mode == "warm":
        assert tc.device_flushes == 0
    else:
        assert tc.device_flushes >= 6  # one before each timed run
    assert host["n"] == 0
