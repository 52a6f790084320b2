"""A model source as the CLI names it: a path, ``zoo:NAME`` or ``pkg:NAME``, loaded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from collage_farm import zoo
from collage_farm.core.graph import DataflowGraph, ModelError, load_graph
from collage_farm.zoo import packaged

__all__ = ["load_source"]


def load_source(spec: str, shapes: Mapping[str, Sequence[int]] | None = None,
                layers: int | None = None, inputs: Mapping[str, object] | None = None
                ) -> DataflowGraph:
    """A model path, ``zoo:NAME`` or ``pkg:NAME`` (`collage_farm.zoo.packaged`), loaded;
    ``inputs`` fixes input values (`collage_farm.core.graph.load_graph`)."""
    if spec.startswith(packaged.PREFIX):
        if layers is not None:
            raise ModelError("--layers applies to zoo models only")
        return packaged.load(spec[len(packaged.PREFIX):], shapes, inputs)
    if spec.startswith("zoo:"):
        name = spec[4:]
        kw = {} if layers is None else {"layers": layers}
        try:
            model = zoo.build(name, **kw)
        except KeyError as e:
            raise ModelError(str(e.args[0]) if e.args else f"unknown zoo model {name!r}") from None
        except ValueError as e:  # a depth the model has not, or out of range
            raise ModelError(str(e)) from None
        return load_graph(model, shapes, name=name, inputs=inputs)  # type: ignore[arg-type]
    if layers is not None:
        raise ModelError("--layers applies to zoo models only")
    return load_graph(spec, shapes, inputs=inputs)  # type: ignore[arg-type]
