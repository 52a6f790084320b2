"""Config files: built-in systems, merge rules, error messages, transition costs, CLI plumbing."""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path

import pytest

from collage_farm.config import ConfigError, builtin_systems, load_config
from collage_farm.core.target import BUILTIN_TARGETS, CPU0, UnknownTargetError, VirtualDevice
from collage_farm.core.transition import (
    DEFAULT_LINKS,
    ConfiguredTransitionModel,
    MeasuredTransitionModel,
    ScaledTransitionModel,
    TransitionSample,
    ZeroTransitionModel,
    scale_transitions,
)
from runners.options import TOOLCHAIN_OPTIONS, effective_options
from runners.vela_facts import (
    VELA_DEFAULTS,
    VELA_MEMORY_MODES,
    VELA_SYSTEM_CONFIGS,
    vela_ini_path,
    vela_ini_sections,
)

MB = 1_000_000
CUDA0, CUDA1 = VirtualDevice("cuda", 0), VirtualDevice("cuda", 1)

SYSTEM = """\
system: lab
description: a test server
devices:
  cpu:
    kind: cpu
    host: true
    memory_mib: 1024
    clock_mhz: 3000
    targets:
      ort-cpu: {toolchain: ort-cpu}
      openvino-cpu: {toolchain: openvino}
  gpu0:
    kind: cuda
    id: 0
    targets:
      ort-cuda: {toolchain: ort-cuda}
      ort-tensorrt: {toolchain: ort-tensorrt}
  npu:
    kind: ethos-u
    targets:
      u55: {toolchain: vela, options: {accelerator_config: ethos-u55-128}}
toolchains:
  ort-tensorrt: {launch_us: 40}
links:
  - {from: cpu, to: gpu0, latency_us: 7, gb_per_s: 16}
subgraph: {max_depth: 3}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def expect_error(fn, *, file: object, key: str, allowed: list[str]) -> ConfigError:
    """``fn()`` raises a ConfigError whose message names the file, the key and allowed values."""
    with pytest.raises(ConfigError) as ei:
        fn()
    e = ei.value
    msg = str(e)
    assert str(file) in msg, msg
    assert key in msg, msg
    assert e.allowed is not None, msg
    for a in allowed:
        assert a in msg, (a, msg)
    return e


# ------------------------------------------------------------------------------------------
# built-in systems


def test_builtin_systems_listed():
    assert set(builtin_systems()) >= {"cpu", "gpu", "gpu2", "ethos-u55-128", "ethos-u55-256",
                                      "ethos-u65-256"}


@pytest.mark.parametrize("name", builtin_systems())
def test_every_builtin_system_loads_and_agrees_with_builtin_targets(name):
    cfg = load_config(builtin_system=name)
    assert cfg.system_name == name
    assert cfg.selected == tuple(cfg.targets)
    assert cfg.targets, name
    assert cfg.host is not None and cfg.host.kind == "cpu"
    for tname, t in cfg.targets.items():
        assert t.id == tname
        if tname in BUILTIN_TARGETS:  # same name: same toolchain, device, options, measure key
            assert t == BUILTIN_TARGETS[tname], tname
            assert t.measure_key == BUILTIN_TARGETS[tname].measure_key
        assert cfg.device_of(t) is not None
    json.dumps(cfg.to_dict(), default=str)  # JSON-able


def test_cpu_system_shares_one_device():
    cfg = load_config(builtin_system="cpu")
    ort, ov = cfg.targets["ort-cpu"], cfg.targets["openvino-cpu"]
    assert ort.device == ov.device == CPU0
    assert cfg.transition.transfer_s(ort.device, ov.device, 10 * MB) == 0.0


def test_gpu_system():
    cfg = load_config(builtin_system="gpu")
    assert cfg.selected == ("ort-cpu", "openvino-cpu", "ort-cuda", "ort-tensorrt")
    assert cfg.targets["ort-tensorrt"].option("fp16") is False
    assert cfg.targets["ort-cuda"].device == cfg.targets["ort-tensorrt"].device == CUDA0


def test_gpu2_two_gpus_are_two_devices_with_a_configured_transfer_cost():
    cfg = load_config(builtin_system="gpu2")
    a, b = cfg.targets["ort-cuda-0"], cfg.targets["ort-cuda-1"]
    assert (a.device, b.device) == (CUDA0, CUDA1)
    assert not a.device.same_memory(b.device)
    assert a.measure_key == b.measure_key == BUILTIN_TARGETS["ort-cuda"].measure_key
    n = 4 * MB
    want = 12e-6 + n / 20e9  # gpu2.yaml: gpu0 <-> gpu1 latency_us 12, gb_per_s 20
    assert cfg.transition.transfer_s(CUDA0, CUDA1, n) == pytest.approx(want)
    assert cfg.transition.transfer_s(CUDA1, CUDA0, n) == pytest.approx(want)  # symmetric
    default = DEFAULT_LINKS[("cuda", "cuda")].cost(n)
    assert cfg.transition.transfer_s(CUDA0, CUDA1, n) != pytest.approx(default)
    assert cfg.transition.transfer_s(CPU0, CUDA1, n) == pytest.approx(10e-6 + n / 12e9)
    assert cfg.transition.transfer_s(CUDA0, CUDA0, n) == 0.0
    assert cfg.clocks == {"gpu0": 1980e6, "gpu1": 1980e6}
    assert cfg.devices["gpu1"].memory_mib == 81559


@pytest.mark.parametrize("name", ["ethos-u55-128", "ethos-u55-256", "ethos-u65-256",
                                  "ethos-u85-256"])
def test_ethos_systems_npu_and_mcu_host(name):
    cfg = load_config(builtin_system=name)
    # the NPU, its Vela --optimise Size variant on the Shared_Sram (U55) boards, the host
    variants = [f"{name}-size"] if name.startswith("ethos-u55") else []
    assert list(cfg.targets)[:1 + len(variants)] == [name, *variants]
    assert len(cfg.targets) == 2 + len(variants)
    for v in variants:
        assert cfg.targets[v].option("optimise") == "Size"
        assert cfg.targets[v].measure_key != cfg.targets[name].measure_key
        assert cfg.targets[v] == BUILTIN_TARGETS[v]
    npu = cfg.targets[name]
    assert npu.toolchain == "vela" and npu.device.kind == "ethos-u"
    assert npu.option("accelerator_config") == name
    full = effective_options(npu)
    assert full["system_config"] in vela_ini_sections()[0]
    assert full["memory_mode"] in vela_ini_sections()[1]
    # the host is a cpu device with its own memory scope, and its Cortex-M is a target
    host = cfg.host
    assert host is not None and host.kind == "cpu" and host.memory_scope != "global"
    hosts = [d for d in cfg.devices.values() if d.host]
    assert len(hosts) == 1 and len(hosts[0].targets) == 1
    assert cfg.targets[hosts[0].targets[0]].toolchain == "cortex-m"
    # graph inputs (placed on cpu:0 by the search) live on the host: they pay the host->NPU
    # hand-over (shared memory: the link's latency, no copy), and moving them "to the host"
    # is free
    link = next(x for x in cfg.links if x.src == host.label and x.dst == npu.device.label)
    n = 100_000
    assert cfg.transition.transfer_s(CPU0, npu.device, n) == pytest.approx(link.latency_s)
    assert cfg.transition.transfer_s(CPU0, host, n) == 0.0


@pytest.mark.skipif(vela_ini_path() is None, reason="ethos-u-vela not installed")
def test_vela_names_and_clocks_match_installed_vela_ini():
    systems, modes, clocks = vela_ini_sections()
    assert set(VELA_SYSTEM_CONFIGS) <= set(systems)
    assert set(VELA_MEMORY_MODES) <= set(modes)
    for fam, (sc, mm) in VELA_DEFAULTS.items():
        assert sc in systems and mm in modes, fam
    for name in ("ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u85-256"):
        cfg = load_config(builtin_system=name)
        sc = effective_options(cfg.targets[name])["system_config"]
        assert cfg.clocks["npu"] == clocks[sc]  # clock_mhz agrees with vela.ini core_clock


def test_vela_defaults_are_what_vela_picks():
    af = pytest.importorskip("ethosu.vela.architecture_features")
    for acc, fam in (("ethos-u55-128", "u55"), ("ethos-u65-256", "u65")):
        a = af.ArchitectureFeatures(
            vela_config_files=None, accelerator_config=acc, system_config="internal-default",
            memory_mode="internal-default", max_blockdep=3, verbose_config=False,
            arena_cache_size=None)
        assert (a.system_config, a.memory_mode) == VELA_DEFAULTS[fam]


def test_option_tables_match_runner_registry():
    from runners.registry import TOOLCHAINS

    assert set(TOOLCHAIN_OPTIONS) <= set(TOOLCHAINS)
    for t in BUILTIN_TARGETS.values():
        assert TOOLCHAINS[t.toolchain].device_kind == t.device.kind


def test_option_names_are_the_ones_the_runners_read():
    """Guards against drift: every option a config accepts is read by that toolchain's runner."""
    import importlib
    import inspect
    import sys

    from runners.registry import TOOLCHAINS

    for tc, specs in TOOLCHAIN_OPTIONS.items():
        entry = TOOLCHAINS[tc]
        cls = getattr(importlib.import_module(entry.module), entry.cls)
        # the modules of the toolchain's class and of its bases (the CUDA EPs subclass ORT's CPU
        # toolchain, which reads ``threads`` in the shared ONNX skeleton)
        src = "".join(inspect.getsource(sys.modules[c.__module__])
                      for c in cls.__mro__ if c.__module__.startswith("runners."))
        for key in specs:
            assert f'"{key}"' in src, (tc, key)


