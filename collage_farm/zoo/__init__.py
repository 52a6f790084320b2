"""The model zoo: well-known topologies built in code, with seeded random weights.

Why build models instead of downloading them: the farm's tests, benchmarks and examples need
models that exist on every machine (no network on device runners), are byte-for-byte
reproducible from a seed, and can be made small (``layers=2``, ``image_size=32``) or full size
from the same code. Only the *structure* of a model matters to Collage (fingerprints hash op
types, attributes, shapes and topology, never weight values), so random weights give the same
candidates, the same fingerprint collisions across repeated layers, and the same latencies as
the real exports. Weights are scaled (He / Xavier-style, residual branches damped) so that
activations stay finite and non-degenerate through deep nets: int8 calibration and numeric
comparisons of partitioned vs whole models run on these models and need real signal.

Every seeded topology is plain ONNX built with `onnx.helper` (IR version 10, opset 17, the
default domain only), has static shapes, unique meaningful node names
(``layer3/attn/qkv_matmul``) and loads with `collage_farm.core.graph.load_graph`. The models of
`realclasses` (``qdq_mnist``, ``if_gate``, ``detector_fpn``, ...) stand for classes of real
exports and keep their exporters' irregularities on purpose: other opsets and IR versions,
quantization, sub-graphs, dynamic dimensions, unused domain imports.

Public API: `names`, `build`, `describe`, `export`. `GraphBuilder` is the small helper the
model modules share.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

IR_VERSION = 10  # ONNX Runtime 1.31 reads IR <= 13, onnx 1.23 writes 14 by default
OPSET = 17  # LayerNormalization is opset 17; ReduceMean still takes `axes` as an attribute
PRODUCER = "collage-farm.zoo"
# protobuf cannot serialise a message over 2 GiB: above this size weights go to a side file
EXTERNAL_DATA_THRESHOLD = int(1.8e9)


class UnknownModelError(KeyError):
    """No zoo model has this name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would repr() the message, quotes and all
        return str(self.args[0]) if self.args else "unknown model"


class GraphBuilder:
    """Accumulates nodes, initializers and graph inputs/outputs, then makes a `ModelProto`.

    A node's single output tensor takes the node's name; a multi-output node's outputs are
    ``name_0``, ``name_1``, ... Names must be unique (checked), which keeps models readable in
    Netron and makes node names usable as stable ids in plans and reports.
    """

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        # initializers are written straight into the final model: copying ~650 MB of GPT-2
        # weights through make_graph/make_model would cost seconds and double peak memory
        self._model = onnx.ModelProto()
        self.initializers = self._model.graph.initializer
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._node_names: set[str] = set()
        self._tensors: set[str] = set()
        self._consts: dict[str, str] = {}

    # --- tensors ---------------------------------------------------------------------------
    def _claim_tensor(self, name: str) -> None:
        if name in self._tensors:
            raise ValueError(f"{self.name}: tensor name {name!r} used twice")
        self._tensors.add(name)

    def input(self, name: str, shape: Sequence[int], elem_type: int = TensorProto.FLOAT) -> str:
        self._claim_tensor(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, tensor: str, shape: Sequence[int],
               elem_type: int = TensorProto.FLOAT) -> None:
        self.outputs.append(helper.make_tensor_value_info(tensor, elem_type, list(shape)))

    def init(self, name: str, array: np.ndarray) -> str:
        """Add an initializer holding ``array`` (dtype kept) and return its name."""
        self._claim_tensor(name)
        # not np.ascontiguousarray: it turns a 0-d scalar into shape [1]
        arr = np.asarray(array)
        t = self.initializers.add()
        t.name = name
        t.dims.extend(arr.shape)
        t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        t.raw_data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
        return name

    def const(self, name: str, value: np.ndarray | Sequence[float] | float,
              dtype: type | np.dtype = np.float32) -> str:
        """A shared constant (shape vector, scale, mask): created once, reused by every layer.

        Sharing keeps repeated layers identical and avoids thousands of tiny duplicate
        initializers; asking again for ``name`` returns the existing tensor.
        """
        if name in self._consts:
            return self._consts[name]
        self._consts[name] = self.init(name, np.asarray(value, dtype=dtype))
        return name

    def param(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        """A float32 weight, uniform with the given mean and standard deviation, seeded.

        Uniform, as PyTorch's default (Kaiming-uniform) init: only the variance matters for
        keeping activations in range, and uniform draws are ~2.4x faster than normal ones,
        which is most of the build time of a full-size GPT-2 (162M parameters).
        """
        arr = self.rng.random(tuple(shape), dtype=np.float32)
        arr -= np.float32(0.5)
        arr *= np.float32(std * math.sqrt(12.0))  # U(-1/2, 1/2) has variance 1/12
        if mean:
            arr += np.float32(mean)
        return self.init(name, arr)

    # --- nodes -----------------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], name: str, *, out: str | None = None,
           **attrs: object) -> str:
        """Add a one-output node; returns its output tensor's name (``out``, default ``name``)."""
        return self.op_multi(op_type, inputs, name, n_out=1, outs=[out] if out else None,
                             **attrs)[0]

    def op_multi(self, op_type: str, inputs: Sequence[str], name: str, *, n_out: int,
                 outs: Sequence[str] | None = None, **attrs: object) -> list[str]:
        """Add a node with ``n_out`` outputs (named ``outs``, default ``name_0``, ...)."""
        if name in self._node_names:
            raise ValueError(f"{self.name}: node name {name!r} used twice")
        self._node_names.add(name)
        if outs is None:
            outs = [name] if n_out == 1 else [f"{name}_{i}" for i in range(n_out)]
        if len(outs) != n_out:
            raise ValueError(f"{name}: {n_out} outputs, {len(outs)} names")
        for o in outs:
            self._claim_tensor(o)
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outs), name=name,
                                           **attrs))
        return list(outs)

    # --- model -----------------------------------------------------------------------------
    def model(self, doc: str = "", **meta: object) -> onnx.ModelProto:
        """The finished model (the builder must not be used afterwards)."""
        model = self._model
        graph = model.graph
        graph.name = self.name
        graph.doc_string = doc
        graph.node.extend(self.nodes)
        graph.input.extend(self.inputs)
        graph.output.extend(self.outputs)
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.producer_name = PRODUCER
        model.doc_string = doc
        model.ir_version = IR_VERSION
        meta = {"zoo_model": self.name, "seed": self.seed, **meta}
        helper.set_model_props(model, {k: str(v) for k, v in meta.items()})
        return model


