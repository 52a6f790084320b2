"""Targets as composable configuration: a *system* file merged with an *app* file.

Why two files. Following the CompilationConfig discussion in TVM, what a deployment looks like
is written by two different people. A hardware vendor or cluster owner knows the devices (an
Ethos-U55-128 NPU next to a Cortex-M55; one CPU and two GPUs), which toolchains are installed on
each, and what it costs to move a tensor between them: that is the **system** file, written once
per machine. The user knows which of those targets to search, which toolchain options to try
(``fp16`` for TensorRT), which nodes must stay where (pins) and how large candidates may grow:
that is the **app** file, one per experiment. Keeping them apart lets one app run unchanged on
several systems and lets a system file be checked once and shared. Both are plain YAML read with
``yaml.safe_load``; nothing in them can run code.

Following TVM RFC 0038, a target is a toolchain on a *virtual device* (kind, id, memory scope),
never a device alone: ORT-CPU and OpenVINO share one CPU device (no copy between them), two GPUs
are two devices (a copy between them), an MCU host is ``cpu:0/mcu``.

System file schema (every key optional unless marked)::

    schema: 1                         # format version; only 1 exists
    system: gpu2                      # name (default: file stem)
    description: "one CPU, two GPUs"
    devices:                          # required, at least one; keys are device names
      host:
        kind: cpu                     # required: cpu | cuda | ethos-u
        id: 0                         # default 0
        memory_scope: global          # default global; "mcu" for a microcontroller's memory
        host: true                    # graph inputs/outputs live here (default: first cpu)
        model: "x86-64 server CPU"    # free text
        description: "..."
        memory_mib: 131072            # > 0
        clock_mhz: 3000               # > 0
        targets:                      # the toolchains installed on this device
          ort-cpu: {toolchain: ort-cpu}
      gpu0:
        kind: cuda
        targets:
          ort-tensorrt: {toolchain: ort-tensorrt, options: {fp16: false}}
    toolchains:                       # per-toolchain settings on this system
      ort-tensorrt: {launch_us: 25, options: {fp16: false}}
    links:                            # measured or datasheet copy costs between two devices
      - {from: host, to: gpu0, latency_us: 10, gb_per_s: 12}   # symmetric unless the
                                                               # reverse is declared too
      # - {from: mcu, to: npu, latency_us: 2, shared_memory: true}  # one memory: no copy,
      #                                                             # a driver call per tensor
    transition: {handoff_gb_per_s: 10}  # or {handoff_copy: false}: partitions share one
                                        # tensor arena (an MCU), a boundary copies nothing
    subgraph: {max_depth: 4, max_exits: 2, allow_taps: false}

A device may be referred to (in ``links`` and in app pins) by its name (``gpu0``), its label
(``cuda:0``, ``cpu:0/mcu``) or, in pins only, its kind (``cuda``: any GPU). A declared name wins
over a kind of the same spelling (a device named ``cpu`` means that device).

App file schema::

    schema: 1
    app: trt-fp16-study               # name (default: file stem)
    description: "..."
    system: gpu                       # which system this app is for; loads that built-in
                                      # system when no system file is given
    targets: [ort-cpu, ort-tensorrt]  # the selection to search (default: all, or "all")
    options:                          # per-target option overrides
      ort-tensorrt: {fp16: true}
    variants:                         # new targets derived from system ones
      ort-tensorrt-fp16: {base: ort-tensorrt, options: {fp16: true}}
    pins:                             # see collage_farm.core.pins
      - {node: "attn_*", device: cuda:0}
      - {op: Softmax, target: ort-cpu}
      - {node: "head/*", device: gpu0, optional: true}
    subgraph: {max_depth: 6, max_exits: 2, allow_taps: false}
    transition: {scale: 2.0}          # what-if: every transition penalty x2

Merge rules (what makes the two layers compose predictably):

1. The system declares the world. An app cannot add devices, links or toolchains; every name it
   uses (targets, ``variants.*.base``, pin devices and targets) must be declared by the system,
   otherwise `ConfigError` lists the declared names.
2. Options are resolved in this order, later wins: the toolchain's built-in defaults
   (`runners.options.TOOLCHAIN_OPTIONS`), the system's ``toolchains.<tc>.options``, the
   system target's ``options``, then the app's ``options.<target>`` (or
   ``variants.<v>.options``).
3. Options that are hardware facts are *locked* (Vela's ``accelerator_config`` and
   ``system_config``): an app may repeat the system's value, but a different value is a
   conflict, reported with the one allowed value. A U55-128 board cannot become a U55-256 from
   an app file.
4. ``subgraph`` keys set in the app override the system's; ``transition.scale`` is app-only.
5. An app's ``system:`` must equal the loaded system's name (conflict otherwise); a variant may
   not reuse a system target's name; two targets may not share a name; two devices may not
   share a label.
6. Unknown keys are errors, never ignored: a typo (``fp61``) must not silently measure the wrong
   thing. Every `ConfigError` names the file, the dotted key path and the allowed values.

Target identity. A target's id is its name. Options are *canonical*: toolchain defaults marked
explicit (TensorRT ``fp16: false``) are always present, defaults that the toolchain applies by
itself (Vela's default system config and memory mode for each accelerator) are dropped when a
file states them. So a target spelled out in full and the same target left at defaults have the
same `Target.measure_key`, and the built-in systems' targets equal
`collage_farm.core.target.BUILTIN_TARGETS` entries of the same name. Runners get the full set back
with `runners.options.effective_options`.

Transition costs. The system's links and per-toolchain launch overheads feed a
`ConfiguredTransitionModel` (an `AnalyticTransitionModel` with per device-pair links,
`collage_farm.core.transition`), exposed as `FarmConfig.transition`. Anything implementing
`TransitionModel` can replace it (`FarmConfig.with_transition`), in particular
`MeasuredTransitionModel`, fitted from the transition rows the runners measure (copy time per
device pair and size, the boundary excess of chained identity sub-models per toolchain),
falling back to the configured model where nothing was measured.

Modules: `collage_farm.config.schema` (`FarmConfig` and its parts, the keys of both files),
`collage_farm.config.reader` (strict YAML reading), `collage_farm.config.options` (options
checked against `runners.options`), `collage_farm.config.systems` (system files, built-in
systems), `collage_farm.config.load` (`load_config`: the merge). The names below are re-exported
here; the toolchain option catalogue and the Vela facts (`runners.options`,
`runners.vela_facts`) and the transition models (`collage_farm.core.transition`) are re-exported
too, for the callers that read them from this package.
"""