def test_runner_defaults_are_canonicalised_away(tmp_path):
    p = write(tmp_path, "s.yaml", """\
        devices:
          cpu:
            kind: cpu
            targets:
              ort-cpu: {toolchain: ort-cpu, options: {threads: 1, iobinding: true}}
              openvino-cpu: {toolchain: openvino, options: {threads: 4}}
        """)
    cfg = load_config(p)
    assert cfg.system_name == "s"  # default: the file stem
    assert cfg.targets["ort-cpu"] == BUILTIN_TARGETS["ort-cpu"]
    assert cfg.targets["openvino-cpu"].option("threads") == 4
    assert effective_options(cfg.targets["ort-cpu"]) == {"threads": 1, "iobinding": True}


# ------------------------------------------------------------------------------------------
# merge rules


def test_system_file_alone(tmp_path):
    cfg = load_config(write(tmp_path, "lab.yaml", SYSTEM))
    assert cfg.system_name == "lab"
    assert cfg.selected == ("ort-cpu", "openvino-cpu", "ort-cuda", "ort-tensorrt", "u55")
    assert cfg.app_name is None
    assert cfg.subgraph_limits.max_depth == 3
    assert cfg.clocks == {"cpu": 3000e6}
    assert cfg.transition.launch_s(cfg.targets["ort-tensorrt"]) == pytest.approx(40e-6)
    assert cfg.transition.transfer_s(CPU0, CUDA0, 16_000) == pytest.approx(7e-6 + 1e-6)
    # a pair the system does not declare keeps the analytic default
    npu = cfg.targets["u55"].device
    assert cfg.transition.transfer_s(CPU0, npu, 1000) == pytest.approx(
        DEFAULT_LINKS[("cpu", "ethos-u")].cost(1000))
    # explicit TensorRT default filled in, so it matches the built-in catalogue
    assert cfg.targets["ort-tensorrt"] == BUILTIN_TARGETS["ort-tensorrt"]


