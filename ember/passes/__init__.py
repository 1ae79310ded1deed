"""Graph passes: functions Graph -> Graph with a name and an opt level, run as a flat pipeline.

    graph, report = run_passes(graph, opt_level=3, disabled=["fuse_ops"], verify=True)

`PASSES` lists them in pipeline order; a pass runs when `opt_level >= pass.opt_level` and its name
is not disabled; passes that decide by target (layouts) get `target` (default: the host CPU).
`report` has each pass's seconds and node count after it; `dump_after=NAME` prints the graph after
that pass (`ember show MODEL --after NAME`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ember.graph.ir import Graph
from ember.ops.verify import verify as verify_graph
from ember.target import Target

from .attention import fuse_attention
from .batchnorm import fold_batchnorm
from .cleanup import dead_code_elimination, eliminate_common_subexpr, fold_constant
from .control import unroll_scan
from .fuse import fuse_ops
from .inplace import channel_shuffle, concat_in_place
from .integer import integer_ops
from .layout import convert_layout
from .pack import pack_weights
from .simplify import simplify


@dataclass(frozen=True)
class Pass:
    name: str
    fn: Callable[[Graph], Graph]
    opt_level: int
    doc: str
    takes_target: bool = False  # fn(graph, target=...): decisions for the compilation target


PASSES: list[Pass] = [
    Pass("unroll_scan", unroll_scan, 0, "inline the body of a Scan with a static length once per step"),
    Pass("integer_ops", integer_ops, 1, "quantized conv/matmul (QDQ, QLinear*) to integer kernels on packed weights",
         takes_target=True),
    Pass("fold_constant", fold_constant, 1, "evaluate subgraphs whose inputs are all constants"),
    Pass("simplify", simplify, 1, "algebraic identities, no-op removal, Gelu/LayerNorm recognition"),
    Pass("fold_batchnorm", fold_batchnorm, 1, "fold BatchNormalization and constant scale/shift into conv/gemm"),
    Pass("fold_constant", fold_constant, 1, "evaluate subgraphs whose inputs are all constants"),
    Pass("eliminate_common_subexpr", eliminate_common_subexpr, 2, "merge identical nodes and constants"),
    Pass("dead_code_elimination", dead_code_elimination, 1, "drop nodes whose outputs are unused"),
    Pass("channel_shuffle", channel_shuffle, 2, "Reshape -> Transpose -> Reshape channel shuffles as ChannelShuffle"),
    Pass("convert_layout", convert_layout, 3, "convolutions and the ops between them to NCHW[x]c", takes_target=True),
    Pass("fold_constant", fold_constant, 3, "evaluate subgraphs whose inputs are all constants (re-laid out weights)"),
    Pass("fuse_attention", fuse_attention, 3, "MatMul -> [scale] -> Softmax -> MatMul as one Attention node",
         takes_target=True),
    Pass("pack_weights", pack_weights, 3, "constant B of MatMul/Gemm packed into GEMM panels", takes_target=True),
    Pass("concat_in_place", concat_in_place, 2, "Concat inputs written by their producers into the output (no copy)",
         takes_target=True),
    Pass("fuse_ops", fuse_ops, 1, "group operators into kernels by pattern kind (Fused nodes)"),
]


class PassError(RuntimeError):
    """A pass produced an invalid graph (raised with verify=True); names the pass."""


def pass_names() -> list[str]:
    return list(dict.fromkeys(p.name for p in PASSES))


def run_passes(
    graph: Graph,
    opt_level: int = 3,
    disabled: Sequence[str] = (),
    verify: bool = False,
    dump_after: str | None = None,
    passes: Sequence[Pass] | None = None,
    target: Target | str | None = None,
) -> tuple[Graph, list[dict]]:
    unknown = set(disabled) - set(pass_names())
    if unknown:
        raise ValueError(f"unknown pass(es) {sorted(unknown)}; passes: {', '.join(pass_names())}")
    if not 0 <= opt_level <= 3:
        raise ValueError(f"opt_level must be 0..3, got {opt_level}")
    report = []
    for p in passes if passes is not None else PASSES:
        if opt_level < p.opt_level or p.name in disabled:
            continue
        t0 = time.perf_counter()
        graph = p.fn(graph, target=target) if p.takes_target else p.fn(graph)
        dt = time.perf_counter() - t0
        if verify:
            try:
                verify_graph(graph)
            except Exception as e:
                raise PassError(f"pass {p.name} produced an invalid graph: {e}") from e
        report.append({"pass": p.name, "seconds": dt, "nodes": len(graph.nodes)})
        if dump_after == p.name:
            print(f"# after {p.name}\n{graph}")
    return graph, report


__all__ = ["PASSES", "Pass", "PassError", "pass_names", "run_passes"]
