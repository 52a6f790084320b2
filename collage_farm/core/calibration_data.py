"""The inputs an int8 build is calibrated on: seeded random feeds, or the user's own data.

An int8 build (an Ethos-U NPU partition, a Cortex-M host partition in int8) needs each tensor's
(min, max) over realistic inputs. `runners.calibration.calibrate` measures them once per model
by running the whole fp32 model on the samples a `CalibrationData` gives:

* ``random`` (the default): ``samples`` seeded feeds (`collage_farm.core.graph.random_inputs`,
  seeds ``seed .. seed + samples - 1``): floats N(0, 1), integer indices inside the axis they
  index, fixed input values (``--input``) as given;
* ``file``: the user's data (``--calibration-data``), read by `CalibrationData.load` from

  - a ``.npz`` file whose keys are the model's input names, or
  - a directory of ``.npy`` files, one per input, named ``<input name>.npy`` (for input names
    that are valid file names; use an ``.npz`` for the others).

  Each array holds one sample in the input's shape, or ``N`` samples stacked on a new leading
  axis (``N x <input shape>``); every input has the same ``N``. Its dtype must be of the
  input's kind (float for a float input, integer for an integer one, bool for bool; cast to
  the input's exact type), floats must be finite. An input with a fixed value (``--input``)
  may be left out: the fixed value is used. Any other mismatch (a missing or unknown input
  name, a wrong kind or shape, an unreadable file) is one `ModelError` line naming the file.

`CalibrationData.to_json` is what plan.json records (``calibration``: the source, the number of
samples, the seed or the path and the SHA-256 of the data); `CalibrationData.from_json` reads
it back, so ``run`` re-calibrates on the very data the campaign's builds were calibrated on
(the data's SHA-256 is checked: a changed file is refused, not silently used).
"""

from __future__ import annotations

import enum
import hashlib
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import helper

from collage_farm.core.feeds import input_values
from collage_farm.core.graph import DataflowGraph, random_inputs
from collage_farm.core.tensors import ModelError

__all__ = ["DEFAULT_SAMPLES", "CalibrationData", "CalibrationSource", "describe"]

#: random samples a campaign calibrates on by default
DEFAULT_SAMPLES = 8


class CalibrationSource(enum.Enum):
    """Where calibration samples come from."""

    RANDOM = "random"
    FILE = "file"


