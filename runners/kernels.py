"""Capability tables of the ONNX toolchains: which (domain, op) each takes, with which types.

Capabilities are tables, not imports: ORT's come from its CPU kernel registry (op type and the
element types its kernels accept, plus standard ops ORT runs through their ONNX function body),
OpenVINO's from probing its ONNX frontend op by op. Both were generated from the pinned versions
(onnxruntime 1.31.1, openvino 2026.4.1) by `ort_cpu_kernel_table` / `probe_openvino_ops`; a unit
test compares the ORT table with the installed registry so a version bump shows up.
`OnnxOpTableCapabilities` answers `Capabilities.why_not` from such a table; `runners.ort`,
`runners.openvino_cpu` and `runners.cuda` use it.
"""

from __future__ import annotations

import collections
import re
import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runners.base import Capabilities

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node

__all__ = [
    "OPENVINO_DTYPES",
    "OPENVINO_OPS",
    "ORT_CPU_KERNELS",
    "ORT_CPU_KERNELS_RAW",
    "ORT_DOMAINS",
    "TYPE_GROUPS",
    "OnnxOpTableCapabilities",
    "elem_type_name",
    "format_kernel_table",
    "ort_cpu_kernel_table",
    "probe_openvino_ops",
]

# ----------------------------------------------------------------------------------------
# capability tables

#: type groups used to keep the tables short
TYPE_GROUPS: dict[str, frozenset[str]] = {
    "FLOAT": frozenset({"float", "double", "float16", "bfloat16"}),
    "INT": frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}),
    "F8": frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"}),
    "LOWBIT": frozenset({"int4", "uint4", "int2", "uint2", "float4e2m1", "float8e8m0"}),
}
ORT_DOMAINS = ("", "ai.onnx.ml", "com.microsoft")