def test_app_overrides_options_selection_limits_and_scale(tmp_path):
    sysf = write(tmp_path, "lab.yaml", SYSTEM)
    app = write(tmp_path, "study.yaml", """\
        system: lab
        targets: [ort-tensorrt, ort-cpu]
        options:
          ort-tensorrt: {fp16: true}
        variants:
          trt32: {base: ort-tensorrt, options: {fp16: false}}
        subgraph: {max_depth: 5, allow_taps: true}
        transition: {scale: 2}
        """)
    cfg = load_config(sysf, app)
    assert cfg.app_name == "study"
    assert cfg.selected == ("ort-tensorrt", "ort-cpu")
    trt = cfg.targets["ort-tensorrt"]
    assert trt.option("fp16") is True
    assert trt.measure_key != BUILTIN_TARGETS["ort-tensorrt"].measure_key
    v = cfg.targets["trt32"]
    assert (v.toolchain, v.device, v.option("fp16")) == ("ort-tensorrt", CUDA0, False)
    assert v.measure_key == BUILTIN_TARGETS["ort-tensorrt"].measure_key
    assert cfg.subgraph_limits.max_depth == 5 and cfg.subgraph_limits.allow_taps is True
    assert cfg.subgraph_limits.max_exits == 2  # neither file set it
    assert cfg.transition.transfer_s(CPU0, CUDA0, 16_000) == pytest.approx(2 * 8e-6)
    assert cfg.resolve_targets(None) == [trt, cfg.targets["ort-cpu"]]
    assert [t.name for t in cfg.resolve_targets("trt32, ort-cuda,trt32")] == ["trt32",
                                                                              "ort-cuda"]
    assert len(cfg.resolve_targets("all")) == 6
    assert cfg.sources == (str(sysf), str(app))