@dataclass(frozen=True, eq=False)
class CalibrationData:
    """The samples a model's int8 ranges are measured on (module docstring).

    ``arrays`` (file data only) maps input names to their samples as stored; `validated`
    checks them against a model and stacks each to ``samples x <input shape>``.
    """

    source: CalibrationSource = CalibrationSource.RANDOM
    samples: int = DEFAULT_SAMPLES
    seed: int = 0
    path: str | None = None
    sha256: str | None = None
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)

    @staticmethod
    def random(samples: int = DEFAULT_SAMPLES, seed: int = 0) -> CalibrationData:
        """``samples`` seeded random feeds, seeds ``seed ..``."""
        return CalibrationData(CalibrationSource.RANDOM, max(1, int(samples)), int(seed))

    @staticmethod
    def load(path: str | Path) -> CalibrationData:
        """The data at ``path`` (an ``.npz`` file or a directory of ``.npy`` files), as stored;
        `ModelError` (one line, naming ``path``) when it cannot be read."""
        p = Path(path)
        if p.is_dir():
            arrays, digest = _read_dir(p)
        elif p.is_file():
            arrays, digest = _read_npz(p)
        else:
            raise ModelError(f"calibration data {path}: no such file or directory")
        if not arrays:
            raise ModelError(f"calibration data {path}: holds no arrays (an .npz keyed by "
                             "input name, or a directory of <input name>.npy files)")
        n = max((a.shape[0] for a in arrays.values() if a.ndim), default=1)
        return CalibrationData(CalibrationSource.FILE, n, 0, str(p.resolve()), digest,
                               arrays)

    @property
    def key(self) -> str:
        """What identifies the samples in a cache key (``|seed=S|n=N`` for random data, so
        cache files written before file data existed stay valid)."""
        if self.source is CalibrationSource.RANDOM:
            return f"|seed={self.seed}|n={self.samples}"
        return f"|data={self.sha256}|n={self.samples}"

    @property
    def row_key(self) -> str:
        """What identifies the samples in the key of an int8 cost row (`Target.calibration`):
        empty for the default (`DEFAULT_SAMPLES` random samples from seed 0), so rows of
        default campaigns keep the keys they had before calibration was part of them (rows
        written before then, whatever they were calibrated on, read as the default's); else
        `key` (the data's SHA-256, or the random seed, and the sample count)."""
        if self.source is CalibrationSource.RANDOM and (self.seed, self.samples) == (
                0, DEFAULT_SAMPLES):
            return ""
        return self.key.lstrip("|")

    def describe(self) -> str:
        """One line: which calibration (`describe`)."""
        return describe(self.to_json())

    def to_json(self) -> dict[str, Any]:
        """plan.json's ``calibration``."""
        out: dict[str, Any] = {"source": self.source.value, "samples": self.samples}
        if self.source is CalibrationSource.RANDOM:
            out["seed"] = self.seed
        else:
            out.update(path=self.path, sha256=self.sha256)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any] | None) -> CalibrationData:
        """What `to_json` wrote (None, from a plan written before plans recorded it: the
        random default those campaigns used). A file is read again and must still have the
        recorded SHA-256; `ModelError` otherwise."""
        if not d:
            return CalibrationData.random()
        try:
            source = CalibrationSource(d.get("source"))
        except ValueError:
            raise ModelError(f"plan.json calibration: unknown source {d.get('source')!r} "
                             "(random, file)") from None
        if source is CalibrationSource.RANDOM:
            return CalibrationData.random(int(d.get("samples") or DEFAULT_SAMPLES),
                                          int(d.get("seed") or 0))
        data = CalibrationData.load(str(d.get("path")))
        if data.sha256 != d.get("sha256"):
            raise ModelError(f"calibration data {d.get('path')}: changed since the campaign "
                             f"calibrated on it (sha256 {str(data.sha256)[:12]}, plan.json "
                             f"records {str(d.get('sha256'))[:12]}); pass the campaign's data "
                             "with --calibration-data")
        return data

    def validated(self, graph: DataflowGraph) -> CalibrationData:
        """This data checked against ``graph``'s runtime inputs (module docstring), each
        array stacked to ``samples x <input shape>`` in the input's dtype; `ModelError` (one
        line) for the first mismatch. Random data is returned as is."""
        if self.source is CalibrationSource.RANDOM:
            return self
        fixed = input_values(graph.model)
        for name in graph.graph_inputs:
            if name not in self.arrays and name not in fixed:
                raise ModelError(f"calibration data {self.path}: no array for input {name!r} "
                                 f"(has: {', '.join(sorted(self.arrays)) or 'none'})")
        unknown = sorted(set(self.arrays) - set(graph.graph_inputs))
        if unknown:
            raise ModelError(f"calibration data {self.path}: {', '.join(map(repr, unknown))} "
                             f"is not an input of the model (inputs: "
                             f"{', '.join(graph.graph_inputs)})")
        out = {name: self._fit(name, graph) for name in graph.graph_inputs
               if name in self.arrays}
        counts = {k: v.shape[0] for k, v in out.items()}
        if len(set(counts.values())) > 1:
            raise ModelError(f"calibration data {self.path}: inputs have different sample "
                             f"counts ({', '.join(f'{k}: {n}' for k, n in counts.items())})")
        n = next(iter(counts.values()), 1)
        return CalibrationData(self.source, n, 0, self.path, self.sha256, out)

    def _fit(self, name: str, graph: DataflowGraph) -> np.ndarray:
        info = graph.tensors[name]
        want = np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type))
        a = np.asarray(self.arrays[name])
        shape = tuple(info.shape)
        where = f"calibration data {self.path}: input {name!r}"
        if _kind(a.dtype) != _kind(want):
            raise ModelError(f"{where} is {want.name}, the array is {a.dtype.name}")
        if a.shape == shape:
            a = a[None]
        elif a.shape[1:] != shape or a.shape[0] < 1:
            dims = "x".join(map(str, shape)) or "scalar"
            raise ModelError(f"{where} is {dims}; the array is "
                             f"{'x'.join(map(str, a.shape)) or 'scalar'} (one sample is "
                             f"{dims}, N samples are Nx{dims})")
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise ModelError(f"{where} holds NaN or infinite values")
        return np.ascontiguousarray(a.astype(want))

    def feeds(self, graph: DataflowGraph) -> Iterator[dict[str, np.ndarray]]:
        """The samples as feeds for ``graph``, one dict per sample (file data: `validated`
        first; fixed input values fill the inputs it leaves out)."""
        if self.source is CalibrationSource.RANDOM:
            for i in range(self.samples):
                yield random_inputs(graph, self.seed + i)
            return
        data = self.validated(graph)
        fixed = random_inputs(graph, 0)  # the fixed values, for inputs the data leaves out
        for i in range(data.samples):
            yield {n: (data.arrays[n][i] if n in data.arrays else fixed[n])
                   for n in graph.graph_inputs}


def describe(record: Mapping[str, Any]) -> str:
    """One line saying which calibration a `CalibrationData.to_json` record names (for
    reports and ``run``), without reading its data."""
    n = int(record.get("samples") or 0)
    if record.get("source") == CalibrationSource.RANDOM.value:
        seed = int(record.get("seed") or 0)
        return (f"random: {n} seeded samples (seeds {seed}..{seed + n - 1}; floats N(0,1), "
                "indices in range)")
    return (f"file: {n} sample(s) from {record.get('path')} "
            f"(sha256 {str(record.get('sha256'))[:12]})")


def _kind(dtype: np.dtype) -> str:
    return "i" if dtype.kind in "iu" else dtype.kind


def _unreadable(path: Path, e: BaseException) -> ModelError:
    why = " ".join(str(e).split())[:200]
    return ModelError(f"calibration data {path}: not readable as numpy data "
                      f"({type(e).__name__}: {why})")


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], str]:
    try:
        raw = path.read_bytes()
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive (give a .npz keyed by input name, or a "
                                 "directory of .npy files)")
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise _unreadable(path, e) from None
    return arrays, hashlib.sha256(raw).hexdigest()


def _read_dir(path: Path) -> tuple[dict[str, np.ndarray], str]:
    h = hashlib.sha256()
    arrays: dict[str, np.ndarray] = {}
    for f in sorted(path.glob("*.npy")):
        try:
            raw = f.read_bytes()
            arrays[f.stem] = np.asarray(np.load(f, allow_pickle=False))
        except (OSError, ValueError, EOFError) as e:
            raise _unreadable(f, e) from None
        h.update(f.name.encode() + b"\0" + hashlib.sha256(raw).digest())
    return arrays, h.hexdigest()
