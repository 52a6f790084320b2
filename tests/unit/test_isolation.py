"""Isolation: a crash or a hang in toolchain code costs one result row, never the runner.

Uses the ``null`` toolchain's fault injection (target options ``crash_on``, ``hang_on``,
``fail_on``) in one module-scoped `LocalRunner` that must keep serving after every fault.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from onnx import TensorProto, helper

from collage_farm.core.target import CPU0, Target
from runners.base import BuildInput, MeasureConfig, MeasureInput, Status
from runners.isolation import WorkerError, WorkerProcess, describe_exit
from runners.local import LocalRunner

SLACK_S = 3.0
CFG = MeasureConfig(warmup_runs=0, rounds=2, min_round_runs=3, min_round_s=0.0, timeout_s=1.0)


def relu_model() -> bytes:
    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m.SerializeToString()


MODEL = relu_model()
FAULTY = Target.make("null-faulty", "null", CPU0, {
    "crash_on": "dead", "hang_on": "hang", "fail_on": "fail",
})


def null_target(**options: object) -> Target:
    return Target.make("null-t", "null", CPU0, options)


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    core = min(os.sched_getaffinity(0))
    r = LocalRunner(["null"], cores=[core], build_timeout_s=2.0)
    yield r
    r.close()


def assert_serving(runner: LocalRunner) -> None:
    b = runner.build(BuildInput("0123abcd", FAULTY, MODEL))
    assert b.status is Status.OK, b.error
    m = runner.measure(MeasureInput(b, CFG))
    assert m.status is Status.OK, m.error
    assert m.kind.value == "analytic" and dict(m.details).get("fake") is True


def test_worker_environment_and_pinning(runner: LocalRunner) -> None:
    info = runner.worker.info()
    assert info["pid"] != os.getpid()
    assert info["affinity"] == list(runner.cores)
    assert info["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert info["env"]["OMP_NUM_THREADS"] == "1"
    assert info["toolchains"]["null"]["available"] is None
    assert runner.available() == {"null": None}


def test_crash_in_build_gives_crashed_and_runner_keeps_serving(runner: LocalRunner) -> None:
    pid = runner.worker.pid
    b = runner.build(BuildInput("deadbeef", FAULTY, MODEL))
    assert b.status is Status.CRASHED
    assert "SIGABRT" in b.error
    assert_serving(runner)
    assert runner.worker.pid != pid


def test_segfault_in_measure_names_the_signal(runner: LocalRunner) -> None:
    t = null_target(crash_on="*", crash_mode="segv", fault_phase="measure")
    b = runner.build(BuildInput("5e9f0000", t, MODEL))
    assert b.status is Status.OK
    m = runner.measure(MeasureInput(b, CFG))
    assert m.status is Status.CRASHED and "SIGSEGV" in m.error
    assert not m.samples and m.seconds == float("inf")
    assert_serving(runner)


def test_exit_139_is_reported_as_such(runner: LocalRunner) -> None:
    t = null_target(crash_on="*", crash_mode="exit")
    b = runner.build(BuildInput("e1170000", t, MODEL))
    assert b.status is Status.CRASHED and "139" in b.error
    assert_serving(runner)


def test_hang_gives_timeout_within_deadline_and_runner_keeps_serving(runner: LocalRunner
                                                                    ) -> None:
    t0 = time.monotonic()
    b = runner.build(BuildInput("hang0001", FAULTY, MODEL))
    elapsed = time.monotonic() - t0
    assert b.status is Status.TIMEOUT
    assert "SIGKILL" in b.error
    assert elapsed < runner.build_timeout_s + SLACK_S
    t = null_target(hang_on="*", fault_phase="measure")
    built = runner.build(BuildInput("hang0002", t, MODEL))
    t0 = time.monotonic()
    m = runner.measure(MeasureInput(built, CFG))
    assert m.status is Status.TIMEOUT
    assert time.monotonic() - t0 < CFG.timeout_s + SLACK_S
    assert_serving(runner)
    stats = runner.stats()
    assert stats["timeouts"] >= 2 and stats["restarts"] >= 2


def test_toolchain_errors_are_results(runner: LocalRunner) -> None:
    b = runner.build(BuildInput("fail0001", FAULTY, MODEL))
    assert b.status is Status.BUILD_FAILED and "injected" in b.error
    t = null_target(fail_on="*", fault_phase="measure")
    built = runner.build(BuildInput("fail0002", t, MODEL))
    m = runner.measure(MeasureInput(built, CFG))
    assert m.status is Status.RUNTIME_ERROR and "injected" in m.error
    failed = runner.measure(MeasureInput(b, CFG))  # measuring a failed build: no worker call
    assert failed.status is Status.BUILD_FAILED


def test_invoke_and_worker_errors(runner: LocalRunner) -> None:
    assert runner.invoke("null", "version").startswith("null ")
    with pytest.raises(WorkerError) as e:
        runner.invoke("null", "no_such_method")
    assert e.value.status is Status.RUNTIME_ERROR
    with pytest.raises(WorkerError):
        runner.invoke("ort-cpu", "version")  # not served


def test_worker_dead_while_idle_is_replaced_transparently() -> None:
    w = WorkerProcess(["null"])
    try:
        w.wait_ready(60)
        os.kill(w.pid, 9)
        time.sleep(0.2)
        assert w.ping().ok  # the request never reached the dead child: no failure row
    finally:
        w.close()


def test_worker_that_cannot_start_fails_fast() -> None:
    w = WorkerProcess(["null"], cores=[10_000])
    try:
        r = w.ping(timeout_s=5)
        assert r.status is Status.CRASHED and "cannot pin" in r.error
    finally:
        w.close()


def test_describe_exit() -> None:
    assert "SIGSEGV" in describe_exit(-11)
    assert "OOM" in describe_exit(-9)
    assert "139" in describe_exit(139) and "SIGSEGV" in describe_exit(139)
    assert describe_exit(0) == "exited with code 0"


def test_run_keeps_the_artifact_in_the_worker_and_keeps_both_deadlines(runner: LocalRunner
                                                                       ) -> None:
    """`LocalRunner.run` (the farm's path) = build + measure, without shipping the artifact."""
    inp = BuildInput("run0001", FAULTY, MODEL)
    b, m = runner.run(inp, CFG)
    assert b.status is Status.OK and b.artifact == b"" and m.status is Status.OK
    ref = runner.measure(MeasureInput(runner.build(inp), CFG))
    assert m.samples == ref.samples  # the null toolchain is deterministic per fingerprint
    # a hang while measuring is cut at the *measure* deadline, not build + measure
    t0 = time.perf_counter()
    b, m = runner.run(BuildInput("hang0002", null_target(hang_on="hang", fault_phase="measure"),
                                 MODEL), CFG)
    assert b.status is Status.OK and m.status is Status.TIMEOUT
    assert time.perf_counter() - t0 < CFG.timeout_s + SLACK_S
    # a failing build is reported once, for both
    b, m = runner.run(BuildInput("fail0003", FAULTY, MODEL, label="fail"), CFG)
    assert b.status is Status.BUILD_FAILED and m.status is Status.BUILD_FAILED
    # a crash while building is the crash of both; the next request finds a fresh worker
    b, m = runner.run(BuildInput("dead0004", FAULTY, MODEL, label="dead"), CFG)
    assert b.status is Status.CRASHED and m.status is Status.CRASHED
    assert_serving(runner)


def test_the_same_model_object_is_sent_to_the_child_once() -> None:
    """`WorkerProcess.run` sends a model once per child: the next request holding the very
    same bytes object builds from the child's kept source; other bytes (even equal), a child
    that lost its source, or a restarted child get the model again. Results are the same."""
    wp = WorkerProcess(["null"], max_rss_mb=None)
    ops: list[str] = []
    request = wp.request

    def recording(op, payload, timeout_s):  # type: ignore[no-untyped-def]
        ops.append(op)
        if op == "build_keep_source":
            assert payload.onnx_bytes == b""  # the model itself stays here
        return request(op, payload, timeout_s)
    wp.request = recording  # type: ignore[method-assign]
    t = null_target()
    try:
        for fp in ("a", "b"):
            b, m = wp.run(BuildInput(fp, t, MODEL), CFG, 30.0)
            assert b.ok and m.ok and m.fingerprint == fp, (b.error, m.error)
        assert ops == ["build_keep", "measure_kept", "build_keep_source", "measure_kept"]
        ops.clear()
        b, m = wp.run(BuildInput("c", t, bytes(bytearray(MODEL))), CFG, 30.0)
        assert b.ok and m.ok and ops[0] == "build_keep"  # equal bytes, another object
        ops.clear()
        wp.restart()
        b, m = wp.run(BuildInput("d", t, MODEL), CFG, 30.0)
        assert b.ok and m.ok and ops[0] == "build_keep"  # a new child: sent again
        ops.clear()
        wp.restart()
        wp.wait_ready()
        wp._sent = (MODEL, wp._proc.pid)  # as if this child had been sent it: it says not
        b, m = wp.run(BuildInput("e", t, MODEL), CFG, 30.0)
        assert b.ok and m.ok and ops[:2] == ["build_keep_source", "build_keep"]
    finally:
        wp.close()
