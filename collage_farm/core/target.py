"""Targets: a toolchain on a virtual device.

Following TVM RFC 0038 (unified target/device planning), a target is not a device: it is a
toolchain (ONNX Runtime's CPU execution provider, OpenVINO, TensorRT, Vela, ...) bound to a
*virtual device* (device kind, device id, memory scope). Several targets may share one device
(ORT-CPU and OpenVINO on one CPU) and then hand tensors to each other without a copy; targets
on different devices pay a transfer.

Two identities matter:

* ``Target.id`` names the target inside one configuration (plans and reports use it);
* ``Target.measure_key`` says which measurements are interchangeable: the toolchain, the device
  *kind* and the options, but not the device id (two identical GPUs share measurements); for a
  target that builds int8 (an Ethos-U NPU, a Cortex-M host) also the calibration its builds are
  quantised with (``Target.calibration``, set by the campaign), since an int8 build's cost
  depends on its ranges. The default calibration (seeded random samples) adds nothing, so
  every key of a default campaign is what it was before calibration entered the key.

The built-in catalogue below gives the target names the whole project uses (``ort-cpu``,
``openvino-cpu``, ``ort-cuda``, ``ort-tensorrt``, ``litert-cpu``, ``ethos-u55-32|64|128|256``,
``ethos-u65-256|512``, ``ethos-u85-128|256|512|1024|2048``, each with its ``-size`` variant
(Vela ``--optimise Size``, e.g. ``ethos-u55-128-size``) and its ``-a16`` variant (16x8:
int16 activations, int8 weights, e.g. ``ethos-u65-256-a16``), and the Cortex-M hosts of Ethos-U
boards ``cortex-m55`` / ``cortex-m85``, on ``cpu:0/mcu``); `collage_farm.config` builds richer
target sets from YAML.

A plan is for one board. `board_conflict` says why a set of catalogue targets is on no board
that exists: toolchains of this machine (ONNX Runtime, OpenVINO, LiteRT, CUDA) next to a
simulated Ethos-U board (`EMBEDDED_TOOLCHAINS`), two different NPUs, two different hosts. A
system file that puts targets on one board is the user's statement that the board exists, and
is not checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VirtualDevice:
    """Where a target's code runs: a device kind, which one of that kind, and a memory scope."""

    kind: str  # "cpu", "cuda", "ethos-u"
    device_id: int = 0
    memory_scope: str = "global"

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.device_id}" + (
            "" if self.memory_scope == "global" else f"/{self.memory_scope}"
        )

    def same_memory(self, other: VirtualDevice) -> bool:
        """True when a tensor produced on ``self`` can be read on ``other`` without a copy."""
        return (self.kind, self.device_id, self.memory_scope) == (
            other.kind,
            other.device_id,
            other.memory_scope,
        )


def _freeze_options(options: Mapping[str, object] | Iterable[tuple[str, object]]) -> tuple:
    items = options.items() if isinstance(options, Mapping) else options
    return tuple(sorted((str(k), v) for k, v in items))


@dataclass(frozen=True)
class Target:
    """A toolchain on a virtual device, with toolchain options (hashable, sorted pairs).

    ``calibration``: for an int8 target of a campaign, what identifies the samples its builds
    are calibrated on (`CalibrationData.row_key`); empty for every other target and for the
    default calibration. It enters `measure_key` (and so every candidate fingerprint and cost
    row key) only when set; runners never read it.
    """

    name: str
    toolchain: str  # "ort-cpu", "openvino", "ort-cuda", "ort-tensorrt", "vela", "litert"
    device: VirtualDevice
    options: tuple[tuple[str, object], ...] = field(default_factory=tuple)
    calibration: str = ""

    @staticmethod
    def make(
        name: str,
        toolchain: str,
        device: VirtualDevice,
        options: Mapping[str, object] | None = None,
    ) -> Target:
        return Target(name, toolchain, device, _freeze_options(options or {}))

    @property
    def id(self) -> str:
        """Stable id of this target inside one configuration (used in plans and tables)."""
        return self.name

    def option(self, key: str, default: object = None) -> object:
        for k, v in self.options:
            if k == key:
                return v
        return default

    @property
    def measure_key(self) -> str:
        """What makes two targets' measurements interchangeable (device id excluded)."""
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        raw = f"{self.toolchain}|{self.device.kind}|{self.device.memory_scope}|{opts}"
        if self.calibration:  # int8 rows of non-default calibration data: never interchangeable
            raw += f"|calibration={self.calibration}"
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        return f"{self.toolchain}@{self.device.kind}#{digest}"

    def __str__(self) -> str:
        return f"{self.name}({self.toolchain}@{self.device.label})"


CPU0 = VirtualDevice("cpu", 0)
CUDA0 = VirtualDevice("cuda", 0)
NPU0 = VirtualDevice("ethos-u", 0)
#: the Cortex-M host of an Ethos-U board: a CPU with memory of its own (not this machine's)
MCU0 = VirtualDevice("cpu", 0, "mcu")

#: toolchains whose targets are parts of a simulated Ethos-U board (NPU and Cortex-M host)
EMBEDDED_TOOLCHAINS = frozenset({"vela", "cortex-m"})
CORTEX_M_CORES = ("cortex-m55", "cortex-m85")