# onnxruntime 1.31.1 CPU EP: "Op=types" (element types any of its kernels accepts, plus the
# fixed types of its formal parameters; "*": no tensor types, e.g. sequence ops).
# Regenerate with: python -c "from runners.kernels import *; print(format_kernel_table(
#     ort_cpu_kernel_table()))"
_ORT_CPU_TEXT = {
    '': """
    Abs=INT,double,float Acos=float Acosh=float Add=INT,double,float Affine=float
    AffineGrid=double,float,int64 And=bool ArgMax=double,float,int32,int64,int8,uint8
    ArgMin=double,float,int32,int64,int8,uint8 Asin=float Asinh=float Atan=float Atanh=float
    Attention=bool,float,float16,int64 AveragePool=float BatchNormalization=double,float
    Bernoulli=FLOAT BitCast=FLOAT,INT BitShift=uint32,uint64,uint8 BitwiseAnd=INT BitwiseNot=INT
    BitwiseOr=INT BitwiseXor=INT BlackmanWindow=INT,double,float
    Cast=FLOAT,INT,F8,bool,float8e8m0,int2,int4,string,uint2,uint4 CastLike=FLOAT
    Ceil=double,float Celu=float CenterCropPad=FLOAT
    Clip=double,float,float16,int32,int64,int8,uint32,uint64,uint8 Col2Im=float,int64
    Compress=FLOAT,INT,bool,string Concat=FLOAT,INT,bool,string ConcatFromSequence=*
    ConstantOfShape=FLOAT,INT,F8,bool Conv=float ConvInteger=int32,int8,uint8
    ConvTranspose=float Cos=double,float Cosh=float Crop=float
    CumProd=double,float,int32,int64,uint32,uint64 CumSum=double,float,int32,int64
    DFT=double,float,int32,int64 DeformConv=double,float DepthToSpace=double,float,int8,uint8
    DequantizeLinear=F8,float,float16,int16,int2,int32,int4,int8,uint16,uint2,uint4,uint8
    Det=float Div=INT,double,float Dropout=bool,double,float,float16
    DynamicQuantizeLinear=float,uint8 DynamicSlice=FLOAT,INT,bool,string
    Einsum=double,float,int32,int64 Elu=float Equal=INT,bool,double,float,string Erf=float
    Exp=double,float Expand=INT,bool,double,float,float16,string
    EyeLike=double,float,int32,int64,uint64 Flatten=FLOAT,INT,bool,string Floor=double,float
    GRU=double,float,int32 Gather=FLOAT,INT,bool,string GatherElements=FLOAT,INT,bool,string
    GatherND=FLOAT,INT,bool,string Gelu=float Gemm=double,float GlobalAveragePool=float
    GlobalLpPool=float GlobalMaxPool=float Greater=INT,bool,double,float
    GreaterOrEqual=INT,bool,double,float GridSample=double,float GroupNormalization=FLOAT
    HammingWindow=INT,double,float HannWindow=INT,double,float HardSigmoid=float HardSwish=FLOAT
    Hardmax=float Identity=FLOAT,INT,F8,bool,string If=FLOAT,INT,F8,bool,string
    ImageScaler=float InstanceNormalization=float IsInf=FLOAT,F8,bool IsNaN=FLOAT,F8,bool
    LRN=float LSTM=double,float,int32 LayerNormalization=FLOAT LeakyRelu=float
    Less=INT,bool,double,float LessOrEqual=INT,bool,double,float Log=double,float
    LogSoftmax=double,float Loop=FLOAT,INT,F8,bool,string LpNormalization=double,float
    LpPool=float MatMul=double,float,int32,int64,uint32,uint64 MatMulInteger=int32,int8,uint8
    Max=double,float,float16,int32,int64,int8,uint32,uint64,uint8
    MaxPool=double,float,int64,int8,uint8 MaxRoiPool=float MaxUnpool=float,int64 Mean=float
    MeanVarianceNormalization=float MelWeightMatrix=INT,double,float
    MemcpyFromHost=FLOAT,INT,F8,bool MemcpyToHost=FLOAT,INT,F8,bool
    Min=double,float,float16,int32,int64,int8,uint32,uint64,uint8 Mish=FLOAT
    Mod=INT,double,float,float16 Mul=INT,double,float Multinomial=float,int32,int64
    Neg=double,float,int16,int32,int64,int8 NegativeLogLikelihoodLoss=FLOAT
    NonMaxSuppression=float,int64 NonZero=bool,float,int32,int64,uint8 Not=bool
    OneHot=float,int32,int64,string Optional=FLOAT,INT,bool,string
    OptionalGetElement=FLOAT,INT,bool,string OptionalHasElement=FLOAT,INT,bool,string Or=bool
    PRelu=float Pad=bool,double,float,int32,int64,int8,uint32,uint64,uint8
    ParametricSoftplus=float Pow=double,float,int32,int64 QLinearConv=float,int32,int8,uint8
    QLinearMatMul=float,int8,uint8
    QuantizeLinear=F8,float,float16,int16,int2,int4,int8,uint16,uint2,uint4,uint8
    RMSNormalization=double,float,float16 RNN=float,int32 RandomNormal=double,float
    RandomNormalLike=FLOAT,INT,bool,string RandomUniform=double,float
    RandomUniformLike=FLOAT,INT,bool,string Range=double,float,int16,int32,int64
    Reciprocal=double,float ReduceL1=double,float,int32,int64 ReduceL2=double,float,int32,int64
    ReduceLogSum=double,float,int32,int64 ReduceLogSumExp=double,float,int32,int64
    ReduceMax=bool,double,float,int32,int64,int8,uint8 ReduceMean=double,float,int32,int64
    ReduceMin=bool,double,float,int32,int64,int8,uint8 ReduceProd=double,float,int32,int64
    ReduceSum=double,float,int32,int64 ReduceSumSquare=double,float,int32,int64
    RegexFullMatch=bool,string Relu=double,float,int32,int8 Reshape=FLOAT,INT,F8,bool,string
    Resize=float,int32,int64,int8,uint8 ReverseSequence=FLOAT,INT,bool,string
    RoiAlign=double,float,int64 RotaryEmbedding=float,float16,int64 Round=double,float,float16
    STFT=double,float,int32,int64 Scale=float ScaledTanh=float Scan=FLOAT,INT,F8,bool,string
    Scatter=FLOAT,INT,bool,string ScatterElements=FLOAT,INT,bool,string
    ScatterND=FLOAT,INT,bool,string Selu=float SequenceAt=FLOAT,INT,bool,string
    SequenceConstruct=FLOAT,INT,bool,string SequenceEmpty=* SequenceErase=int32,int64
    SequenceInsert=int32,int64 SequenceLength=int64 SequenceMap=FLOAT
    Shape=FLOAT,INT,F8,bool,string Shrink=FLOAT,INT Sigmoid=double,float Sign=FLOAT,INT
    SimplifiedLayerNormalization=FLOAT Sin=double,float Sinh=float
    Size=INT,bool,double,float,string Slice=FLOAT,INT,bool,string Softmax=double,float
    SoftmaxCrossEntropyLoss=FLOAT Softplus=float Softsign=float
    SpaceToDepth=double,float,int8,uint8 Split=FLOAT,INT,bool,string
    SplitToSequence=bool,double,float,float16,int32,int64,string Sqrt=double,float
    Squeeze=FLOAT,INT,bool,string StringConcat=string StringNormalizer=string
    StringSplit=int64,string Sub=INT,double,float Sum=double,float Swish=FLOAT Tan=float
    Tanh=double,float TensorScatter=FLOAT,INT,bool TfIdfVectorizer=float,int32,int64,string
    ThresholdedRelu=float Tile=INT,bool,double,float,string
    TopK=double,float,int16,int32,int64,int8,uint8
    Transpose=FLOAT,INT,F8,bool,int2,int4,string,uint2,uint4 Trilu=bool,double,float,int32,int64
    Unique=double,float,int64,int8,string Unsqueeze=FLOAT,INT,bool,string
    Upsample=float,int32,int8,uint8 Where=double,float,int32,int64,int8,string,uint32,uint8
    Xor=bool
""",
    'ai.onnx.ml': """
    ArrayFeatureExtractor=double,float,int32,int64,string Binarizer=float
    CastMap=float,int64,string CategoryMapper=int64,string
    DictVectorizer=double,float,int64,string FeatureVectorizer=double,float,int32,int64
    Imputer=float,int64 LabelEncoder=double,float,int16,int64,string
    LinearClassifier=double,float,int32,int64,string LinearRegressor=float
    Normalizer=double,float,int32,int64 OneHotEncoder=double,float,int64,string
    SVMClassifier=double,float,int32,int64,string SVMRegressor=float
    Scaler=double,float,int32,int64 TreeEnsemble=double,float
    TreeEnsembleClassifier=double,float,int32,int64,string TreeEnsembleRegressor=double,float
    ZipMap=float
""",
    'com.microsoft': """
    Attention=float AttnLSTM=double,float,int32 BeamSearch=float BiasGelu=float
    BifurcationDetector=int64 BranchwiseRMSNorm=bfloat16,float,float16 CDist=double,float
    CausalConvWithState=float ConvTransposeWithDynamicPads=float,int64 CropAndResize=float,int32
    DecoderMaskedMultiHeadAttention=float
    DequantizeLinear=float,int16,int32,int4,int8,uint16,uint4,uint8
    DynamicQuantizeLSTM=float,int32,int8,uint8 DynamicQuantizeMatMul=float,int8,uint8
    DynamicTimeWarping=float,int32 EmbedLayerNormalization=float EngramGate=float,float16
    ExpandDims=FLOAT,INT,bool,string FastGelu=float FusedConv=float FusedGemm=float
    FusedMatMul=double,float GatedAdd=float,float16 GatedRMSNorm=float,float16
    GatherBlockQuantized=F8,float,float16,float4e2m1,int32,int4,int64,uint4,uint8
    GatherND=FLOAT,INT,bool,string Gelu=float GreedySearch=float GridSample=float
    GroupQueryAttention=float,float16,int32,int64,int8,uint8
    HyperConnectionPostMix=bfloat16,float,float16 HyperConnectionPreMix=bfloat16,float,float16
    Inverse=double,float,float16 LinearAttention=float LinearAttentionGate=float,float16
    MRotaryEmbedding=float,float16,int64 MatMulBnb4=float,uint8 MatMulFpQ4=float,int64,uint8
    MatMulInteger16=int16,int32 MatMulIntegerToFloat=float,int8,uint8
    MatMulNBits=float,float16,int32,uint8 MaxpoolWithMask=float,int32 MoE=float
    MultiHeadAttention=float MurmurHash3=double,float,int32,int64,string,uint32,uint64
    NGramHashMapping=int32,int64 NGramRepeatBlock=float,int64 NhwcMaxPool=int8,uint8
    Pad=float,int64 QAttention=float,int32,int8,uint8 QEmbedLayerNormalization=float
    QGemm=float,int32,int8,uint8 QLinearAdd=float,int8,uint8 QLinearAveragePool=float
    QLinearConcat=* QLinearConv=float,int32,int8,uint8 QLinearGlobalAveragePool=float
    QLinearLeakyRelu=float,int8,uint8 QLinearMul=float,int8,uint8
    QLinearSigmoid=float,int8,uint8 QLinearSoftmax=float,int8,uint8 QLinearWhere=int8,uint8
    QMoE=float,float16,uint8 QuantizeLinear=float,int16,int4,int8,uint16,uint4,uint8
    QuickGelu=float Range=double,float,int16,int32,int64 RotaryEmbedding=float,float16,int64
    SampleOp=float Sampling=float ScaledSiLU=bfloat16,float,float16 SkipLayerNormalization=FLOAT
    SkipSimplifiedLayerNormalization=FLOAT SparseAttention=float,float16,int32
    SparseToDenseMatMul=double,float,int32,int64,uint32,uint64 Tokenizer=string
    TransposeMatMul=float Trilu=double,float,int64 UnfoldTensor=FLOAT,INT,bool,string
    Unique=float,int64 VarlenNGramHashMapping=int32,int64 WhisperBeamSearch=float
    WordConvEmbedding=float,int32
""",
}