def test_app_naming_a_builtin_system_loads_it(tmp_path):
    app = write(tmp_path, "a.yaml", "system: gpu\ntargets: [ort-cuda]\n")
    cfg = load_config(app=app)
    assert cfg.system_name == "gpu" and cfg.selected == ("ort-cuda",)


def test_canonical_vela_options(tmp_path):
    # stating Vela's own defaults is the same target (and measurement) as leaving them out
    text = """\
        system: board
        devices:
          npu:
            kind: ethos-u
            targets:
              ethos-u55-128:
                toolchain: vela
                options: {accelerator_config: ethos-u55-128, system_config: %s,
                          memory_mode: Shared_Sram, optimise: Performance}
        """
    same = load_config(write(tmp_path, "a.yaml", text % "Ethos_U55_High_End_Embedded"))
    assert same.targets["ethos-u55-128"] == BUILTIN_TARGETS["ethos-u55-128"]
    other = load_config(write(tmp_path, "b.yaml", text % "Ethos_U55_Deep_Embedded"))
    t = other.targets["ethos-u55-128"]
    assert t.option("system_config") == "Ethos_U55_Deep_Embedded"
    assert t.measure_key != BUILTIN_TARGETS["ethos-u55-128"].measure_key


def test_locked_option_may_be_repeated_but_not_changed(tmp_path):
    sysf = write(tmp_path, "lab.yaml", SYSTEM)
    ok = write(tmp_path, "ok.yaml", "options: {u55: {accelerator_config: ethos-u55-128, "
                                    "memory_mode: Sram_Only}}\n")
    cfg = load_config(sysf, ok)
    assert cfg.targets["u55"].option("memory_mode") == "Sram_Only"  # not locked: overridden
    bad = write(tmp_path, "bad.yaml", "options: {u55: {accelerator_config: ethos-u55-256}}\n")
    e = expect_error(lambda: load_config(sysf, bad), file=bad,
                     key="options.u55.accelerator_config", allowed=["ethos-u55-128"])
    assert "conflict" in str(e)
    # system_config left at Vela's default by the system is still the board's: locked
    bad2 = write(tmp_path, "bad2.yaml", "options: {u55: {system_config: Ethos_U55_Deep_Embedded}}")
    expect_error(lambda: load_config(sysf, bad2), file=bad2, key="options.u55.system_config",
                 allowed=["Ethos_U55_High_End_Embedded"])


def test_scale_transitions_what_if():
    cfg = load_config(builtin_system="gpu2")
    n = MB
    base = cfg.transition.transfer_s(CUDA0, CUDA1, n)
    t = cfg.targets["ort-cuda-0"]
    doubled = cfg.scale_transitions(2.0)
    assert doubled.transition.transfer_s(CUDA0, CUDA1, n) == pytest.approx(2 * base)
    assert doubled.transition.launch_s(t) == pytest.approx(2 * cfg.transition.launch_s(t))
    assert cfg.transition.transfer_s(CUDA0, CUDA1, n) == base  # original untouched
    assert isinstance(doubled.transition, ConfiguredTransitionModel)
    assert cfg.scale_transitions(0).transition.transfer_s(CUDA0, CUDA1, n) == 0.0
    # any model can be scaled, e.g. a measured one
    z = scale_transitions(ZeroTransitionModel(), 3.0)
    assert isinstance(z, ScaledTransitionModel) and z.transfer_s(CPU0, CUDA0, n) == 0.0
    with pytest.raises(ValueError):
        scale_transitions(cfg.transition, -1.0)


