"""Random DAGs of small float32 ops: the stress test for sub-graph and search logic.

Real models are mostly chains with the odd residual diamond; the bugs in Collage-style code
(convexity, taps, exit counting, post-DFS indexing, multi-output nodes, dedup by fingerprint)
hide in the irregular cases. `random_dag` makes them common: every tensor is float32 [1, 8], so
any op can feed any other, operands are drawn from recent *and* old tensors (fan-out and
reconvergent paths, i.e. diamonds, appear in most graphs), ``Split`` makes multi-output nodes,
and graph outputs include "taps" (tensors that are also consumed inside the graph).

Guarantees, for every seed and ``n_nodes >= 1``:

* exactly ``n_nodes`` nodes; deterministic for a seed (only `numpy.random.default_rng(seed)`);
* every graph input is consumed and every node reaches a graph output (no dead code), every
  node depends on a graph input (no constant-only nodes);
* runs in ONNX Runtime with finite, non-degenerate outputs. While building, every tensor's
  values are simulated in numpy on a batch of N(0, 1) reference inputs (what tests feed), and
  it also carries a worst-case magnitude bound (inputs assumed |x| <= 4). An op is only placed
  if its result stays finite in the worst case (bound <= 1e30), has a typical magnitude
  (rms in [1e-3, 30]) and still depends on the input (not constant across samples); otherwise
  another op is tried, ending with ones that cannot fail (Max/Min of two tensors, Tanh).

Op units (one to three nodes): unary Relu / LeakyRelu / Sigmoid / Tanh / Abs / Neg / Softmax;
binary Add / Sub / Mul / Max / Min; MatMul with an [8, 8] weight; Concat -> MatMul [16, 8];
Concat -> (unary) -> Split into two [1, 8]; ReduceMean(keepdims) -> broadcast binary;
Reshape [1, 2, 4] -> Transpose -> Reshape [1, 8].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from collage_farm.zoo import GraphBuilder

WIDTH = 8
_INPUT_BOUND = 4.0  # worst-case |input| the finiteness guarantee assumes
_BOUND_CAP = 1e30  # float32 overflows at 3.4e38
_RMS_RANGE = (1e-3, 30.0)
_N_REF = 64  # reference samples simulated while building

_UNARY_FN = {
    "Relu": lambda x: np.maximum(x, 0),
    "LeakyRelu": lambda x: np.where(x > 0, x, 0.1 * x),
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": np.tanh,
    "Abs": np.abs,
    "Neg": np.negative,
    "Softmax": lambda x: (e := np.exp(x - x.max(-1, keepdims=True))) / e.sum(-1, keepdims=True),
}
_UNARY = tuple(_UNARY_FN)
_BOUNDED_UNARY = ("Sigmoid", "Tanh", "Softmax")
_BINARY_FN = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum,
}
_BINARY = tuple(_BINARY_FN)
# unit kind -> (node count, data operands, weight when drawing)
_UNITS = {
    "unary": (1, 1, 5),
    "binary": (1, 2, 6),
    "matmul": (1, 1, 3),
    "concat_matmul": (2, 2, 2),
    "concat_split": (2, 2, 2),
    "concat_act_split": (3, 2, 1),
    "reduce_mean": (2, 2, 2),
    "reshape_transpose": (3, 1, 1),
}
_NEVER = 1 << 30


def _unary_bound(op: str, b: float) -> float:
    return 1.0 if op in _BOUNDED_UNARY else b


def _binary_bound(op: str, b1: float, b2: float) -> float:
    if op in ("Add", "Sub"):
        return b1 + b2
    if op == "Mul":
        return b1 * b2
    return max(b1, b2)


def _acceptable(val: np.ndarray, bound: float) -> bool:
    """Finite in the worst case, of ordinary size, and still a function of the input."""
    if bound > _BOUND_CAP or not np.isfinite(val).all():
        return False
    rms = float(np.sqrt(np.mean(val.astype(np.float64) ** 2)))
    return _RMS_RANGE[0] <= rms <= _RMS_RANGE[1] and float(val.std(axis=0).max()) > 1e-4


@dataclass
class _State:
    b: GraphBuilder
    rng: np.random.Generator
    val: dict[str, np.ndarray] = field(default_factory=dict)  # simulated values [N_REF, ...]
    bound: dict[str, float] = field(default_factory=dict)  # worst-case |value|
    order: list[str] = field(default_factory=list)  # operand candidates, oldest first
    dangling_inputs: list[str] = field(default_factory=list)  # graph inputs not yet consumed
    dangling: list[str] = field(default_factory=list)  # node outputs not yet consumed
    produced: list[str] = field(default_factory=list)  # every [1, 8] node output
    count: int = 0

    def name(self, op: str) -> str:
        self.count += 1
        return f"n{self.count - 1}/{op.lower()}"

    def consume(self, *ts: str) -> None:
        for t in ts:
            if t in self.dangling_inputs:
                self.dangling_inputs.remove(t)
            if t in self.dangling:
                self.dangling.remove(t)

    def add(self, t: str, val: np.ndarray, bound: float) -> None:
        self.val[t] = val
        self.bound[t] = bound
        self.order.append(t)
        self.dangling.append(t)
        self.produced.append(t)

    def shuffled(self, options: tuple[str, ...]) -> list[str]:
        return [options[i] for i in self.rng.permutation(len(options))]

    def weight(self, rows: int) -> tuple[np.ndarray, float]:
        """A [rows, 8] Xavier-ish weight and its worst-case gain (max column abs-sum)."""
        w = (self.rng.standard_normal((rows, WIDTH)) / np.sqrt(rows)).astype(np.float32)
        return w, float(np.abs(w).sum(axis=0).max())

    def add_weight(self, w: np.ndarray) -> str:
        return self.b.init(f"w{len(self.b.initializers)}", w)


def _needed(n_dangling_inputs: int, n_dangling: int, n_outputs: int, merge: bool) -> int:
    """Fewest nodes that still consume every input and leave <= n_outputs dangling tensors.

    With binary ops (``merge``) each finishing node merges two pending tensors into one; with
    unary ops only, dangling tensors can never merge, so a unit must not create one too many.
    """
    if not merge:
        return n_dangling_inputs if n_dangling <= n_outputs else _NEVER
    return max(n_dangling_inputs + n_dangling - n_outputs, (n_dangling_inputs + 1) // 2, 0)


def _pick(st: _State, avoid: tuple[str, ...] = ()) -> str:
    """An operand: unconsumed inputs first, then dangling, recent or any older tensor."""
    rng = st.rng
    pool = [t for t in st.dangling_inputs if t not in avoid]
    if pool:
        return pool[int(rng.integers(len(pool)))]
    r = rng.random()
    if r < 0.35:
        pool = [t for t in st.dangling if t not in avoid]
    elif r < 0.7:
        pool = [t for t in st.order[-4:] if t not in avoid]
    else:
        pool = []
    if not pool:
        pool = [t for t in st.order if t not in avoid] or list(st.order)
    return pool[int(rng.integers(len(pool)))]


def _unary(st: _State, x: str, ops: tuple[str, ...] = _UNARY, force: str = "") -> bool:
    for op in st.shuffled(ops) + ([force] if force else []):
        val = _UNARY_FN[op](st.val[x])
        bound = _unary_bound(op, st.bound[x])
        if op != force and not _acceptable(val, bound):
            continue
        kw: dict[str, object] = {"alpha": 0.1} if op == "LeakyRelu" else {}
        if op == "Softmax":
            kw["axis"] = -1
        st.add(st.b.op(op, [x], st.name(op), **kw), val, bound)
        st.consume(x)
        return True
    return False


def _binary(st: _State, x: str, y: str, ops: tuple[str, ...] = _BINARY,
            force: str = "") -> bool:
    """``op(x, y)``; ``y`` may be a [1, 1] tensor (broadcast)."""
    for op in st.shuffled(ops) + ([force] if force else []):
        if op == "Sub" and x == y:
            continue  # x - x = 0
        val = _BINARY_FN[op](st.val[x], st.val[y])
        bound = _binary_bound(op, st.bound[x], st.bound[y])
        if op != force and not _acceptable(val, bound):
            continue
        st.add(st.b.op(op, [x, y], st.name(op)), val, bound)
        st.consume(x, y)
        return True
    return False


def _run_unit(st: _State, kind: str, ops: list[str]) -> bool:
    """Add one unit reading ``ops``; False (nothing added) if no variant is acceptable."""
    b = st.b
    if kind == "unary":
        return _unary(st, ops[0])
    if kind == "binary":
        return _binary(st, ops[0], ops[1])
    if kind == "matmul":
        (x,) = ops
        wv, gain = st.weight(WIDTH)
        val, bound = st.val[x] @ wv, st.bound[x] * gain
        if not _acceptable(val, bound):
            return False
        st.add(b.op("MatMul", [x, st.add_weight(wv)], st.name("MatMul")), val, bound)
        st.consume(x)
        return True
    if kind == "reshape_transpose":
        (x,) = ops
        val = st.val[x].reshape(-1, 2, WIDTH // 2).transpose(0, 2, 1).reshape(-1, WIDTH)
        s3 = b.const("const/shape_1_2_4", [1, 2, WIDTH // 2], np.int64)
        s2 = b.const("const/shape_1_8", [1, WIDTH], np.int64)
        r = b.op("Reshape", [x, s3], st.name("Reshape"))
        t = b.op("Transpose", [r], st.name("Transpose"), perm=[0, 2, 1])
        st.add(b.op("Reshape", [t, s2], st.name("Reshape")), val, st.bound[x])
        st.consume(x)
        return True
    x, y = ops
    if kind == "reduce_mean":
        mval = st.val[x].mean(axis=1, keepdims=True)
        plan = [op for op in st.shuffled(("Sub", "Add", "Mul"))
                if _acceptable(_BINARY_FN[op](st.val[y], mval),
                               _binary_bound(op, st.bound[y], st.bound[x]))]
        if not plan:
            return False
        m = b.op("ReduceMean", [x], st.name("ReduceMean"), axes=[1], keepdims=1)
        st.val[m], st.bound[m] = mval, st.bound[x]  # [1, 1]: used at once, never an operand
        st.consume(x)
        return _binary(st, y, m, ops=(plan[0],))
    cval = np.concatenate([st.val[x], st.val[y]], axis=1)
    cbound = max(st.bound[x], st.bound[y])
    if kind == "concat_matmul":
        wv, gain = st.weight(2 * WIDTH)
        val, bound = cval @ wv, cbound * gain
        if not _acceptable(val, bound):
            return False
        c = b.op("Concat", [x, y], st.name("Concat"), axis=1)
        st.add(b.op("MatMul", [c, st.add_weight(wv)], st.name("MatMul")), val, bound)
        st.consume(x, y)
        return True
    act = ""
    if kind == "concat_act_split":
        for op in st.shuffled(("Softmax", "Tanh", "Relu")):
            v = _UNARY_FN[op](cval)
            bnd = _unary_bound(op, cbound)
            if all(_acceptable(h, bnd) for h in (v[:, :WIDTH], v[:, WIDTH:])):
                act, cval, cbound = op, v, bnd
                break
        else:
            return False
    c = b.op("Concat", [x, y], st.name("Concat"), axis=1)
    if act:
        c = b.op(act, [c], st.name(act), **({"axis": -1} if act == "Softmax" else {}))
    split = b.const("const/split_8_8", [WIDTH, WIDTH], np.int64)
    halves = b.op_multi("Split", [c, split], st.name("Split"), n_out=2, axis=1)
    st.consume(x, y)
    st.add(halves[0], cval[:, :WIDTH], cbound)
    st.add(halves[1], cval[:, WIDTH:], cbound)
    return True


def _effect(st: _State, kind: str, ops: list[str]) -> tuple[int, int]:
    """(dangling inputs, dangling node outputs) after a unit, without building it."""
    di = len([t for t in st.dangling_inputs if t not in ops])
    do = len([t for t in st.dangling if t not in ops])
    return di, do + (2 if kind in ("concat_split", "concat_act_split") else 1)


def random_dag(seed: int = 0, n_nodes: int = 24, *, max_inputs: int = 2,
               n_graph_inputs: int | None = None, n_outputs: int | None = None
               ) -> onnx.ModelProto:
    """A random DAG of exactly ``n_nodes`` float32 ops on [1, 8] tensors.

    ``n_graph_inputs`` and ``n_outputs`` default to a seeded draw from 1..3 (inputs are capped
    at ``n_nodes``). ``max_inputs`` is the most data operands one node reads: 1 gives a tree
    of unary / MatMul / Reshape units from one input (its leaves, at most ``n_outputs``, are
    the outputs); 2, the default, adds binary ops, Concat, Split and diamonds (larger values
    behave like 2: no unit reads more than two tensors). Inputs are
    ``x0``, ``x1``, ...; outputs are the unconsumed tensors plus, to reach ``n_outputs``,
    random tapped intermediates. Node names are ``n{k}/{op}``.
    """
    if n_nodes < 1:
        raise ValueError(f"random_dag: n_nodes must be >= 1, got {n_nodes}")
    if max_inputs < 1:
        raise ValueError(f"random_dag: max_inputs must be >= 1, got {max_inputs}")
    rng = np.random.default_rng(seed)
    n_in = int(rng.integers(1, 4)) if n_graph_inputs is None else n_graph_inputs
    n_out = int(rng.integers(1, 4)) if n_outputs is None else n_outputs
    if n_in < 1 or n_out < 1:
        raise ValueError("random_dag: n_graph_inputs and n_outputs must be >= 1")
    merge = max_inputs >= 2
    n_in = min(n_in, n_nodes) if merge else 1  # unary-only: a 2nd input could never join

    b = GraphBuilder("random_dag", seed)
    st = _State(b, rng)
    for i in range(n_in):
        x = b.input(f"x{i}", [1, WIDTH])
        st.val[x] = rng.standard_normal((_N_REF, WIDTH)).astype(np.float32)
        st.bound[x] = _INPUT_BOUND
        st.order.append(x)
        st.dangling_inputs.append(x)

    kinds = [k for k, (_, n_ops, _) in _UNITS.items() if merge or n_ops == 1]
    p = np.array([_UNITS[k][2] for k in kinds], dtype=np.float64)
    p /= p.sum()
    remaining = n_nodes
    while remaining > 0:
        need = _needed(len(st.dangling_inputs), len(st.dangling), n_out, merge)
        placed = False
        for _ in range(4 if remaining > need else 0):
            kind = kinds[int(rng.choice(len(kinds), p=p))]
            size, n_ops, _ = _UNITS[kind]
            if size > remaining:
                continue
            ops = [_pick(st)]
            if n_ops == 2:
                ops.append(_pick(st, avoid=tuple(ops)))
            if remaining - size < _needed(*_effect(st, kind, ops), n_out, merge):
                continue
            if _run_unit(st, kind, ops):
                remaining -= size
                placed = True
                break
        if placed:
            continue
        # finishing step: one node that lowers `need` by exactly one (or keeps it at 0)
        pending = st.dangling_inputs + st.dangling
        if len(pending) >= 2 and merge:
            # x is the oldest pending tensor (an input while any is unconsumed); with two or
            # more inputs pending, y must be one too, or `need` is not lowered (seed 840328)
            rest = st.dangling_inputs[1:] if len(st.dangling_inputs) >= 2 else pending[1:]
            x, y = pending[0], rest[int(rng.integers(len(rest)))]
            _binary(st, x, y, force="Max")
        else:
            _unary(st, pending[0] if pending else st.order[-1], force="Tanh")
        remaining -= 1

    assert not st.dangling_inputs and len(st.dangling) <= n_out, "random_dag bookkeeping"
    outputs = list(st.dangling)
    taps = [t for t in st.produced if t not in outputs]
    extra = min(n_out - len(outputs), len(taps))
    if extra > 0:
        outputs += [taps[i] for i in sorted(rng.choice(len(taps), extra, replace=False))]
    for t in outputs:
        b.output(t, [1, WIDTH])
    return b.model(f"random DAG, seed {seed}, {n_nodes} nodes", n_nodes=n_nodes)