# openvino 2026.4.1 ONNX frontend: ops that convert (probed one by one with
# `probe_openvino_ops`; "Supported Version" columns of the frontend docs are not reliable).
_OPENVINO_TEXT = {
    "": """
    Abs Acos Acosh Add AffineGrid And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool
    BatchNormalization BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BlackmanWindow Cast
    CastLike Ceil Celu CenterCropPad Clip Col2Im Compress Concat ConcatFromSequence Constant
    ConstantOfShape Conv ConvInteger ConvTranspose Cos Cosh CumSum DFT DepthToSpace
    DequantizeLinear Div Dropout DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand EyeLike
    Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool
    GlobalMaxPool Greater GreaterOrEqual GridSample GroupNormalization HammingWindow HannWindow
    HardSigmoid HardSwish Hardmax Identity If InstanceNormalization IsInf IsNaN LRN LSTM
    LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LpNormalization LpPool
    MatMul MatMulInteger Max MaxPool MaxRoiPool Mean MeanVarianceNormalization Min Mish Mod Mul
    Multinomial Neg NegativeLogLikelihoodLoss NonMaxSuppression NonZero Not OneHot Or PRelu Pad
    Pow QLinearConv QLinearMatMul QuantizeLinear RMSNormalization RNN RandomNormal
    RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2
    ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
    ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign RotaryEmbedding Round STFT Scan
    Scatter ScatterElements ScatterND Selu SequenceAt SequenceConstruct SequenceEmpty
    SequenceErase SequenceInsert SequenceLength Shape Shrink Sigmoid Sign Sin Sinh Size Slice
    Softmax SoftmaxCrossEntropyLoss Softplus Softsign SpaceToDepth Split SplitToSequence Sqrt
    Squeeze Sub Sum Swish Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unique Unsqueeze
    Upsample Where Xor
    """,
    "ai.onnx.ml": "Normalizer",
    "com.microsoft": """
    Attention BiasAdd BiasGelu BifurcationDetector DequantizeLinear DynamicQuantizeLSTM
    DynamicQuantizeMatMul EmbedLayerNormalization FastGelu FusedConv FusedGemm FusedMatMul
    GatherBlockQuantized GatherND Gelu GroupNorm GroupQueryAttention MatMulIntegerToFloat
    MatMulNBits MultiHeadAttention Pad QLinearAdd QLinearAveragePool QLinearConcat
    QLinearLeakyRelu QLinearMul QLinearReduceMean QLinearSigmoid QLinearSoftmax QLinearWhere
    QuantizeLinear QuickGelu Range RotaryEmbedding SkipLayerNormalization
    SkipSimplifiedLayerNormalization Trilu
    """,
    "org.openvinotoolkit": """
    DeformableConv2D DetectionOutput FakeQuantize GenerateProposals GroupNorm Normalize PriorBox
    PriorBoxClustered Swish
    """,
}