def test_measured_transition_model_replaces_the_analytic_one():
    cfg = load_config(builtin_system="gpu2")
    lat, bw = 9e-6, 25e9
    rows = [TransitionSample("transfer", lat + nb / bw, nbytes=nb, src="cuda:0", dst="cuda:1")
            for nb in (1_000, 100_000, 10_000_000)]
    rows += [TransitionSample("launch", s, toolchain="ort-cuda", device_kind="cuda")
             for s in (30e-6, 31e-6, 90e-6)]
    m = cfg.with_measured_transitions(rows)
    assert isinstance(m.transition, MeasuredTransitionModel)
    assert m.transition.links[("cuda:0", "cuda:1")].latency_s == pytest.approx(lat, rel=1e-6)
    assert m.transition.links[("cuda:0", "cuda:1")].bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert m.transition.transfer_s(CUDA0, CUDA1, 5 * MB) == pytest.approx(lat + 5 * MB / bw)
    # not measured: the configured model answers
    assert m.transition.transfer_s(CUDA1, CUDA0, MB) == cfg.transition.transfer_s(CUDA1, CUDA0,
                                                                                  MB)
    assert m.transition.launch_s(cfg.targets["ort-cuda-1"]) == pytest.approx(31e-6)
    assert m.transition.launch_s(cfg.targets["ort-cpu"]) == cfg.transition.launch_s(
        cfg.targets["ort-cpu"])
    one = MeasuredTransitionModel.from_samples(
        [TransitionSample("transfer", 1e-3, nbytes=MB, src="cpu:0", dst="cuda:0")],
        cfg.transition)
    assert one.transfer_s(CPU0, CUDA0, MB) == pytest.approx(1e-3)
    assert math.isfinite(one.transfer_s(CPU0, CUDA0, 0))


# ------------------------------------------------------------------------------------------
# errors: each names the file, the dotted key and the allowed values


def test_unknown_top_level_key(tmp_path):
    p = write(tmp_path, "s.yaml", SYSTEM + "devcies: {}\n")
    expect_error(lambda: load_config(p), file=p, key="devcies",
                 allowed=["devices", "toolchains", "links"])


def test_unknown_nested_key(tmp_path):
    p = write(tmp_path, "s.yaml", SYSTEM.replace("    host: true\n", "    hots: true\n"))
    expect_error(lambda: load_config(p), file=p, key="devices.cpu.hots",
                 allowed=["kind", "memory_scope", "host", "targets"])


def test_unknown_app_key_and_option(tmp_path):
    sysf = write(tmp_path, "lab.yaml", SYSTEM)
    a = write(tmp_path, "a.yaml", "pinz: []\n")
    expect_error(lambda: load_config(sysf, a), file=a, key="pinz",
                 allowed=["targets", "options", "pins"])
    b = write(tmp_path, "b.yaml", "options: {ort-tensorrt: {fp61: true}}\n")
    expect_error(lambda: load_config(sysf, b), file=b, key="options.ort-tensorrt.fp61",
                 allowed=["fp16"])


def test_unknown_toolchain(tmp_path):
    p = write(tmp_path, "s.yaml", SYSTEM.replace("{toolchain: openvino}", "{toolchain: openvno}"))
    expect_error(lambda: load_config(p), file=p,
                 key="devices.cpu.targets.openvino-cpu.toolchain",
                 allowed=["ort-cpu", "openvino", "vela"])
    q = write(tmp_path, "t.yaml", SYSTEM.replace("toolchains:\n",
                                                 "toolchains:\n  tensorrt: {launch_us: 3}\n"))
    expect_error(lambda: load_config(q), file=q, key="toolchains.tensorrt",
                 allowed=["ort-tensorrt"])


def test_toolchain_on_the_wrong_device_kind(tmp_path):
    p = write(tmp_path, "s.yaml", SYSTEM.replace("ort-cuda: {toolchain: ort-cuda}",
                                                 "ort-cuda: {toolchain: vela}"))
    expect_error(lambda: load_config(p), file=p, key="devices.gpu0.targets.ort-cuda.toolchain",
                 allowed=["ort-cuda", "ort-tensorrt"])


def test_unknown_device_reference(tmp_path):
    p = write(tmp_path, "s.yaml", SYSTEM.replace("to: gpu0", "to: gpu1"))
    expect_error(lambda: load_config(p), file=p, key="links[0].to",
                 allowed=["cpu", "gpu0", "npu", "cuda:0"])
    sysf = write(tmp_path, "lab.yaml", SYSTEM)
    a = write(tmp_path, "a.yaml", "pins: [{op: Softmax, device: 'cuda:1'}]\n")
    expect_error(lambda: load_config(sysf, a), file=a, key="pins[0]",
                 allowed=["gpu0", "cuda:0", "ethos-u"])


