"""PyTorch versions of the example models (torchvision-style ResNet-18 and MobileNetV2, a BERT-like
encoder, a conv stack, an MLP), for comparing with PyTorch eager and for testing the export path
(torch.onnx -> ember.compile). Importing this module needs torch.
"""

from __future__ import annotations

import math

import torch
from torch import nn


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


def example(name: str, image: int = 224) -> tuple[nn.Module, tuple[torch.Tensor, ...], list[str]]:
    """(module in eval mode with non-trivial batch-norm statistics, example inputs, input names)."""
    g = torch.Generator().manual_seed(0)
    if name == "resnet18":
        m, args = ResNet18(), (torch.randn(1, 3, image, image, generator=g),)
    elif name == "mobilenet_v2":
        m, args = MobileNetV2(), (torch.randn(1, 3, image, image, generator=g),)
    elif name == "bert4":
        m = BertEncoder()
        args = (torch.randint(0, 1000, (1, 128), generator=g), torch.ones(1, 128, dtype=torch.int64))
    elif name == "conv_stack":
        m, args = ConvStack(), (torch.randn(1, 64, 56, 56, generator=g),)
    elif name == "mlp":
        m, args = MLP(), (torch.randn(64, 784, generator=g),)
    else:
        raise KeyError(f"unknown model {name!r}")
    names = ["input_ids", "attention_mask"] if name == "bert4" else ["x"]
    g = torch.Generator().manual_seed(1)
    for bn in (b for b in m.modules() if isinstance(b, nn.BatchNorm2d)):
        bn.running_mean.copy_(torch.randn(bn.num_features, generator=g) * 0.1)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
    return m.eval(), args, names


def to_onnx(module: nn.Module, args: tuple, names: list[str], opset: int = 17):
    """Export with torch.onnx (the TorchScript exporter: no onnxscript needed)."""
    import io
    import warnings

    import onnx

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, f, input_names=names, output_names=["y"], opset_version=opset, dynamo=False)
    return onnx.load_from_string(f.getvalue())
