"""Transformer zoo models: a GPT-2 style decoder and a BERT encoder, as plain ONNX ops.

The graphs are spelled out op by op the way ``torch.onnx.export`` writes them at opset 17
(``LayerNormalization``, MatMul + Add projections, Reshape/Transpose into heads, erf GELU as
Div/Erf/Add/Mul/Mul), not as fused ``Attention`` / ``Gelu`` contrib ops: Collage should find the
fusions itself, and every toolchain can read the result.

Repeated layers are *structurally identical*: the same op types, attributes, shapes and
topology in every layer, with shape vectors, scales and the causal mask shared as single
constants. Only weight values differ per layer. Collage fingerprints ignore weight values and
node names, so a candidate found in layer 3 has the fingerprint of the same candidate in layer
7, and one measurement serves all layers: the property the farm's cost table is built on.

Weights (seeded): projections into attention/MLP have std 1/sqrt(fan_in) so their outputs have
unit variance after LayerNorm (attention scores q.k/sqrt(d_head) are then ~N(0, 1): softmax is
neither uniform nor one-hot); GPT-2's residual-branch output projections are further damped by
1/sqrt(2 * layers) (GPT-2's own init rule) so the pre-LN residual stream stays bounded;
LayerNorm gains are 1 + N(0, 0.05^2). Logits come out with std ~1.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from collage_farm.zoo import GraphBuilder

LN_EPS_GPT2 = 1e-5
LN_EPS_BERT = 1e-12
MASK_VALUE = -10000.0  # GPT-2's original additive mask value: exp() underflows to 0, no inf


def _check_dims(name: str, layers: int, width: int, heads: int, vocab: int,
                seq_len: int) -> None:
    if min(layers, width, heads, vocab, seq_len) < 1:
        raise ValueError(f"{name}: layers, width, heads, vocab and seq_len must be >= 1")
    if width % heads:
        raise ValueError(f"{name}: width {width} is not divisible by heads {heads}")


class _Layers:
    """Builders for the pieces both models share; ``p`` is the node-name prefix."""

    def __init__(self, b: GraphBuilder, seq_len: int, width: int, heads: int) -> None:
        self.b, self.s, self.d, self.h = b, seq_len, width, heads
        self.dh = width // heads
        self.heads_shape = b.const("const/heads_shape", [1, seq_len, heads, self.dh], np.int64)
        self.merge_shape = b.const("const/merged_shape", [1, seq_len, width], np.int64)
        self.sqrt_dh = b.const("const/sqrt_head_dim", math.sqrt(self.dh))
        self.sqrt2 = b.const("const/sqrt2", math.sqrt(2.0))
        self.one = b.const("const/one", 1.0)
        self.half = b.const("const/half", 0.5)

    def layer_norm(self, x: str, p: str, eps: float, out: str | None = None) -> str:
        b = self.b
        g = b.param(f"{p}.weight", (self.d,), 0.05, mean=1.0)
        beta = b.param(f"{p}.bias", (self.d,), 0.02)
        return b.op("LayerNormalization", [x, g, beta], p, out=out, axis=-1, epsilon=eps)

    def linear(self, x: str, p: str, d_in: int, d_out: int, damp: float = 1.0) -> str:
        """MatMul with a [d_in, d_out] weight, then Add of the bias (as exports write it)."""
        b = self.b
        w = b.param(f"{p}.weight", (d_in, d_out), damp / math.sqrt(d_in))
        bias = b.param(f"{p}.bias", (d_out,), 0.02)
        y = b.op("MatMul", [x, w], f"{p}_matmul")
        return b.op("Add", [y, bias], f"{p}_add")

    def gelu(self, x: str, p: str) -> str:
        """x * 0.5 * (1 + erf(x / sqrt 2)) as Div, Erf, Add, Mul, Mul (torch's export)."""
        b = self.b
        y = b.op("Div", [x, self.sqrt2], f"{p}/gelu_div")
        y = b.op("Erf", [y], f"{p}/gelu_erf")
        y = b.op("Add", [y, self.one], f"{p}/gelu_add")
        y = b.op("Mul", [x, y], f"{p}/gelu_mul")
        return b.op("Mul", [y, self.half], f"{p}/gelu_mul_half")

    def split_heads(self, x: str, p: str, transpose_k: bool = False) -> str:
        """[1, S, D] -> [1, H, S, Dh] (or [1, H, Dh, S] for K, ready for Q @ K^T)."""
        b = self.b
        y = b.op("Reshape", [x, self.heads_shape], f"{p}_reshape")
        perm = [0, 2, 3, 1] if transpose_k else [0, 2, 1, 3]
        return b.op("Transpose", [y], f"{p}_transpose", perm=perm)

    def attention_core(self, q: str, k: str, v: str, p: str, mask: str | None) -> str:
        """softmax(Q K^T / sqrt(Dh) [+ mask]) V, heads merged back to [1, S, D]."""
        b = self.b
        s = b.op("MatMul", [q, k], f"{p}/scores_matmul")
        s = b.op("Div", [s, self.sqrt_dh], f"{p}/scores_scale")
        if mask is not None:
            s = b.op("Add", [s, mask], f"{p}/causal_mask_add")
        s = b.op("Softmax", [s], f"{p}/softmax", axis=-1)
        y = b.op("MatMul", [s, v], f"{p}/context_matmul")
        y = b.op("Transpose", [y], f"{p}/context_transpose", perm=[0, 2, 1, 3])
        return b.op("Reshape", [y, self.merge_shape], f"{p}/context_reshape")

    def positions(self) -> str:
        return self.b.const("const/position_ids", np.arange(self.s)[None, :], np.int64)


def gpt2(*, seed: int = 0, layers: int = 12, width: int = 768, heads: int = 12,
         vocab: int = 50257, seq_len: int = 64) -> onnx.ModelProto:
    """GPT-2 style decoder; defaults are GPT-2 small (124M parameters + untied LM head).

    ``input_ids`` int64 [1, seq_len] -> ``logits`` float32 [1, seq_len, vocab]. Per layer (31
    nodes, named ``layer{i}/...``): pre-LN attention (fused QKV MatMul+Add, Split, heads via
    Reshape/Transpose, scaled scores, constant causal mask Add, Softmax, context MatMul, merge,
    projection MatMul+Add, residual Add) and pre-LN MLP (MatMul+Add, erf GELU, MatMul+Add,
    residual Add). Embeddings: token and position ``Gather`` + Add; final LayerNorm and LM head
    MatMul (its own [width, vocab] weight). Total nodes: 31 * layers + 5.
    """
    _check_dims("gpt2", layers, width, heads, vocab, seq_len)
    b = GraphBuilder("gpt2", seed)
    L = _Layers(b, seq_len, width, heads)
    ids = b.input("input_ids", [1, seq_len], TensorProto.INT64)
    wte = b.param("wte.weight", (vocab, width), 0.5)
    wpe = b.param("wpe.weight", (seq_len, width), 0.2)
    tok = b.op("Gather", [wte, ids], "embed/token_gather", axis=0)
    pos = b.op("Gather", [wpe, L.positions()], "embed/position_gather", axis=0)
    h = b.op("Add", [tok, pos], "embed/add")
    causal = np.triu(np.full((seq_len, seq_len), MASK_VALUE, np.float32), k=1)
    mask = b.const("const/causal_mask", causal[None, None])
    split = b.const("const/qkv_split", [width] * 3, np.int64)
    damp = 1.0 / math.sqrt(2 * layers)
    for i in range(layers):
        p = f"layer{i}"
        x = L.layer_norm(h, f"{p}/ln_1", LN_EPS_GPT2)
        qkv = L.linear(x, f"{p}/attn/qkv", width, 3 * width)
        q, k, v = b.op_multi("Split", [qkv, split], f"{p}/attn/qkv_split", n_out=3, axis=-1)
        q = L.split_heads(q, f"{p}/attn/q")
        k = L.split_heads(k, f"{p}/attn/k", transpose_k=True)
        v = L.split_heads(v, f"{p}/attn/v")
        a = L.attention_core(q, k, v, f"{p}/attn", mask)
        a = L.linear(a, f"{p}/attn/proj", width, width, damp)
        h = b.op("Add", [h, a], f"{p}/attn_residual_add")
        x = L.layer_norm(h, f"{p}/ln_2", LN_EPS_GPT2)
        x = L.linear(x, f"{p}/mlp/fc", width, 4 * width)
        x = L.gelu(x, f"{p}/mlp")
        x = L.linear(x, f"{p}/mlp/proj", 4 * width, width, damp)
        h = b.op("Add", [h, x], f"{p}/mlp_residual_add")
    h = L.layer_norm(h, "ln_f", LN_EPS_GPT2)
    w = b.param("lm_head.weight", (width, vocab), 1.0 / math.sqrt(width))
    logits = b.op("MatMul", [h, w], "lm_head/matmul", out="logits")
    b.output(logits, [1, seq_len, vocab])
    return b.model("GPT-2 style decoder, seeded random weights", layers=layers, width=width,
                   heads=heads, vocab=vocab, seq_len=seq_len)


def bert(*, seed: int = 0, layers: int = 12, width: int = 768, heads: int = 12,
         vocab: int = 30522, seq_len: int = 128) -> onnx.ModelProto:
    """BERT encoder; defaults are BERT-base (110M parameters).

    ``input_ids`` int64 [1, seq_len] -> ``last_hidden_state`` [1, seq_len, width] and
    ``pooler_output`` [1, width]. Embeddings: word, position and token-type (all type 0)
    ``Gather``s, two Adds, LayerNorm. Per layer (33 nodes, ``layer{i}/...``), post-LN:
    separate Q, K, V MatMul+Add, heads via Reshape/Transpose, scaled scores, Softmax (no mask:
    one input, every token attends everywhere), context MatMul, merge, output MatMul+Add,
    residual Add, LayerNorm, MLP MatMul+Add, erf GELU, MatMul+Add, residual Add, LayerNorm.
    Pooler: Gather of token 0, Gemm, Tanh. Total nodes: 33 * layers + 9.
    """
    _check_dims("bert", layers, width, heads, vocab, seq_len)
    b = GraphBuilder("bert", seed)
    L = _Layers(b, seq_len, width, heads)
    ids = b.input("input_ids", [1, seq_len], TensorProto.INT64)
    word = b.param("embeddings/word.weight", (vocab, width), 0.5)
    posw = b.param("embeddings/position.weight", (seq_len, width), 0.2)
    typew = b.param("embeddings/token_type.weight", (2, width), 0.2)
    types = b.const("const/token_type_ids", np.zeros((1, seq_len)), np.int64)
    e = b.op("Gather", [word, ids], "embeddings/word_gather", axis=0)
    pe = b.op("Gather", [posw, L.positions()], "embeddings/position_gather", axis=0)
    te = b.op("Gather", [typew, types], "embeddings/token_type_gather", axis=0)
    e = b.op("Add", [e, pe], "embeddings/add_position")
    e = b.op("Add", [e, te], "embeddings/add_token_type")
    h = L.layer_norm(e, "embeddings/layer_norm", LN_EPS_BERT)
    for i in range(layers):
        p = f"layer{i}"
        q = L.split_heads(L.linear(h, f"{p}/attn/query", width, width), f"{p}/attn/q")
        k = L.split_heads(L.linear(h, f"{p}/attn/key", width, width), f"{p}/attn/k",
                          transpose_k=True)
        v = L.split_heads(L.linear(h, f"{p}/attn/value", width, width), f"{p}/attn/v")
        a = L.attention_core(q, k, v, f"{p}/attn", None)
        a = L.linear(a, f"{p}/attn/output", width, width)
        h = b.op("Add", [a, h], f"{p}/attn_residual_add")
        h = L.layer_norm(h, f"{p}/attn_layer_norm", LN_EPS_BERT)
        x = L.linear(h, f"{p}/mlp/intermediate", width, 4 * width)
        x = L.gelu(x, f"{p}/mlp")
        x = L.linear(x, f"{p}/mlp/output", 4 * width, width)
        h = b.op("Add", [x, h], f"{p}/mlp_residual_add")
        last = "last_hidden_state" if i == layers - 1 else None
        h = L.layer_norm(h, f"{p}/output_layer_norm", LN_EPS_BERT, out=last)
    b.output(h, [1, seq_len, width])
    first = b.const("const/first_token", 0, np.int64)
    cls = b.op("Gather", [h, first], "pooler/first_token_gather", axis=1)
    w = b.param("pooler/dense.weight", (width, width), 1.0 / math.sqrt(width))
    bias = b.param("pooler/dense.bias", (width,), 0.02)
    pooled = b.op("Gemm", [cls, w, bias], "pooler/dense", transB=1)
    pooled = b.op("Tanh", [pooled], "pooler/tanh", out="pooler_output")
    b.output(pooled, [1, width])
    return b.model("BERT encoder, seeded random weights", layers=layers, width=width,
                   heads=heads, vocab=vocab, seq_len=seq_len)
