"""Real exported ONNX models that ship inside pip wheels, usable as ``pkg:NAME``.

Why: the seeded zoo models (`collage_farm.zoo`) are clean by construction: opset 17, the
default domain only, static shapes, named nodes, weights as initializers. Real exports are not,
and the loader, the rules and the executor must cope with what they really look like: opsets
11-12, hundreds of ``Constant`` nodes holding every weight (PaddlePaddle), unnamed nodes,
dynamic dimensions written as ``dim_param``, ``?`` or ``dim_value: -1``, int32 inputs, and
custom opset imports such as ``ai.onnx.ml``. A few pip packages carry such models in their
wheels, so pinning the package pins the exact file: nothing is downloaded at run time (device
runners have no network), and a machine without the package skips these models with the
exact install command instead of failing.

The packages are never imported (their ``__init__`` pulls in OpenCV and friends, which the
farm does not need): files are located with `importlib.util.find_spec`, which only finds the
package directory. ``pip install --no-deps`` is enough, and what the ``real`` extra installs.

Public API: `names`, `get`, `installed`, `locate`, `input_shapes`, `load`, `reference_model`,
`PREFIX`, `PackagedModel`, `PackageNotInstalledError`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from collage_farm.core.graph import DataflowGraph, ModelError, bind_input_shapes, load_graph

log = logging.getLogger(__name__)

#: model spec prefix: ``pkg:ppocr-det`` wherever ``zoo:NAME`` or a path is accepted
PREFIX = "pkg:"


@dataclass(frozen=True)
class PackagedModel:
    """One ONNX file inside a pinned pip package, with default bindings for dynamic inputs."""

    name: str
    package: str  # the pip distribution; also its import name (both use underscores here)
    version: str  # pinned: the file is only known to be there, and as described, at this one
    path: str  # relative to the package directory
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    description: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def install_command(self) -> str:
        # --no-deps: the packages' own dependencies (OpenCV, ...) are not needed to read a file
        return f"pip install --no-deps {self.requirement}"

    @property
    def spec(self) -> str:
        return PREFIX + self.name


class PackageNotInstalledError(ModelError):
    """A packaged model's pip package is missing; the message has the install command."""


_RAPIDOCR = ("rapidocr_onnxruntime", "1.4.4")
_MAGIKA = ("magika", "1.0.3")

_REGISTRY: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        "ppocr-det", *_RAPIDOCR, "models/ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 256, 256)},
        "PP-OCRv4 text detection (DB head, PaddlePaddle export): opset 12, weights as "
        "Constant nodes, unnamed nodes, input x [N,3,H,W] dynamic."),
    PackagedModel(
        "ppocr-rec", *_RAPIDOCR, "models/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)},
        "PP-OCRv4 text recognition (SVTR neck, CTC head over 6625 characters): opset 12, "
        "Constant weights, input x [N,3,48?,W] dynamic."),
    PackagedModel(
        "ppocr-cls", *_RAPIDOCR, "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        {"x": (1, 3, 48, 192)},
        "PP-OCR mobile v2.0 text-direction classifier: opset 11, Constant weights, batch "
        "written as dim_value -1, '?' spatial dims."),
    PackagedModel(
        "magika", *_MAGIKA, "models/standard_v3_3/model.onnx", {"bytes": (1, 2048)},
        "Magika standard_v3_3 file-type classifier (Keras export): opset 15 + ai.onnx.ml "
        "import, int32 input bytes [unk, 2048], 214 classes."),
)}


def names() -> list[str]:
    """The packaged models' names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> PackagedModel:
    """The registry entry for ``name`` (without the ``pkg:`` prefix)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ModelError(f"no packaged model named {name!r}; known: "
                         f"{', '.join(PREFIX + n for n in names())}") from None


def _package_dir(entry: PackagedModel) -> Path | None:
    try:
        spec = importlib.util.find_spec(entry.package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed(name: str) -> bool:
    """Whether the model's file is on this machine (its package installed, file present)."""
    d = _package_dir(get(name))
    return d is not None and (d / get(name).path).is_file()


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(get(name).package)
    except importlib.metadata.PackageNotFoundError:
        return None


def locate(name: str) -> Path:
    """The model file's path; `PackageNotInstalledError` with the install command if absent."""
    entry = get(name)
    d = _package_dir(entry)
    if d is None:
        raise PackageNotInstalledError(
            f"{entry.spec} needs the pip package {entry.requirement}, which is not installed; "
            f"install it with: {entry.install_command}")
    path = d / entry.path
    have = installed_version(name)
    if not path.is_file():
        raise PackageNotInstalledError(
            f"{entry.spec}: {path} not found in {entry.package} {have or '(unknown version)'}; "
            f"the model is registered for {entry.requirement}: {entry.install_command}")
    if have is not None and have != entry.version:
        log.warning("%s: %s %s installed, registered for %s; the model file may differ",
                    entry.spec, entry.package, have, entry.version)
    return path


def input_shapes(name: str, shapes: Mapping[str, Sequence[int]] | None = None
                 ) -> dict[str, tuple[int, ...]]:
    """The entry's default input shapes, overridden input by input by ``shapes``."""
    merged = {k: tuple(v) for k, v in get(name).shapes.items()}
    merged.update({k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()})
    return merged


def load(name: str, shapes: Mapping[str, Sequence[int]] | None = None,
         inputs: Mapping[str, object] | None = None) -> DataflowGraph:
    """``pkg:NAME`` loaded into a graph; default shapes for inputs ``shapes`` does not name;
    ``inputs`` fixes input values (`load_graph`)."""
    return load_graph(locate(name), input_shapes(name, shapes), name=name,
                      inputs=inputs)  # type: ignore[arg-type]


def reference_model(name: str, shapes: Mapping[str, Sequence[int]] | None = None
                    ) -> onnx.ModelProto:
    """The original file with its inputs bound (defaults, then ``shapes``).

    What plans compare against: unchanged apart from the input shapes, so whole-model runs on
    each toolchain see static inputs, as the campaign did.
    """
    model = onnx.load(str(locate(name)))
    bind_input_shapes(model, input_shapes(name, shapes))
    return model


__all__ = [
    "PREFIX",
    "PackageNotInstalledError",
    "PackagedModel",
    "get",
    "input_shapes",
    "installed",
    "installed_version",
    "load",
    "locate",
    "names",
    "reference_model",
]
