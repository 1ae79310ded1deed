"""Ember against ONNX Runtime and PyTorch eager on whole models, side by side in one run.

    python bench/models.py [--models resnet18,mobilenet_v2,bert4,conv_stack,mlp] [--threads 1,2]
                           [--tuning-log LOG] [--repeat 30] [--cold-compile] [--json]

The models are PyTorch modules written here (torchvision-style ResNet-18 and MobileNetV2, a
BERT-base-like encoder with 4 layers at sequence 128, 5 x (Conv, BN, ReLU) at 64 channels, an MLP
at batch 64) with random weights, exported to ONNX with torch.onnx. Without torch, the same
architectures come from `ember.zoo` (ONNX built directly) and the torch column is left out.

Per model and thread count: median latency of each system (after warm-up, the systems take turns
in blocks of a few runs, with a pause before each block and its first run not counted, so that
one system's idle worker threads do not steal CPU from the next; ONNX Runtime's threads do not
spin), the ratio to Ember, Ember's compile time, and the max relative difference from onnxruntime.
The last lines give the geometric means of the ratios.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import onnx

import ember
from ember import zoo

try:
    import torch
    from torch import nn
except ImportError:  # the bench still runs: Ember vs onnxruntime on the zoo's ONNX models
    torch = None


# -- PyTorch modules ------------------------------------------------------------------------------
if torch is not None:

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self, classes: int = 1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))  # fmt: skip
            layers, cin = [], 64
            for i, c in enumerate([64, 128, 256, 512]):
                layers += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
                cin = c
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int):
            super().__init__()
            hidden = cin * expand
            layers = []
            if expand != 1:
                layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
            layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                       nn.ReLU6(), nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]  # fmt: skip
            self.conv = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self, classes: int = 1000):
            super().__init__()
            layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
            cin = 32
            for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                               (6, 160, 3, 2), (6, 320, 1, 1)]:  # fmt: skip
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, classes)

        def forward(self, x):
            return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    class EncoderLayer(nn.Module):
        def __init__(self, d: int, heads: int, ff: int):
            super().__init__()
            self.heads, self.dh = heads, d // heads
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
            self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def split(self, t):
            b, s, _ = t.shape
            return t.view(b, s, self.heads, self.dh).transpose(1, 2)

        def forward(self, x, mask):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.dh) + mask
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
            h = self.ln1(x + self.o(ctx))
            return self.ln2(h + self.ff2(nn.functional.gelu(self.ff1(h))))

    class BertEncoder(nn.Module):
        def __init__(self, layers: int = 4, seq: int = 128, d: int = 768, heads: int = 12, ff: int = 3072,
                     vocab: int = 1000):  # fmt: skip
            super().__init__()
            self.words, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(EncoderLayer(d, heads, ff) for _ in range(layers))
            self.register_buffer("positions", torch.arange(seq).unsqueeze(0))

        def forward(self, input_ids, attention_mask):
            h = self.ln(self.words(input_ids) + self.pos(self.positions))
            mask = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
            for layer in self.layers:
                h = layer(h, mask)
            return h

    class ConvStack(nn.Module):
        def __init__(self, layers: int = 5, channels: int = 64):
            super().__init__()
            self.body = nn.Sequential(*[m for _ in range(layers) for m in (
                nn.Conv2d(channels, channels, 3, 1, 1), nn.BatchNorm2d(channels), nn.ReLU())])  # fmt: skip

        def forward(self, x):
            return self.body(x)

    class MLP(nn.Module):
        def __init__(self, features: int = 784, hidden: tuple[int, ...] = (1024, 1024), classes: int = 10):
            super().__init__()
            dims = (features, *hidden)
            layers = [m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
            self.body = nn.Sequential(*layers, nn.Linear(dims[-1], classes))

        def forward(self, x):
            return self.body(x)


def _torch_model(name: str):
    """(module, example inputs) for a model name."""
    g = torch.Generator().manual_seed(0)
    if name == "resnet18":
        return ResNet18(), (torch.randn(1, 3, 224, 224, generator=g),)
    if name == "mobilenet_v2":
        return MobileNetV2(), (torch.randn(1, 3, 224, 224, generator=g),)
    if name == "bert4":
        ids = torch.randint(0, 1000, (1, 128), generator=g)
        return BertEncoder(), (ids, torch.ones(1, 128, dtype=torch.int64))
    if name == "conv_stack":
        return ConvStack(), (torch.randn(1, 64, 56, 56, generator=g),)
    if name == "mlp":
        return MLP(), (torch.randn(64, 784, generator=g),)
    raise KeyError(name)


def _randomize_bn(module) -> None:
    """Give batch norms non-trivial statistics (fresh modules have mean 0, var 1)."""
    g = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


ZOO: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet18": zoo.resnet18,
    "mobilenet_v2": zoo.mobilenet_v2,
    "bert4": lambda: zoo.bert_encoder(layers=4, seq=128),
    "conv_stack": lambda: zoo.conv_bn_relu_stack(layers=5, channels=64, size=56),
    "mlp": lambda: zoo.mlp(batch=64, features=784, hidden=(1024, 1024)),
}


def build(name: str) -> tuple[onnx.ModelProto, Callable | None, dict[str, np.ndarray]]:
    """(ONNX model, torch callable or None, feeds)."""
    if torch is None:
        model = ZOO[name]()
        return model, None, zoo.random_feeds(model)
    module, args = _torch_model(name)
    _randomize_bn(module)
    module.eval()
    f = io.BytesIO()
    names = ["input_ids", "attention_mask"] if name == "bert4" else ["x"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, f, input_names=names, output_names=["y"], opset_version=17, dynamo=False)
    model = onnx.load_from_string(f.getvalue())
    feeds = {n: a.numpy() for n, a in zip(names, args)}

    def run_torch(*xs):
        with torch.inference_mode():
            return module(*[torch.from_numpy(x) for x in xs])

    return model, run_torch, feeds


BLOCK = 5  # runs of one system in a row


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_model(name: str, threads: int, repeat: int, tuning_log: str | None) -> dict:
    import onnxruntime as ort

    model, run_torch, feeds = build(name)
    xs = list(feeds.values())
    target = f"c -threads={threads}"
    kwargs = {"tuning_log": tuning_log} if tuning_log else {}
    m = ember.compile(model, target=target, **kwargs)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle ORT threads must not steal CPU
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    ours = list(m.run(feeds).values())
    diff = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ours, ref))
    systems: dict[str, Callable[[], object]] = {"ember": lambda: m(*xs), "onnxruntime": lambda: sess.run(None, feeds)}
    if run_torch is not None:
        torch.set_num_threads(threads)
        systems["torch"] = lambda: run_torch(*xs)
    for fn in systems.values():  # warm-up
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {k: [] for k in systems}
    blocks = max(1, repeat // BLOCK)
    for _ in range(blocks):  # systems in turn, a block each, so drifts of a shared machine hit every system alike
        for k, fn in systems.items():
            time.sleep(0.05)  # the previous system's worker threads go idle
            fn()  # the first run after a switch warms caches and wakes this system's threads: not counted
            times[k] += [timed(fn) for _ in range(-(-repeat // blocks))]
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    s = m.summary()
    return {"ms": med, "ratio": {k: med[k] / med["ember"] for k in med}, "compile_s": s["compile_seconds"],
            "kernels": s["kernels"], "fallback": len(s["fallback_ops"]), "rel_diff": diff}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(ZOO))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--tuning-log", default=None)
    p.add_argument("--cold-compile", action="store_true",
                   help="also time each model's compile with an empty kernel cache (the compile column is warm)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results: dict = {}
    if args.cold_compile:
        results["cold_compile_s"] = cold = {}
        print("compile with an empty kernel cache (1 thread, untuned):")
        for name in args.models.split(","):
            model = build(name)[0]
            with tempfile.TemporaryDirectory() as d:
                saved = os.environ.get("EMBER_CACHE_DIR")
                os.environ["EMBER_CACHE_DIR"] = d
                try:
                    s = ember.compile(model, target="c -threads=1").summary()
                finally:
                    if saved is None:
                        del os.environ["EMBER_CACHE_DIR"]
                    else:
                        os.environ["EMBER_CACHE_DIR"] = saved
            cold[name] = s["compile_seconds"]
            print(f"  {name:<14} {s['compile_seconds']:6.2f} s  (lower {s['lower_seconds']:.2f} s, "
                  f"C compiler {s['build_seconds']:.2f} s, {s['kernels']} kernels)")  # fmt: skip
    for threads in [int(t) for t in args.threads.split(",")]:
        print(f"\n{threads} thread(s){'  (tuned: ' + args.tuning_log + ')' if args.tuning_log else ''}")
        head = (
            "model",
            "ember ms",
            "ort ms",
            "torch ms",
            "ort/ember",
            "torch/ember",
            "compile s",
            "kernels",
            "rel diff",
        )
        print("{:<14} {:>9} {:>9} {:>9} {:>10} {:>12} {:>10} {:>8} {:>9}".format(*head))
        rows = {}
        for name in args.models.split(","):
            r = bench_model(name, threads, args.repeat, args.tuning_log)
            rows[name] = r
            t = r["ms"].get("torch")
            tr = r["ratio"].get("torch")
            print(f"{name:<14} {r['ms']['ember']:>9.3f} {r['ms']['onnxruntime']:>9.3f} "
                  f"{t if t is not None else float('nan'):>9.3f} {r['ratio']['onnxruntime']:>10.2f} "
                  f"{tr if tr is not None else float('nan'):>12.2f} {r['compile_s']:>10.2f} {r['kernels']:>8} "
                  f"{r['rel_diff']:>9.1e}" + (f"  ({r['fallback']} on ref.)" if r["fallback"] else ""))  # fmt: skip
        for other in ("onnxruntime", "torch"):
            ratios = [r["ratio"][other] for r in rows.values() if other in r["ratio"]]
            if ratios:
                gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                print(f"geometric mean {other}/ember: {gm:.2f}  (> 1: Ember faster; Ember = {1 / gm:.2f} x {other})")
        results[str(threads)] = rows
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