#: element types OpenVINO's CPU plugin computes in (f64 runs as f32; strings/float8 do not run)
OPENVINO_DTYPES = frozenset(
    {"float", "float16", "bfloat16", "double", "int8", "int16", "int32", "int64", "uint8",
     "uint16", "uint32", "uint64", "bool"}
)


def _decode_types(text: str) -> frozenset[str] | None:
    if text == "*":
        return None
    out: set[str] = set()
    for tok in text.split(","):
        out |= TYPE_GROUPS.get(tok, {tok})
    return frozenset(out)


def _parse_kernel_text(tables: Mapping[str, str]) -> dict[tuple[str, str], frozenset[str] | None]:
    out: dict[tuple[str, str], frozenset[str] | None] = {}
    for dom, text in tables.items():
        for item in text.split():
            op, _, types = item.partition("=")
            out[(dom, op)] = _decode_types(types)
    return out


#: the registry as generated: (domain, op) -> element types of its kernels (None: not checked)
ORT_CPU_KERNELS_RAW = _parse_kernel_text(_ORT_CPU_TEXT)
#: what the CPU EP takes: ORT's InsertCastTransformer runs float16 nodes that lack an fp16
#: kernel in float32 behind inserted Casts, so float16 goes wherever float goes
ORT_CPU_KERNELS: dict[tuple[str, str], frozenset[str] | None] = {
    k: (v | {"float16"} if v is not None and "float" in v else v)
    for k, v in ORT_CPU_KERNELS_RAW.items()
}
#: ops OpenVINO converts but computes wrongly: com.microsoft QLinearAdd and QLinearMul wrap
#: around instead of saturating (openvino 2026.4.1: QLinearAdd(0, 0) with output zero point 120
#: gives 242 where ONNX Runtime gives 0), so a quantized mnist's logits came out wrong
_OPENVINO_WRONG = frozenset({("com.microsoft", "QLinearAdd"), ("com.microsoft", "QLinearMul")})
#: (domain, op) -> None (any of `OPENVINO_DTYPES`)
OPENVINO_OPS: dict[tuple[str, str], frozenset[str] | None] = {
    (dom, op): OPENVINO_DTYPES for dom, text in _OPENVINO_TEXT.items() for op in text.split()
    if (dom, op) not in _OPENVINO_WRONG
}


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


