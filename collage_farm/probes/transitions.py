"""A campaign's transition model from the cost table's transition rows, measuring what is missing.

`collage_farm.probes.handoff` measures the boundary excess of chained identity partitions per
toolchain (``transition:iso:...`` and ``transition:pipe:...`` rows) and `runners.transitions`
copies per device pair (``transition:copy:...``); `transition_samples` turns such rows into
`TransitionSample`s and `measured_transition_model` fits a `MeasuredTransitionModel` over them,
in front of the configured or analytic model, which answers what no row covers.

The probe reads the table it is given and writes through the writer it is given (the campaign's
single `CostTableWriter`): it never opens a writer of its own. Rows it measures are used at once,
whether or not they are written and flushed yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow.compute as pc

from collage_farm.core.target import CPU0, Target, VirtualDevice
from collage_farm.core.transition import (
    AnalyticTransitionModel,
    MeasuredTransitionModel,
    TransitionModel,
    TransitionSample,
    scale_transitions,
    split_scale,
)
from collage_farm.costtable import (
    CostRow,
    CostTable,
    CostTableWriter,
    normalize_row,
    row_from_result,
)
from collage_farm.probes.handoff import measure_toolchain_transitions
from runners.base import DeviceDescription, MeasureConfig, canonical_mode
from runners.transitions import PROBED_TOOLCHAINS, measure_copies, parse_fingerprint

__all__ = ["measured_transition_model", "transition_rows", "transition_samples"]


def transition_samples(rows: Iterable[CostRow], mode: str | None = None,
                       device: str | None = None) -> list[TransitionSample]:
    """`TransitionSample`s from cost-table transition rows.

    ``rows``: `CostRow` objects (any fingerprints; non-transition and failed rows are skipped).
    ``mode``: only ``iso`` rows measured in this measurement mode (the boundary excess is
    relative to how candidates were measured); ``device``: only rows of this device
    description (None: any device, the newest row wins: offline reuse on another machine).
    Launch rows (call floors) give no sample: every candidate's cost already contains one call.
    """
    newest: dict[tuple, CostRow] = {}
    for r in rows:
        info = parse_fingerprint(str(r.fingerprint))
        if info is None or not r.ok or (device is not None and r.device != device):
            continue
        if mode is not None and info["kind"] == "iso":
            try:
                if r.config.measure_mode != canonical_mode(mode):
                    continue
            except ValueError:
                continue
        key = tuple(sorted(info.items()))
        old = newest.get(key)
        if old is None or r.created_at > old.created_at:
            newest[key] = r
    iso: dict[tuple[str, str, int], float] = {}
    pipe: dict[tuple[str, str, int], float] = {}
    out = []
    for key, r in newest.items():
        info = dict(key)
        if info["kind"] == "copy":
            out.append(TransitionSample("transfer", float(r.seconds), nbytes=info["nbytes"],
                                        src=info["src"], dst=info["dst"]))
        elif info["kind"] in ("iso", "pipe"):
            k = (info["toolchain"], info["device"].split(":")[0], info["nbytes"])
            (iso if info["kind"] == "iso" else pipe)[k] = float(r.seconds)
    for k in sorted(set(iso) & set(pipe)):
        tc, dev_kind, nb = k
        out.append(TransitionSample("handoff", pipe[k] - 2.0 * iso[k], nbytes=nb,
                                    toolchain=tc, device_kind=dev_kind))
    return out


def transition_rows(table: CostTable) -> list[CostRow]:
    """The table's transition rows (fingerprints ``transition:...``), of every machine."""
    return table.rows(pc.starts_with(pc.field("fingerprint"), "transition:"))


