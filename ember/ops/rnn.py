"""Recurrent layers: RNN, GRU, LSTM (ONNX gate orders, directions, sequence lengths, layouts)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, one_of, op

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