ETHOS_U_CONFIGS = (
    "ethos-u55-32",
    "ethos-u55-64",
    "ethos-u55-128",
    "ethos-u55-256",
    "ethos-u65-256",
    "ethos-u65-512",
    "ethos-u85-128",
    "ethos-u85-256",
    "ethos-u85-512",
    "ethos-u85-1024",
    "ethos-u85-2048",
)

#: suffix of the catalogue's Vela ``--optimise Size`` variant of each accelerator: a target of
#: its own (its own measure key), so the search picks Performance or Size per partition
SIZE_VARIANT = "-size"
#: suffix of the catalogue's 16x8 variant of each accelerator (option ``activations: int16``:
#: int16 activations, int8 weights, biases corrected with the calibration's channel means),
#: a target of its own, e.g. ``ethos-u65-256-a16``
A16_VARIANT = "-a16"
#: target options that make a catalogue variant of a board's target: the board declares the
#: target without them (`variant_base`)
VARIANT_OPTIONS = frozenset({"activations"})


def _builtin() -> dict[str, Target]:
    targets = [
        Target.make("ort-cpu", "ort-cpu", CPU0),
        Target.make("openvino-cpu", "openvino", CPU0),
        Target.make("litert-cpu", "litert", CPU0),
        Target.make("ort-cuda", "ort-cuda", CUDA0),
        Target.make("ort-tensorrt", "ort-tensorrt", CUDA0, {"fp16": False}),
    ]
    for accel in ETHOS_U_CONFIGS:
        targets.append(Target.make(accel, "vela", NPU0, {"accelerator_config": accel}))
        targets.append(Target.make(f"{accel}{SIZE_VARIANT}", "vela", NPU0,
                                   {"accelerator_config": accel, "optimise": "Size"}))
        targets.append(Target.make(f"{accel}{A16_VARIANT}", "vela", NPU0,
                                   {"accelerator_config": accel, "activations": "int16"}))
    for core in CORTEX_M_CORES:
        targets.append(Target.make(core, "cortex-m", MCU0, {"core": core}))
        targets.append(Target.make(f"{core}{A16_VARIANT}", "cortex-m", MCU0,
                                   {"core": core, "activations": "int16"}))
    return {t.name: t for t in targets}


BUILTIN_TARGETS: dict[str, Target] = _builtin()


class UnknownTargetError(ValueError):
    """A target name that no configuration defines."""


class ConfigError(ValueError):
    """A configuration that cannot be used; says where (file, dotted key) and what is allowed.

    Raised for a bad system or app file (`collage_farm.config`, which re-exports it) and for
    pins a model cannot satisfy (`collage_farm.core.pins`): both are the user's configuration.
    """

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 allowed: Iterable[object] | None = None) -> None:
        self.reason = message
        self.file = file
        self.key = key
        self.allowed = None if allowed is None else tuple(allowed)
        where = ": ".join(x for x in (file, key) if x)
        text = f"{where}: {message}" if where else message
        if self.allowed is not None:
            text += f" (allowed: {', '.join(map(str, self.allowed)) or 'none'})"
        super().__init__(text)


def variant_base(target: Target) -> Target:
    """``target`` without its `VARIANT_OPTIONS` (the board's own target, for a catalogue
    variant such as ``ethos-u65-256-a16``), or ``target`` itself when it has none."""
    opts = tuple((k, v) for k, v in target.options if k not in VARIANT_OPTIONS)
    if opts == target.options:
        return target
    return Target(target.name, target.toolchain, target.device, opts, target.calibration)


def board_conflict(targets: Iterable[Target]) -> str | None:
    """Why these targets are on no one board (None when they are): an Ethos-U NPU or
    Cortex-M host (`EMBEDDED_TOOLCHAINS`) with a toolchain of this machine, two different NPUs
    or two different Cortex-M cores."""
    ts = list(targets)
    embedded = [t.id for t in ts if t.toolchain in EMBEDDED_TOOLCHAINS]
    here = [t.id for t in ts if t.toolchain not in EMBEDDED_TOOLCHAINS]
    if embedded and here:
        return (f"{', '.join(here)} run{'s' if len(here) == 1 else ''} on this machine but "
                f"{', '.join(embedded)} {'is' if len(embedded) == 1 else 'are'} a simulated "
                "Ethos-U board: a plan mixing them is for a board that does not exist (search "
                "them in separate campaigns, or give a --system file that puts them on one "
                "board)")
    for tc, key, what in (("vela", "accelerator_config", "NPUs"), ("cortex-m", "core", "hosts")):
        kinds = sorted({str(t.option(key, t.name)) for t in ts if t.toolchain == tc})
        if len(kinds) > 1:
            return (f"{' and '.join(kinds)} are two different {what}: an Ethos-U board has one "
                    "(give a --system file for a board with both)")
    return None


def get_target(name: str, catalogue: Mapping[str, Target] | None = None) -> Target:
    cat = BUILTIN_TARGETS if catalogue is None else catalogue
    try:
        return cat[name]
    except KeyError:
        raise UnknownTargetError(
            f"unknown target {name!r}; known targets: {', '.join(sorted(cat))}"
        ) from None


def parse_targets(spec: str | Iterable[str], catalogue: Mapping[str, Target] | None = None
                  ) -> list[Target]:
    """Parse ``"ort-cpu,openvino-cpu"`` (or a list of names) into targets, in order, deduped."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    out: list[Target] = []
    for n in names:
        if not n:
            continue
        t = get_target(n, catalogue)
        if t not in out:
            out.append(t)
    if not out:
        raise UnknownTargetError("no targets given")
    return out
