"""Profile mode on the CUDA EP: the ONNX Runtime trace of a whole model on a real GPU.

`runners.profilers.OrtTraceProfiler` is shared by ort-cpu and ort-cuda. On the CPU a kernel's
trace duration is its run time; on the GPU ONNX Runtime's trace times each CUDA kernel's host
side (the launch), which is not what the GPU spends. So this test checks what must hold either
way (the profile request succeeds, is kind ``profiled``, names only the model's nodes and
covers all of them), and prints the per-operator sum over the unprofiled whole model. A trace
that sum rejects (`runners.profile.OperatorProfile.problem`) is replaced on the worker by
prefix differences at thin cuts, whose ``rejected`` says why; it must cover the nodes as well.
"""

from __future__ import annotations

import pytest

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.target import CUDA0, Target
from runners.base import BuildInput, Kind, MeasureInput, Status
from runners.profile import PROFILE_DETAIL, OperatorProfile, profile_config, profile_measure
from runners.registry import get_toolchain

pytestmark = pytest.mark.device


@pytest.mark.parametrize("name,kw", [("resnet18", {"image_size": 64}), ("bert", {"layers": 2})])
def test_ort_cuda_profile_request(name: str, kw: dict) -> None:
    tc = get_toolchain("ort-cuda")
    why = tc.available()
    if why:
        pytest.skip(f"ort-cuda: {why}")
    g = load_graph(zoo.build(name, **kw), name=name)
    data = g.model.SerializeToString()
    b = tc.build(BuildInput(f"prof-{name}", Target.make("ort-cuda", "ort-cuda", CUDA0), data))
    assert b.ok, b.error
    r = profile_measure(tc, MeasureInput(b, profile_config(rounds=3, runs=10)), data)
    assert r.status is Status.OK, r.error
    assert r.kind is Kind.PROFILED and r.seconds > 0
    prof = OperatorProfile.from_json(dict(r.details)[PROFILE_DETAIL])
    named = [n for nodes, _ in prof.groups for n in nodes]
    assert set(named) <= {n.name for n in g.nodes}
    assert len(named) == len(set(named))  # a node is in one group only
    covered = len(set(named)) / len(g.nodes)
    print(f"\n{name} ort-cuda: {len(g.nodes)} nodes, {len(prof.groups)} groups, "
          f"{covered:.0%} of nodes in a group, whole {r.seconds * 1e6:.1f} us unprofiled, "
          f"per-operator sum / whole = {prof.ratio:.3f}, unattributed "
          f"{prof.unattributed_s * 1e6:.1f} us, method {prof.method.value}"
          + (f" (trace not used: {prof.rejected})" if prof.rejected else ""))
    assert covered > 0.9
