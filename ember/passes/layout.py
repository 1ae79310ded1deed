"""ConvertLayout: 2-d convolutions to the blocked layout NCHW[x]c, and the ops between them along.

A tensor of C channels is blocked as [N, C/x, H, W, x] with x the target's vector lanes, or the
largest power of two >= 4 below them that divides C (`block_of`; None: it stays NCHW). Then:

- a Conv (2-d, float, weights [K, C/group, KH, KW], group 1, depthwise, or grouped with whole channel
  blocks per group: groups narrower than a block with as many channels in as out, at least `MIN_NARROW_BITS`
  wide, run in whole vectors, a shuffle of the block per input channel of a group (`narrow_groups`, RegNet's
  groups of 8 in blocks of 16, ResNeXt's of 4); other narrow
  groups are merged, up to `MAX_GROUP_MERGE` of them, their constant weights zero outside each group) whose
  output channels block becomes `ConvNCHWc` (one whose
  input is not blocked yet only when it has at least `MIN_MACS` multiply-adds: a small one would not pay
  for the transforms around it). Its weights go through
  `LayoutTransform(OIHW -> OIHW{cb}i{kb}o)`, which `fold_constant` evaluates at compile time (the
  pass after this one). A stride-1 3x3 one with constant weights becomes `ConvWinogradNCHWc` instead
  where `winograd_gain` (`ember.templates.winograd`) is at least `WINOGRAD_MIN_GAIN`, at the output tile
  `winograd_tile` picks (F(4x4, 3x3), or F(2x2, 3x3) on small maps), its weights transformed here. That
  estimate can be overridden per convolution by a measured choice (`algorithm_choices`: what `ember tune --auto`
  measured and logged, which `ember.compile(..., tuning_log=...)` hands to this pass).
  Its input is taken blocked: as its producer made it, else through a
  LayoutTransform, or for a channel count without a block (an RGB image) as [N, C, H, W, 1], a free
  reshape of NCHW. A 1-d convolution runs as a 2-d one of height 1 (reshapes are free);
- elementwise and broadcast ops (relu, clip, residual add, ...) whose operand is blocked run blocked;
  their other operands follow (constants re-laid out at compile time, per-channel [C, 1, 1] ones
  included), unless one is a map computed in NCHW (then the op stays NCHW: transforming it would
  cost as much as transforming the blocked operand back); MaxPool/AveragePool become `PoolNCHWc`;
  global pooling, and ReduceMean/ReduceMax over H and W, `GlobalPoolNCHWc`; a channel Concat, Split or
  Slice stays blocked where its cuts fall between blocks (re-blocked by a smaller block where they fall
  inside one); a `ChannelShuffle` with a blocked input, or read by a convolution that starts a blocked
  region, becomes `ChannelShuffleNCHWc`, whose output block divides the cuts of the Splits and Slices
  reading it (ShuffleNet v2: the shuffle, its split halves and the convolutions around them exchange
  blocked tensors);
- a convolution whose output channels have no block of the full vector width (ShuffleNet v2's 58, 116, 232;
  RegNet-Y-400MF's 104 and 440) computes them zero-padded to whole vectors (zero weights and bias), where that
  adds at most `MAX_CHANNEL_PAD` and every reader takes the padded value (`takes_padded`: convolutions, which
  read the padding with zero weights, a grouped one as whole groups more; depthwise convolutions, `PAD_SAFE`
  and `PAD_FINITE` ops and `PAD_BINARY` ones whose other operands are padded alike (a squeeze-excitation's
  channel multiply, a residual add), whose outputs stay padded; global pooling; channel shuffles, which read
  each input's own channels); any other reader gets it back in NCHW, sliced. The padding holds finite values
  (zeros, or what a sigmoid makes of them) that no real channel reads;
- every other reader of a blocked value, and the graph outputs, get the value back in NCHW through one
  `LayoutTransform` per value, placed before its first reader (a Reshape where H = W = 1: the pooled
  features of a classifier are laid out alike in both layouts).

Values are converted forward in topological order, so consecutive convolutions and the ops between
them exchange blocked tensors with no transform in between; a transform back to NCHW is only made
where a reader needs it, and a transform that undoes another is cancelled.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from ember.graph.dims import is_static_dim
from ember.graph.ir import Graph, Node, Uses, Value, node_reads, unique_name
from ember.graph.types import TensorType
from ember.ops import Pattern, get_op
from ember.ops.common import norm_axis, spatial_attrs
from ember.ops.layout import relayout
from ember.ops.tensor import slice_bounds
from ember.target import Target
from ember.te.tensor import prod_hint
from ember.templates.gpu import is_gpu
from ember.templates.winograd import winograd_gain, winograd_tile, winograd_weight

from .cleanup import dead_code_elimination

FLOATS = ("float32", "float64")
NOT_CHANNELWISE = {"BatchNormalization", "Expand", "Dropout", "QuantizeLinear", "DequantizeLinear"}
POOLS = {"MaxPool": "max", "AveragePool": "avg"}
GLOBAL_POOLS = {"GlobalMaxPool": "max", "GlobalAveragePool": "avg"}
SPATIAL_REDUCES = {"ReduceMax": "max", "ReduceMean": "avg"}  # over H and W: global pooling
WINOGRAD_MIN_GAIN = 1.5  # estimated direct / Winograd time from which a 3x3 convolution takes Winograd
WINOGRAD_TILE: int | None = None  # Winograd's output tile (2 or 4); None: `winograd_tile`'s choice per layer
MIN_MACS = 1 << 20  # a convolution whose input is not blocked yet starts a blocked region only from this size
NARROW_MACS_DIVISOR = 8  # ... or from MIN_MACS / this, a depthwise one whose rows are narrower than a vector
MIN_NARROW_BITS = 128  # groups narrower than a block run as such (`conv_nchwc_acc`) from this width
MAX_GROUP_MERGE = 2  # a grouped convolution merges at most this many groups into one of whole channel blocks
MAX_CHANNEL_PAD = 0.25  # a convolution pads its output channels to whole vectors when that adds at most this share
PAD_SAFE = {"Relu", "LeakyRelu", "Clip", "HardSwish"}  # channelwise ops that run on padded values as they are
PAD_FINITE = {"Sigmoid", "HardSigmoid", "Tanh"}  # ... whose padding becomes other finite values
CONV_ALGORITHMS = ("direct", "winograd2", "winograd4")  # a stride-1 3x3 convolution's implementations


@dataclass
class AlgorithmChoices:
    """Implementations chosen per convolution by measurement rather than by the estimate (`fixed`: key ->
    one of CONV_ALGORITHMS), and the convolutions with a choice that the pass met (`seen`: key -> the estimate's
    choice), for a tuner to measure."""

    fixed: dict[str, str] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)


_CHOICES: ContextVar[AlgorithmChoices | None] = ContextVar("ember_algorithm_choices", default=None)


@contextmanager
def algorithm_choices(choices: AlgorithmChoices | dict[str, str] | None) -> Iterator[AlgorithmChoices]:
    """Within this context, ConvertLayout takes each convolution's implementation from `choices` where it
    names one (a dict: key -> algorithm, as `conv_algorithm_key` names the convolution) and records the
    convolutions it met in `choices.seen`."""
    c = choices if isinstance(choices, AlgorithmChoices) else AlgorithmChoices(dict(choices or {}))
    bad = {k: v for k, v in c.fixed.items() if v not in CONV_ALGORITHMS}
    if bad:
        raise ValueError(f"unknown convolution algorithm(s) {bad}; the algorithms: {', '.join(CONV_ALGORITHMS)}")
    token = _CHOICES.set(c)
    try:
        yield c
    finally:
        _CHOICES.reset(token)


def active_algorithm_choices() -> AlgorithmChoices | None:
    """The choices of the innermost `algorithm_choices` context, if any."""
    return _CHOICES.get()


def conv_algorithm_key(x: TensorType, k: int, pads: tuple[int, ...]) -> str:
    """The name of a stride-1 3x3 convolution's workload for `algorithm_choices`: its input type, output
    channels and pads (one image: a batch runs image by image)."""
    return f"conv3x3:{x.dtype}:{'x'.join(str(d) for d in x.shape[1:])}:k{k}:pads{','.join(map(str, pads))}"
PAD_BINARY = {"Add", "Sub", "Mul"}  # ... with operands padded alike (a squeeze-excitation scale, a residual)


def block_of(channels: int, lanes: int) -> int | None:
    """The channel block of a tensor with `channels` channels: the lanes, or the largest power of two
    >= 4 dividing the channels; None when there is none (the tensor stays NCHW)."""
    b = lanes
    while b >= 4:
        if channels % b == 0:
            return b
        b //= 2
    return None


def group_merge(gw_in: int, gw_out: int, group: int, cb: int, kb: int) -> int | None:
    """How many consecutive groups of a grouped convolution (`gw_in` input and `gw_out` output channels
    each) one blocked group takes so that it holds whole input (`cb`) and output (`kb`) channel blocks: 1
    when a group already does; up to `MAX_GROUP_MERGE` (each merged group computes that many times the
    multiply-adds, the weights zero between groups); None beyond."""
    for merge in range(1, MAX_GROUP_MERGE + 1):
        if group % merge == 0 and (gw_in * merge) % cb == 0 and (gw_out * merge) % kb == 0:
            return merge
    return None


def merged_group_weight(w: np.ndarray, group: int, merge: int) -> np.ndarray:
    """Weights [K, C/group, KH, KW] of a grouped convolution as those of `group / merge` groups: each output
    channel's weights placed at its group's offset within the merged group, zero elsewhere."""
    k, gw = w.shape[:2]
    out = np.zeros((k, gw * merge, *w.shape[2:]), w.dtype)
    for j in range(merge):  # the output channels of the j-th group of every merged one read columns j*gw..
        rows = (np.arange(k) // (k // group)) % merge == j
        out[rows, j * gw:(j + 1) * gw] = w[rows]
    return out


def nchwc(block: int) -> str:
    return f"NCHW{block}c"


class _Converter:
    def __init__(self, graph: Graph, lanes: dict[str, int]):
        self.graph = graph
        self.lanes = lanes  # vector lanes by dtype
        self.nodes: list[Node] = []
        self.blocked: dict[Value, tuple[Value, int]] = {}  # NCHW value -> (its blocked form, block)
        self.missing: set[Value] = set()  # NCHW values whose producer was converted (not computed yet)
        self.reblocked: dict[tuple[Value, int], Value] = {}  # (value, block) -> it in a block other than its own
        self.names = {v.name for v in graph.values()}
        self.as_2d: dict[Value, Value] = {}  # output of a 1-d convolution -> its [N, C, 1, L] form
        self.padded: dict[Value, int] = {}  # NCHW value -> the channels of its blocked form, zero-padded past its own

    # -- helpers -----------------------------------------------------------------------------------
    def fresh(self, name: str) -> str:
        return unique_name(name, self.names)

    def emit(self, op: str, inputs: list[Value | None], out_type: TensorType, attrs: dict, name: str) -> Value:
        out = Value(self.fresh(name), out_type)
        self.nodes.append(Node(op, inputs, [out], attrs, out.name))
        return out

    def block(self, v: Value) -> int | None:
        if v.dtype not in self.lanes or len(v.shape) != 4:
            return None
        return block_of(v.shape[1], self.lanes[v.dtype])

    def to_blocked(self, v: Value, b: int) -> Value:
        """v [N, C, H, W] as [N, C/b, H, W, b] (memoized; b == 1 is a reshape)."""
        if v in self.blocked and self.blocked[v][1] == b:
            return self.blocked[v][0]
        n, c, h, w = v.shape
        shape = (n, c // b, h, w, b)
        name = f"{v.name}_{nchwc(b)}"
        if v in self.padded:  # padded, wanted in another block: through NCHW (once)
            if (v, b) not in self.reblocked:
                attrs = {"src_layout": "NCHW", "dst_layout": nchwc(b)}
                self.reblocked[v, b] = self.emit("LayoutTransform", [self.to_nchw(v)], v.type.with_shape(shape), attrs,
                                                 name)  # fmt: skip
            return self.reblocked[v, b]
        if v in self.blocked and b > 1:  # blocked by another block: re-blocked directly, not through NCHW (once)
            if (v, b) not in self.reblocked:
                bv, vb = self.blocked[v]
                attrs = {"src_layout": nchwc(vb), "dst_layout": nchwc(b)}
                self.reblocked[v, b] = self.emit("LayoutTransform", [bv], v.type.with_shape(shape), attrs, name)
            return self.reblocked[v, b]
        if b == 1 or h * w == 1:  # the same memory order: a view
            bv = self.emit("Reshape", [self.to_nchw(v)], v.type.with_shape(shape), {"shape": shape}, name)
        else:
            attrs = {"src_layout": "NCHW", "dst_layout": nchwc(b)}
            bv = self.emit("LayoutTransform", [self.to_nchw(v)], v.type.with_shape(shape), attrs, name)
        if b > 1:  # block 1 only feeds convolutions
            self.blocked.setdefault(v, (bv, b))
        return bv

    def to_nchw(self, v: Value) -> Value:
        """v itself, computed back from its blocked form (once, before its first reader) if needed."""
        if v in self.missing:
            bv, b = self.blocked[v]
            out = v  # a padded value: all its channels back, then the slice of its own
            if v in self.padded:
                shape = (v.shape[0], self.padded[v], *v.shape[2:])
                out = Value(self.fresh(f"{v.name}_padded"), v.type.with_shape(shape))
            if v.shape[2] * v.shape[3] == 1:  # [N, C/b, 1, 1, b] is [N, C, 1, 1] in memory: a view
                self.nodes.append(Node("Reshape", [bv], [out], {"shape": out.shape}, f"{v.name}_to_nchw"))
            else:
                attrs = {"src_layout": nchwc(b), "dst_layout": "NCHW"}
                self.nodes.append(Node("LayoutTransform", [bv], [out], attrs, f"{v.name}_to_nchw"))
            if out is not v:
                attrs = {"starts": (0,), "ends": (v.shape[1],), "axes": (1,), "steps": (1,)}
                self.nodes.append(Node("Slice", [out], [v], attrs, f"{v.name}_unpadded"))
            self.missing.discard(v)
        return v

    def produce_blocked(self, node: Node, bout: Value, b: int) -> None:
        v = node.outputs[0]
        self.blocked[v] = (bout, b)
        self.missing.add(v)

    # -- rules -------------------------------------------------------------------------------------
    def conv1d(self, node: Node) -> bool:
        """A 1-d convolution (Whisper's and wav2vec's front ends) as a 2-d one of height 1: its input, weights
        and output are free reshapes, so it takes the blocked templates; consecutive ones stay blocked."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        if len(x.shape) != 3 or len(w.shape) != 3 or len(node.outputs) != 1:
            return False
        (s,), (p0, p1), (d,) = spatial_attrs(node.attrs, 1)
        start = len(self.nodes)
        x2 = self.as_2d.get(x)
        if x2 is None:
            shape = (x.shape[0], x.shape[1], 1, x.shape[2])
            x2 = self.emit("Reshape", [x], x.type.with_shape(shape), {"shape": shape}, f"{x.name}_2d")
        wshape = (w.shape[0], w.shape[1], 1, w.shape[2])
        if w.is_constant:
            w2 = Value(self.fresh(f"{w.name}_2d"), w.type.with_shape(wshape), w.data.reshape(wshape))
        else:
            w2 = self.emit("Reshape", [w], w.type.with_shape(wshape), {"shape": wshape}, f"{w.name}_2d")
        y2 = Value(self.fresh(f"{y.name}_2d"), y.type.with_shape((y.shape[0], y.shape[1], 1, y.shape[2])))
        attrs = {"strides": (1, s), "pads": (0, p0, 0, p1), "dilations": (1, d), "group": node.attrs["group"]}
        conv = Node("Conv", [x2, w2, *node.inputs[2:]], [y2], attrs, y2.name)
        if not self.conv(conv):
            del self.nodes[start:]  # not blocked after all: the 1-d convolution stays as it was
            return False
        self.as_2d[y] = y2
        self.nodes.append(Node("Reshape", [self.to_nchw(y2)], [y], {"shape": y.shape}, f"{y.name}_1d"))  # DCE drops
        return True  # it where only 1-d convolutions read y

    def conv(self, node: Node) -> bool:
        x, w = node.inputs[0], node.inputs[1]
        b = node.inputs[2] if len(node.inputs) > 2 else None
        y = node.outputs[0]
        if x is None or w is None or len(x.shape) != 4 or x.dtype not in self.lanes or len(node.outputs) != 1:
            return False
        c, k, group = x.shape[1], y.shape[1], node.attrs["group"]
        lanes = self.lanes[x.dtype]
        kb = block_of(k, lanes)
        depthwise = group > 1 and group == c == k
        grouped = group > 1 and not depthwise
        c_in = self.padded.get(x, c)
        k_out = self.padded_groups(node, c_in) if grouped else self.padded_channels(node, depthwise)
        if c_in != c and (k_out is None or x not in self.blocked):
            return False
        if k_out != k:
            kb = lanes
        if grouped and c_in != c:  # a padded input: whole zero groups for its padding, their outputs padding too
            w, b = self.padded_weights(w, b, c // group, k_out, False)
            c, k, group = c_in, k_out, c_in // (c // group)
        if kb is None or (group > 1 and not depthwise and group == c):
            return False
        if x not in self.blocked and not self.starts_blocked(node):
            return False  # too small to pay for transforming its input (and likely its output back)
        if depthwise:
            cb = kb
        elif x in self.blocked:
            cb = self.blocked[x][1]
        else:
            cb = block_of(c, self.lanes[x.dtype]) or 1
        narrow = grouped and self.narrow_groups(c // group, k // group, cb, kb, x.dtype)
        if grouped and not narrow:
            merge = group_merge(c // group, k // group, group, cb, kb)
            if merge is None or (merge > 1 and not w.is_constant):
                return False
            if merge > 1:  # groups narrower than a block: merged, their weights zero outside each group
                w = Value(self.fresh(f"{w.name}_merged"), w.type.with_shape((k, c // group * merge, *w.shape[2:])),
                          merged_group_weight(w.data, group, merge))  # fmt: skip
                group //= merge
        xb = self.to_blocked(x, cb)
        kh, kw = w.shape[2:]
        if (c_in, k_out) != (c, k):  # zero weights (and bias) for the padding channels, read and written
            w, b = self.padded_weights(w, b, 1 if depthwise else c_in, k_out, depthwise)
            c, k, group = c_in, k_out, k_out if depthwise else group
        elif not depthwise and self.winograd(node, xb, cb, kb):
            return True
        wl = f"OIHW{1 if depthwise else c // group if narrow else cb}i{kb}o"
        if narrow:  # each block several whole groups: [K/kb, 1, KH, KW, C/group, kb]
            wshape = (k // kb, 1, kh, kw, c // group, kb)
        else:
            wshape = (k // kb, 1 if depthwise else c // group // cb, kh, kw, 1 if depthwise else cb, kb)
        wb = self.emit("LayoutTransform", [w], w.type.with_shape(wshape), {"src_layout": "OIHW", "dst_layout": wl},
                       f"{w.name}_{wl}")  # fmt: skip
        out = y.type.with_shape((y.shape[0], k // kb, *y.shape[2:], kb))
        attrs = {a: node.attrs[a] for a in ("strides", "pads", "dilations")} | {"group": group}
        self.produce_blocked(node, self.emit("ConvNCHWc", [xb, wb, b], out, attrs, f"{y.name}_nchwc"), kb)
        if k != y.shape[1]:
            self.padded[y] = k
        return True

    def narrow_groups(self, gw_in: int, gw_out: int, cb: int, kb: int, dtype: str) -> bool:
        """Whether a grouped convolution with groups of `gw_in` -> `gw_out` channels runs with groups narrower than
        its blocks (`ember.templates.nchwc.narrow_groups`): as many channels in as out per group, the same block in
        and out, a multiple of the group width, which is at least `MIN_NARROW_BITS` wide (a vector of its lanes).
        Merged groups (`group_merge`) would compute kb/g times the multiply-adds, full-width."""
        bits = int(dtype[-2:])
        return gw_in == gw_out < kb == cb and kb % gw_in == 0 and gw_in * bits >= MIN_NARROW_BITS

    def padded_channels(self, node: Node, depthwise: bool) -> int:
        """The output channels of a Conv's blocked form: its own, or zero-padded to whole vectors where they have
        no block of the full lanes (ShuffleNet v2's 58, 116, 232; RegNet's 104 and 440), that adds at most
        `MAX_CHANNEL_PAD` of them and every reader takes a padded value (`takes_padded`); a depthwise one follows its
        input."""
        x, y = node.inputs[0], node.outputs[0]
        k = y.shape[1]
        if depthwise:
            return self.padded.get(x, k)
        pad = self.channel_pad(node)
        return pad if pad and self.takes_padded(y, pad) else k

    def channel_pad(self, node: Node) -> int | None:
        """The padded output channels a Conv of group 1 with constant weights would compute (whole vectors), or None
        where its channels have a block of the full lanes or the padding would add more than `MAX_CHANNEL_PAD`."""
        x, y = node.inputs[0], node.outputs[0]
        if node.attrs["group"] != 1 or not all(v is None or v.is_constant for v in node.inputs[1:]):
            return None
        if x is None or len(y.shape) != 4 or y.dtype not in self.lanes or not isinstance(y.shape[1], int):
            return None
        k, lanes = y.shape[1], self.lanes[y.dtype]
        padded = -(-k // lanes) * lanes
        return padded if block_of(k, lanes) != lanes and padded <= k * (1 + MAX_CHANNEL_PAD) else None

    def padded_groups(self, node: Node, c_in: int) -> int | None:
        """The output channels of a grouped (not depthwise) Conv reading a value padded to `c_in` channels: the
        padding taken as whole groups more (zero weights and bias), whose outputs pad the output alike; its own
        channels when the input is not padded; None when the padding is not whole groups or the weights not constant."""
        x, y = node.inputs[0], node.outputs[0]
        c, k, group = x.shape[1], y.shape[1], node.attrs["group"]
        if c_in == c:
            return k
        if (c_in - c) % (c // group) or not all(v is None or v.is_constant for v in node.inputs[1:]):
            return None
        k_out = k + (c_in - c) // (c // group) * (k // group)
        return k_out if k_out % self.lanes[y.dtype] == 0 else None  # whole vectors out, as the input

    def takes_padded(self, v: Value, pad: int, seen: set[Value] | None = None) -> bool:
        """Whether every reader of v can read its blocked form zero-padded to `pad` channels (the padding holds finite
        values that no real channel reads): convolutions with constant weights (zero weights for the padding; a
        grouped one takes it as whole groups more), depthwise ones, `PAD_SAFE` and `PAD_FINITE` ops and channelwise
        `PAD_BINARY` ops whose other operands are (or will be) padded alike, when their outputs are taken padded as
        well; global pooling (its [N, C, 1, 1] output is cheap to slice for a reader that wants it unpadded); channel
        shuffles (they read each input's own channels). `seen`: values asked about already in this question (taken
        as yes: a residual chain asks about itself)."""
        seen = set() if seen is None else seen
        if v in seen:
            return True
        seen.add(v)
        if v in self.graph.outputs or not self.readers.get(v):
            return False
        return all(self.reader_takes_padded(r, v, pad, seen) for r in self.readers[v])

    def reader_takes_padded(self, r: Node, v: Value, pad: int, seen: set[Value]) -> bool:
        one = len(r.outputs) == 1 and r.inputs[0] is v and v not in r.inputs[1:]
        consts = all(u is None or u.is_constant for u in r.inputs[1:])
        scalars = all(u.is_constant and u.data.size == 1 for u in r.present_inputs[1:])
        if r.op == "ChannelShuffle":
            return True
        if r.op in GLOBAL_POOLS or (r.op in SPATIAL_REDUCES and r.attrs.get("keepdims", 1)):
            return one
        if r.op == "Conv" and one and consts and len(r.outputs[0].shape) == 4:
            c, group = v.shape[1], r.attrs["group"]
            if group == 1:
                return True
            if group == c == r.outputs[0].shape[1]:  # depthwise: its output stays padded
                return self.takes_padded(r.outputs[0], pad, seen)
            grown = self.padded_groups(r, pad)
            return grown is not None and self.takes_padded(r.outputs[0], grown, seen)
        if r.op in PAD_SAFE | PAD_FINITE and one and scalars:
            return self.takes_padded(r.outputs[0], pad, seen)
        if r.op in PAD_BINARY and len(r.outputs) == 1 and r.outputs[0].shape[1] == v.shape[1]:
            others = [u for u in r.present_inputs if u is not v]
            if all(u.is_constant and u.data.size == 1 or u in seen or self.would_pad(u, pad, seen) for u in others):
                return self.takes_padded(r.outputs[0], pad, seen)
        return False

    def would_pad(self, u: Value, pad: int, seen: set[Value]) -> bool:
        """Whether u is padded to `pad` channels, or will be when its producer (not converted yet) is: a Conv that
        pads its output, or a `PAD_SAFE`/`PAD_FINITE` op of such a value."""
        if u in self.padded or len(u.shape) != 4:
            return self.padded.get(u) == pad
        p = self.producers.get(u)
        if p is None or p in self.done or len(p.outputs) != 1:
            return False
        if p.op == "Conv":
            return self.channel_pad(p) == pad and self.takes_padded(u, pad, seen)
        scalars = all(w.is_constant and w.data.size == 1 for w in p.present_inputs[1:])
        if p.op in PAD_SAFE | PAD_FINITE and scalars and p.inputs[0] is not None:
            return self.would_pad(p.inputs[0], pad, seen) and self.takes_padded(u, pad, seen)
        return False

    def padded_weights(self, w: Value, b: Value | None, c_in: int, k_out: int, depthwise: bool) -> tuple:
        """Constant weights [K, C, KH, KW] and bias [K] zero-padded to `k_out` output and `c_in` input channels
        (a depthwise conv's [K, 1, KH, KW] to `k_out`; a grouped one's [K, C/group, KH, KW] to `k_out` with `c_in`
        its channels per group: the padding is whole groups of zero weights)."""
        k, c = w.shape[:2]
        wp = np.zeros((k_out, 1 if depthwise else c_in, *w.shape[2:]), w.data.dtype)
        wp[:k, :c] = w.data
        w = Value(self.fresh(f"{w.name}_padded"), w.type.with_shape(wp.shape), wp)
        if b is not None:
            bp = np.zeros(k_out, b.data.dtype)
            bp[:k] = b.data
            b = Value(self.fresh(f"{b.name}_padded"), b.type.with_shape(bp.shape), bp)
        return w, b

    def starts_blocked(self, node: Node) -> bool:
        """Whether a Conv is big enough to take the blocked layout when its input is not blocked yet. An NCHW
        depthwise convolution vectorizes along the output's rows: one narrower than a vector wastes lanes
        (convnext's 5x5 depthwise 7x7 ran at 1/4 of its blocked speed), so it goes blocked from a smaller size."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        c, group = x.shape[1], node.attrs.get("group", 1)
        depthwise = group > 1 and group == c == y.shape[1]
        lanes = self.lanes.get(x.dtype)
        narrow = depthwise and lanes is not None and is_static_dim(y.shape[3]) and y.shape[3] < lanes
        min_macs = MIN_MACS // NARROW_MACS_DIVISOR if narrow else MIN_MACS
        return prod_hint(y.shape) * math.prod(w.shape[1:]) >= min_macs

    def elementwise(self, node: Node) -> bool:
        y = node.outputs[0]
        if any(v in self.padded for v in node.present_inputs):  # a PAD_* op (`convert`): the padding goes through
            return self.elementwise_padded(node)
        sources = [self.blocked[v][1] for v in node.present_inputs if v in self.blocked and v.shape == y.shape]
        if not sources or len(node.outputs) != 1:
            return False
        if not all(self.fits(v, y.shape) for v in node.present_inputs):
            return False
        if any(self.costs_transform(v) for v in node.present_inputs):
            return False  # it stays NCHW: transforming its blocked operands back costs no more
        b = sources[0]
        operands = [None if v is None else self.operand(v, y.shape, b) for v in node.inputs]
        out = y.type.with_shape(self.blocked_shape(y.shape, b))
        self.produce_blocked(node, self.emit(node.op, operands, out, dict(node.attrs), f"{y.name}_{nchwc(b)}"), b)
        return True

    def elementwise_padded(self, node: Node) -> bool:
        """A channelwise op on padded values: each operand a scalar constant or a value padded alike (the same
        channels and block; [N, C, 1, 1] ones broadcast over the pixels), its output padded as they are."""
        y = node.outputs[0]
        pads = {self.padded.get(v) for v in node.present_inputs if not (v.is_constant and v.data.size == 1)}
        if len(pads) != 1 or None in pads or len(node.outputs) != 1 or len(y.shape) != 4:
            return False
        pad = pads.pop()
        b = next(self.blocked[v][1] for v in node.present_inputs if v in self.padded)
        operands = [v if v is None or v not in self.padded else self.blocked[v][0] for v in node.inputs]
        out = y.type.with_shape((y.shape[0], pad // b, *y.shape[2:], b))
        self.produce_blocked(node, self.emit(node.op, operands, out, dict(node.attrs), f"{y.name}_{nchwc(b)}"), b)
        self.padded[y] = pad
        return True

    @staticmethod
    def fits(v: Value, shape: tuple[int, ...]) -> bool:
        """Whether operand v broadcasts to NCHW `shape` dim by dim (so it has a blocked form)."""
        full = (1,) * (4 - len(v.shape)) + tuple(v.shape)
        if v.type.is_static and v.type.size == 1:
            return True
        return len(v.shape) <= 4 and all(d in (1, s) for d, s in zip(full, shape))

    def costs_transform(self, v: Value) -> bool:
        """Whether operand v of a broadcasting op would need a LayoutTransform kernel to be blocked (a
        computed map with channels and pixels that is not blocked yet)."""
        full = (1,) * (4 - len(v.shape)) + tuple(v.shape)
        return not v.is_constant and v not in self.blocked and full[1] > 1 and full[2] * full[3] > 1

    def winograd(self, node: Node, xb: Value, cb: int, kb: int) -> bool:
        """A stride-1 undilated 3x3 convolution with constant weights as `ConvWinogradNCHWc` when
        `winograd_gain` expects it faster than the direct template; the weights re-laid out and
        transformed here, at compile time."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        strides, pads, dil = spatial_attrs(node.attrs, 2)
        static = all(isinstance(d, int) for d in y.shape[1:])  # the batch may be symbolic: a loop of images
        if not (w.is_constant and tuple(w.shape[2:]) == (3, 3) and node.attrs["group"] == 1 and static
                and set(strides) | set(dil) == {1}):
            return False
        n, c, k, out = y.shape[0], x.shape[1], y.shape[1], tuple(y.shape[2:])
        m = WINOGRAD_TILE or winograd_tile(1, c, k, out)  # per image: a symbolic batch runs image by image
        choice = f"winograd{m}" if winograd_gain(1, c, k, out, m) >= WINOGRAD_MIN_GAIN else "direct"
        chosen = _CHOICES.get()
        if chosen is not None:
            key = conv_algorithm_key(x.type, k, tuple(pads))
            chosen.seen.setdefault(key, choice)
            choice = chosen.fixed.get(key, choice)
        if choice == "direct":
            return False
        m = int(choice.removeprefix("winograd"))
        u = winograd_weight(relayout(w.data, "OIHW", f"OIHW{cb}i{kb}o"), m)
        uv = Value(self.fresh(f"{w.name}_winograd"), w.type.with_shape(u.shape), u)
        b = node.inputs[2] if len(node.inputs) > 2 else None
        out = y.type.with_shape((n, k // kb, *y.shape[2:], kb))
        self.produce_blocked(node, self.emit("ConvWinogradNCHWc", [xb, uv, b], out, {"pads": tuple(pads)},
                                             f"{y.name}_winograd"), kb)  # fmt: skip
        return True

    def operand(self, v: Value, shape: tuple[int, ...], b: int) -> Value:
        """Operand v (that `fits`) of a broadcasting op with NCHW output `shape`, in the blocked layout: a
        value of the full channel count re-laid out, a size-1 one as is, one without channels ([N, 1, H,
        W]) reshaped."""
        if v.type.is_static and v.type.size == 1:
            return v
        full = (1,) * (4 - len(v.shape)) + tuple(v.shape)
        if full[1] == 1:
            target = (full[0], 1, full[2], full[3], 1)
            return self.emit("Reshape", [self.to_nchw(v)], v.type.with_shape(target), {"shape": target},
                             f"{v.name}_nchw1c")  # fmt: skip
        if v.shape != full:
            v = self.emit("Reshape", [self.to_nchw(v)], v.type.with_shape(full), {"shape": full}, f"{v.name}_4d")
        return self.to_blocked(v, b)

    @staticmethod
    def blocked_shape(shape: tuple[int, ...], b: int) -> tuple[int, ...]:
        n, c, h, w = shape
        return (n, c // b, h, w, b)

    def pool(self, node: Node) -> bool:
        x, y = node.inputs[0], node.outputs[0]
        used = [v for v in node.outputs[1:] if v in self.readers or v in self.graph.outputs]
        if x not in self.blocked or used or len(node.attrs["kernel_shape"]) != 2:
            return False
        xb, b = self.blocked[x]
        attrs = {k: node.attrs[k] for k in ("kernel_shape", "strides", "pads", "dilations", "ceil_mode")}
        attrs["mode"] = POOLS[node.op]
        attrs["count_include_pad"] = node.attrs.get("count_include_pad", 0)
        out = self.emit("PoolNCHWc", [xb], y.type.with_shape(self.blocked_shape(y.shape, b)), attrs, f"{y.name}_nchwc")
        self.produce_blocked(node, out, b)
        return True

    def global_pool(self, node: Node) -> bool:
        x, y = node.inputs[0], node.outputs[0]
        if x not in self.blocked:
            return False
        xb, b = self.blocked[x]
        out = self.emit("GlobalPoolNCHWc", [xb], xb.type.with_shape((xb.shape[0], xb.shape[1], 1, 1, b)),
                        {"mode": GLOBAL_POOLS[node.op]}, f"{y.name}_nchwc")  # fmt: skip
        self.produce_blocked(node, out, b)
        if x in self.padded:
            self.padded[y] = self.padded[x]
        return True

    def spatial_reduce(self, node: Node) -> bool:
        """ReduceMean/ReduceMax of a blocked value over H and W (torchvision's `x.mean([2, 3])`) as global pooling;
        without keepdims, [N, C/b, 1, 1, b] read as [N, C] (the same memory order)."""
        x, y = node.inputs[0], node.outputs[0]
        axes = sorted(norm_axis(a, 4) for a in node.attrs.get("axes") or ())
        if x not in self.blocked or len(node.present_inputs) != 1 or axes != [2, 3]:
            return False
        if x in self.padded and not node.attrs["keepdims"]:
            return False  # [N, C] read as [N, C/b, 1, 1, b] would hold the padding: the input is unpadded instead
        xb, b = self.blocked[x]
        out = xb.type.with_shape((xb.shape[0], xb.shape[1], 1, 1, b))
        pooled = self.emit("GlobalPoolNCHWc", [xb], out, {"mode": SPATIAL_REDUCES[node.op]}, f"{y.name}_nchwc")
        if node.attrs["keepdims"]:
            self.produce_blocked(node, pooled, b)
            if x in self.padded:
                self.padded[y] = self.padded[x]
        else:
            self.nodes.append(Node("Reshape", [pooled], [y], {"shape": y.shape}, node.name))
        return True

    def concat(self, node: Node) -> bool:
        """A Concat along the channels of 4-d values, one of them blocked: in the blocked layout with the largest
        block that divides every input's channels (so each input is a whole number of blocks of the output)."""
        y = node.outputs[0]
        if len(y.shape) != 4 or y.dtype not in self.lanes or norm_axis(node.attrs["axis"], 4) != 1:
            return False
        channels = [v.shape[1] for v in node.inputs]
        if not any(v in self.blocked for v in node.inputs) or not all(isinstance(c, int) for c in channels):
            return False
        b = block_of(math.gcd(*channels), self.lanes[y.dtype])
        if b is None:
            return False
        parts = [self.to_blocked(v, b) for v in node.inputs]
        out = y.type.with_shape(self.blocked_shape(y.shape, b))
        self.produce_blocked(node, self.emit("Concat", parts, out, {"axis": 1}, f"{y.name}_{nchwc(b)}"), b)
        return True

    def split(self, node: Node) -> bool:
        """A Split or Slice of a blocked value along the channels: in the blocked layout (a view when the batch
        is 1, `ember.passes.inplace.channel_view`), re-blocked first by a smaller block where a cut falls inside
        one of its blocks."""
        x = node.inputs[0]
        if x not in self.blocked or len(node.present_inputs) != 1 or not x.type.is_static:
            return False
        if node.op == "Split":
            if norm_axis(node.attrs["axis"], 4) != 1:
                return False
            sizes = node.attrs["split"]
        else:
            bounds = slice_bounds(tuple(x.shape), node.attrs)
            (start, end, step) = bounds[1]
            if any(bd != (0, d, 1) for k, (bd, d) in enumerate(zip(bounds, x.shape)) if k != 1):
                return False
            if step != 1 or end <= start:
                return False
            sizes = (start, end - start)
        xb, b = self.blocked[x]
        if any(n % b for n in sizes):  # cuts inside a block: re-blocked by one that holds them (one transform)
            b = block_of(math.gcd(x.shape[1], *sizes), self.lanes[x.dtype])
            if b is None:
                return False
            xb = self.to_blocked(x, b)
        if node.op == "Split":
            attrs = {"axis": 1, "split": tuple(n // b for n in sizes)}
        else:
            attrs = {"starts": (start // b,), "ends": (end // b,), "axes": (1,), "steps": (1,)}
        outs = [Value(self.fresh(f"{v.name}_{nchwc(b)}"), v.type.with_shape(self.blocked_shape(v.shape, b)))
                for v in node.outputs]  # fmt: skip
        self.nodes.append(Node(node.op, [xb], outs, attrs, outs[0].name))
        for v, bv in zip(node.outputs, outs):
            self.blocked[v] = (bv, b)
            self.missing.add(v)
        return True

    def channel_cuts(self, v: Value) -> list[int]:
        """Where the readers of v cut its channels: the boundaries of channel Splits and Slices (unit step)."""
        cuts = []
        for r in self.readers.get(v, []):
            if r.op == "Split" and norm_axis(r.attrs["axis"], 4) == 1 and len(r.present_inputs) == 1:
                cuts += np.cumsum(r.attrs["split"]).tolist()
            elif r.op == "Slice" and len(r.present_inputs) == 1:
                start, end, _ = slice_bounds(tuple(v.shape), r.attrs)[1]
                cuts += [start, end]
        return cuts

    def shuffle(self, node: Node) -> bool:
        """A ChannelShuffle with a blocked input, or read by a convolution big enough to start a blocked region, as
        `ChannelShuffleNCHWc`: its inputs read as they are (blocked, or an NCHW one as [N, C, H, W, 1], a view),
        its output blocked by the largest block that divides its channels and every cut of a channel Split or
        Slice reading it (so those stay blocked: ShuffleNet's halves). One copy, where the NCHW shuffle and a
        LayoutTransform would be two."""
        y = node.outputs[0]
        if y.dtype not in self.lanes or not y.type.is_static:
            return False
        convs = [r for r in self.readers.get(y, []) if r.op == "Conv" and r.inputs[0] is y and len(y.shape) == 4]
        if not any(v in self.blocked for v in node.inputs) and not any(map(self.starts_blocked, convs)):
            return False  # NCHW in, and no reader that takes it blocked: it stays NCHW
        b = block_of(math.gcd(y.shape[1], *self.channel_cuts(y)), self.lanes[y.dtype])
        parts = [self.blocked[v][0] if v in self.blocked else self.to_blocked(v, 1) for v in node.inputs]
        attrs = {"group": node.attrs["group"], "block": b or 1}
        if any(v in self.padded for v in node.inputs):
            attrs["channels"] = tuple(v.shape[1] for v in node.inputs)
        out = y.type.with_shape(self.blocked_shape(y.shape, b or 1))
        shuffled = self.emit("ChannelShuffleNCHWc", parts, out, attrs, f"{y.name}_{nchwc(b or 1)}")
        if b is None:  # no block holds the cuts: NCHW, written as [N, C, H, W, 1]
            self.nodes.append(Node("Reshape", [shuffled], [y], {"shape": y.shape}, node.name))
        else:
            self.produce_blocked(node, shuffled, b)
        return True

    def convert(self, node: Node) -> bool:
        if node.subgraphs():
            return False
        takes = ("Conv", "ChannelShuffle", *PAD_SAFE, *PAD_FINITE, *PAD_BINARY, *GLOBAL_POOLS, *SPATIAL_REDUCES)
        if any(v in self.padded for v in node.present_inputs) and node.op not in takes:
            return False  # unforeseen reader of a padded value: it gets it back in NCHW (`to_nchw`)
        if node.op == "Conv":
            return self.conv1d(node) if len(node.inputs[0].shape) == 3 else self.conv(node)
        if node.op == "Concat":
            return self.concat(node)
        if node.op in ("Split", "Slice") and node.inputs and node.inputs[0] is not None:
            return self.split(node)
        if node.op == "ChannelShuffle":
            return self.shuffle(node)
        if node.op in POOLS:
            return self.pool(node)
        if node.op in GLOBAL_POOLS:
            return self.global_pool(node)
        if node.op in SPATIAL_REDUCES and node.inputs and len(node.inputs[0].shape) == 4:
            return self.spatial_reduce(node)
        opdef = get_op(node.op)
        if opdef.pattern not in (Pattern.ELEMWISE, Pattern.BROADCAST) or node.op in NOT_CHANNELWISE:
            return False
        if any(k in node.attrs for k in ("axis", "axes", "shape")) or len(node.outputs[0].shape) != 4:
            return False
        return self.elementwise(node)

    def run(self) -> Graph:
        g = self.graph
        self.readers = g.consumers()
        self.producers = {v: node for node in g.nodes for v in node.outputs}
        self.done: set[Node] = set()  # nodes converted (or kept) so far
        for node in g.nodes:
            if not self.convert(node):
                for v in node_reads(node):
                    self.to_nchw(v)
                self.nodes.append(node)
            self.done.add(node)
        for v in g.outputs:
            self.to_nchw(v)
        g.nodes = self.nodes
        return g


def cancel_transforms(graph: Graph) -> Graph:
    """A LayoutTransform of a LayoutTransform's output back to the first one's input layout reads that
    input instead; a transform to the same layout is dropped."""
    uses = Uses(graph)
    for node in list(graph.nodes):
        if node.op != "LayoutTransform" or node in uses.dead:
            continue
        src, dst = node.attrs["src_layout"], node.attrs["dst_layout"]
        prev = uses.producer(node.inputs[0])
        if src == dst:
            uses.replace_uses(node.outputs[0], node.inputs[0])
        elif prev is not None and prev.op == "LayoutTransform" and prev.attrs["src_layout"] == dst:
            uses.replace_uses(node.outputs[0], prev.inputs[0])
    uses.sweep()
    graph.topo_sort()
    return dead_code_elimination(graph)


def convert_layout(graph: Graph, target: Target | str | None = None) -> Graph:
    """Convolutions and the ops between them to NCHW[x]c for `target` (default: the host CPU). GPU targets
    keep NCHW: their threads run over output channels and pixels, not over vector lanes of a channel block."""
    target = Target.parse(target or "c")
    if is_gpu(target):
        return graph
    lanes = {dt: target.vector_lanes(int(dt[-2:])) for dt in FLOATS}
    graph.topo_sort()
    return cancel_transforms(_Converter(graph, lanes).run())


__all__ = ["block_of", "cancel_transforms", "convert_layout"]
