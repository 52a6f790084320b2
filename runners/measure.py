"""The measurement loop every toolchain shares, so every cost in the table means the same thing.

Why one loop: Collage compares costs across toolchains (RFC 0062, Appendix E: "the median of
repeated runs"), so a cost from ONNX Runtime and one from OpenVINO must be taken the same way or
the search optimises measurement artefacts. The loop follows `MeasureConfig`:

* ``warmup_runs`` runs are discarded (first-run allocation, lazy kernel selection, page faults);
* then ``rounds`` rounds; a round runs until it has at least ``min_round_runs`` samples *and* its
  samples add up to ``min_round_s`` (timed time, so a cache flush between runs does not count);
  every round may take ``max_samples // rounds`` samples at most, so tiny kernels stay cheap;
* a round whose median deviates from the median of round medians by more than
  ``outlier_ratio`` is re-run once (field notes: an occasional round is +70% on a shared VM);
* timing uses `time.perf_counter_ns`; an optional ``sync`` (device synchronisation) is inside
  the timed region, an optional ``flush`` is outside it.

Mode ``"cache_flush"`` calls a flush before every timed run: a write over a buffer larger than
the last-level cache (2x the L3 size read from sysfs, 64 MiB when unknown), the idea behind TVM's
``enable_cpu_cache_flush``: a sub-graph inside a whole model seldom finds its weights in cache,
so the isolated warm number is optimistic (1-18% in the field notes).

`pin_to_cores` pins the calling process (workers call it once at start); the median of all
samples is the cost, `summarize` gives the statistics stored with every row.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence

from runners.base import MeasureConfig, Summary

DEFAULT_FLUSH_BYTES = 64 * 1024 * 1024

__all__ = [
    "CacheFlusher",
    "llc_bytes",
    "pin_to_cores",
    "summarize",
    "time_callable",
]


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = 1
    for suffix, m in (("K", 1024), ("M", 1024**2), ("G", 1024**3)):
        if text.endswith(suffix):
            text, mult = text[:-1], m
            break
    return int(text) * mult


def llc_bytes(default: int = DEFAULT_FLUSH_BYTES // 2) -> int:
    """Size of the largest (last-level) data/unified cache of cpu0 from sysfs, else ``default``."""
    best = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(d, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "size")) as f:
                best = max(best, _parse_size(f.read()))
        except (OSError, ValueError):
            continue
    return best or default


class CacheFlusher:
    """Evicts the caches by read-modify-writing a buffer of ``size_bytes`` (default 2x LLC).

    A plain ``fill`` is not enough: large memsets use non-temporal stores that bypass the cache
    and evict nothing; ``buf += 1`` reads every line into the cache and dirties it.
    """

    def __init__(self, size_bytes: int | None = None) -> None:
        import numpy as np

        if size_bytes is None:
            llc = llc_bytes(0)
            size_bytes = max(2 * llc, 1 << 20) if llc else DEFAULT_FLUSH_BYTES
        self.size_bytes = int(size_bytes)
        self._buf = np.zeros(max(1, self.size_bytes // 8), dtype=np.int64)

    def __call__(self) -> None:
        self._buf += 1


_DEFAULT_FLUSHER: CacheFlusher | None = None


def _default_flusher() -> CacheFlusher:
    global _DEFAULT_FLUSHER
    if _DEFAULT_FLUSHER is None:
        _DEFAULT_FLUSHER = CacheFlusher()
    return _DEFAULT_FLUSHER


def time_callable(
    fn: Callable[[], None],
    config: MeasureConfig,
    *,
    sync: Callable[[], None] | None = None,
    flush: Callable[[], None] | None = None,
) -> tuple[list[float], list[float]]:
    """Time ``fn`` following ``config``; returns (samples in seconds, round medians).

    ``sync`` runs after every call inside the timed region (device synchronisation);
    ``flush`` runs before every timed call outside it. In ``cache_flush`` mode a default
    `CacheFlusher` is used when no ``flush`` is given; in ``isolated`` mode ``flush`` is
    ignored unless given explicitly.
    """
    if config.mode not in ("isolated", "cache_flush"):
        raise ValueError(f"unknown measure mode {config.mode!r} (isolated, cache_flush)")
    if config.mode == "cache_flush" and flush is None:
        flush = _default_flusher()
    clock = time.perf_counter_ns
    rounds = max(1, int(config.rounds))
    per_round_cap = max(1, int(config.max_samples) // rounds)
    min_runs = max(1, min(int(config.min_round_runs), per_round_cap))
    min_ns = max(0.0, float(config.min_round_s)) * 1e9

    def one() -> int:
        if flush is not None:
            flush()
        t0 = clock()
        fn()
        if sync is not None:
            sync()
        return clock() - t0

    def one_round() -> list[int]:
        out: list[int] = []
        total = 0
        while len(out) < per_round_cap and (len(out) < min_runs or total < min_ns):
            dt = one()
            out.append(dt)
            total += dt
        return out

    for _ in range(max(0, int(config.warmup_runs))):
        one()
    per_round = [one_round() for _ in range(rounds)]
    medians = [statistics.median(r) for r in per_round]
    if rounds >= 2 and config.outlier_ratio > 0:
        center = statistics.median(medians)
        if center > 0:
            for i in range(rounds):
                if abs(medians[i] - center) / center > config.outlier_ratio:
                    per_round[i] = one_round()  # re-run once; keep whatever it gives
                    medians[i] = statistics.median(per_round[i])
    samples = [ns * 1e-9 for r in per_round for ns in r]
    return samples, [m * 1e-9 for m in medians]


def summarize(samples: Sequence[float], round_medians: Sequence[float] = ()) -> Summary:
    """Statistics stored with a row: median (the cost), mean, std, p10, p90, min, n, CV."""
    return Summary.of(samples, round_medians)


def pin_to_cores(cores: Iterable[int] | None) -> set[int]:
    """Pin the calling process to ``cores`` (``None``: leave as is); returns the previous set.

    Raises ValueError when none of the cores is available to this process (a wrong slot in a
    cluster config should fail loudly, not silently measure on another core).
    """
    previous = set(os.sched_getaffinity(0))
    if cores is None:
        return previous
    want = {int(c) for c in cores}
    if not want:
        return previous
    try:
        os.sched_setaffinity(0, want)
    except OSError as e:
        raise ValueError(f"cannot pin to cores {sorted(want)}: {e}") from None
    return previous
