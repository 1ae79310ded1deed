"""`ember show MODEL`: import a model and print its graph (or a summary).

    ember show model.onnx
    ember show model.onnx --input-shape input=1,3,224,224 --summary

`show_main(argv)` is the command; the CLI (`ember.cli`) dispatches to it. It returns the
exit status: 0, or 1 with a one-paragraph message on stderr for bad input."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np

from ember.frontend.onnx import ModelError, from_onnx
from ember.graph.ir import Graph


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """'name=1,3,224,224' -> ('name', (1, 3, 224, 224))."""
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-shape wants NAME=D,D,...; got {text!r}") from None


def summary(graph: Graph) -> str:
    """Op counts, parameter count and size, inputs and outputs."""
    ops = Counter(n.op for n in graph.nodes)
    consts = graph.constants()
    params = sum(c.data.size for c in consts)
    nbytes = sum(c.data.nbytes for c in consts)
    lines = [
        f"graph {graph.name}: {len(graph.nodes)} nodes, {len(consts)} constants "
        f"({params:,} elements, {nbytes / 2**20:.1f} MiB)",
        "inputs:  " + ", ".join(f"{v.name}: {v.type}" for v in graph.inputs),
        "outputs: " + ", ".join(f"{v.name}: {v.type}" for v in graph.outputs),
        "operators:",
    ]
    lines += [f"  {count:5d}  {op}" for op, count in ops.most_common()]
    return "\n".join(lines)


def show_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ember show", description="Import a model and print Ember's graph.")
    parser.add_argument("model", help="path to an .onnx file")
    parser.add_argument("--input-shape", action="append", type=parse_shape, default=[], metavar="NAME=D,D,...",
                        help="shape for an input with symbolic dims (repeatable)")  # fmt: skip
    parser.add_argument("--summary", action="store_true", help="print op counts and sizes instead of the graph")
    args = parser.parse_args(argv)
    try:
        graph = from_onnx(args.model, dict(args.input_shape) or None)
    except ModelError as e:
        print(f"ember show: {e}", file=sys.stderr)
        return 1
    with np.printoptions(threshold=8):
        print(summary(graph) if args.summary else graph)
    return 0


if __name__ == "__main__":
    sys.exit(show_main())