def test_unknown_target_references_in_app(tmp_path):
    sysf = write(tmp_path, "lab.yaml", SYSTEM)
    a = write(tmp_path, "a.yaml", "targets: [ort-cpu, ort-cuda2]\n")
    expect_error(lambda: load_config(sysf, a), file=a, key="targets[1]",
                 allowed=["ort-cpu", "ort-cuda", "u55"])
    b = write(tmp_path, "b.yaml", "options: {tensorrt: {fp16: true}}\n")
    expect_error(lambda: load_config(sysf, b), file=b, key="options.tensorrt",
                 allowed=["ort-tensorrt"])
    c = write(tmp_path, "c.yaml", "variants: {x: {base: nope}}\n")
    expect_error(lambda: load_config(sysf, c), file=c, key="variants.x.base",
                 allowed=["ort-tensorrt"])
    d = write(tmp_path, "d.yaml", "pins: [{node: 'a*', target: trt}]\n")
    expect_error(lambda: load_config(sysf, d), file=d, key="pins[0].target",
                 allowed=["ort-tensorrt"])


def test_bad_option_type_and_value(tmp_path):
    sysf = write(tmp_path, "lab.yaml", SYSTEM)
    a = write(tmp_path, "a.yaml", "options: {ort-tensorrt: {fp16: 'yes please'}}\n")
    expect_error(lambda: load_config(sysf, a), file=a, key="options.ort-tensorrt.fp16",
                 allowed=["true", "false"])
    b = write(tmp_path, "b.yaml", "options: {ort-cpu: {threads: 0}}\n")
    expect_error(lambda: load_config(sysf, b), file=b, key="options.ort-cpu.threads",
                 allowed=[">= 1"])
    p = write(tmp_path, "s.yaml", SYSTEM.replace(
        "{accelerator_config: ethos-u55-128}",
        "{accelerator_config: ethos-u55-128, system_config: Ethos_U65_High_End}"))
    # a U65 board config on a U55: the allowed values are the U55 sections of vela.ini
    expect_error(lambda: load_config(p), file=p,
                 key="devices.npu.targets.u55.options.system_config",
                 allowed=["Ethos_U55_High_End_Embedded", "Ethos_U55_Deep_Embedded"])
    q = write(tmp_path, "q.yaml", SYSTEM.replace("    id: 0\n", "    id: -1\n"))
    expect_error(lambda: load_config(q), file=q, key="devices.gpu0.id", allowed=[">= 0"])
    r = write(tmp_path, "r.yaml", SYSTEM.replace("kind: cuda", "kind: gpu"))
    expect_error(lambda: load_config(r), file=r, key="devices.gpu0.kind",
                 allowed=["cpu", "cuda", "ethos-u"])


def test_missing_required_option(tmp_path):
    p = write(tmp_path, "s.yaml", SYSTEM.replace(
        "{toolchain: vela, options: {accelerator_config: ethos-u55-128}}", "{toolchain: vela}"))
    expect_error(lambda: load_config(p), file=p,
                 key="devices.npu.targets.u55.options.accelerator_config",
                 allowed=["ethos-u55-32", "ethos-u65-512"])


def test_malformed_yaml(tmp_path):
    p = write(tmp_path, "s.yaml", "system: lab\ndevices: {cpu: {kind: cpu}\nlinks: [\n")
    e = expect_error(lambda: load_config(p), file=p, key="line ",
                     allowed=["devices", "links", "toolchains"])
    assert "malformed YAML" in str(e)
    q = write(tmp_path, "q.yaml", "- just\n- a list\n")
    expect_error(lambda: load_config(q), file=q, key="<top>", allowed=["devices"])


def test_duplicate_key_is_an_error(tmp_path):
    p = write(tmp_path, "s.yaml", SYSTEM + "subgraph: {max_depth: 9}\n")
    expect_error(lambda: load_config(p), file=p, key="subgraph", allowed=["each key once"])


