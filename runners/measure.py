"""The measurement loop every toolchain shares, so every cost in the table means the same thing.

Why one loop: Collage compares costs across toolchains (RFC 0062, Appendix E: "the median of
repeated runs"), so a cost from ONNX Runtime and one from OpenVINO must be taken the same way or
the search optimises measurement artefacts. The loop follows `MeasureConfig`:

* ``warmup_runs`` runs are discarded (first-run allocation, lazy kernel selection, page faults);
* then ``rounds`` rounds; a round runs until it has at least ``min_round_runs`` samples *and* its
  samples add up to ``min_round_s`` (timed time; in the flushing modes the flushes count too,
  or a 30 us kernel behind a 3 ms eviction would take seconds);
  every round may take ``max_samples // rounds`` samples at most, so tiny kernels stay cheap;
* a round whose median deviates from the median of round medians by more than
  ``outlier_ratio`` is re-run once (on a shared VM an occasional round is +70%);
* timing uses `time.perf_counter_ns`; an optional ``sync`` (device synchronisation) is inside
  the timed region, an optional ``flush`` is outside it.

Modes (``MeasureConfig.mode``) say what the caches hold when a timed run starts, because an
isolated candidate run again and again finds its weights and activations cached, which a
sub-graph inside a whole model seldom does (isolated warm runs were measured 1-18%
optimistic):

* ``warm`` (the old ``isolated``): nothing between runs; everything stays cached;
* ``flush`` (the old ``cache_flush``): before every timed run, a read-modify-write over a buffer
  of twice the last-level cache (size from sysfs; 64 MiB when unknown), TVM's
  ``enable_cpu_cache_flush`` idea: a cold start, weights and inputs from memory;
* ``network``: a candidate inside a running network. Between two runs of a partition in a
  pipeline, the *rest of the network* runs once: it touches the other partitions' weights and
  activations, ``MeasureConfig.network_bytes`` (set per candidate by the campaign: the model's
  bytes minus the candidate's own). So the eviction before each timed run is a
  read-modify-write of that many bytes, at most 2 x LLC of this machine
  (`network_eviction_bytes`: more evicts nothing more); then the candidate's input buffers
  are read back (one load per cache line), as if the partition producing them had just written
  them. Measured on this VM (bench/inchain.py -> bench/results/inchain-vm.md: 6 zoo models
  in 8 chunks, each chunk's time alone vs inside a running chain): sizing the eviction by the
  rest of the network put the sum of chunk costs within -9.9..+0.3% of their in-chain sum
  (median |error| 1.3%), where warm runs were -34..+8% off and a fixed 2 x L2 eviction
  -27..+30%.
  ``network_bytes=0`` evicts 2 x L2; ``flush_bytes`` > 0 sets the eviction size outright.

Eviction and touching happen outside the timed region, so they cost wall time, not samples.
`pin_to_cores` pins the calling process (workers call it once at start); the median of all
samples is the cost, `summarize` gives the statistics stored with every row.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from runners.base import MeasureConfig, Summary

DEFAULT_FLUSH_BYTES = 64 * 1024 * 1024

__all__ = [
    "CacheFlusher",
    "InputToucher",
    "flush_for",
    "llc_bytes",
    "network_eviction_bytes",
    "pin_to_cores",
    "private_cache_bytes",
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


def _cache_sizes() -> dict[int, int]:
    """Data/unified cache size per level of cpu0 from sysfs ({} when unknown)."""
    out: dict[int, int] = {}
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(d, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "size")) as f:
                out[level] = max(out.get(level, 0), _parse_size(f.read()))
        except (OSError, ValueError):
            continue
    return out


def llc_bytes(default: int = DEFAULT_FLUSH_BYTES // 2) -> int:
    """Size of the largest (last-level) data/unified cache of cpu0 from sysfs, else ``default``."""
    return max(_cache_sizes().values(), default=0) or default


def private_cache_bytes(default: int = 1 << 20) -> int:
    """Size of cpu0's level-2 cache (private to a core on current x86/Arm) else ``default``."""
    return _cache_sizes().get(2, 0) or default


