"""NCHW -> NHWC: the one layout decision of the converter, for shapes, axes and weights.

Every rank-4 activation is held NHWC inside the TFLite model, converted once for the whole
sub-graph; tensors of other ranks keep their ONNX layout. So Conv weights become OHWI,
depthwise weights [1, H, W, C*M] (quantized_dimension 3), FC weights [out, in], constants of
rank-4 elementwise ops are permuted to NHWC at conversion time, and axes (Concat, Softmax, Pad,
Split, reductions) are remapped with `_NHWC_AXIS`. The graph inputs and outputs are NHWC too
(for rank 4); `IOSpec` transposes at the boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: TFLite axis j of an NHWC-held rank-4 tensor holds ONNX axis _NHWC_ORDER[j]
_NHWC_ORDER = (0, 2, 3, 1)
#: ONNX (NCHW) axis -> the axis that holds it in the NHWC-held tensor
_NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}


def _nhwc(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape a tensor of this ONNX shape is held in (NHWC for rank 4, else unchanged)."""
    s = tuple(shape)
    return (s[0], s[2], s[3], s[1]) if len(s) == 4 else s


def _layout_noop(onnx_shape: Sequence[int]) -> bool:
    """True when a rank-4 tensor has the same memory order in NCHW and NHWC."""
    nchw = [ax for ax in (0, 1, 2, 3) if onnx_shape[ax] != 1]
    nhwc = [ax for ax in _NHWC_ORDER if onnx_shape[ax] != 1]
    return nchw == nhwc


def _perm_nhwc(perm: Sequence[int]) -> tuple[int, ...]:
    """An ONNX rank-4 permutation expressed on NHWC-held tensors (input and output NHWC)."""
    q = _NHWC_ORDER  # TFLite axis j holds ONNX axis q[j]
    inv = {a: j for j, a in enumerate(q)}
    return tuple(inv[perm[q[j]]] for j in range(4))


def _conv_weights(w: np.ndarray, depthwise: bool) -> tuple[np.ndarray, int]:
    """ONNX Conv weights -> (TFLite weights, their per-channel axis).

    Dense: OIHW -> OHWI (axis 0). Depthwise: [C*M, 1, kh, kw] -> [1, kh, kw, C*M] (axis 3).
    """
    if depthwise:
        return w.transpose(1, 2, 3, 0), 3
    return w.transpose(0, 2, 3, 1), 0


def _transpose_conv_weights(w: np.ndarray) -> np.ndarray:
    """ONNX ConvTranspose weights [I, O, kh, kw] -> TFLite TRANSPOSE_CONV's [O, kh, kw, I]."""
    return np.ascontiguousarray(w.transpose(1, 2, 3, 0))


def _nhwc_const(arr: np.ndarray, out_rank: int) -> np.ndarray:
    """A constant operand of an elementwise op, broadcast-ranked to ``out_rank`` and held like
    the op's output (NHWC for rank 4)."""
    arr = arr.reshape((1,) * (out_rank - arr.ndim) + arr.shape)
    if out_rank == 4:
        arr = arr.transpose(0, 2, 3, 1)
    return arr
