"""Recurrent layers: RNN, GRU, LSTM (ONNX gate orders, directions, sequence lengths, layouts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, one_of, op
from ember.ops.te_lib import NotLowerable, lowering
from ember.target import Target
from ember.templates.nn import schedule_nn

# activation name -> f(x, alpha, beta); alpha/beta default per ONNX when not given
ACTIVATIONS: dict[str, tuple[Callable, float | None, float | None]] = {
    "Relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "Tanh": (lambda x, a, b: np.tanh(x), None, None),
    "Sigmoid": (lambda x, a, b: 1 / (1 + np.exp(-x)), None, None),
    "Affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "LeakyRelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "ThresholdedRelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "ScaledTanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "HardSigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "Elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)), 1.0, None),
    "Softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "Softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}


def _attrs(extra: list[Attr]) -> list[Attr]:
    return [
        Attr("hidden_size", "int"), Attr("activations", "strs", ()), Attr("activation_alpha", "floats", ()),
        Attr("activation_beta", "floats", ()), Attr("clip", "float", None),
        Attr("direction", "str", "forward", **one_of("forward", "reverse", "bidirectional")),
        Attr("layout", "int", 0, **one_of(0, 1)),
    ] + extra  # fmt: skip


def _infer(kind: str):
    def infer(a: dict, x: TensorType, w: TensorType, r: TensorType, *rest) -> tuple[TensorType, ...]:
        dirs = 2 if a["direction"] == "bidirectional" else 1
        hidden = a["hidden_size"]
        if w.shape != (dirs, GATES[kind] * hidden, x.shape[-1]):
            raise ShapeError(f"{kind} W {w} does not match {dirs} direction(s), hidden {hidden}, input {x}")
        seq, batch = (x.shape[0], x.shape[1]) if a["layout"] == 0 else (x.shape[1], x.shape[0])
        y_shape = (seq, dirs, batch, hidden) if a["layout"] == 0 else (batch, seq, dirs, hidden)
        h_shape = (dirs, batch, hidden) if a["layout"] == 0 else (batch, dirs, hidden)
        states = 2 if kind == "LSTM" else 1
        return (x.with_shape(y_shape),) + (x.with_shape(h_shape),) * states

    return infer


def _activations(a: dict, kind: str, dirs: int) -> list[list[Callable]]:
    """Per direction, the activation functions bound to their alpha/beta."""
    names = list(a["activations"]) or list(DEFAULT_ACTS[kind]) * dirs
    alphas, betas = list(a["activation_alpha"]), list(a["activation_beta"])
    bound = []
    for name in names:
        fn, da, db = ACTIVATIONS[name]
        alpha = alphas.pop(0) if da is not None and alphas else da
        beta = betas.pop(0) if db is not None and betas else db
        bound.append(lambda x, fn=fn, alpha=alpha, beta=beta: fn(x, alpha, beta))
    per = len(names) // dirs
    return [bound[d * per : (d + 1) * per] for d in range(dirs)]


def _cell(kind: str, a: dict, acts: list[Callable], x, h, c, w, r, wb, rb, p) -> tuple:
    """One time step for the whole batch: returns (h, c)."""
    clip = a["clip"]
    cl = (lambda v: np.clip(v, -clip, clip)) if clip is not None else (lambda v: v)
    hidden = a["hidden_size"]
    gx = x @ w.T + wb
    if kind == "RNN":
        return acts[0](cl(gx + h @ r.T + rb)), c
    if kind == "GRU":
        f, g = acts
        rz = gx[:, : 2 * hidden] + h @ r[: 2 * hidden].T + rb[: 2 * hidden]
        z, rr = f(cl(rz[:, :hidden])), f(cl(rz[:, hidden:]))
        rh, rbh = r[2 * hidden :], rb[2 * hidden :]
        if a["linear_before_reset"]:
            cand = g(cl(gx[:, 2 * hidden :] + rr * (h @ rh.T + rbh)))
        else:
            cand = g(cl(gx[:, 2 * hidden :] + (rr * h) @ rh.T + rbh))
        return (1 - z) * cand + z * h, c
    f, g, hact = acts
    gates = gx + h @ r.T + rb
    i, o, fg, cc = (gates[:, k * hidden : (k + 1) * hidden] for k in range(4))
    pi, po, pf = (p[k * hidden : (k + 1) * hidden] for k in range(3))
    i = f(cl(i + pi * c))
    fg = 1 - i if a["input_forget"] else f(cl(fg + pf * c))
    c_new = fg * c + i * g(cl(cc))
    o = f(cl(o + po * c_new))
    return o * hact(c_new), c_new


def _run(kind: str, a: dict, x, w, r, b=None, lens=None, h0=None, c0=None, p=None) -> tuple[np.ndarray, ...]:
    dtype = x.dtype
    x = x.astype(np.float64)
    if a["layout"]:
        x = np.swapaxes(x, 0, 1)
        h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else np.swapaxes(c0, 0, 1)
    seq, batch = x.shape[:2]
    hidden = a["hidden_size"]
    dirs = 2 if a["direction"] == "bidirectional" else 1
    gh = GATES[kind] * hidden
    b = np.zeros((dirs, 2 * gh)) if b is None else b.astype(np.float64)
    lens = np.full(batch, seq) if lens is None else lens.astype(np.int64)
    y = np.zeros((seq, dirs, batch, hidden))
    hs, cs = np.zeros((dirs, batch, hidden)), np.zeros((dirs, batch, hidden))
    acts = _activations(a, kind, dirs)
    for d in range(dirs):
        reverse = a["direction"] == "reverse" or d == 1
        h = np.zeros((batch, hidden)) if h0 is None else h0[d].astype(np.float64)
        c = np.zeros((batch, hidden)) if c0 is None else c0[d].astype(np.float64)
        peep = np.zeros(3 * hidden) if p is None else p[d].astype(np.float64)
        for step in range(seq):
            active = step < lens
            t = np.where(active, lens - 1 - step, 0) if reverse else np.full(batch, step)
            xt = x[t, np.arange(batch)]
            h_new, c_new = _cell(kind, a, acts[d], xt, h, c, w[d].astype(np.float64), r[d].astype(np.float64),
                                 b[d, :gh], b[d, gh:], peep)  # fmt: skip
            h = np.where(active[:, None], h_new, h)
            c = np.where(active[:, None], c_new, c)
            y[t[active], d, np.arange(batch)[active]] = h[active]
        hs[d], cs[d] = h, c
    if a["layout"]:
        y, hs, cs = np.transpose(y, (2, 0, 1, 3)), np.swapaxes(hs, 0, 1), np.swapaxes(cs, 0, 1)
    outs = (y.astype(dtype), hs.astype(dtype))
    return outs + ((cs.astype(dtype),) if kind == "LSTM" else ())


@op("RNN", Pattern.OPAQUE, infer=_infer("RNN"), inputs=(3, 6), attrs=_attrs([]))
def rnn(a: dict, *args) -> tuple[np.ndarray, ...]:
    """Elman RNN: H = f(X W^T + H R^T + Wb + Rb)."""
    return _run("RNN", a, *args)


@op("GRU", Pattern.OPAQUE, infer=_infer("GRU"), inputs=(3, 6), attrs=_attrs([Attr("linear_before_reset", "int", 0)]))
def gru(a: dict, *args) -> tuple[np.ndarray, ...]:
    """GRU with gates z, r, h (ONNX order)."""
    return _run("GRU", a, *args)


@op("LSTM", Pattern.OPAQUE, infer=_infer("LSTM"), inputs=(3, 8), attrs=_attrs([Attr("input_forget", "int", 0)]))
def lstm(a: dict, *args) -> tuple[np.ndarray, ...]:
    """LSTM with gates i, o, f, c and optional peepholes (ONNX order)."""
    return _run("LSTM", a, *args)


# -- TE computes: the time loop unrolled, one set of stages per step and direction (the state of a step is
# read by the next step's recurrent matrix product, so each step's state is materialized). Stages grow with
# the steps, and so do lowering and C compile times (16 steps of a 128-wide LSTM: about 4 s); longer
# sequences run by reference. Lowering nests one allocation per stage, and Python's recursion limit
# stops it near 300 stages.
MAX_STEPS = 16  # steps x directions

TE_ACTIVATIONS: dict[str, Callable] = {
    "Relu": lambda x, a, b: te.maximum(x, te.const(0.0, x.dtype)),
    "Tanh": lambda x, a, b: te.tanh(x),
    "Sigmoid": lambda x, a, b: te.sigmoid(x),
    "Affine": lambda x, a, b: x * a + b,
    "LeakyRelu": lambda x, a, b: te.if_then_else(x >= 0.0, x, x * a),
    "ThresholdedRelu": lambda x, a, b: te.if_then_else(x > a, x, te.const(0.0, x.dtype)),
    "ScaledTanh": lambda x, a, b: te.tanh(x * b) * a,
    "HardSigmoid": lambda x, a, b: te.minimum(te.maximum(x * a + b, te.const(0.0, x.dtype)), te.const(1.0, x.dtype)),
    "Elu": lambda x, a, b: te.if_then_else(x >= 0.0, x, (te.exp(x) - 1.0) * a),
    "Softsign": lambda x, a, b: x / (te.abs(x) + 1.0),
    "Softplus": lambda x, a, b: (
        te.maximum(x, te.const(0.0, x.dtype)) + te.log(te.exp(te.const(0.0, x.dtype) - te.abs(x)) + 1.0)
    ),
}


def _compute(shape: tuple[int, ...], fn: Callable, name: str, attrs: dict | None = None) -> te.Tensor:
    """te.compute of a closure (whose default arguments bind loop values, not axes)."""
    return te.compute(shape, lambda *i: fn(*i), name=name, attrs=attrs)


def _te_activations(a: dict, kind: str, dirs: int) -> list[list[Callable]]:
    """Per direction, the activations as te functions (alpha/beta bound as `_activations` does)."""
    names = list(a["activations"]) or list(DEFAULT_ACTS[kind]) * dirs
    alphas, betas = list(a["activation_alpha"]), list(a["activation_beta"])
    bound = []
    for name in names:
        if name not in TE_ACTIVATIONS:
            raise NotLowerable(f"{kind} activation {name}")
        _, da, db = ACTIVATIONS[name]
        alpha = alphas.pop(0) if da is not None and alphas else da
        beta = betas.pop(0) if db is not None and betas else db
        bound.append(lambda x, fn=TE_ACTIVATIONS[name], alpha=alpha, beta=beta: fn(x, alpha, beta))
    per = len(names) // dirs
    return [bound[d * per : (d + 1) * per] for d in range(dirs)]


def _lower(kind: str, a: dict, x, w, r, b=None, lens=None, h0=None, c0=None, p=None) -> list:
    if not x.dtype.is_float:
        raise NotLowerable(f"{kind} on {x.dtype}")
    layout = a["layout"]
    seq, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    dirs = 2 if a["direction"] == "bidirectional" else 1
    if seq * dirs > MAX_STEPS:
        raise NotLowerable(f"{kind} over {seq} steps x {dirs} directions (the time loop is unrolled up to {MAX_STEPS})")
    hidden, dt = a["hidden_size"], x.dtype
    gh = GATES[kind] * hidden
    acts = _te_activations(a, kind, dirs)
    clip = a["clip"]
    zero = te.const(0.0, dt)

    def cl(v):
        return te.minimum(te.maximum(v, te.const(-clip, dt)), te.const(clip, dt)) if clip is not None else v

    def xin(t, bi, k):
        return x[(t, bi, k) if layout == 0 else (bi, t, k)]

    def state0(s, d):
        if s is None:
            return lambda bi, j: zero
        return lambda bi, j: s[(d, bi, j) if layout == 0 else (bi, d, j)]

    def bias(d, g, rec):
        return b[d, g + (gh if rec else 0)] if b is not None else zero

    finals, ys = [], []
    for d in range(dirs):
        f = acts[d]
        reverse = a["direction"] == "reverse" or d == 1
        h_prev, c_prev = state0(h0, d), state0(c0, d)
        steps = []
        for step in range(seq):

            def active(bi, step=step):
                return lens[bi] > step if lens is not None else te.const(True)

            def time(bi, step=step, reverse=reverse, active=active):
                if not reverse:
                    return te.const(step)
                if lens is None:
                    return te.const(seq - 1 - step)
                return te.if_then_else(active(bi), lens[bi] - 1 - step, te.const(0, lens.dtype))

            k = te.reduce_axis((0, x.shape[-1]), name="k")
            gx = _compute((batch, gh), lambda bi, g, d=d, time=time, k=k: te.sum(xin(time(bi), bi, k) * w[d, g, k],
                            axis=k), name=f"{kind.lower()}_x{d}_{step}")  # fmt: skip
            hp = _compute((batch, hidden), lambda bi, j, h_prev=h_prev: h_prev(bi, j), name=f"h{d}_{step}_prev",
                            attrs={"materialize": True})  # fmt: skip
            j_ = te.reduce_axis((0, hidden), name="j")
            ghr = _compute((batch, gh), lambda bi, g, d=d, hp=hp, j_=j_: te.sum(hp[bi, j_] * r[d, g, j_], axis=j_),
                             name=f"{kind.lower()}_h{d}_{step}")  # fmt: skip

            def gate(bi, g, gx=gx, ghr=ghr, d=d):  # x W^T + h R^T + both biases, gate row g
                return gx[bi, g] + ghr[bi, g] + bias(d, g, False) + bias(d, g, True)

            if kind == "RNN":
                h_new = lambda bi, j, gate=gate, f=f: f[0](cl(gate(bi, j)))  # noqa: E731
            elif kind == "GRU":
                h_new = _gru_cell(a, f, cl, gate, gx, hp, r, d, hidden, bias, dt, f"{d}_{step}")
            else:
                cs, h_new = _lstm_cell(a, f, cl, gate, c_prev, p, d, hidden, active, dt, (batch, hidden), f"{d}_{step}")
                c_prev = lambda bi, j, cs=cs: cs[bi, j]  # noqa: E731
            hs = _compute((batch, hidden), lambda bi, j, h_new=h_new, hp=hp, active=active: te.if_then_else(
                active(bi), h_new(bi, j), hp[bi, j]), name=f"h{d}_{step}", attrs={"materialize": True})  # fmt: skip
            h_prev = lambda bi, j, hs=hs: hs[bi, j]  # noqa: E731
            steps.append((hs, time, active))  # noqa: B023
        finals.append((h_prev, c_prev))
        ys.append(steps)

    def pick(k, options: list, lo: int = 0):
        """options[k - lo] for an index expression k: a balanced tree of selects (depth log2 n)."""
        if len(options) == 1:
            return options[0]
        mid = len(options) // 2
        return te.if_then_else(k < lo + mid, pick(k, options[:mid], lo), pick(k, options[mid:], lo + mid))

    def y(*i):
        t, d, bi, j = i if layout == 0 else (i[1], i[2], i[0], i[3])
        per_dir = []
        for dd, steps in enumerate(ys):  # the step that wrote time t: t, or counted from the sequence's end
            reverse = a["direction"] == "reverse" or dd == 1
            last = (lens[bi] - 1 if lens is not None else te.const(seq - 1)) if reverse else None
            step = last - t if reverse else t
            v = pick(step, [hs[bi, j] for hs, _, _ in steps])
            per_dir.append(te.if_then_else(t < lens[bi], v, zero) if lens is not None else v)
        return pick(d, per_dir)

    def final(which):
        def body(*i):
            d, bi, j = i if layout == 0 else (i[1], i[0], i[2])
            v = zero
            for dd, fin in enumerate(finals):
                v = te.if_then_else(d == dd, fin[which](bi, j), v)
            return v

        return body

    y_shape = (seq, dirs, batch, hidden) if layout == 0 else (batch, seq, dirs, hidden)
    h_shape = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    outs = [_compute(y_shape, y, name=f"{kind.lower()}_y"), _compute(h_shape, final(0), name=f"{kind.lower()}_yh")]
    if kind == "LSTM":
        outs.append(_compute(h_shape, final(1), name="lstm_yc"))
    return outs


def _gru_cell(a, f, cl, gate, gx, hp, r, d, hidden, bias, dt, tag):
    """z and r gates, then the candidate: r * (h R_h^T + Rb_h) (linear_before_reset) or (r * h) R_h^T."""
    z = lambda bi, j: f[0](cl(gate(bi, j)))  # noqa: E731
    rr = lambda bi, j: f[0](cl(gate(bi, hidden + j)))  # noqa: E731
    h3 = 2 * hidden
    if a["linear_before_reset"]:

        def cand(bi, j):
            rec = gate(bi, h3 + j) - gx[bi, h3 + j] - bias(d, h3 + j, False)  # h R_h^T + Rb_h
            return f[1](cl(gx[bi, h3 + j] + bias(d, h3 + j, False) + rr(bi, j) * rec))
    else:
        rh = _compute(hp.shape, lambda bi, j: rr(bi, j) * hp[bi, j], name=f"gru_rh{tag}", attrs={"materialize": True})
        k = te.reduce_axis((0, hidden), name="k")
        ghh = _compute(hp.shape, lambda bi, g: te.sum(rh[bi, k] * r[d, h3 + g, k], axis=k), name=f"gru_hh{tag}")

        def cand(bi, j):
            return f[1](cl(gx[bi, h3 + j] + bias(d, h3 + j, False) + ghh[bi, j] + bias(d, h3 + j, True)))

    return lambda bi, j: (te.const(1.0, dt) - z(bi, j)) * cand(bi, j) + z(bi, j) * hp[bi, j]


def _lstm_cell(a, f, cl, gate, c_prev, p, d, hidden, active, dt, shape, tag):
    """Gates i, o, f, c (ONNX order) with optional peepholes; returns (the cell state stage, h)."""

    def peep(k, c):
        return p[d, k * hidden + c[1]] * c[0] if p is not None else te.const(0.0, dt)

    def c_new(bi, j):
        c = c_prev(bi, j)
        i = f[0](cl(gate(bi, j) + peep(0, (c, j))))
        fg = te.const(1.0, dt) - i if a["input_forget"] else f[0](cl(gate(bi, 2 * hidden + j) + peep(2, (c, j))))
        return fg * c + i * f[1](cl(gate(bi, 3 * hidden + j)))

    cs = _compute(shape, lambda bi, j: te.if_then_else(active(bi), c_new(bi, j), c_prev(bi, j)), name=f"c{tag}",
                    attrs={"materialize": True})  # fmt: skip

    def h_new(bi, j):
        o = f[0](cl(gate(bi, hidden + j) + peep(1, (cs[bi, j], j))))
        return o * f[2](cs[bi, j])

    return cs, h_new


def _schedule(a: dict, outs: list, target: Target):
    """The default treatment without parallel loops: a step's stages are small and run one after
    another, and a fork/join per stage costs more than it saves."""
    return schedule_nn(a, outs, dataclasses.replace(target, threads=1))


for _kind in GATES:
    lowering(_kind, schedule=_schedule)(lambda a, *xs, _kind=_kind: _lower(_kind, a, *xs))