def test_conflicts(tmp_path):
    sysf = write(tmp_path, "lab.yaml", SYSTEM)
    a = write(tmp_path, "a.yaml", "system: other-lab\n")
    e = expect_error(lambda: load_config(sysf, a), file=a, key="system", allowed=["lab"])
    assert "conflict" in str(e)
    v = write(tmp_path, "v.yaml", "variants: {ort-cpu: {base: ort-cuda}}\n")
    expect_error(lambda: load_config(sysf, v), file=v, key="variants.ort-cpu",
                 allowed=["a name not in"])
    dup = SYSTEM.replace("ort-cuda: {toolchain: ort-cuda}", "ort-cpu: {toolchain: ort-cuda}")
    p = write(tmp_path, "dup.yaml", dup)
    expect_error(lambda: load_config(p), file=p, key="devices.gpu0.targets.ort-cpu",
                 allowed=["a unique target name"])
    lab = SYSTEM.replace("kind: ethos-u", "kind: cuda").replace(
        "u55: {toolchain: vela, options: {accelerator_config: ethos-u55-128}}",
        "x: {toolchain: ort-cuda}")
    q = write(tmp_path, "label.yaml", lab)
    expect_error(lambda: load_config(q), file=q, key="devices.npu",
                 allowed=["a label other than cuda:0"])
    hosts = write(tmp_path, "hosts.yaml", SYSTEM.replace("kind: cuda\n", "kind: cuda\n"
                                                        "    host: true\n"))
    expect_error(lambda: load_config(hosts), file=hosts, key="devices.gpu0.host",
                 allowed=["host: true on one device (cpu)"])
    link = write(tmp_path, "link.yaml", SYSTEM.replace(
        "links:\n", "links:\n  - {from: 'cpu:0', to: 'cuda:0', latency_us: 1, gb_per_s: 1}\n"))
    expect_error(lambda: load_config(link), file=link, key="links[1]",
                 allowed=["one link per direction"])
    with pytest.raises(ConfigError, match="not both"):
        load_config(sysf, builtin_system="gpu")