# ----------------------------------------------------------------------------------------
# registry: modules are imported on first use (the model modules import this package)


@dataclass(frozen=True)
class _Entry:
    module: str
    func: str
    summary: str
    layers: str  # what `layers` means for this model, "" if it takes none


_REGISTRY: dict[str, _Entry] = {
    "mnist": _Entry(
        "cnn", "mnist",
        "MNIST CNN like ONNX model-zoo mnist-8 (the Collage RFC's example): 2x "
        "Conv/Add/Relu/MaxPool, Reshape, MatMul/Add; input 1x1x28x28; 11 nodes.", ""),
    "resnet18": _Entry(
        "cnn", "resnet18",
        "ResNet-18 (basic blocks, BN folded into Conv bias), GAP + Gemm; input 1x3xSxS "
        "(image_size, default 224).", "network depth: 18 or 34"),
    "resnet50": _Entry(
        "cnn", "resnet50",
        "ResNet-50 v1.5 (bottleneck blocks, stride on the 3x3, BN folded), GAP + Gemm; "
        "input 1x3xSxS.", "network depth: 50, 101 or 152"),
    "mobilenet_v2": _Entry(
        "cnn", "mobilenet_v2",
        "MobileNetV2 (inverted residuals, depthwise Conv group=C, Clip(0,6) as ReLU6); "
        "width_mult, image_size.", ""),
    "gpt2": _Entry(
        "transformer", "gpt2",
        "GPT-2 style decoder (pre-LN, causal mask, erf GELU), defaults GPT-2 small: 12 layers, "
        "width 768, 12 heads, vocab 50257, seq_len 64; input int64 input_ids [1, seq_len].",
        "number of decoder layers"),
    "bert": _Entry(
        "transformer", "bert",
        "BERT encoder (post-LN, erf GELU, pooler), defaults BERT-base: 12 layers, width 768, "
        "12 heads, vocab 30522, seq_len 128; input int64 input_ids [1, seq_len].",
        "number of encoder layers"),
    "random_dag": _Entry(
        "random_dag", "random_dag",
        "Random DAG of small float32 ops on [1, 8] tensors with fan-out, diamonds and several "
        "outputs (seed picks the graph; n_nodes default 24).", "number of nodes (n_nodes)"),
    # classes of real exports (`realclasses`): other opsets and IR versions on purpose
    **{name: _Entry("realclasses", name, summary, "") for name, summary in (
        ("qdq_mnist", "mnist quantized by onnxruntime.quantization.quantize_static, QDQ "
         "format (QuantizeLinear/DequantizeLinear around Conv and MatMul)."),
        ("dynquant_mnist", "mnist through onnxruntime.quantization.quantize_dynamic "
         "(DynamicQuantizeLinear, ConvInteger, MatMulInteger)."),
        ("qlinear_mnist", "mnist quantized by quantize_static, QOperator format (QLinearConv, "
         "QLinearMatMul, com.microsoft QLinearAdd)."),
        ("if_gate", "If with two bodies reading outer-scope tensors, a body initializer; "
         "opset 13, IR 7."),
        ("loop_rnn", "Loop with loop-carried state and a scan output, outer-scope reads; "
         "opset 11, IR 6."),
        ("scan_cumsum", "Scan over the sequence axis with an outer-scope read; opset 16."),
        ("lstm_tagger", "int64 token ids, embedding Gather, LSTM with initial_h/initial_c "
         "inputs; opset 14."),
        ("gru_speech", "GRU with an initial_h input and an int64 speaker id into a 2-row "
         "table; opset 12."),
        ("detector_fpn", "FPN detector head: Resize (computed sizes and scale 2), dynamic "
         "height/width (--shape image=1x3xHxW), six outputs; opset 11..17."),
        ("old_ir", "mnist at opset 12 saved as IR 6 (below what opset 12 needs)."),
        ("unused_domains", "mnist importing four domains no node uses."),
    )},
}