_ELEM_NAMES: dict[int, str] = {}


def elem_type_name(elem_type: int) -> str:
    """ONNX element type enum -> ORT's spelling ("float", "int64", "float8e4m3fn", ...)."""
    name = _ELEM_NAMES.get(elem_type)
    if name is None:
        import onnx

        try:
            name = onnx.TensorProto.DataType.Name(elem_type).lower()
        except ValueError:
            name = f"onnx{elem_type}"
        _ELEM_NAMES[elem_type] = name
    return name


class OnnxOpTableCapabilities(Capabilities):
    """Capabilities from an op table: (domain, op) -> accepted element types.

    A node is taken when its (domain, op type) is in the table and every input and output
    tensor of known type has an accepted element type. Custom domains are not in the tables,
    so they are unsupported.
    """

    style = "graph"

    def __init__(self, toolchain: str, table: Mapping[tuple[str, str], frozenset[str] | None]):
        self.toolchain = toolchain
        self.table = table

    def why_not(self, node: Node, graph: DataflowGraph) -> str | None:
        dom = _norm_domain(node.domain)
        key = (dom, node.op_type)
        if key not in self.table:
            where = f"{dom}." if dom else ""
            return f"{self.toolchain} has no implementation of {where}{node.op_type}"
        types = self.table[key]
        if types is None:
            return None
        for t in (*node.inputs, *node.outputs):
            info = graph.tensors.get(t) if t else None
            if info is None:
                continue
            name = elem_type_name(info.elem_type)
            if name not in types:
                return f"{self.toolchain} {node.op_type} does not take {name} ({t!r})"
        return None


# ----------------------------------------------------------------------------------------
# table generation (development tools; they import the heavy packages)


