"""Ember, stage by stage: one model from ONNX to native code, printing what each layer produces.

    python examples/walkthrough.py

1. import: the ONNX model (a ResNet basic block built in code) becomes Ember's graph IR;
2. graph passes: batch norms fold into the convolutions, operators fuse into groups;
3. one fused group (conv + residual add + relu) as tensor expressions;
4. its schedule lowered to loop IR;
5. the generated C;
6. the whole model compiled, checked against onnxruntime, timed and profiled.
"""

import numpy as np

import ember
from ember import zoo
from ember.codegen.c import codegen_c
from ember.frontend.onnx import from_onnx
from ember.kernels import kernel_te
from ember.passes import run_passes
from ember.te.lower import lower_schedule
from ember.te.schedule import topo_ops
from ember.tir.transform import optimize


def banner(title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}")


model = zoo.resnet_basic_block(channels=16, size=14)
target = ember.Target.parse("c")

banner("1. the imported graph")
graph = from_onnx(model)
print(graph)

banner("2. after the graph passes (opt_level 3)")
graph, report = run_passes(graph, opt_level=3)
for r in report:
    print(f"  {r['pass']:<26} {r['nodes']:>3} nodes  {r['seconds'] * 1e3:6.2f} ms")
print(graph)

group = next(n for n in graph.nodes if n.op == "Fused" and len(n.attrs["body"].nodes) >= 3)
banner(f"3. the tensor expressions of group {group.attrs['body'].name}")
kernel = kernel_te(group, target)
for op in topo_ops([t.op for t in kernel.outputs]):
    print(f"  {op}")

banner("4. its loop IR, after scheduling and the loop passes")
func = optimize(lower_schedule(kernel.schedule, kernel.args, "fused_conv_add_relu"))
print(func)

banner("5. the generated C (the kernel function)")
source = codegen_c(func, target)
print(source[source.index("// fused_conv_add_relu(") :])

banner("6. the whole model: compile, check against onnxruntime, time, profile")
m = ember.compile(model, target=target)
feeds = zoo.random_feeds(model)
ours = list(m.run(feeds).values())[0]
try:
    import onnxruntime as ort

    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    print(f"max abs difference from onnxruntime: {np.abs(ours - theirs).max():.2e}")
except ImportError:
    print("(onnxruntime not installed: skipping the check)")
print({k: v for k, v in m.summary().items() if k in ("nodes", "nodes_after_passes", "kernels", "compile_seconds")})
print(f"latency: {m.benchmark(list(feeds.values()))['median'] * 1e3:.3f} ms")
print(m.profile_table(list(feeds.values())))
