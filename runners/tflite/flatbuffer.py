"""Writing the TFLite flatbuffer with the schema modules ethos-u-vela ships."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runners.tflite.ir import _Builder
from runners.tflite.quant import _encode, _Encoded
from runners.tflite.result import ActivationBits, ConvertedModel, IOSpec, OpInfo

#: builtins whose first registered version in TFLite is above 1 (BROADCAST_TO starts at 2)
_MIN_VERSION = {"BROADCAST_TO": 2}


def _activation_bytes(conv: _Builder, tid: int) -> int:
    t = conv.tensors[tid]
    item = (conv.activations.value // 8) if conv.mode == "int8" else 4
    if t.kind in ("int32", "int64"):
        return 0
    if t.kind == "bias":
        return int(np.prod(t.shape)) * 4
    return int(np.prod(t.shape)) * item


def _serialise(conv: _Builder, q: Mapping[int, tuple[float, int]], write: bool = True
               ) -> ConvertedModel:
    """The flatbuffer of the emitted model (int8 parameters ``q``; empty in fp32 mode).

    Tables are written bottom-up in a fixed order (buffers, tensors, operator codes,
    operators, subgraph, model), so the same IR always gives the same bytes. ``write=False``
    skips the flatbuffer (``tflite`` is empty) and encodes only the graph's inputs and
    outputs: the I/O contract and the per-operator figures are the same, at a fraction of the
    cost (what a cycle model that never runs the bytes needs).
    """
    g = conv.g
    in_ids = [conv.by_name[n] for n in g.graph_inputs]
    out_ids = [conv.by_name[n] for n in g.graph_outputs]
    if write:
        data, enc_of = _write_flatbuffer(conv, q, in_ids, out_ids)
    else:
        data, enc_of = b"", {t: _encode(conv, t, q, {}) for t in (*in_ids, *out_ids)}

    def io(tid: int, name: str) -> IOSpec:
        e = enc_of[tid]
        return IOSpec(
            name=name, index=tid, onnx_shape=tuple(g.tensors[name].shape),
            tflite_shape=conv.tensors[tid].shape,
            dtype=(("int16" if conv.activations is ActivationBits.INT16 else "int8")
                   if conv.mode == "int8" else conv.tensors[tid].dtype),
            scale=float(e.scale[0]) if e.scale else 0.0,
            zero_point=int(e.zero_point[0]) if e.zero_point else 0,
        )

    ops = tuple(
        OpInfo(i, op.code, op.nodes, op.macs,
               sum(_activation_bytes(conv, t) for t in (*op.inputs, *op.outputs)),
               sum(_activation_bytes(conv, t) for t in op.outputs))
        for i, op in enumerate(conv.ops)
    )
    return ConvertedModel(
        tflite=data,
        mode=conv.mode,
        inputs=tuple(io(t, n) for t, n in zip(in_ids, g.graph_inputs)),
        outputs=tuple(io(t, n) for t, n in zip(out_ids, g.graph_outputs)),
        ops=ops,
    )


def _write_flatbuffer(conv: _Builder, q: Mapping[int, tuple[float, int]], in_ids: list[int],
                      out_ids: list[int]) -> tuple[bytes, Sequence[_Encoded]]:
    """The flatbuffer bytes and every tensor's encoding (indexed by tensor id)."""
    import flatbuffers  # heavy third-party (with ethos-u-vela's schema): only when writing

    # sized once, generously: growing the builder copies every weight byte again
    b = flatbuffers.Builder((1 << 20) + 64 * len(conv.tensors) + sum(
        (t.data.nbytes + 32 if t.data is not None else 0) for t in conv.tensors))
    weight_scales: dict[int, np.ndarray] = {}
    enc = [_encode(conv, i, q, weight_scales) for i in range(len(conv.tensors))]
    buffer_of, buf_offsets = _write_buffers(b, enc)
    tensor_offsets = _write_tensors(b, conv, enc, buffer_of)
    codes, code_offsets = _write_opcodes(b, conv)
    op_offsets = _write_operators(b, conv, codes)
    data = _write_model(b, conv, (tensor_offsets, op_offsets, code_offsets, buf_offsets),
                        in_ids, out_ids)
    return data, enc


def _i32_vec(b: Any, vals: Sequence[int]) -> int:
    return b.CreateNumpyVector(np.asarray(list(vals), dtype=np.int32))


def _byte_vec(b: Any, data: bytes | memoryview, align: int = 16) -> int:
    b.StartVector(1, len(data), align)
    b.head = b.head - len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return b.EndVector()


