"""Operators of the blocked layout NCHW[x]c, made by the ConvertLayout pass (`ember.passes.layout`).

A layout is a string of axes: upper case letters are whole (primal) axes, a lower case letter with a
factor is a block of its primal axis, innermost where it stands. "NCHW16c" is [N, C/16, H, W, 16],
channel c of pixel (h, w) at [n, c // 16, h, w, c % 16]; "OIHW16i16o" packs convolution weights as
[O/16, I/16, H, W, 16 (i), 16 (o)].

- `LayoutTransform(src_layout, dst_layout)`: the same tensor in another layout (injective; on a
  constant, such as weights, it is folded at compile time).
- `ConvNCHWc`: 2-d convolution of x [N, C/cb, H, W, cb] with packed weights [K/kb, C/cb, KH, KW, cb,
  kb] (`group` 1), or depthwise with weights [C/kb, 1, KH, KW, 1, kb] (`group` = C = K, cb = kb),
  or grouped with whole channel blocks per group, weights [K/kb, C/group/cb, KH, KW, cb, kb], or with groups
  narrower than a block (g = C/group = K/group channels each, cb = kb a multiple of g: RegNet's width-8 groups
  in blocks of 16), weights [K/kb, 1, KH, KW, g, kb]; and a bias [K]; output [N, K/kb, OH, OW, kb].
- `PoolNCHWc(mode="max"|"avg", ...)` and `GlobalPoolNCHWc(mode)`: MaxPool/AveragePool and
  GlobalAveragePool/GlobalMaxPool on [N, C/c, H, W, c] (the ONNX attributes of those ops).
- `ConcatInPlace(axis)`: a Concat whose inputs their producers write straight into the output
  (`ember.passes.inplace`; no kernel on CPUs); `ChannelShuffle(group)`: ShuffleNet's channel shuffle
  of an NCHW tensor as one op (a plane copy per channel); `ChannelShuffleNCHWc(group, block)`: the same
  of blocked inputs (each in its own block) into a blocked output, one copy with a block's lanes unrolled
  over a loop of pixels.

References convert to NCHW, call the NCHW operator's reference and convert back. Computes use the
templates of `ember.templates.nchwc`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, spatial_attrs, window_out_dim
from ember.ops.conv import CONV_ATTRS, conv
from ember.ops.opdef import Attr, Pattern, get_op, one_of, op
from ember.ops.pool import (
    POOL_ATTRS,
    average_pool,
    global_average_pool,
    global_max_pool,
    max_pool,
    pool_dims,
    window_count,
)
from ember.ops.te_lib import NotLowerable, lowering, rows
from ember.target import Target
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import nchwc as B
from ember.templates import nn as T
from ember.templates.flat import default_schedule, schedule_injective, standalone
from ember.tir.expr import Expr


# -- layouts --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Axes in memory order: (letter, factor), factor 0 for a primal (upper case) axis."""

    axes: tuple[tuple[str, int], ...]

    @staticmethod
    def parse(text: str) -> Layout:
        parts = re.findall(r"(\d*)([A-Za-z])", text)
        if "".join(n + a for n, a in parts) != text or not parts:
            raise ValueError(f"layout {text!r}: expected letters, each lower case one after its block size")
        axes = []
        for num, letter in parts:
            if letter.isupper() != (num == ""):
                raise ValueError(f"layout {text!r}: {num}{letter}: upper case axes take no size, blocks need one")
            if letter.islower() and int(num) < 1:
                raise ValueError(f"layout {text!r}: block {num}{letter} must be at least 1")
            axes.append((letter, int(num) if num else 0))
        letters = [a for a, _ in axes]
        if len(set(letters)) != len(letters):
            raise ValueError(f"layout {text!r} names an axis twice")
        if any(a.islower() and a.upper() not in letters for a in letters):
            raise ValueError(f"layout {text!r}: a block without its axis")
        return Layout(tuple(axes))

    def __str__(self) -> str:
        return "".join(f"{f}{a}" if f else a for a, f in self.axes)

    def primal(self) -> list[str]:
        return [a for a, f in self.axes if not f]

    def block(self, primal: str) -> int:
        """The block size of a primal axis (1 when it is not blocked)."""
        return next((f for a, f in self.axes if a == primal.lower()), 1)

    def pos(self, letter: str) -> int:
        return [a for a, _ in self.axes].index(letter)