class CacheFlusher:
    """Evicts the caches by read-modify-writing a buffer of ``size_bytes`` (default 2x LLC).

    A plain ``fill`` is not enough: large memsets use non-temporal stores that bypass the cache
    and evict nothing; ``buf += 1`` reads every line into the cache and dirties it.
    """

    def __init__(self, size_bytes: int | None = None, pool: Any = None) -> None:
        import numpy as np

        if size_bytes is None:
            llc = llc_bytes(0)
            size_bytes = max(2 * llc, 1 << 20) if llc else DEFAULT_FLUSH_BYTES
        self.size_bytes = int(size_bytes)
        n = max(1, self.size_bytes // 8)
        if pool is not None and len(pool) >= n:  # a view: one buffer serves every size
            self._buf = pool[:n]
        else:
            self._buf = np.zeros(n, dtype=np.int64)

    def __call__(self) -> None:
        self._buf += 1


_DEFAULT_FLUSHER: CacheFlusher | None = None


def _default_flusher() -> CacheFlusher:
    global _DEFAULT_FLUSHER
    if _DEFAULT_FLUSHER is None:
        _DEFAULT_FLUSHER = CacheFlusher()
    return _DEFAULT_FLUSHER


def network_eviction_bytes(config: MeasureConfig) -> int:
    """Bytes evicted before each timed run in ``network`` mode on this machine.

    ``flush_bytes`` when set; else what the rest of the network touches
    (``network_bytes``), at most 2 x LLC (more evicts nothing more); else (size unknown)
    2 x L2. No lower clamp: the rest of a 100 KB model leaves most of a candidate's data in
    L2, and evicting 2 x L2 anyway made mnist's candidates 21% slower than in the model.
    """
    if config.flush_bytes > 0:
        return int(config.flush_bytes)
    if config.network_bytes > 0:
        return int(min(2 * llc_bytes(), config.network_bytes))
    return 2 * private_cache_bytes()


_FLUSHERS: dict[int, CacheFlusher] = {}


_POOL: list[Any] = []  # [the int64 buffer every flusher views], grown to the largest size
_MAX_FLUSHERS = 64


def _flusher_of(size_bytes: int) -> CacheFlusher:
    """A flusher of ``size_bytes``, viewing one per-process buffer.

    ``network`` mode asks for a different size per candidate (the rest of its network), so
    the eviction buffer is allocated (and page-faulted) once at the largest size asked, not
    once per candidate.
    """
    got = _FLUSHERS.get(size_bytes)
    if got is None:
        import numpy as np

        n = max(1, int(size_bytes) // 8)
        if not _POOL or len(_POOL[0]) < n:
            _POOL[:] = [np.zeros(n, dtype=np.int64)]
            _FLUSHERS.clear()  # views of the old buffer
        if len(_FLUSHERS) >= _MAX_FLUSHERS:
            _FLUSHERS.clear()
        got = _FLUSHERS[size_bytes] = CacheFlusher(size_bytes, pool=_POOL[0])
    return got


class InputToucher:
    """Reads one byte per cache line of each array: brings a producer's fresh outputs back."""

    def __init__(self, arrays: Sequence[Any]) -> None:
        import numpy as np

        self._views = []
        for a in arrays:
            if isinstance(a, np.ndarray) and a.size and a.flags.c_contiguous:
                self._views.append(a.reshape(-1).view(np.uint8)[::64])

    def __call__(self) -> int:
        total = 0
        for v in self._views:
            total += int(v.sum())  # the loads are the point; the sum keeps them
        return total


def flush_for(config: MeasureConfig, inputs: Sequence[Any] = ()) -> Callable[[], None] | None:
    """The between-runs action of ``config``'s mode (None for ``warm``).

    ``inputs``: the candidate's bound input arrays (numpy, sharing memory with what the
    toolchain reads), re-read after the eviction in ``network`` mode.
    """
    mode = config.measure_mode
    if mode == "warm":
        return None
    if mode == "flush":
        return _flusher_of(config.flush_bytes) if config.flush_bytes > 0 else _default_flusher()
    flusher = _flusher_of(network_eviction_bytes(config))
    touch = InputToucher(inputs)

    def network() -> None:
        flusher()
        touch()

    return network


def time_callable(
    fn: Callable[[], None],
    config: MeasureConfig,
    *,
    sync: Callable[[], None] | None = None,
    flush: Callable[[], None] | None = None,
    inputs: Sequence[Any] = (),
) -> tuple[list[float], list[float]]:
    """Time ``fn`` following ``config``; returns (samples in seconds, round medians).

    ``sync`` runs after every call inside the timed region (device synchronisation);
    ``flush`` runs before every timed call outside it. When no ``flush`` is given, the mode's
    own action is used (`flush_for`, with ``inputs`` for ``network`` mode); in ``warm`` mode an
    explicit ``flush`` still runs. An unknown mode raises ValueError.
    """
    if flush is None:
        flush = flush_for(config, inputs)
    else:
        config.measure_mode  # noqa: B018 - validates the mode
    clock = time.perf_counter_ns
    rounds = max(1, int(config.rounds))
    per_round_cap = max(1, int(config.max_samples) // rounds)
    min_runs = max(1, min(int(config.min_round_runs), per_round_cap))
    min_ns = max(0.0, float(config.min_round_s)) * 1e9

    def one() -> tuple[int, int]:
        """(timed ns, ns the round is charged: the timed ns, plus the flush when there is one)."""
        if flush is None:
            t0 = clock()
            fn()
            if sync is not None:
                sync()
            dt = clock() - t0
            return dt, dt
        tf = clock()
        flush()
        t0 = clock()
        fn()
        if sync is not None:
            sync()
        t1 = clock()
        return t1 - t0, t1 - tf

    def one_round() -> list[int]:
        # with a flush, ``min_round_s`` counts the flushes too: a 64 MiB eviction costs ~3 ms,
        # so counting timed time alone would spend seconds per candidate on a 30 us kernel
        out: list[int] = []
        total = 0
        while len(out) < per_round_cap and (len(out) < min_runs or total < min_ns):
            dt, charged = one()
            out.append(dt)
            total += charged
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