def ort_cpu_kernel_table(max_opset: int = 26) -> dict[tuple[str, str], frozenset[str]]:
    """Derive `ORT_CPU_KERNELS` from the installed onnxruntime's kernel registry."""
    import onnx
    import onnxruntime.capi.onnxruntime_pybind11_state as C

    def tensor_type(t: str) -> str | None:
        m = re.fullmatch(r"tensor\((\w+)\)", t)
        return m.group(1) if m else None

    table: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for k in C.get_all_opkernel_def():
        dom = _norm_domain(k.domain)
        if k.provider != "CPUExecutionProvider" or dom not in ORT_DOMAINS:
            continue
        s = table[(dom, k.op_name)]
        for types in k.type_constraints.values():
            s.update(x for x in map(tensor_type, types) if x)
    latest: dict[tuple[str, str], Any] = {}
    for sc in C.get_all_operator_schema():
        key = (_norm_domain(sc.domain), sc.name)
        if key[0] in ORT_DOMAINS and (key not in latest
                                      or sc.since_version > latest[key].since_version):
            latest[key] = sc
    for (dom, name) in latest:
        if dom or (dom, name) in table:
            continue
        try:  # standard ops without a kernel run through their function body
            osc = onnx.defs.get_schema(name, max_opset, "")
        except Exception:
            continue
        if osc.has_function or osc.has_context_dependent_function:
            table[(dom, name)] = set(TYPE_GROUPS["FLOAT"])
    for key, s in table.items():
        sc = latest.get(key)
        if sc is not None:
            for p in list(sc.inputs) + list(sc.outputs):
                t = tensor_type(p.typeStr)
                if t:
                    s.add(t)
    return {k: frozenset(v) for k, v in table.items()}


def _encode_types(types: frozenset[str] | None) -> str:
    if not types:
        return "*"
    s = set(types)
    toks = []
    for g, members in TYPE_GROUPS.items():
        if members <= s:
            toks.append(g)
            s -= members
    return ",".join(toks + sorted(s))


def format_kernel_table(table: Mapping[tuple[str, str], frozenset[str] | None]) -> str:
    """Source text for `_ORT_CPU_TEXT`."""
    out = []
    for dom in ORT_DOMAINS:
        items = sorted((op, _encode_types(t)) for (d, op), t in table.items() if d == dom)
        body = " ".join(f"{op}={enc}" for op, enc in items)
        lines = textwrap.wrap(body, 92, break_long_words=False, break_on_hyphens=False)
        out.append(f'    {dom!r}: """\n' + "\n".join("    " + ln for ln in lines) + '\n""",')
    return "{\n" + "\n".join(out) + "\n}"


def probe_openvino_ops(ops: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
    """Whether OpenVINO's ONNX frontend converts a one-node model of each (domain, op).

    Unknown ops become framework nodes under ``convert_partially``; an op whose converter
    exists but rejects the dummy float inputs counts as supported.
    """
    import os
    import tempfile

    import onnx
    from onnx import TensorProto, helper
    from openvino.frontend import FrontEndManager

    fe = FrontEndManager().load_by_framework("onnx")
    result: dict[tuple[str, str], bool] = {}
    for dom, op in ops:
        try:
            n_in = max(1, onnx.defs.get_schema(op, dom).min_input)
        except Exception:
            n_in = 1
        ins = [f"i{k}" for k in range(n_in)]
        node = helper.make_node(op, ins, ["o0"], domain=dom)
        g = helper.make_graph(
            [node], "probe",
            [helper.make_tensor_value_info(i, TensorProto.FLOAT, [1, 4]) for i in ins],
            [helper.make_tensor_value_info("o0", TensorProto.FLOAT, None)])
        imports = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(dom, 1)] if dom else [])
        m = helper.make_model(g, opset_imports=imports)
        m.ir_version = 10
        fd, path = tempfile.mkstemp(suffix=".onnx")
        os.close(fd)
        try:
            onnx.save(m, path)
            model = fe.convert_partially(fe.load(path))
            result[(dom, op)] = not any(
                "FrameworkNode" in o.get_type_name() for o in model.get_ops())
        except Exception:
            result[(dom, op)] = True
        finally:
            os.unlink(path)
    return result
