"""Toolchains by name, loaded on demand.

Why a registry: the coordinator, the farm and the workers all speak of toolchains by the name in
`Target.toolchain` ("ort-cpu", "openvino", ...). Importing every toolchain module up front would
pull ONNX Runtime, OpenVINO, Vela and LiteRT into every process (~0.5 s and hundreds of MB), and
would fail outright on machines where one is missing. So the table below maps names to modules,
a module is imported the first time its toolchain is asked for, and a toolchain module itself
imports its heavy package only inside `available()`, `build()` and `measure()`.

`capabilities_for` is what the partition rules call in the coordinator: it must stay cheap (no
heavy imports) because the coordinator may run on a laptop with no toolchain installed at all
(offline searches from a cost table).
"""

from __future__ import annotations

import importlib
import threading
from typing import NamedTuple

from collage_farm.core.target import Target
from runners.base import Capabilities, Toolchain

__all__ = [
    "TOOLCHAINS",
    "ToolchainUnavailableError",
    "UnknownToolchainError",
    "available_toolchains",
    "capabilities_for",
    "capabilities_for_target",
    "device_kind_of",
    "get_toolchain",
    "toolchain_names",
]


class Entry(NamedTuple):
    module: str
    cls: str
    device_kind: str


#: name -> where its class lives and which device kind it runs on (known without importing it)
TOOLCHAINS: dict[str, Entry] = {
    "ort-cpu": Entry("runners.cpu", "OrtCpuToolchain", "cpu"),
    "openvino": Entry("runners.cpu", "OpenVinoToolchain", "cpu"),
    "ort-cuda": Entry("runners.cuda", "OrtCudaToolchain", "cuda"),
    "ort-tensorrt": Entry("runners.cuda", "OrtTensorRTToolchain", "cuda"),
    "vela": Entry("runners.ethosu", "VelaToolchain", "ethos-u"),
    "cortex-m": Entry("runners.cortex_m", "CortexMToolchain", "cpu"),
    "litert": Entry("runners.litert", "LiteRTToolchain", "cpu"),
    "null": Entry("runners.null", "NullToolchain", "cpu"),
}


class UnknownToolchainError(KeyError):
    """A toolchain name that the registry does not know."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown toolchain"


class ToolchainUnavailableError(RuntimeError):
    """A known toolchain whose module cannot be imported here."""


_lock = threading.Lock()
_instances: dict[str, Toolchain] = {}


def toolchain_names() -> tuple[str, ...]:
    return tuple(TOOLCHAINS)


def device_kind_of(name: str) -> str:
    """Device kind a toolchain runs on, without importing it."""
    return _entry(name).device_kind


def _entry(name: str) -> Entry:
    try:
        return TOOLCHAINS[name]
    except KeyError:
        raise UnknownToolchainError(
            f"unknown toolchain {name!r}; known: {', '.join(TOOLCHAINS)}") from None


def get_toolchain(name: str) -> Toolchain:
    """The (process-wide, cached) toolchain object for ``name``.

    Raises `UnknownToolchainError` for a name not in `TOOLCHAINS` and
    `ToolchainUnavailableError` when its module cannot be imported.
    """
    entry = _entry(name)
    with _lock:
        tc = _instances.get(name)
        if tc is not None:
            return tc
        try:
            module = importlib.import_module(entry.module)
        except ImportError as e:
            raise ToolchainUnavailableError(
                f"toolchain {name!r}: cannot import {entry.module} ({type(e).__name__}: {e})"
            ) from e
        cls = getattr(module, entry.cls, None)
        if cls is None:
            raise ToolchainUnavailableError(
                f"toolchain {name!r}: {entry.module} defines no {entry.cls}")
        tc = cls()
        _instances[name] = tc
        return tc


def available_toolchains() -> dict[str, str | None]:
    """Every known toolchain -> None when usable here, else why not.

    This imports the heavy packages (that is what `available()` checks); call it in workers
    or once at start-up, not in the search loop.
    """
    out: dict[str, str | None] = {}
    for name in TOOLCHAINS:
        try:
            out[name] = get_toolchain(name).available()
        except (ToolchainUnavailableError, UnknownToolchainError) as e:
            out[name] = str(e)
        except Exception as e:  # a broken toolchain module must not hide the others
            out[name] = f"{type(e).__name__}: {e}"
    return out


def capabilities_for(toolchain_name: str) -> Capabilities:
    """Which nodes ``toolchain_name`` takes; cheap (no heavy imports)."""
    return get_toolchain(toolchain_name).capabilities()


def capabilities_for_target(target: Target) -> Capabilities:
    """Which nodes ``target`` takes (its toolchain's capabilities for its options: Vela's
    depend on the accelerator); cheap (no heavy imports)."""
    return get_toolchain(target.toolchain).capabilities_for_target(target)