def measured_transition_model(
    table: CostTable | None,
    targets: Sequence[Target],
    *,
    writer: CostTableWriter | None = None,
    measure: bool = False,
    config: MeasureConfig | None = None,
    fallback: TransitionModel | None = None,
    host: VirtualDevice | None = None,
    campaign_id: str = "",
    sizes: Sequence[int] | None = None,
    handoff_targets: Sequence[Target] | None = None,
) -> TransitionModel:
    """The transition model of a campaign: measured rows where they exist, ``fallback`` else.

    ``table``: the cost table whose transition rows are read (None: none are). With
    ``measure`` (a campaign that can measure: the farm estimator), toolchains of ``targets``
    that lack rows for this machine and ``config``'s mode are measured here
    (`collage_farm.probes.handoff`, in this process: the embedded farm's host), and so are copies
    between the targets' devices and the host where this machine has both; the new rows are
    appended to ``writer`` (None: not written) and used at once. Without ``measure`` (offline)
    the rows of any machine are used, newest first. ``fallback`` (the configured or analytic
    model) answers what no row covers; a what-if scale on it applies to the measured model too.
    ``sizes``: hand-off probe sizes in bytes (default `runners.transitions.HANDOFF_SIZES`).
    ``handoff_targets``: the targets whose toolchains' hand-offs are measured when missing
    (None: all of ``targets``; copies are measured for all of ``targets`` either way): a
    profile-mode campaign charges no hand-off to a target whose costs are profile shares
    (`collage_farm.core.transition.CallsIncluded`), so it measures none for it.
    Returns ``fallback`` unchanged when there are no usable rows.
    """
    config = config or MeasureConfig()
    base, factor = split_scale(fallback or AnalyticTransitionModel())
    rows = transition_rows(table) if table is not None else []
    device: str | None = None
    if measure:
        device = DeviceDescription.host_cpu().describe()
        rows += _measure_missing(rows, targets, config, device, host or CPU0, sizes,
                                 writer, campaign_id,
                                 targets if handoff_targets is None else handoff_targets)
    samples = transition_samples(rows, config.measure_mode, device)
    if not samples and device is not None:  # measured nothing usable here: any machine's rows
        samples = transition_samples(rows, config.measure_mode, None)
    if not samples:
        return fallback or base
    host_dev = host if host is not None else getattr(base, "host", None)
    model: TransitionModel = MeasuredTransitionModel.from_samples(samples, base, host_dev)
    return scale_transitions(model, factor) if factor != 1.0 else model


def _measure_missing(rows: Sequence[CostRow], targets: Sequence[Target],
                     config: MeasureConfig, device: str, host: VirtualDevice,
                     sizes: Sequence[int] | None, writer: CostTableWriter | None,
                     campaign_id: str, handoff_targets: Sequence[Target]) -> list[CostRow]:
    """Measure the hand-offs (of ``handoff_targets``' toolchains) and copies (between the
    host and ``targets``' devices) ``rows`` lack on this machine (``device``); each new row
    goes to ``writer`` as soon as it is measured, and all come back as `CostRow`s."""
    have = transition_samples(rows, config.measure_mode, device)
    have_tc = {(s.toolchain, s.device_kind) for s in have if s.kind == "handoff"}
    todo: dict[tuple[str, str], Target] = {}
    for t in handoff_targets:
        if (t.toolchain in PROBED_TOOLCHAINS and t.device.kind == "cpu"
                and (t.toolchain, t.device.kind) not in have_tc):
            todo.setdefault((t.toolchain, t.device.label), t)
    have_copy = {(s.src, s.dst) for s in have if s.kind == "transfer"}
    pairs = []
    for t in targets:
        for a, b in ((host, t.device), (t.device, host)):
            if not a.same_memory(b) and (a.label, b.label) not in have_copy:
                pairs.append((a, b))
    pairs = list(dict.fromkeys(pairs))
    if not todo and not pairs:
        return []
    kw: dict[str, Any] = {} if sizes is None else {"sizes": tuple(sizes)}
    fresh: list[dict[str, Any]] = []

    def keep(row: dict[str, Any]) -> None:
        if writer is not None:
            writer.append(row)
        fresh.append(row)

    for t in todo.values():
        for res in measure_toolchain_transitions(t, config, **kw):
            keep(row_from_result(res, campaign_id=campaign_id, model="transitions", nodes=[],
                                 op_types=["Identity"]))
    for res in measure_copies(pairs, config, **kw):
        keep(row_from_result(res, campaign_id=campaign_id, model="transitions", nodes=[],
                             op_types=["copy"]))
    return [CostRow.from_dict(normalize_row(r, campaign_id=campaign_id)) for r in fresh]