from __future__ import annotations

from collage_farm.config.load import builtin_system_for, load_config
from collage_farm.config.schema import (
    ConfigTargetError,
    DeviceSpec,
    FarmConfig,
    LinkSpec,
    SubgraphLimits,
)
from collage_farm.config.systems import builtin_system_path, builtin_systems
from collage_farm.core.target import ConfigError
from collage_farm.core.transition import (
    ConfiguredTransitionModel,
    MeasuredTransitionModel,
    ScaledTransitionModel,
    TransitionSample,
    scale_transitions,
)
from runners.options import TOOLCHAIN_OPTIONS, OptionSpec, effective_options
from runners.vela_facts import VELA_DEFAULTS, vela_ini_path, vela_ini_sections

__all__ = [
    "TOOLCHAIN_OPTIONS",
    "VELA_DEFAULTS",
    "ConfigError",
    "ConfigTargetError",
    "ConfiguredTransitionModel",
    "DeviceSpec",
    "FarmConfig",
    "LinkSpec",
    "MeasuredTransitionModel",
    "OptionSpec",
    "ScaledTransitionModel",
    "SubgraphLimits",
    "TransitionSample",
    "builtin_system_for",
    "builtin_system_path",
    "builtin_systems",
    "effective_options",
    "load_config",
    "scale_transitions",
    "vela_ini_path",
    "vela_ini_sections",
]