def names() -> list[str]:
    """The zoo's model names, sorted."""
    return sorted(_REGISTRY)


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownModelError(
            f"no zoo model named {name!r}; known models: {', '.join(names())}") from None


def _builder(name: str) -> Callable[..., onnx.ModelProto]:
    e = _entry(name)
    mod = importlib.import_module(f"{__name__}.{e.module}")
    return getattr(mod, e.func)


def _options(fn: Callable[..., onnx.ModelProto]) -> dict[str, object]:
    """A builder's options with their defaults, ``seed`` aside."""
    return {
        p.name: p.default for p in inspect.signature(fn).parameters.values()
        if p.name != "seed" and p.default is not inspect.Parameter.empty
    }


def describe(name: str) -> str:
    """One paragraph about a model: what it is, its options and their defaults."""
    e = _entry(name)
    fn = _builder(name)
    params = [f"{k}={v!r}" for k, v in _options(fn).items()]
    text = f"{name}: {e.summary}"
    if e.layers:
        text += f" layers = {e.layers}."
    return text + f" Options: {', '.join(params)}."


#: the deepest zoo transformer (GPT-3 has 96 layers) and the largest random DAG `build` makes
MAX_LAYERS = 128
MAX_NODES = 4096


def build(name: str, *, seed: int = 0, layers: int | None = None,
          **kw: object) -> onnx.ModelProto:
    """Build zoo model ``name`` with weights from ``seed``.

    ``layers`` sets the depth where a model has one (see `describe`); for ``random_dag`` it is
    the node count. Other keywords go to the model's builder (``image_size``, ``width``, ...);
    an option the model does not take raises `TypeError`.
    """
    e = _entry(name)
    fn = _builder(name)
    if layers is not None:
        if not e.layers:
            raise ValueError(f"zoo model {name!r} has a fixed depth; `layers` does not apply")
        top = MAX_NODES if name == "random_dag" else MAX_LAYERS
        if not 1 <= layers <= top:  # 100000 GPT-2 layers ran a 24 GiB machine out of memory
            raise ValueError(f"zoo model {name!r}: layers must be 1..{top}, not {layers}")
        kw["n_nodes" if name == "random_dag" else "layers"] = layers
    accepted = set(_options(fn))
    unknown = sorted(set(kw) - accepted)
    if unknown:
        raise TypeError(
            f"zoo model {name!r} takes no option {', '.join(unknown)}; it takes "
            f"{', '.join(sorted(accepted))} (and seed)")
    return fn(seed=seed, **kw)


def export(name: str, path: str | os.PathLike, *, seed: int = 0, layers: int | None = None,
           **kw: object) -> Path:
    """Build a zoo model and save it to ``path``; returns the path.

    Models whose weights exceed ~1.8 GB (protobuf's 2 GiB message limit) are saved with their
    initializers in one external data file beside the model, ``<file name>.data``, which
    `onnx.load` and `collage_farm.core.graph.load_graph` read back transparently.
    """
    model = build(name, seed=seed, layers=layers, **kw)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    if weight_bytes > EXTERNAL_DATA_THRESHOLD:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save(model, str(path))
    return path


__all__ = [
    "IR_VERSION",
    "OPSET",
    "GraphBuilder",
    "UnknownModelError",
    "build",
    "describe",
    "export",
    "names",
]
