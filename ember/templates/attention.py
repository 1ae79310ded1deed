"""Attention in row blocks: softmax(scale * Q @ K + mask) @ V as one kernel, the scores never leaving the cache.

The unfused graph writes the score matrix of every head ([*batch, M, N], 13.5 MB for Whisper's 6 heads of 750
frames) to memory, reads it back for the softmax, writes the probabilities and reads them again for the second
product: four passes over a tensor far larger than the caches. Here each block of `R` query rows is carried
through all three steps before the next one starts (the row-block form of flash attention; a whole row of scores
fits the cache, so the softmax needs no running rescale):

    for each batch index b, block of R rows:
        scores[R, Np]  = scale * Q[b, rows] @ K[b] + mask   register tiles of the GEMM template (K packed)
        m[R]           = row max of scores              the row template's vector partials and lane tree
        e[R, Np]       = exp(scores - m)                vector exps, whole vectors only
        l[R]           = row sum of e
        out[b, rows]   = (e @ V[b]) * (1 / l)           register tiles again, the normalization in the epilogue

The score row is padded to the panel width Np (a multiple of the vector lanes) with -inf: exp gives 0 there, so
the max, exp and sum run over whole vectors; the second product reduces over the N real columns only.
`attention_te` builds the stages; `schedule_attention` nests them in the block loop (parallel over blocks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ember import te
from ember.target import Target
from ember.te.tensor import ComputeOp, Reduce, Tensor, TensorLoad
from ember.templates import nn as T
from ember.tir import expr as E
from ember.tir.dtype import dtype as as_dtype
from ember.tir.functor import walk

ROW_MAX = te.comm_reducer(lambda a, b: te.if_then_else(a < b, b, a), te.max.identity, "att_row_max")
BLOCK_ROWS = 24  # query rows per block: two register tiles of 12 rows; scores + exps of 24 x 768 floats: 144 KiB
BLOCK_BYTES = 24 * 768 * 4 * 2  # ... the cache the scores and exps of a block may take: short rows take more rows


def attention_te(q: Tensor, k: Tensor, v: Tensor, scale: float = 1.0, bias: Tensor | None = None,
                 name: str = "attention") -> Tensor:  # fmt: skip
    """softmax(scale * q @ k + bias, last axis) @ v for q [*batch, M, D], k [*batch, D, N], v [*batch, N, Dv] of
    one float32 dtype and equal static batch dims, bias (a mask) broadcast to the scores [*batch, M, N]; the output
    [*batch, M, Dv] names the template "attention"."""
    *batch, M, D = q.shape
    N, Dv = v.shape[-2], v.shape[-1]
    batch = tuple(batch)
    dt = as_dtype(q.dtype)

    def same(bi):
        return tuple(bi)

    sacc = T.gemm_acc(batch, M, N, D, lambda bi, i, kk: q[tuple(bi) + (i, kk)],
                      lambda bb, kk, j: k[tuple(bb) + (kk, j)], batch, same, dt, name=f"{name}_s")  # fmt: skip
    Np = sacc.shape[-1]  # the panels' padded width: a whole number of vectors
    # -inf past column N, added (not selected: a select on the column splits off the last panel, which then
    # stores lane by lane); the padded panels' products are 0, so those scores become -inf
    pad = te.compute((Np,), lambda j: te.if_then_else(j < N, te.const(0.0, dt), te.const(float("-inf"), dt)),
                     name=f"{name}_pad", attrs={"materialize": True})  # fmt: skip

    def bias_at(idx):  # the mask's element for the scores' index idx (broadcast)
        return bias[tuple(te.const(0) if n == 1 else idx[len(idx) - len(bias.shape) + d]
                          for d, n in enumerate(bias.shape))]  # fmt: skip

    padded_bias = None
    if bias is not None and Np != N:
        # the mask copied per block into rows of Np with -inf past column N: the score tiles then add whole aligned
        # vectors (reading the mask in place, the panel across column N took a gather per vector and kept its
        # accumulators in memory: a third of Swin's window attention)
        padded_bias = T.row_buffer((*batch, M, Np), lambda *idx: te.if_then_else(
            idx[-1] < N, bias_at(idx), te.const(float("-inf"), dt)), f"{name}_bias")  # fmt: skip

    def score(*idx):
        s = sacc[idx]
        s = s * te.const(scale, dt) if scale != 1.0 else s
        if padded_bias is not None:
            return s + padded_bias[idx]
        if bias is not None:
            s = s + bias_at(idx)
        return s + pad[idx[-1]] if Np != N else s

    sc = te.compute((*batch, M, Np), score, name=f"{name}_scores", tag="attention_scores",
                    attrs={"materialize": True})  # fmt: skip
    rows = (*batch, M)
    mx = T.row_reduce(rows, Np, lambda r, l: sc[tuple(r) + (l,)], ROW_MAX, dt, f"{name}_max", acc=4)
    e = T.row_buffer((*batch, M, Np), lambda *i: te.exp(sc[i] - mx(i[:-1])), f"{name}_exp")
    total = T.row_reduce(rows, Np, lambda r, l: e[tuple(r) + (l,)], te.sum, dt, f"{name}_sum", acc=4)
    rcp = T.row_buffer(rows, lambda *r: te.const(1.0, dt) / total(r), f"{name}_rcp")
    oacc = T.gemm_acc(batch, M, Dv, N, lambda bi, i, kk: e[tuple(bi) + (i, kk)],
                      lambda bb, kk, j: v[tuple(bb) + (kk, j)], batch, same, dt, name=f"{name}_o")  # fmt: skip
    return te.compute((*batch, M, Dv), lambda *i: oacc[i] * rcp[i[:-1]], name=name,
                      attrs={"template": "attention", "acc": oacc, "scores": sc, "scores_acc": sacc,
                             "q": q})  # fmt: skip


def _prologue(st: te.Stage) -> bool:
    """A stage of the kernel's prologue at root that the attention may read in place (a transpose's tag is for
    its standalone tiles: here it is read in place like a reshape)."""
    op = st.op
    return st.attach == "root" and not st.is_placeholder and not st.is_output \
        and op.tag in ("", "transpose", "gather", "slice", "concat", "expand") \
        and not isinstance(op.body, Reduce) and not op.attrs.get("materialize")  # fmt: skip


def _computes(t: Tensor, s: te.Schedule, inlined: list) -> bool:
    """Whether reading an element of t does floating-point arithmetic or calls, through the stages read in place."""
    todo, seen = [t], set()
    while todo:
        t = todo.pop()
        if id(t.op) in seen or not isinstance(t.op, ComputeOp):
            continue
        seen.add(id(t.op))
        for n in walk(t.op.body):
            if n.dtype.is_float and (isinstance(n, E.BinOp) and n.op in E.ARITH_OPS or isinstance(n, E.Call)):
                return True
            if isinstance(n, TensorLoad) and s[n.tensor] in inlined:
                todo.append(n.tensor)
    return False


def _tile(s: te.Schedule, out: te.Stage, acc: Tensor, rows, cols, target: Target, tail: str = "guard"):
    """The GEMM template's register tile of `acc` (cache_write local) under `out`'s loops `rows` x `cols` (already
    restricted to a block): row tiles of mr, column panels of nr outside them, the accumulators' vectors unrolled.
    `tail`: how the row split treats a last partial tile (`Stage.split`). Returns the loop the tile is computed at."""
    plan = acc.op.attrs["plan"]
    lanes = T.lanes_of(acc.dtype, target)
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    io, ii = out.split(rows, plan.mr, tail=tail)
    jo, ji = out.split(cols, plan.nr)
    out.reorder(jo, io, ii, ji)
    jio, jii = out.split(ji, lanes)
    out.unroll(ii)
    out.unroll(jio)
    out.vectorize(jii)
    L = s[accl]
    *_, li, lj = L.op.axis
    (kax,) = L.op.reduce_axis
    ko, ki = L.split(kax, plan.kr)
    jco, jci = L.split(lj, lanes)
    L.reorder(ko, ki, li, jco, jci)
    L.vectorize(jci)
    L.unroll(jco)
    L.unroll(li)
    L.unroll(ki)
    L.compute_at(out, io)
    pb = acc.op.attrs.get("pack")
    if pb is not None:  # the packing stays at root: once per call, before the blocks, parallel over its panels
        P = s[pb]
        P.vectorize(P.op.axis[-1])
        lead = P.op.axis[:-2]
        if target.num_cores > 1:
            P.parallel(P.fuse(*lead) if len(lead) > 1 else lead[0])
    return io


def block_rows(mr_scores: int, mr_out: int, M: int | None = None, Np: int | None = None) -> int:
    """Query rows per block: about BLOCK_ROWS, a whole number of both products' row tiles (each block's last tile
    is otherwise a partial one computed whole: Swin's 49 rows in tiles of 10 took blocks of 24 as 3 x 10, and 1.8x
    the score rows), or of the output's tiles where the two tile heights have no common multiple near it. All M
    rows (static) where their scores and exps (padded rows of Np) fit BLOCK_BYTES: a window's 49 x 64 scores are
    one block (no partial block, no rows computed twice; the batch loop gives the parallel work)."""
    if M is not None and Np is not None and M * Np * 4 * 2 <= BLOCK_BYTES:
        return M
    both = math.lcm(mr_scores, mr_out)
    step = both if both <= 2 * BLOCK_ROWS else mr_out
    return step * max(1, round(BLOCK_ROWS / step))


def schedule_attention(attrs: dict, outs: Sequence[Tensor], target: Target) -> te.Schedule:
    """Block loop over (batch, R query rows), parallel when there are threads; in it the scores' register tiles,
    the row stages (max, exp, sum, reciprocal), then the output's register tiles."""
    (out,) = outs
    s = te.create_schedule(list(outs))
    a = out.op.attrs
    lanes = T.lanes_of(out.dtype, target)
    O = s[out]
    *b, i, j = O.op.axis
    M, Np = out.shape[-2], a["scores"].shape[-1]
    static = isinstance(M, int) and isinstance(Np, int)
    rows = min(block_rows(a["scores_acc"].op.attrs["plan"].mr, a["acc"].op.attrs["plan"].mr,
                          M if static else None, Np if static else None), te.size_hint(M))  # fmt: skip
    # static rows: partial blocks and tiles are shifted back to end at the last row (`tail="shift"`), so that every
    # register tile is whole: a guarded tile indexed its accumulators by the shift and kept them in memory (the
    # output product of Swin's 49-row windows ran at 10-16% of the roofline)
    tail = "shift" if static else "guard"
    io, ii = O.split(i, rows, tail="shift" if static and M % rows else "guard")
    O.reorder(*b, io, ii, j)
    _tile(s, O, a["acc"], ii, j, target, tail)
    S = s[a["scores"]]
    S.compute_at(O, io)
    *_, si, sj = S.op.axis
    _tile(s, S, a["scores_acc"], si, sj, target, tail)
    for st in s.stages:
        tag = st.op.tag if not st.is_placeholder else None
        if tag not in ("row_partial", "row_reduce", "row_buffer") or st.attach == "inline":
            continue
        st.compute_at(O, io)
        ax, shape = st.op.axis, st.op.shape
        if tag == "row_partial" and 1 < shape[-1] < lanes:  # a step of the lane tree: one narrower vector
            st.vectorize(ax[-1])
        elif tag == "row_partial" and shape[-1] % lanes == 0:
            lo, li = st.split(ax[-1], lanes)
            st.vectorize(li)
            if shape[-1] > lanes:  # several vectors of partials: independent chains
                st.reorder(*st.op.reduce_axis, lo, li)
                st.unroll(lo)
        elif tag == "row_buffer" and len(ax) == len(out.shape) and te.multiple_of(shape[-1], lanes):
            _, fi = st.split(ax[-1], lanes)
            st.vectorize(fi)
    prologue = [st for st in s.stages if _prologue(st)]
    q = a.get("q")
    keep = s[q] if q is not None and s[q] in prologue and _computes(q, s, prologue) else None
    for st in prologue:  # prologues fused into the kernel (the heads' reshapes and transposes, the gathers that
        # take q, k, v out of a stacked qkv, rotary embeddings): read in place; left at root they were serial copies
        if st is not keep:
            st.compute_inline()
    if keep is not None:
        # ... but a query computed (a rotary embedding: q cos + rotate(q) sin) is computed once, in vectors: read in
        # place, each register tile's broadcasts redid it for every column panel of the scores (LLaMA's attention
        # kernels 2.45 -> 2.01 ms)
        *lead, last = keep.op.axis
        if te.multiple_of(keep.op.shape[-1], lanes):
            last = keep.split(last, lanes)[1]
            keep.vectorize(last)
        if lead and target.num_cores > 1:
            keep.parallel(keep.fuse(*lead) if len(lead) > 1 else lead[0])
    if target.num_cores > 1:
        O.parallel(O.fuse(*b, io) if b else io)
    return s