def test_no_or_unknown_system(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config()
    assert "gpu2" in str(ei.value) and "cpu" in str(ei.value)
    expect_error(lambda: load_config(builtin_system="gpu3"), file="", key="--builtin-system",
                 allowed=["gpu", "gpu2", "ethos-u55-128"])
    a = write(tmp_path, "a.yaml", "system: my-board\n")
    expect_error(lambda: load_config(app=a), file=a, key="system", allowed=["cpu", "gpu"])
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")


def test_resolve_targets_errors():
    cfg = load_config(builtin_system="gpu")
    with pytest.raises(ConfigError) as ei:
        cfg.resolve_targets("ort-cpu,ort-trt")
    msg = str(ei.value)
    assert "ort-trt" in msg and "--targets" in msg
    for n in ("ort-cpu", "openvino-cpu", "ort-cuda", "ort-tensorrt"):
        assert n in msg
    assert isinstance(ei.value, UnknownTargetError)  # callers catching that still work
    with pytest.raises(ConfigError, match="no targets"):
        cfg.resolve_targets(" , ")
    assert cfg.resolve_targets("") == cfg.selected_targets
    # names from other systems are not silently accepted
    with pytest.raises(ConfigError, match="ort-cuda-1"):
        cfg.resolve_targets("ort-cuda-1")


# ------------------------------------------------------------------------------------------
# CLI plumbing


def _parser() -> argparse.ArgumentParser:
    from collage_farm.cli.targets import add_config_args

    p = argparse.ArgumentParser()
    p.add_argument("--targets", default="ort-cpu,openvino-cpu")
    add_config_args(p)
    return p


def test_config_args_app_selection_wins_over_the_default_targets(tmp_path):
    from collage_farm.cli.targets import config_from_args

    app = write(tmp_path, "a.yaml", "system: gpu\ntargets: [ort-tensorrt]\n")
    args = _parser().parse_args(["--app", str(app)])
    cfg = config_from_args(args)
    assert [t.name for t in cfg.resolve_targets(args.targets)] == ["ort-tensorrt"]
    args = _parser().parse_args(["--app", str(app), "--targets", "ort-cpu,ort-cuda"])
    cfg = config_from_args(args)
    assert [t.name for t in cfg.resolve_targets(args.targets)] == ["ort-cpu", "ort-cuda"]
    args = _parser().parse_args([])
    assert config_from_args(args) is None and args.targets == "ort-cpu,openvino-cpu"
    args = _parser().parse_args(["--builtin-system", "gpu2"])
    assert config_from_args(args).system_name == "gpu2"


def test_targets_cli_list_and_show(capsys, tmp_path):
    from collage_farm.cli import main

    assert main(["targets", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["systems"]) >= {"cpu", "gpu", "gpu2"}
    assert "ethos-u65-512" in data["other_builtin_targets"]
    assert main(["targets", "list"]) == 0
    assert "ort-cuda-1" in capsys.readouterr().out
    assert main(["targets", "show", "ort-tensorrt", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["target"]["measure_key"] == BUILTIN_TARGETS["ort-tensorrt"].measure_key
    assert d["target"]["systems"] == ["gpu"]
    assert main(["targets", "show", "ethos-u55-128"]) == 0
    out = capsys.readouterr().out
    assert "system ethos-u55-128" in out and "measure key" in out and "cpu:0/mcu" in out
    app = write(tmp_path, "a.yaml", "system: gpu\noptions: {ort-tensorrt: {fp16: true}}\n"
                                    "pins: [{op: Softmax, device: cpu}]\n")
    assert main(["targets", "list", "--app", str(app), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["config"]
    assert c["targets"]["ort-tensorrt"]["options"] == {"fp16": True}
    assert len(c["pins"]) == 1
    assert main(["targets", "show", "ort-tensorrt", "--app", str(app)]) == 0
    assert "'fp16': True" in capsys.readouterr().out
    assert main(["targets", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "ort-cuda" in err
    bad = write(tmp_path, "bad.yaml", "system: gpu\nfoo: 1\n")
    assert main(["targets", "list", "--app", str(bad)]) == 2
    assert "bad.yaml: foo" in capsys.readouterr().err


def test_cuda_tf32_option_is_known_and_its_default_is_implicit(tmp_path):
    text = """\
        system: gpu-strict
        devices:
          gpu:
            kind: cuda
            targets:
              cuda-tf32: {toolchain: ort-cuda, options: {tf32: true}}
              cuda-fp32: {toolchain: ort-cuda, options: {tf32: false}}
    """
    cfg = load_config(system=write(tmp_path, "s.yaml", textwrap.dedent(text)))
    default = BUILTIN_TARGETS["ort-cuda"].measure_key
    assert cfg.targets["cuda-tf32"].measure_key == default  # ORT's own default, stated
    assert cfg.targets["cuda-fp32"].measure_key != default  # strict fp32 is another measurement


def test_target_show_says_whether_it_can_run_here():
    from collage_farm.cli.targets import _show_data, _show_text

    cpu = _show_data("ort-cpu", None)
    assert cpu["target"]["available"] is None
    assert "available here:    yes" in _show_text(cpu)
    trt = _show_data("ort-tensorrt", None)
    why = trt["target"]["available"]
    if why is None:
        pytest.skip("TensorRT runs here")
    assert isinstance(why, str) and why  # which EP, library or driver is missing
    assert f"available here:    {why}" in _show_text(trt)


def test_targets_list_check_marks_each_target_and_names_what_is_missing(capsys):
    from collage_farm.cli import main as cli_main

    assert cli_main(["targets", "list", "--check", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cpu = data["systems"]["cpu"]["targets"]["ort-cpu"]
    assert "available" in cpu and cpu["available"] is None
    bad = data["unavailable_toolchains"]
    assert all(isinstance(v, str) and v for v in bad.values())
    for s in data["systems"].values():
        for t in s["targets"].values():
            assert (t["available"] is None) == (t["toolchain"] not in bad)
    assert cli_main(["targets", "list", "--check"]) == 0
    text = capsys.readouterr().out
    assert "[here: yes]" in text
    for k in bad:
        assert f"not available here: {k}: " in text


def test_the_readme_example_files_load_and_their_pins_bind_to_mnist() -> None:
    """`examples/my-board.yaml` + `examples/my-app.yaml` are what the README tells users to
    copy: they must stay valid as the schema moves, and their pins must fit a zoo model."""
    from collage_farm import zoo
    from collage_farm.core.graph import load_graph
    from collage_farm.core.pins import check_pins

    ex = Path(__file__).resolve().parents[2] / "examples"
    cfg = load_config(ex / "my-board.yaml", ex / "my-app.yaml")
    assert (cfg.system_name, cfg.app_name) == ("my-board", "my-app")
    assert cfg.selected == ("ort-cpu", "openvino-cpu")
    assert cfg.targets["ort-cpu"] == BUILTIN_TARGETS["ort-cpu"]  # shares the built-in costs
    graph = load_graph(zoo.build("mnist"), name="mnist")
    targets = cfg.resolve_targets(None)
    check_pins(graph, targets, cfg.pin_set)  # the optional Softmax pin matches nothing: fine
    pool = next(n for n in graph.nodes if n.op_type == "MaxPool")
    assert [t.id for t in targets if cfg.pin_set.allowed(pool, t)] == ["openvino-cpu"]
