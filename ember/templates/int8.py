"""The int8 GEMM/convolution template: uint8 x int8 -> int32 on the `dot_u8s8` intrinsic (`ember.te.intrin`).

A quantized product or convolution is three stages:

- `A` [M, KH, KW, Cp] uint8, the activations by output row: the rows of x for a matrix product (KH = KW = 1),
  the im2col patches of x for a convolution (channels innermost, padded with the zero point; Cp = C rounded up
  to 4). int8 activations are shifted to uint8 here (x + 128, zero point + 128), the operand `vpdpbusd` takes;
- `acc` [M, Np] int32 = sum over (kh, kw, c) of A * W, W packed at compile time by `pack_weight` as
  [Np / nb, KH * KW * Cp / 4, nb, 4] int8: per panel of nb columns, groups of 4 k per column;
- the output, written by the op (`ember.ops.int8`): requantization of acc as an epilogue.

`schedule_int8` tiles the output by (mr rows, nb columns) (an NCHW convolution: one row of pixels by nb
channels, accumulated mr pixels at a time), computes the accumulation tile in a local buffer at that tile
with the reduction tensorized (one micro-kernel call per tile keeps the mr x nb/16 accumulators
in registers over all of K), and runs the tile loops in parallel. Knobs: the tile (mr, nb) and the loop order
(column panels outside: one panel of W stays in cache while the rows stream), as in the float GEMM template.

Stride-1 convolutions take the other orientation, weights times activations (`int8_acc_wx`, `dot_s8u8`): W's rows
(packed with nb = 1) broadcast against 16 pixels x 4 channels of X4, the padded image with 4 channels
interleaved, so the accumulator comes out channels by pixels as NCHW stores it (a contiguous, vectorized
epilogue), and a k x k kernel is k * k shifted windows of that one copy instead of a k * k times larger im2col.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember import te
from ember.target import Target
from ember.te.config import ConfigBase
from ember.te.intrin import amx_tiles, isa_features
from ember.te.tensor import Tensor

# (columns per panel, rows per tile), best first: nb / 16 * mr accumulators stay below 32 zmm registers
TILES = ((64, 6), (64, 5), (64, 4), (32, 8), (32, 7), (32, 6), (32, 5), (32, 4), (64, 3), (32, 3), (64, 2), (32, 2),
         (16, 4), (16, 2), (64, 1), (32, 1), (16, 1))  # fmt: skip


@dataclass(frozen=True)
class Int8Plan:
    mr: int  # rows of a tile (divides the rows of one image / matrix: no padded rows)
    nb: int  # columns of a panel (the packed weight's layout)
    order: str = "ji"  # "ji": column panels outside the row tiles


def choose_nb(n: int, target: Target | None = None, rows: int = 0, product_rows: int = 0) -> int:
    """The panel width for n output columns (the packed weight's layout, fixed at compile time): up to 4 vectors
    of 16 int32 (AVX-512), 16 columns where vectors hold 4 (NEON: 4 x 4 accumulators per row); `rows`, the rows
    of a tile's block (an output row's pixels), when known: the width whose tile holds the most accumulators.
    `product_rows`, a product's rows (a MatMul's M) when known: where 8 divides them, tiles of 8 x 32 rather than
    4 x 64 (as many accumulators; a panel of B half as wide, 24 KiB at K = 768, stays in the L1 cache while the row
    tiles pass over it: BERT's int8 GEMMs 470-495 -> 520-535 GOP/s, 1 thread)."""
    if target is not None and target.vector_bits and target.vector_bits < 256:
        return 16
    nb = 16 if n <= 16 else 32 if n <= 32 or n % 64 else 64
    if nb == 64 and product_rows and product_rows % 8 == 0:
        return 32
    if rows and nb == 64 and _accumulators(32, rows) > _accumulators(64, rows):
        return 32  # rows of 7 or 14 pixels: 7 rows x 2 vectors per tile, where 64 columns allow 1 or 2 rows
    return nb


AMX_PANEL = 32  # columns of a packed panel where products run on AMX: 2 x 2 tiles of 16 x 16 with 32 rows


def amx_tile_rows(target: Target | None, rows: int, n: int, kind: str = "int8") -> int:
    """The tile height of a product of `rows` rows (a MatMul's M) on a target with AMX (`ember.te.intrin.amx_tiles`,
    panels of AMX_PANEL columns; `kind` "bf16": amx_bf16's tiles): 32 where 32 divides the rows, else 16; 0
    without AMX, for too few rows or columns, or rows no tile height divides."""
    if target is None or rows <= 0 or n < AMX_PANEL or not amx_tiles(isa_features(target), 16, AMX_PANEL, kind):
        return 0
    return next((r for r in (32, 16) if rows % r == 0), 0)


def _accumulators(nb: int, rows: int) -> int:
    """Vector accumulators of the best (mr, nb) tile whose mr divides `rows` (`int8_plan`)."""
    return max((mr * nb // 16 for b, mr in TILES if b == nb and rows % mr == 0), default=nb // 16)


WX_ACCUMULATORS = 28  # zmm registers for the accumulators of a W x X tile (the rest: columns of X, a row of W)
WX_REGISTERS = 32  # all of them: accumulators, the tile's vectors of X or its broadcasts of W, one more operand
ROW_WEIGHT = {1: 0.5, 2: 0.9}  # a W x X tile's worth by its rows (measured on ResNet-50's layers; 4 or more: 1)
# A tile's worth where its requantizing epilogue has no vector width (`wx_epilogue_width` 0: scalar). Vectors of 4
# or 8 cost nothing more since the epilogue narrows to bytes in one instruction (`ember.codegen.c`'s vpmovdb; GCC's
# narrowing lane by lane had made 8 x 28 tiles of 14 x 14 images slower than 2 x 196): ResNet-50's 1 x 1
# convolutions at 14 x 14, 1024 -> 256 and 1024 -> 512 channels, 2 x 196 -> 8 x 28 tiles: 23% less time
SCALAR_EPILOGUE_WEIGHT = 0.7
WX_L1_BYTES = 32768  # the most bytes of X (channels x pixels) a W x X tile reads per call from the L1 cache
WX_L2_WEIGHT = 0.85  # a tile's worth where its X is larger (read from L2 by every tile of channels)


def wx_registers(mr: int, nv: int, whole_flat: bool = False) -> int:
    """The vector registers of an mr x nv W x X micro-kernel (`ember.te.intrin`'s VNNI one): the accumulators plus
    the nv vectors of X loaded once per k and a broadcast of W, or for a whole flat image (a 1 x 1 convolution's;
    14 x 14: 13 vectors) the fewer of that and the mr broadcasts of W with one vector of X at a time (the
    micro-kernel's other order, only measured faster there: 2 x 14-vector tiles of 56 x 56 images ran at half the
    speed of 2 x 7)."""
    return mr * nv + (min(nv + 1, mr + 1) if whole_flat else nv + 1)


def wx_epilogue_width(nb: int, whole: bool, flat: bool, lanes: int = 16) -> int:
    """The vector width `_schedule_wx` writes a tile of nb output pixels in: `lanes` (16 int32), the last vector
    masked, where the tile's pixels are one range of the accumulator (`flat`: no padding columns, or the whole
    image) and more than one vector (the accumulator tile then ends at the last vector's end: a tile of 28 pixels
    takes 32), else the widest of lanes, lanes / 2, lanes / 4 that divides nb (0: none; a partial vector would
    extend the tile's accumulator into the next row, past the micro-kernel's registers)."""
    if lanes > 1 and (flat or whole) and nb > lanes:
        return lanes
    return next((v for v in (lanes, lanes // 2, lanes // 4) if v > 1 and nb % v == 0), 0)


WX_NARROW_BYTES = 32768  # the most bytes of X (channels x pixels) a 256-bit W x X tile reads per call (`wx_lanes`)
# Whether `wx_lanes` may take vectors of 8 pixels: they pay only where a 512-bit vpdpbusd costs two 256-bit ones (a
# CPU that splits them, such as Zen 4); where both take one instruction, vectors of 16 do twice the work per
# instruction. Since the int8 epilogue narrows in one instruction (`ember.codegen.c`), ResNet-50's 512 -> 2048 at
# 7 x 7 runs 23% faster as 4 x 49 tiles of 16 lanes than as 2 x 49 of 8 (Xeon, AVX-512 VNNI, 1 thread)
WX_HALF_VECTORS = False


def wx_lanes(nb: int, whole_flat: bool, channels: int = 0) -> int:
    """The pixels per vector of a W x X tile of nb pixels: 8 (`dot_s8u8_256`) where WX_HALF_VECTORS allows, for a
    whole flat image (a 1 x 1 convolution's) of fewer than 64 pixels that vectors of 8 cover with fewer idle lanes
    than vectors of 16, where its X of `channels` x nb bytes stays in the L1 cache (its tiles have 2 rows of W, not
    4: each reads X twice as often), else 16."""
    fits = 0 < channels * nb <= WX_NARROW_BYTES
    if not WX_HALF_VECTORS:
        return 16
    return 8 if whole_flat and fits and nb < 64 and -nb % 8 < -nb % 16 else 16


AMX_WX_TILES = ((32, 32), (16, 48), (32, 16), (16, 32), (16, 16))  # (channels, pixels) on AMX, most C tiles first


def amx_grid_width(width: int, channels: int) -> int:
    """The padded row length of a W x X convolution's grid on AMX (`amx_wx_tile`): `width` rounded up to whole
    tiles of 16 pixels where one to three of them make a row (14 x 14 with its padding: 16; 28 x 28: 30 -> 32;
    7 x 7: 9 -> 16) and the channels are whole 64-byte steps, else `width` (56 x 56: rows of 64 would need tiles
    wider than the tile registers hold)."""
    whole = -(-width // 16) * 16
    return whole if whole <= 48 and channels % 64 == 0 else width


def amx_wx_tile(height: int, width: int, rows: int, flat: bool, channels: int) -> tuple[int, int]:
    """The (mr channels, nb pixels) tile of a W x X convolution on AMX's tile registers (`ember.te.intrin.
    amx_tiles`), (0, 0) where none fits; channels a multiple of 64 (a K of whole 64-byte steps a tap). On a flat
    image (a 1 x 1 convolution's, no padding columns) a tile is any run of nb pixels; on a padded grid, whole
    rows whose length is a multiple of 16 (`amx_grid_width`; the columns past the image's are computed and
    dropped)."""
    if channels % 64:
        return 0, 0
    if not flat:
        if width % 16:
            return 0, 0
        whole = [(mr, nb) for mr, nb in AMX_WX_TILES
                 if rows % mr == 0 and nb % width == 0 and height % (nb // width) == 0]  # fmt: skip
        return whole[0] if whole else (0, 0)
    pixels = height * width
    fits = [(mr, nb) for mr, nb in AMX_WX_TILES if rows % mr == 0 and pixels >= 2 * nb]
    # tiles that divide the image first; else the last tile's few pixels run the vpdpbusd kernel (14 x 14: 12 x 16
    # pixels on AMX, 4 after them)
    return next((t for t in fits if pixels % t[1] == 0), fits[0] if fits else (0, 0))


def wx_tile(height: int, width: int, rows: int, flat: bool = False, channels: int = 0,
            amx: bool = False) -> tuple[int, int]:  # fmt: skip
    """(mr output channels, nb pixels) of a W x X tile (`int8_acc_wx`) for an image of height x width: nb whole
    image rows (the tile's pixels are then one range of the NCHW image), in vectors of 16 pixels (the last one
    masked where 16 does not divide nb), mr x vectors within WX_ACCUMULATORS, and the whole micro-kernel within
    WX_REGISTERS (`wx_registers`; else the compiler reloads X for every row: a load per vpdpbusd, 7 x 4 tiles
    of 14 x 14 images at 60% of the 8 x 2 tile's speed). Best: the most lanes used, times ROW_WEIGHT (a row of W
    broadcast per vector of X loaded: one row is slow, two nearly as good as four), times SCALAR_EPILOGUE_WEIGHT
    where the grid is `flat` (a 1 x 1 convolution: no padding columns) and no vector width divides the tile's
    pixels, then the most accumulators. Vectors of 16
    pixels, or of 8 where `wx_lanes` says (`channels`: the input's, padded to 4). `amx`: the target has AMX, whose
    tile (`amx_wx_tile`) comes first where one fits."""
    tile = amx_wx_tile(height, width, rows, flat, channels) if amx else (0, 0)
    if tile[0]:
        return tile
    best, key = (0, 0), (0.0, 0)
    for k in (k for k in range(1, height + 1) if height % k == 0):
        nb = k * width
        lanes = wx_lanes(nb, flat and k == height, channels)
        nv = -(-nb // lanes)
        for mr in (8, 6, 4, 2, 1):
            fits = wx_registers(mr, nv, flat and k == height) <= WX_REGISTERS
            if rows % mr == 0 and mr * nv <= WX_ACCUMULATORS and fits:
                worth = nb / (lanes * nv) * ROW_WEIGHT.get(mr, 1.0)
                if flat and not wx_epilogue_width(nb, k == height, True):
                    worth *= SCALAR_EPILOGUE_WEIGHT
                if channels * nb > WX_L1_BYTES:
                    worth *= WX_L2_WEIGHT
                score = (worth, mr * nv)
                if score > key:
                    best, key = (mr, nb), score
    return best


def int8_plan(rows: int, nb: int, cfg: ConfigBase | None = None, tile_rows: int = 0) -> Int8Plan:
    """The tile for a product whose output rows come in blocks of `rows` (an image's pixels, a matrix's rows);
    `tile_rows`, a tile height the graph pass chose for the target (AMX's 16 or 32: `amx_tile_rows`), first."""
    mrs = [mr for b, mr in TILES if b == nb and rows % mr == 0] or [1]
    if tile_rows and rows % tile_rows == 0:
        mrs = [tile_rows, *mrs]
    if cfg is None:
        return Int8Plan(mrs[0], nb)
    mr = cfg.define_knob("tile_rows", mrs, default=mrs[0])
    order = cfg.define_knob("order", ["ji", "ij"], default="ji")
    return Int8Plan(mr, nb, order)


def pack_weight(w_kn: np.ndarray, nb: int) -> np.ndarray:
    """W [K, N] int8 (K a multiple of 4) as panels [Np / nb, K / 4, nb, 4], zeros past N."""
    return _pack_panels(w_kn, nb, 4, np.int8, "pack_weight")


def _pack_panels(w_kn: np.ndarray, nb: int, group: int, dtype, what: str) -> np.ndarray:
    """W [K, N] as dtype panels [Np / nb, K / group, nb, group] (`group` consecutive k of a column together, as
    the dot-product instruction reads them), zeros past N."""
    k, n = w_kn.shape
    if k % group:
        raise ValueError(f"{what}: K={k} must be a multiple of {group} (pad the channels)")
    np_ = -(-n // nb) * nb
    w = np.zeros((k, np_), dtype)
    w[:, :n] = w_kn
    return np.ascontiguousarray(w.reshape(k // group, group, np_ // nb, nb).transpose(2, 0, 3, 1))


def unpack_weight(wp: np.ndarray, n: int) -> np.ndarray:
    """The W [K, n] of panels [Np / nb, K / 4, nb, 4]."""
    p, k4, nb, _ = wp.shape
    return wp.transpose(1, 3, 0, 2).reshape(k4 * 4, p * nb)[:, :n]


def int8_acc(a: Tensor, wp: Tensor, name: str = "acc", cfg: ConfigBase | None = None, rows: int = 0,
             tile_rows: int = 0) -> Tensor:  # fmt: skip
    """acc[i, j] = sum of int32(A[i, kh, kw, c]) * int32(W[j, (kh, kw, c)]) for A [M, KH, KW, Cp] uint8 and
    W packed [Np / nb, KH * KW * Cp / 4, nb, 4] int8; `rows` (dividing M) bounds the row tile, `tile_rows` is
    the height chosen for the target (`int8_plan`)."""
    return _packed_acc(a, wp, 4, "int32", "int8_acc", name, cfg, rows, {}, tile_rows)


def _packed_acc(a: Tensor, wp: Tensor, group: int, acc_dtype: str, what: str, name: str, cfg: ConfigBase | None,
                rows: int, attrs: dict, tile_rows: int = 0) -> Tensor:  # fmt: skip
    """The product of A [M, KH, KW, Cp] and W packed [Np / nb, KH * KW * Cp / group, nb, group] (`group`
    consecutive k of a column together, as the dot-product instruction reads them), accumulated in acc_dtype."""
    m, kh_, kw_, cp = a.shape
    npanel, kg, nb, _ = wp.shape
    if cp % group or kg != kh_ * kw_ * cp // group:
        raise ValueError(f"{what}: A {a.shape} and packed W {wp.shape} do not agree on K")
    kh = te.reduce_axis((0, kh_), name="kh")
    kw = te.reduce_axis((0, kw_), name="kw")
    cg = te.reduce_axis((0, cp // group), name=f"c{group}")
    kk = te.reduce_axis((0, group), name="kk")

    def body(i, j):
        g = (kh * kw_ + kw) * (cp // group) + cg
        return te.sum(te.cast(a[i, kh, kw, cg * group + kk], acc_dtype) * te.cast(wp[j // nb, g, j % nb, kk],
                      acc_dtype), axis=[kh, kw, cg, kk])  # fmt: skip

    plan = int8_plan(rows or m, nb, cfg, tile_rows)
    return te.compute((m, npanel * nb), body, name=name, tag="int8_gemm", attrs={"plan": plan, **attrs})


def pack_pairs(w_kn: np.ndarray, nb: int) -> np.ndarray:
    """W [K, N] (K even; bfloat16) as panels [Np / nb, K / 2, nb, 2], zeros past N: `dot_bf16`'s layout."""
    return _pack_panels(w_kn, nb, 2, w_kn.dtype, "pack_pairs")


def bf16_acc(a: Tensor, wp: Tensor, name: str = "acc", cfg: ConfigBase | None = None, rows: int = 0,
             tile_rows: int = 0) -> Tensor:  # fmt: skip
    """`int8_acc` in bfloat16: acc[i, j] (float32) = sum of float32(A[i, kh, kw, c]) * float32(W[j, (kh, kw, c)])
    for A [M, KH, KW, Cp] and W packed [Np / nb, KH * KW * Cp / 2, nb, 2] bfloat16 (`pack_pairs`), on the
    `dot_bf16` intrinsic (the same tiles and schedule: `schedule_int8`; `tile_rows` AMX's, as `int8_acc`)."""
    return _packed_acc(a, wp, 2, "float32", "bf16_acc", name, cfg, rows, {"intrinsic": "dot_bf16"}, tile_rows)


def int8_acc_batched(a: Tensor, wp: Tensor, m: int, name: str = "acc", cfg: ConfigBase | None = None,
                     tile_rows: int = 0) -> Tensor:  # fmt: skip
    """A batch of products whose both operands are activations: acc[g, i, j] = sum of int32(A[g * m + i, 0, 0, c])
    * int32(W[g, j / nb, c / 4, j % nb, c % 4]) for A [G * m, 1, 1, Kp] uint8 (the rows of every product) and W
    [G, Np / nb, Kp / 4, nb, 4] int8, each product's right operand packed at run time (`int8_acc`'s layout)."""
    rows, kh_, kw_, kp = a.shape
    groups, npanel, k4, nb, _ = wp.shape
    if kh_ != 1 or kw_ != 1 or kp != 4 * k4 or rows != groups * m:
        raise ValueError(f"int8_acc_batched: A {a.shape} and packed W {wp.shape} do not make {groups} products "
                         f"of {m} rows")  # fmt: skip
    kh = te.reduce_axis((0, 1), name="kh")
    kw = te.reduce_axis((0, 1), name="kw")
    c4 = te.reduce_axis((0, k4), name="c4")
    kk = te.reduce_axis((0, 4), name="kk")

    def body(g, i, j):
        return te.sum(te.cast(a[g * m + i, kh, kw, c4 * 4 + kk], "int32") * te.cast(wp[g, j // nb, c4, j % nb, kk],
                      "int32"), axis=[kh, kw, c4, kk])  # fmt: skip

    plan = int8_plan(m, nb, cfg, tile_rows)
    return te.compute((groups, m, npanel * nb), body, name=name, tag="int8_gemm", attrs={"plan": plan})


def int8_acc_wx(wt: Tensor, x4: Tensor, geometry: tuple[int, ...], name: str = "acc",
                cfg: ConfigBase | None = None, amx: bool = False) -> Tensor:  # fmt: skip
    """A stride-1 convolution as weights times activations, on the padded image's pixels:

        acc[b, o, q] = sum over (r, s, c4, kk) of int32(Wt[o, (r * KW + s) * Cp / 4 + c4, 0, kk])
                                                * int32(X4[b, c4, q + r * dh * Wp + s * dw, kk])

    Wt the weights packed with nb = 1 ([Co, KH * KW * Cp / 4, 1, 4]: W's rows, broadcast 4 bytes at a time), X4
    [N, Cp / 4, pixels, 4] uint8 the padded image (Hp x Wp, then zeros) with 4 channels interleaved (the vector
    operand: 16 pixels x 4 channels), q = oh * Wp + ow an output pixel on the padded grid (each kernel tap is one
    shift of the whole image: no im2col; the columns ow >= OW are computed and never read). `geometry` =
    (KH, KW, dh, dw, OH, OW, Wp), or with (S, P) after it a stride-S convolution on the S x S phase planes of the
    padded image, P pixels each, rows of Wp (`ember.ops.int8._phase_grid`): tap (r, s) reads plane
    (r % S) * S + s % S at q + (r // S) * Wp + s // S. The accumulator comes out channels by pixels, as NCHW
    stores it."""
    kh_, kw_, dh, dw, oh, ow, wpad, *phases = geometry
    st, plane = phases or (1, 0)
    co, k, one, _ = wt.shape
    _, k4, pixels, _ = x4.shape
    need = (oh + (kh_ - 1) * dh) * wpad + (kw_ - 1) * dw if st == 1 else st * st * plane
    if one != 1 or k != kh_ * kw_ * k4 or pixels < need:
        raise ValueError(f"int8_acc_wx: packed W {wt.shape} (nb = 1) and X4 {x4.shape} do not make a "
                         f"{kh_} x {kw_} convolution to {oh} x {ow} on rows of {wpad}")  # fmt: skip
    flat = st == 1 and wpad == ow
    mr, rows = wx_tile(oh, wpad, co, flat, 4 * k4, amx)
    if not rows:
        raise ValueError(f"int8_acc_wx: no tile of whole rows of {wpad} pixels for {co} channels (use int8_acc)")
    r = te.reduce_axis((0, kh_), name="r")
    s = te.reduce_axis((0, kw_), name="s")
    c4 = te.reduce_axis((0, k4), name="c4")
    kk = te.reduce_axis((0, 4), name="kk")

    def tap(r, s):  # the offset of tap (r, s) from the output pixel
        if st == 1:
            return r * (dh * wpad) + s * dw
        return ((r % st) * st + s % st) * plane + (r // st) * wpad + s // st

    def body(b, o, q):
        w = te.cast(wt[o, (r * kw_ + s) * k4 + c4, 0, kk], "int32")
        return te.sum(w * te.cast(x4[b, c4, q + tap(r, s), kk], "int32"), axis=[r, s, c4, kk])

    plan = Int8Plan(mr, rows if flat else rows // wpad * ow)  # nb: the output pixels of a tile (whole output rows,
    # or on a flat image any run of them: `amx_wx_tile`)
    attrs = {"plan": plan, "planes": (plane, wpad)} if st > 1 else {"plan": plan, "row": wpad}
    if wx_lanes(rows, flat and rows == oh * wpad, 4 * k4) == 8:
        attrs["intrinsic"] = "dot_s8u8_256"
    if amx and not flat and st == 1 and (mr, rows) == amx_wx_tile(oh, wpad, co, flat, 4 * k4):
        # whole padded rows on AMX: the tile's accumulator rows aligned to whole tiles of 16 columns
        attrs.update(intrinsic="dot_s8u8_rows", grid_rows=rows // wpad)
    return te.compute((x4.shape[0], co, oh * wpad), body, name=name, tag="int8_gemm", attrs=attrs)


def rows_stage(shape: tuple[int, ...], fn: Callable, name: str) -> Tensor:
    """The A stage: materialized once per call (a copy of the activations in the intrinsic's layout)."""
    return te.compute(shape, fn, name=name, tag="int8_rows", attrs={"materialize": True})


def schedule_int8(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """Tile the output at axes `attrs["row_axes"]` (the rows, outer first) and `attrs["col_axis"]` by panels of nb
    columns: rows-by-columns outputs (a product) in (mr, nb) tiles, channels-by-pixels outputs (NCHW) by one row
    of pixels per panel (written contiguously, accumulated mr pixels at a time); the accumulation tile at the
    tile loop, its reduction tensorized."""
    acc: Tensor = attrs["acc"]
    if attrs.get("wx"):
        return _schedule_wx(s, out, acc, target)
    plan: Int8Plan = acc.op.attrs["plan"]
    O = s[out]
    axes = list(O.op.axis)
    row_axes = [axes[d] for d in attrs["row_axes"]]
    col = axes[attrs["col_axis"]]
    others = [ax for d, ax in enumerate(axes) if d not in attrs["row_axes"] and d != attrs["col_axis"]]
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    rows = O.fuse(*row_axes) if len(row_axes) > 1 else row_axes[0]
    co, ci = O.split(col, plan.nb)
    L = s[accl]
    *lg, li, lj = L.op.axis  # lg: the product of a batch (`int8_acc_batched`), one per tile
    kh, kw, c4, kk = L.op.reduce_axis
    lanes = target.vector_lanes(32)
    if attrs["col_axis"] == len(axes) - 1:  # rows x columns, columns contiguous: tiles of (mr, nb)
        ro, ri = O.split(rows, plan.mr)
        outer = [co, *others, ro] if plan.order == "ji" else [*others, ro, co]
        O.reorder(*outer, ri, ci)
        if plan.nb % lanes == 0 and lanes > 1:
            _, cii = O.split(ci, lanes)
            O.vectorize(cii)
        L.reorder(*lg, kh, kw, c4, li, lj, kk)
    else:  # channels x pixels (NCHW): a whole row of pixels per panel, written contiguously
        outer = [co, *others] if plan.order == "ji" else [*others, co]
        O.reorder(*outer, ci, rows)
        n_rows = out.shape[attrs["row_axes"][-1]]
        width = next((w for w in (lanes, lanes // 2) if w > 1 and n_rows % w == 0), 0)
        if width:
            _, rii = O.split(rows, width)
            O.vectorize(rii)
        lio, lii = L.split(li, plan.mr)
        L.reorder(lio, kh, kw, c4, lii, lj, kk)
    L.tensorize(kh, acc.op.attrs.get("intrinsic", "dot_u8s8"))
    L.compute_at(O, outer[-1])
    if target.num_cores > 1 and math.prod(acc.shape) * acc.op.reduce_axis[2].dom[1] >= 1 << 16:
        O.parallel(O.fuse(*outer))
    done = {O.name, L.name}
    for t in acc.op.inputs:
        st = s[t]
        if st.is_placeholder or st.op.tag != "int8_rows" or len(st.op.axis) != 4:
            continue  # (a batch's packed right operands: the default schedule)
        i, r, c, ch = st.op.axis  # tiles of 16 rows x 64 channels: a transpose of NCHW that stays in cache
        io, ii = st.split(i, 16) if t.shape[0] % 16 == 0 else (i, None)
        if ii is not None and t.shape[3] > 64:
            cho, chi = st.split(ch, 64)
            st.reorder(io, r, c, cho, ii, chi)
        elif ii is not None:
            st.reorder(io, r, c, ii, ch)
        if target.num_cores > 1 and math.prod(t.shape) >= 1 << 15:
            st.parallel(io)
        done.add(st.name)
    return done


def _schedule_wx(s: te.Schedule, out: Tensor, acc: Tensor, target: Target) -> set[str]:
    """A W x X convolution (`int8_acc_wx`) written as NCHW: pixels fused and cut in panels of nb, whole output
    rows, mr channels by nb pixels accumulated in a local tile by one micro-kernel call per kernel tap, then
    requantized and stored contiguously. The larger operand is read once: where W has fewer bytes than X4, the
    pixel panels are outer (a panel of X4, its pixels x all channels, stays in cache while the channel tiles of W
    pass over it), else the channel tiles (a tile of W stays while the panels pass). Channel tiles outer also
    give each thread whole output rows: two threads writing pixel panels of one 14 x 14 or 7 x 7 row share its
    cache lines, and ResNet-50's residual 1 x 1 convolutions took 2.4x longer at 2 threads than at 1."""
    plan: Int8Plan = acc.op.attrs["plan"]
    O = s[out]
    b, o, h, w = O.op.axis
    wt, x4 = acc.op.inputs[:2]
    oo, oi = O.split(o, plan.mr)
    lanes = target.vector_lanes(32)
    grid_rows = acc.op.attrs.get("grid_rows", 0)
    if grid_rows:  # AMX on whole padded rows: a tile of grid_rows image rows, each row's pixels in masked vectors
        po, pi = O.split(h, grid_rows)
    else:
        po, pi = O.split(O.fuse(h, w), plan.nb)
    outer = (oo, po) if math.prod(wt.shape) >= math.prod(x4.shape[1:]) else (po, oo)  # the channel tiles outer?
    O.reorder(b, *outer, oi, pi, *([w] if grid_rows else []))
    if grid_rows:
        if out.shape[3] > lanes:
            _, w = O.split(w, lanes)
        O.vectorize(w)
    else:
        # whole output rows, which 16 does not always divide (56, 28, 98): `wx_epilogue_width`
        whole = plan.nb == out.shape[2] * out.shape[3]
        width = wx_epilogue_width(plan.nb, whole, acc.shape[2] == out.shape[2] * out.shape[3], lanes)
        if width:
            _, pii = O.split(pi, width)
            O.vectorize(pii)
    tile = outer[1]  # the loop of one tile
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    L = s[accl]
    lb, lo, lp = L.op.axis
    r, s_, c4, kk = L.op.reduce_axis
    L.reorder(r, s_, c4, lb, lo, lp, kk)  # one micro-kernel call per kernel tap
    L.tensorize(c4, acc.op.attrs.get("intrinsic", "dot_s8u8"))
    if grid_rows:
        L.storage_align(16)  # the tile's last row ends short of its 16-column tile (`dot_s8u8_rows`)
    big = target.num_cores > 1 and math.prod(acc.shape) * acc.op.reduce_axis[2].dom[1] >= 1 << 16
    if big:  # the threads share the pixel panels and the channel tiles: a 7 x 7 or 14 x 14 image is one panel
        tile = O.fuse(b, *outer)
        O.parallel(tile)
    L.compute_at(O, tile)
    done = {O.name, L.name}
    for t in acc.op.inputs:
        st = s[t]
        if st.is_placeholder or st.op.tag != "int8_rows":
            continue
        _, _, p, kk = st.op.axis  # by row and column of the padded grid: no division per pixel, the padding
        if "planes" in acc.op.attrs:  # columns partitioned off (phase planes: by plane first)
            plane, wpad = acc.op.attrs["planes"]
            ph, pp = st.split(p, plane)
            i, j = st.split(pp, wpad)
            st.reorder(ph, i, j, kk)
        elif t.shape[2] % acc.op.attrs["row"] == 0:
            st.split(p, acc.op.attrs["row"])
        if big:
            st.parallel(st.op.axis[1])
        done.add(st.name)
    return done


def schedule_int8_dw(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """A depthwise convolution (`ember.ops.int8.QConvDepthwise`): per (image, channel), blocks of `chains` x 16
    pixels accumulated in registers over the kernel taps (one vector FMA per tap on contiguous pixels of a phase
    plane) and requantized at once into the channel's grid, then its valid columns copied into NCHW; the phase
    planes, one copy of the channel's input, are written row by row first. (A whole plane of accumulators in a
    buffer, as this was before, made the C compiler store each vector back after every tap: 0.81 -> 0.53 ms on
    96 channels of 112 x 112.) Channels run in parallel."""
    acc: Tensor = attrs["acc"]
    O = s[out]
    b, c, h, w = O.op.axis
    lanes = target.vector_lanes(32)
    width = next((v for v in (lanes, lanes // 2, lanes // 4) if v > 1 and out.shape[3] % v == 0), 0)
    if width:
        _, wi = O.split(w, width)
        O.vectorize(wi)
    bc = O.fuse(b, c)
    chains = acc.op.attrs["chains"]
    G = s[attrs["grid"]]
    _, _, gp = G.op.axis
    gpo, gpi = G.split(gp, 16 * chains)  # a block of chains x 16 pixels: accumulated, then requantized
    gc, gv = G.split(gpi, 16)
    G.unroll(gc)  # constant offsets into the block: it stays in registers
    G.vectorize(gv)
    G.compute_at(O, bc)
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    L = s[accl]
    _, _, p = L.op.axis
    r, s_ = L.op.reduce_axis
    pc, pi = L.split(p, 16)
    L.reorder(r, s_, pc, pi)  # independent FMA chains over the taps, in registers (a local block, not a plane)
    L.unroll(r)
    L.unroll(s_)
    L.unroll(pc)
    L.vectorize(pi)
    L.compute_at(G, gpo)
    big = target.num_cores > 1 and math.prod(out.shape) >= 1 << 14
    if big:
        O.parallel(bc)
    done = {O.name, L.name, G.name}
    for t in acc.op.inputs:
        st = s[t]
        if st.is_placeholder or st.op.tag != "int8_rows":
            continue
        _, _, pr, pc, q = st.op.axis
        qo, qi = st.split(q, int(acc.op.attrs["plane_width"]))  # rows of the plane: no division per pixel
        if t.shape[3] > 1:  # strided: a row of every column phase at once (one read of the input row, a pair
            st.reorder(pr, qo, qi, pc)  # of interleaved loads that the C compiler vectorizes)
            st.unroll(pc)
        st.compute_at(O, bc)  # one channel's planes at a time: they stay in cache for the taps
        done.add(st.name)
    return done
