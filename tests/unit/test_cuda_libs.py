"""The CUDA runner's library checks, without a GPU: soname discovery and the TensorRT message.

Why: onnxruntime-gpu silently falls back to the CPU EP when CUDA or TensorRT libraries are
missing, and a plain ``pip install tensorrt`` brings TensorRT 11 while ORT 1.31's EP links
TensorRT 10. The runner must name the exact library it needs instead of measuring CPU time
under a CUDA target.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runners import cuda


def test_provider_needs_reads_sonames_from_the_dynamic_strings(tmp_path: Path) -> None:
    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"\x7fELF\0\0libcublas.so.13\0libnvinfer.so.10\0libnvinfer_plugin.so.10\0"
                    b"junk libnvinfer.so.10\0libnvonnxparser.so.10\0")
    assert cuda.provider_needs(lib, "libnvinfer") == ["libnvinfer.so.10"]
    assert cuda.provider_needs(lib, "libnvonnxparser") == ["libnvonnxparser.so.10"]
    assert cuda.provider_needs(lib, "libcudnn") == []
    assert cuda.provider_needs(tmp_path / "missing.so", "libnvinfer") == []


def test_tensorrt_missing_names_the_version_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "_preloaded", {})
    why = cuda.load_tensorrt()
    if why is None:
        pytest.skip("TensorRT is installed here")
    assert "libnvinfer.so." in why and "cannot load" in why
    assert "tensorrt-cu13-libs==" in why


def test_tensorrt_loading_is_tried_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def cdll(name: str, *a: object, **k: object) -> None:
        calls.append(name)
        raise OSError(f"{name}: not here")

    monkeypatch.setattr(cuda.ctypes, "CDLL", cdll)
    monkeypatch.setattr(cuda, "_preloaded", {})
    why = cuda.load_tensorrt()
    assert why is not None and calls
    n = len(calls)
    assert cuda.load_tensorrt() == why and len(calls) == n


def test_tensorrt_build_fails_with_the_library_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the EP's libraries are missing, a build is a clear failure, not a CPU fallback."""
    from collage_farm.core.target import CUDA0, Target
    from runners.base import BuildInput

    monkeypatch.setattr(cuda, "_preloaded", {"cuda": None, "trt": "libnvinfer.so.10: missing"})
    tc = cuda.OrtTensorRTToolchain()
    b = tc.build(BuildInput("trtlib01", Target.make("trt", "ort-tensorrt", CUDA0),
                            b"not even a model"))
    assert not b.ok and "libnvinfer.so.10: missing" in str(b.error)


class FakeCudart:
    """The slice of the CUDA runtime `DeviceL2Flusher` calls, with a 50 MB L2 on attribute 38."""

    def __init__(self, l2: int = 50 << 20, memset_rc: int = 0) -> None:
        self.l2, self.memset_rc = l2, memset_rc
        self.attrs: list[int] = []
        self.next_ptr = 0x1000
        self.live: dict[int, int] = {}
        self.memsets: list[tuple[int, int]] = []
        self.syncs = 0

        def error_string(rc: int) -> bytes:  # a function: _check sets its restype, as on ctypes
            return b"fake error"

        self.cudaGetErrorString = error_string

    def cudaGetDevice(self, ref) -> int:
        ref._obj.value = 0
        return 0

    def cudaDeviceGetAttribute(self, ref, attr: int, dev: int) -> int:
        self.attrs.append(attr)
        ref._obj.value = self.l2 if attr == 38 else 1  # 89 (managed access) answers 1
        return 0

    def cudaMalloc(self, ref, size) -> int:
        ref._obj.value = self.next_ptr
        self.live[self.next_ptr] = size.value
        self.next_ptr += 0x1000_0000
        return 0

    def cudaFree(self, ptr) -> int:
        del self.live[ptr.value]
        return 0

    def cudaMemset(self, ptr, value: int, size) -> int:
        assert ptr.value in self.live, "memset on freed device memory"
        assert size.value <= self.live[ptr.value]
        self.memsets.append((ptr.value, size.value))
        return self.memset_rc

    def cudaDeviceSynchronize(self) -> int:
        self.syncs += 1
        return 0


@pytest.fixture
def fake_rt(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    rt = FakeCudart()
    monkeypatch.setattr(cuda, "_cudart", lambda: rt)
    monkeypatch.setattr(cuda.DeviceL2Flusher, "_buffer", None)
    monkeypatch.setattr(cuda.DeviceL2Flusher, "_l2", {})
    return rt


def test_l2_flusher_reads_the_l2_size_and_clamps_to_twice_it(fake_rt: FakeCudart) -> None:
    f = cuda.DeviceL2Flusher(1 << 40)
    assert fake_rt.attrs == [38]  # cudaDevAttrL2CacheSize, not 89
    assert f.l2_bytes == 50 << 20 and f.nbytes == 100 << 20
    f()
    f()
    assert [n for _, n in fake_rt.memsets] == [100 << 20] * 2 and fake_rt.syncs == 2
    small = cuda.DeviceL2Flusher(4 << 20)
    assert small.nbytes == 4 << 20 and fake_rt.attrs == [38]  # L2 size read once


def test_an_older_flusher_never_writes_freed_memory(fake_rt: FakeCudart) -> None:
    old = cuda.DeviceL2Flusher(1 << 20)
    new = cuda.DeviceL2Flusher(64 << 20)  # grows the shared buffer
    old()  # the fake asserts the pointer is still allocated
    new()
    assert len({p for p, _ in fake_rt.memsets}) == 2
    del old
    import gc

    gc.collect()
    assert len(fake_rt.live) == 1  # the small buffer went with its last user


def test_an_implausible_l2_size_or_a_failed_memset_raises(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(cuda.DeviceL2Flusher, "_buffer", None)
    monkeypatch.setattr(cuda.DeviceL2Flusher, "_l2", {})
    monkeypatch.setattr(cuda, "_cudart", lambda: FakeCudart(l2=1))
    with pytest.raises(RuntimeError, match="implausible L2"):
        cuda.DeviceL2Flusher(1 << 20)
    monkeypatch.setattr(cuda.DeviceL2Flusher, "_l2", {})
    monkeypatch.setattr(cuda, "_cudart", lambda: FakeCudart(memset_rc=2))
    f = cuda.DeviceL2Flusher(1 << 20)
    with pytest.raises(RuntimeError, match="cudaMemset: CUDA error 2"):
        f()