def _layouts(a: dict) -> tuple[Layout, Layout]:
    src, dst = Layout.parse(a["src_layout"]), Layout.parse(a["dst_layout"])
    if sorted(src.primal()) != sorted(dst.primal()):
        raise ShapeError(f"LayoutTransform {src} -> {dst}: the layouts have different axes")
    return src, dst


def full_extents(layout: Layout, shape: tuple[int, ...]) -> dict[str, int]:
    """Extent of each primal axis of a tensor of `shape` in `layout`."""
    if len(shape) != len(layout.axes):
        raise ShapeError(f"layout {layout} has {len(layout.axes)} axes, the tensor has shape {list(shape)}")
    for (a, f), n in zip(layout.axes, shape):
        if f and n != f:
            raise ShapeError(f"layout {layout}: axis {f}{a} has extent {n}, not {f}")
    return {a: shape[layout.pos(a)] * layout.block(a) if layout.block(a) != 1 else shape[layout.pos(a)]
            for a in layout.primal()}  # fmt: skip


def transformed_shape(src: Layout, dst: Layout, shape: tuple[int, ...]) -> tuple[int, ...]:
    full = full_extents(src, shape)
    out = []
    for a, f in dst.axes:
        if f:
            out.append(f)
            continue
        if dst.block(a) == 1:  # an unblocked axis keeps its extent (symbolic ones too)
            out.append(full[a])
            continue
        if full[a] % dst.block(a):
            raise ShapeError(f"layout {dst}: axis {a} of extent {full[a]} does not split in blocks of {dst.block(a)}")
        out.append(full[a] // dst.block(a))
    return tuple(out)


def _has_block(layout: Layout, primal: str) -> bool:
    return any(a == primal.lower() for a, _ in layout.axes)


def _to_primal(layout: Layout, x: np.ndarray, order: list[str]) -> np.ndarray:
    """x in `layout` as an array of the primal axes in `order` (blocks merged into their axes)."""
    perm, shape = [], []
    for a in order:
        perm += [layout.pos(a), layout.pos(a.lower())] if _has_block(layout, a) else [layout.pos(a)]
        shape.append(x.shape[layout.pos(a)] * layout.block(a))
    return x.transpose(perm).reshape(shape)


def _from_primal(layout: Layout, x: np.ndarray, order: list[str]) -> np.ndarray:
    """The inverse of `_to_primal`: primal axes in `order` to `layout`."""
    split, names = [], []
    for a, n in zip(order, x.shape):
        f = layout.block(a)
        split += [n // f, f] if _has_block(layout, a) else [n]
        names += [a, a.lower()] if _has_block(layout, a) else [a]
    return x.reshape(split).transpose([names.index(a) for a, _ in layout.axes])


def relayout(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    """numpy: x converted from layout src to layout dst."""
    s, d = Layout.parse(src), Layout.parse(dst)
    order = s.primal()
    return np.ascontiguousarray(_from_primal(d, _to_primal(s, x, order), order))


# -- LayoutTransform ------------------------------------------------------------------------------------
def _lt_infer(a: dict, x: TensorType) -> TensorType:
    src, dst = _layouts(a)
    return x.with_shape(transformed_shape(src, dst, x.shape))


@op("LayoutTransform", Pattern.INJECTIVE, infer=_lt_infer,
    attrs=[Attr("src_layout", "str"), Attr("dst_layout", "str")])  # fmt: skip
def layout_transform(a: dict, x: np.ndarray) -> np.ndarray:
    """x re-laid out from src_layout to dst_layout (see the module doc for layout strings)."""
    return relayout(x, a["src_layout"], a["dst_layout"])


@lowering("LayoutTransform", schedule=schedule_injective("layout_transform"))
def _layout_transform_compute(a: dict, x: Tensor) -> Tensor:
    src, dst = _layouts(a)
    shape = transformed_shape(src, dst, x.shape)

    def body(*idx):
        full = {}
        for (letter, f), i in zip(dst.axes, idx):
            if not f:
                full[letter] = full.get(letter, 0) + i * dst.block(letter)
            else:
                full[letter.upper()] = full.get(letter.upper(), 0) + i
        src_idx = []
        for letter, f in src.axes:
            if f:
                src_idx.append(full[letter.upper()] % f)
            else:
                blk = src.block(letter)
                src_idx.append(full[letter] // blk if blk > 1 else full[letter])
        return x[tuple(src_idx)]

    return te.compute(shape, body, name="layout_transform", tag="layout_transform")


# -- ConvNCHWc ------------------------------------------------------------------------------------------
def _blocked(x: TensorType, what: str) -> tuple[int, int, int, int, int]:
    if x.rank != 5:
        raise ShapeError(f"{what} must be 5-d [N, C/c, H, W, c] (NCHW[x]c), got {x}")
    return x.shape  # type: ignore[return-value]


def _conv_nchwc_infer(a: dict, x: TensorType, w: TensorType, b: TensorType | None = None) -> TensorType:
    n, cb_, h, wd, cb = _blocked(x, "ConvNCHWc input")
    if w.rank != 6:
        raise ShapeError(f"ConvNCHWc weight must be 6-d [K/kb, C/cb, KH, KW, cb, kb], got {w}")
    kb_, wcb_, kh, kw, wcb, kb = w.shape
    strides, pads, dil = spatial_attrs(a, 2)
    g = a["group"]
    if g == 1:
        if (wcb_, wcb) != (cb_, cb):
            raise ShapeError(f"ConvNCHWc weight {w} does not match input {x}: its input blocks must be [{cb_}, {cb}]")
    elif g == cb_ * cb:
        if (wcb_, wcb, kb_, kb) != (1, 1, cb_, cb):
            raise ShapeError(f"ConvNCHWc with group={g} = channels is depthwise: weight [{cb_}, 1, KH, KW, 1, {cb}], "
                             f"got input {x} and weight {w}")  # fmt: skip
    elif B.narrow_groups(x.shape, w.shape, g):
        pass  # groups narrower than a block: weight [C/cb, 1, KH, KW, C/group, cb]
    elif cb_ % g or kb_ % g or (wcb_, wcb) != (cb_ // g, cb):
        raise ShapeError(f"ConvNCHWc with group={g} must be depthwise (group = channels) or have whole channel blocks "
                         f"per group (weight [K/kb, {cb_ // g or '?'}, KH, KW, {cb}, kb], input and output blocks "
                         f"divisible by the groups), got input {x} and weight {w}")  # fmt: skip
    if b is not None and b.shape != (kb_ * kb,):
        raise ShapeError(f"ConvNCHWc bias {b} must have shape [{kb_ * kb}]")
    oh = window_out_dim(h, kh, strides[0], (pads[0], pads[2]), dil[0])
    ow = window_out_dim(wd, kw, strides[1], (pads[1], pads[3]), dil[1])
    return TensorType((n, kb_, oh, ow, kb), x.dtype)


def _to_nchw(x: np.ndarray) -> np.ndarray:
    return relayout(x, f"NCHW{x.shape[-1]}c", "NCHW")


def _to_nchwc(x: np.ndarray, block: int) -> np.ndarray:
    return relayout(x, "NCHW", f"NCHW{block}c")


@op("ConvNCHWc", Pattern.OUT_ELEMWISE_FUSABLE, infer=_conv_nchwc_infer, inputs=(2, 3), attrs=CONV_ATTRS)
def conv_nchwc(a: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Conv in the blocked layout: x NCHW[cb]c, weights OIHW[cb]i[kb]o, output NCHW[kb]c."""
    kb, cb = w.shape[-1], w.shape[-2]
    wl = relayout(w, f"OIHW{cb}i{kb}o", "OIHW")
    return _to_nchwc(conv(a, _to_nchw(x), wl, b), kb)


@lowering("ConvNCHWc", schedule=T.schedule_nn)
def _conv_nchwc_compute(a: dict, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    strides, pads, dil = spatial_attrs(a, 2)
    kh, kw, kb = w.shape[2], w.shape[3], w.shape[5]
    n, _, h, wd, _ = x.shape
    out = (window_out_dim(h, kh, strides[0], (pads[0], pads[2]), dil[0]),
           window_out_dim(wd, kw, strides[1], (pads[1], pads[3]), dil[1]))  # fmt: skip
    depthwise = a["group"] > 1 and a["group"] == x.shape[1] * x.shape[4]
    acc, read = B.conv_nchwc_acc(x, w, pads, T.Window((kh, kw), strides, dil, out), depthwise, name="conv_acc",
                                 cfg=a.get(CONFIG_ATTR), groups=1 if depthwise else a["group"])  # fmt: skip

    def body(n_, k_, oh, ow, v):
        val = read(n_, k_, oh, ow, v)
        return val + b[k_ * kb + v] if b is not None else val

    return te.compute((n, w.shape[0], *out, kb), body, name="conv_nchwc",
                      attrs={"template": "window_nchwc" if depthwise else "conv_nchwc", "acc": acc})  # fmt: skip


# -- pooling ----------------------------------------------------------------------------------------------
MODE = Attr("mode", "str", **one_of("max", "avg"))
POOL_NCHWC_ATTRS = [MODE, *POOL_ATTRS, Attr("count_include_pad", "int", 0)]


def _pool_nchwc_infer(a: dict, x: TensorType) -> TensorType:
    _blocked(x, "PoolNCHWc input")
    if len(a["kernel_shape"]) != 2:
        raise ShapeError(f"PoolNCHWc needs a 2-d kernel, got {list(a['kernel_shape'])}")
    nchw = (x.shape[0], x.shape[1] * x.shape[4], x.shape[2], x.shape[3])
    oh, ow = pool_dims(a, nchw)
    return x.with_shape((x.shape[0], x.shape[1], oh, ow, x.shape[4]))


@op("PoolNCHWc", Pattern.OPAQUE, infer=_pool_nchwc_infer, attrs=POOL_NCHWC_ATTRS)
def pool_nchwc(a: dict, x: np.ndarray) -> np.ndarray:
    """MaxPool (mode "max") or AveragePool (mode "avg") of x in NCHW[c]c."""
    attrs = {p.name: a[p.name] for p in POOL_ATTRS}
    if a["mode"] == "max":
        y = max_pool({**attrs, "storage_order": 0}, _to_nchw(x))[0]
    else:
        y = average_pool({**attrs, "count_include_pad": a["count_include_pad"]}, _to_nchw(x))
    return _to_nchwc(y, x.shape[-1])


@lowering("PoolNCHWc", schedule=T.schedule_nn)
def _pool_nchwc_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"PoolNCHWc on {x.dtype}")
    strides, pads, dil = spatial_attrs(a, 2)
    ks = a["kernel_shape"]
    size = x.shape[2:4]
    out = pool_dims(a, (x.shape[0], x.shape[1] * x.shape[4], *size))
    extra = [max(0, (out[i] - 1) * strides[i] + dil[i] * (ks[i] - 1) + 1 - size[i] - pads[i] - pads[i + 2])
             for i in range(2)]  # fmt: skip
    win = T.Window(tuple(ks), strides, dil, tuple(out))
    ends = (pads[2] + extra[0], pads[3] + extra[1])
    if a["mode"] == "max":
        acc, read = B.window_nchwc_acc(x, (*pads[:2], *ends), te.const(-np.inf, x.dtype), win, te.max, name="maxpool",
                                       cfg=a.get(CONFIG_ATTR))  # fmt: skip

        def body(*i: Expr) -> Expr:
            return read(*i)
    else:
        acc, read = B.window_nchwc_acc(x, (*pads[:2], *ends), T.zero(x.dtype), win, te.sum, name="avgpool",
                                       cfg=a.get(CONFIG_ATTR))  # fmt: skip
        count = window_count(size, pads, win, bool(a["count_include_pad"]), x.dtype)

        def body(*i: Expr) -> Expr:
            return read(*i) / count(i[2:4])

    return te.compute(acc.shape, body, name=f"{a['mode']}pool_nchwc", attrs={"template": "window_nchwc", "acc": acc})


def _global_pool_nchwc_infer(a: dict, x: TensorType) -> TensorType:
    _blocked(x, "GlobalPoolNCHWc input")
    return x.with_shape((x.shape[0], x.shape[1], 1, 1, x.shape[4]))


@op("GlobalPoolNCHWc", Pattern.REDUCTION, infer=_global_pool_nchwc_infer, attrs=[MODE])
def global_pool_nchwc(a: dict, x: np.ndarray) -> np.ndarray:
    """GlobalMaxPool (mode "max") or GlobalAveragePool (mode "avg") of x in NCHW[c]c."""
    fn = global_max_pool if a["mode"] == "max" else global_average_pool
    return _to_nchwc(fn({}, _to_nchw(x)), x.shape[-1])


@lowering("GlobalPoolNCHWc", schedule=T.schedule_nn)
def _global_pool_nchwc_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"GlobalPoolNCHWc on {x.dtype}")
    h, w = x.shape[2:4]
    reducer = te.max if a["mode"] == "max" else te.sum
    acc, read = B.global_nchwc_acc(x, reducer, name=f"global_{a['mode']}pool", cfg=a.get(CONFIG_ATTR))
    scale = 1.0 / (h * w)

    def body(*i: Expr) -> Expr:
        return read(*i) * te.const(scale, x.dtype) if a["mode"] == "avg" else read(*i)

    return te.compute(acc.shape, body, name=f"global_{a['mode']}pool_nchwc",
                      attrs={"template": "global_nchwc", "acc": acc})  # fmt: skip


# -- concatenation in place -------------------------------------------------------------------------------
def _concat_in_place_infer(a: dict, *xs: TensorType) -> tuple[TensorType, ...]:
    return get_op("Concat").infer(a, *xs)


@op("ConcatInPlace", Pattern.OPAQUE, infer=_concat_in_place_infer, inputs=(1, None), attrs=[Attr("axis", "int")])
def concat_in_place(a: dict, *xs: np.ndarray) -> np.ndarray:
    """Concat whose inputs are written by their producers straight into their slices of the output
    (`ember.passes.inplace`): the CPU lowering gives it no kernel. Opaque, so that fusion keeps it and its
    producers apart; where it does get a kernel (GPU targets), it is Concat's."""
    return get_op("Concat").reference(a, *xs)[0]


def _concat_in_place_schedule(a: dict, outs: list[Tensor], target: Target) -> te.Schedule:
    return get_op("Concat").schedule(a, outs, target)


@lowering("ConcatInPlace", schedule=_concat_in_place_schedule)
def _concat_in_place_compute(a: dict, *xs: Tensor) -> Tensor:
    return get_op("Concat").compute(a, *xs)


# -- channel shuffle ----------------------------------------------------------------------------------
def _shuffle_infer(a: dict, *xs: TensorType) -> TensorType:
    g, x = a["group"], xs[0]
    channels = [t.shape[1] if t.rank == 4 else None for t in xs]
    if any(not isinstance(c, int) for c in channels) or g < 1 or sum(channels) % g:
        raise ShapeError(f"ChannelShuffle(group={g}) takes [N, C, H, W] tensors with C in all a multiple of the "
                         f"group, got {', '.join(map(str, xs))}")  # fmt: skip
    if any(t.dtype != x.dtype or (t.shape[0],) + t.shape[2:] != (x.shape[0],) + x.shape[2:] for t in xs):
        raise ShapeError(f"ChannelShuffle inputs {', '.join(map(str, xs))} differ outside the channels")
    return x.with_shape((x.shape[0], sum(channels), *x.shape[2:]))


@op("ChannelShuffle", Pattern.OPAQUE, infer=_shuffle_infer, inputs=(1, None), attrs=[Attr("group", "int")])
def channel_shuffle(a: dict, *xs: np.ndarray) -> np.ndarray:
    """ShuffleNet's channel shuffle of the inputs concatenated along the channels, Reshape [N, g, C/g, H, W] ->
    Transpose(0, 2, 1, 3, 4) -> Reshape [N, C, H, W]: output channel c is channel (c % g) * (C / g) + c // g of
    the concatenation. Opaque: its own kernel copies one plane (H x W, contiguous on both sides) per channel,
    vectorized along it, where a fused group would compute the index of every element."""
    x = np.concatenate(xs, axis=1)
    n, c, h, w = x.shape
    g = a["group"]
    return x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


@lowering("ChannelShuffle", schedule=schedule_injective("channel_shuffle"))
def _channel_shuffle_compute(a: dict, *xs: Tensor) -> Tensor:
    g = a["group"]
    offsets = np.cumsum([0] + [x.shape[1] for x in xs]).tolist()
    per = offsets[-1] // g

    def body(n, c, h, w):
        src = c % g * per + c // g  # the channel of the concatenation, then the input that holds it
        out = xs[-1][n, src - offsets[-2], h, w]
        for x, start in zip(reversed(xs[:-1]), reversed(offsets[:-2])):
            out = te.if_then_else(src < start + x.shape[1], x[n, src - start, h, w], out)
        return out

    shape = (xs[0].shape[0], offsets[-1], *xs[0].shape[2:])
    return te.compute(shape, body, name="channel_shuffle", tag="channel_shuffle", attrs=rows(2))


# -- channel shuffle in the blocked layout --------------------------------------------------------------
def _part_channels(a: dict, shapes: list[tuple]) -> list[int | None]:
    """The channels of each blocked input: `channels` where given (an input's blocks may end in zero padding),
    else all of its blocks."""
    whole = [s[1] * s[4] if isinstance(s[1], int) else None for s in shapes]
    return list(a["channels"]) if a.get("channels") else whole


def _shuffle_nchwc_infer(a: dict, *xs: TensorType) -> TensorType:
    g, b = a["group"], a["block"]
    if any(t.rank != 5 for t in xs):
        raise ShapeError(f"ChannelShuffleNCHWc(group={g}) takes [N, C/c, H, W, c] tensors (NCHW[x]c), got "
                         f"{', '.join(map(str, xs))}")  # fmt: skip
    channels = _part_channels(a, [t.shape for t in xs])
    fits = [isinstance(ch, int) and (not isinstance(t.shape[1], int) or ch <= t.shape[1] * t.shape[4])
            for ch, t in zip(channels, xs)]  # fmt: skip
    if len(channels) != len(xs) or not all(fits):
        raise ShapeError(f"ChannelShuffleNCHWc: channels={list(channels)} do not fit its inputs "
                         f"{', '.join(map(str, xs))}")  # fmt: skip
    if g < 1 or sum(channels) % g or b < 1 or sum(channels) % b:
        raise ShapeError(f"ChannelShuffleNCHWc(group={g}, block={b}): the channels of {', '.join(map(str, xs))} "
                         f"must add up to a multiple of the group and of the block")  # fmt: skip
    x = xs[0]
    if any(t.dtype != x.dtype or (t.shape[0],) + t.shape[2:4] != (x.shape[0],) + x.shape[2:4] for t in xs):
        raise ShapeError(f"ChannelShuffleNCHWc inputs {', '.join(map(str, xs))} differ outside the channels")
    return x.with_shape((x.shape[0], sum(channels) // b, *x.shape[2:4], b))


@op("ChannelShuffleNCHWc", Pattern.OPAQUE, infer=_shuffle_nchwc_infer, inputs=(1, None),
    attrs=[Attr("group", "int"), Attr("block", "int"), Attr("channels", "ints", ())])  # fmt: skip
def channel_shuffle_nchwc(a: dict, *xs: np.ndarray) -> np.ndarray:
    """`ChannelShuffle(group)` of blocked inputs [N, C_k/c_k, H, W, c_k] (each its own block, 1 included; the
    first `channels[k]` channels of input k where given: its last block may end in padding), the output blocked
    by `block`: [N, C/block, H, W, block]. The ConvertLayout pass makes it where the shuffle's inputs are
    blocked, so that the convolutions around it need no LayoutTransform."""
    channels = _part_channels(a, [x.shape for x in xs])
    flat = [relayout(x, f"NCHW{x.shape[4]}c", "NCHW")[:, :ch] for x, ch in zip(xs, channels)]
    y = channel_shuffle({"group": a["group"]}, *flat)
    return relayout(y, "NCHW", f"NCHW{a['block']}c")


def _shuffle_nchwc_schedule(a: dict, outs: list[Tensor], target: Target) -> te.Schedule:
    if not standalone(outs, "channel_shuffle_nchwc"):
        return default_schedule(outs, target)
    return B.schedule_lane_gather(a["group"], outs, target)


@lowering("ChannelShuffleNCHWc", schedule=_shuffle_nchwc_schedule)
def _channel_shuffle_nchwc_compute(a: dict, *xs: Tensor) -> Tensor:
    g, b = a["group"], a["block"]
    sizes = _part_channels(a, [x.shape for x in xs])
    offsets = np.cumsum([0, *sizes]).tolist()
    per = offsets[-1] // g

    def read(x: Tensor, s, n, h, w):
        cb = x.shape[4]
        return x[n, s // cb, h, w, s % cb] if cb > 1 else x[n, s, h, w, 0]

    def body(n, c, h, w, lane):
        full = c * b + lane
        src = full % g * per + full // g  # the channel of the concatenation, then the input that holds it
        out = read(xs[-1], src - offsets[-2], n, h, w)
        for x, start, size in zip(reversed(xs[:-1]), reversed(offsets[:-2]), reversed(sizes[:-1])):
            out = te.if_then_else(src < start + size, read(x, src - start, n, h, w), out)
        return out

    shape = (xs[0].shape[0], offsets[-1] // b, *xs[0].shape[2:4], b)
    return te.compute(shape, body, name="channel_shuffle_nchwc", tag="channel_shuffle_nchwc")