def _vec_of(b: Any, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _write_buffers(b: Any, enc: Sequence[_Encoded]) -> tuple[dict[int, int], list[int]]:
    """Buffer 0 is the empty sentinel, then one per constant tensor: (tensor -> buffer,
    buffer offsets)."""
    from ethosu.vela.tflite import Buffer

    buffer_of: dict[int, int] = {}
    buffer_data: list[bytes | memoryview | None] = [None]
    for i, e in enumerate(enc):
        if e.data is not None:
            buffer_of[i] = len(buffer_data)
            buffer_data.append(e.data)
    buf_offsets = []
    for data in buffer_data:
        dv = _byte_vec(b, data) if data else None
        Buffer.BufferStart(b)
        if dv is not None:
            Buffer.BufferAddData(b, dv)
        buf_offsets.append(Buffer.BufferEnd(b))
    return buffer_of, buf_offsets


def _write_tensors(b: Any, conv: _Builder, enc: Sequence[_Encoded],
                   buffer_of: Mapping[int, int]) -> list[int]:
    from ethosu.vela.tflite import QuantizationParameters, Tensor

    tensor_offsets = []
    for i, (t, e) in enumerate(zip(conv.tensors, enc)):
        name = b.CreateString(t.name)
        shape = _i32_vec(b, t.shape)
        qoff = None
        if e.scale:
            sv = b.CreateNumpyVector(np.asarray(e.scale, dtype=np.float32))
            zv = b.CreateNumpyVector(np.asarray(e.zero_point, dtype=np.int64))
            QuantizationParameters.QuantizationParametersStart(b)
            QuantizationParameters.QuantizationParametersAddScale(b, sv)
            QuantizationParameters.QuantizationParametersAddZeroPoint(b, zv)
            QuantizationParameters.QuantizationParametersAddQuantizedDimension(b, e.axis)
            qoff = QuantizationParameters.QuantizationParametersEnd(b)
        Tensor.TensorStart(b)
        Tensor.TensorAddShape(b, shape)
        Tensor.TensorAddType(b, e.ttype)
        Tensor.TensorAddBuffer(b, buffer_of.get(i, 0))
        Tensor.TensorAddName(b, name)
        if qoff is not None:
            Tensor.TensorAddQuantization(b, qoff)
        tensor_offsets.append(Tensor.TensorEnd(b))
    return tensor_offsets


def _write_opcodes(b: Any, conv: _Builder) -> tuple[list[str], list[int]]:
    """The builtin codes in first-use order, and their OperatorCode offsets."""
    from ethosu.vela.tflite import BuiltinOperator, OperatorCode

    codes: list[str] = []
    for op in conv.ops:
        if op.code not in codes:
            codes.append(op.code)
    code_offsets = []
    for c in codes:
        num = getattr(BuiltinOperator.BuiltinOperator, c)
        OperatorCode.OperatorCodeStart(b)
        OperatorCode.OperatorCodeAddDeprecatedBuiltinCode(b, min(num, 127))
        OperatorCode.OperatorCodeAddBuiltinCode(b, num)
        OperatorCode.OperatorCodeAddVersion(b, _MIN_VERSION.get(c, 1))
        code_offsets.append(OperatorCode.OperatorCodeEnd(b))
    return codes, code_offsets


def _write_operators(b: Any, conv: _Builder, codes: list[str]) -> list[int]:
    from ethosu.vela.tflite import BuiltinOptions, Operator

    op_offsets = []
    for op in conv.ops:
        opt_off = opt_type = None
        if op.options is not None:
            tname, fields = op.options
            mod = __import__(f"ethosu.vela.tflite.{tname}", fromlist=[tname])
            prepared = []
            for key, val in fields:
                if isinstance(val, list):
                    val = _i32_vec(b, val)
                prepared.append((key, val))
            getattr(mod, f"{tname}Start")(b)
            for key, val in prepared:
                getattr(mod, f"{tname}Add{key}")(b, val)
            opt_off = getattr(mod, f"{tname}End")(b)
            opt_type = getattr(BuiltinOptions.BuiltinOptions, tname)
        ins = _i32_vec(b, op.inputs)
        outs = _i32_vec(b, op.outputs)
        Operator.OperatorStart(b)
        Operator.OperatorAddOpcodeIndex(b, codes.index(op.code))
        Operator.OperatorAddInputs(b, ins)
        Operator.OperatorAddOutputs(b, outs)
        if opt_off is not None:
            Operator.OperatorAddBuiltinOptionsType(b, opt_type)
            Operator.OperatorAddBuiltinOptions(b, opt_off)
        op_offsets.append(Operator.OperatorEnd(b))
    return op_offsets


def _write_model(b: Any, conv: _Builder,
                 offsets: tuple[list[int], list[int], list[int], list[int]],
                 in_ids: list[int], out_ids: list[int]) -> bytes:
    """The one subgraph and the model around it; ``offsets``: (tensors, operators, operator
    codes, buffers). Returns the finished flatbuffer."""
    from ethosu.vela.tflite import Model, SubGraph

    tensor_offsets, op_offsets, code_offsets, buf_offsets = offsets
    tv = _vec_of(b, tensor_offsets)
    ov = _vec_of(b, op_offsets)
    iv = _i32_vec(b, in_ids)
    outv = _i32_vec(b, out_ids)
    sg_name = b.CreateString(conv.g.name or "main")
    SubGraph.SubGraphStart(b)
    SubGraph.SubGraphAddTensors(b, tv)
    SubGraph.SubGraphAddInputs(b, iv)
    SubGraph.SubGraphAddOutputs(b, outv)
    SubGraph.SubGraphAddOperators(b, ov)
    SubGraph.SubGraphAddName(b, sg_name)
    sg = SubGraph.SubGraphEnd(b)
    sgv = _vec_of(b, [sg])
    cv = _vec_of(b, code_offsets)
    bv = _vec_of(b, buf_offsets)
    desc = b.CreateString(f"collage-farm tflite_convert ({conv.mode})")
    Model.ModelStart(b)
    Model.ModelAddVersion(b, 3)
    Model.ModelAddOperatorCodes(b, cv)
    Model.ModelAddSubgraphs(b, sgv)
    Model.ModelAddDescription(b, desc)
    Model.ModelAddBuffers(b, bv)
    m = Model.ModelEnd(b)
    b.Finish(m, file_identifier=b"TFL3")
    # one copy of the used tail (`Builder.Output` slices, a copy, and `bytes` copies again:
    # seconds for a model of a few hundred MB)
    return bytes(memoryview(b.Bytes)[b.Head():])
