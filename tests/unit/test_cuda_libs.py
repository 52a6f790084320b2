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
    # cached: the loader is not asked again in this process
    assert cuda.load_tensorrt() == why


def test_tensorrt_build_fails_with_the_library_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the EP's libraries are missing, a build is a clear failure, not a CPU fallback."""
    from collage_farm.target import CUDA0, Target
    from runners.base import BuildInput

    monkeypatch.setattr(cuda, "_preloaded", {"cuda": None, "trt": "libnvinfer.so.10: missing"})
    tc = cuda.OrtTensorRTToolchain()
    b = tc.build(BuildInput("trtlib01", Target.make("trt", "ort-tensorrt", CUDA0),
                            b"not even a model"))
    assert not b.ok and "libnvinfer.so.10: missing" in str(b.error)
