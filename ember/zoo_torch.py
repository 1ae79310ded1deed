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


def _divisible(v: float, d: int = 8) -> int:
    """torchvision's channel rounding: the nearest multiple of `d`, never 10% below `v`."""
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


class SqueezeExcite(nn.Module):
    """Channel attention: global average pool, a bottleneck of two 1x1 convolutions, a gate."""

    def __init__(self, channels: int, squeeze: int, act: type[nn.Module], gate: type[nn.Module]):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(nn.functional.adaptive_avg_pool2d(x, 1)))))


def _conv_bn(cin: int, cout: int, k: int, stride: int, groups: int, act: type[nn.Module] | None) -> list[nn.Module]:
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return layers + ([act()] if act is not None else [])


class MBConv(nn.Module):
    """The inverted residual of MobileNetV3 and EfficientNet: expand, depthwise, squeeze-excite, project."""

    def __init__(self, cin: int, k: int, expanded: int, cout: int, se: int, act: type[nn.Module], stride: int,
                 gate: type[nn.Module] = nn.Hardsigmoid):  # fmt: skip
        super().__init__()
        layers = _conv_bn(cin, expanded, 1, 1, 1, act) if expanded != cin else []
        layers += _conv_bn(expanded, expanded, k, stride, expanded, act)
        if se:
            layers.append(SqueezeExcite(expanded, se, nn.ReLU if act is nn.Hardswish else act, gate))
        layers += _conv_bn(expanded, cout, 1, 1, 1, None)
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV3(nn.Module):
    """torchvision's mobilenet_v3_large (hardswish, hardsigmoid squeeze-excite), channels scaled by `width`."""

    def __init__(self, classes: int = 1000, width: float = 1.0):
        super().__init__()
        RE, HS = nn.ReLU, nn.Hardswish
        rows = [(3, 16, 16, False, RE, 1), (3, 64, 24, False, RE, 2), (3, 72, 24, False, RE, 1),
                (5, 72, 40, True, RE, 2), (5, 120, 40, True, RE, 1), (5, 120, 40, True, RE, 1),
                (3, 240, 80, False, HS, 2), (3, 200, 80, False, HS, 1), (3, 184, 80, False, HS, 1),
                (3, 184, 80, False, HS, 1), (3, 480, 112, True, HS, 1), (3, 672, 112, True, HS, 1),
                (5, 672, 160, True, HS, 2), (5, 960, 160, True, HS, 1), (5, 960, 160, True, HS, 1)]  # fmt: skip
        cin = _divisible(16 * width)
        layers = _conv_bn(3, cin, 3, 2, 1, HS)
        for k, exp, out, se, act, stride in rows:
            exp, out = _divisible(exp * width), _divisible(out * width)
            layers.append(MBConv(cin, k, exp, out, _divisible(exp // 4) if se else 0, act, stride))
            cin = out
        layers += _conv_bn(cin, 6 * cin, 1, 1, 1, HS)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(6 * cin, 1280), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1280, classes))  # fmt: skip

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class EfficientNetB0(nn.Module):
    """torchvision's efficientnet_b0 (SiLU, sigmoid squeeze-excite, 5x5 depthwise), channels scaled by `width`."""

    def __init__(self, classes: int = 1000, width: float = 1.0):
        super().__init__()
        stages = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                  (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]  # fmt: skip
        layers = _conv_bn(3, _divisible(32 * width), 3, 2, 1, nn.SiLU)
        for ratio, k, stride, cin, cout, n in stages:
            cin, cout = _divisible(cin * width), _divisible(cout * width)
            for i in range(n):
                c = cin if i == 0 else cout
                layers.append(MBConv(c, k, c * ratio, cout, max(1, c // 4), nn.SiLU, stride if i == 0 else 1,
                                     gate=nn.Sigmoid))  # fmt: skip
        last = _divisible(320 * width)
        layers += _conv_bn(last, 4 * last, 1, 1, 1, nn.SiLU)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(4 * last, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class ViTBlock(nn.Module):
    def __init__(self, d: int, heads: int, mlp: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d))

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.self_attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    """torchvision's vit_b_16 (patch embedding by a strided convolution, class token, learned positions, pre-norm
    encoder blocks of nn.MultiheadAttention); the defaults are ViT-B/16 at 224x224."""

    def __init__(self, classes: int = 1000, image: int = 224, patch: int = 16, d: int = 768, layers: int = 12,
                 heads: int = 12, mlp: int = 3072):  # fmt: skip
        super().__init__()
        self.patch = patch
        self.conv_proj = nn.Conv2d(3, d, patch, patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos_embedding = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d) * 0.02)
        self.layers = nn.Sequential(*[ViTBlock(d, heads, mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        return self.head(self.ln(self.layers(x))[:, 0])


class DecoderWithCache(nn.Module):
    """A Hugging Face causal LM as a function of flat tensors: (input_ids, past key, past value per layer) ->
    (logits, present key, present value per layer), the cache rebuilt from the tensors on every call."""

    def __init__(self, model: nn.Module, layers: int):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, *past):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        present = [t for layer in out.past_key_values.layers[: self.layers] for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def gpt2_with_kv_cache(layers: int = 2, d: int = 64, heads: int = 4, vocab: int = 100, positions: int = 64,
                       init_std: float = 0.2, seed: int = 0):  # fmt: skip
    """A GPT-2 language model with random weights (transformers' GPT2LMHeadModel) exported to ONNX by torch's
    dynamo exporter with its KV cache as inputs and outputs: `input_ids` [batch, seq], `past_key_<i>` and
    `past_value_<i>` [batch, heads, past, d/heads] -> `logits` [batch, seq, vocab], `present_key_<i>` and
    `present_value_<i>` [batch, heads, past + seq, d/heads]. The prompt step runs at past = 0, each decoding
    step at seq = 1 (past + seq <= positions). Weights are drawn with `init_std` (GPT-2's 0.02 makes a random
    model repeat one token forever). Needs transformers and onnxscript."""
    import warnings

    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads, n_positions=positions,
                                  initializer_range=init_std, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = DecoderWithCache(transformers.GPT2LMHeadModel(cfg).eval(), layers)
    names = [f"{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    batch = torch.export.Dim("batch", max=64)
    seq, past = torch.export.Dim("seq", max=positions), torch.export.Dim("past", max=positions)
    ids = torch.randint(0, vocab, (2, 5))  # example sizes other than 0 and 1, which torch.export would specialize
    cache = tuple(torch.randn(2, heads, 3, d // heads) for _ in names)
    shapes = ({0: batch, 1: seq}, ({0: batch, 2: past},) * len(names))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (ids, *cache), dynamo=True, verbose=False,
                                    input_names=["input_ids"] + [f"past_{n}" for n in names],
                                    output_names=["logits"] + [f"present_{n}" for n in names],
                                    dynamic_shapes=shapes)  # fmt: skip
    return program.model_proto


def greedy_decode(run, model, prompt, steps: int) -> tuple[list[int], list]:
    """Greedy decoding of the model `gpt2_with_kv_cache` makes, by `run(feeds) -> {output name: array}` (an Ember
    model's `run`, an onnxruntime session wrapped): the prompt [1, n] at an empty cache (past = 0), then `steps`
    decoding steps of one token each (past = n .. n + steps - 1), each step's present key/values fed back as the
    next step's past. Returns (the steps + 1 tokens chosen, the logits of the last position at each call)."""
    import numpy as np

    past = {}
    for vi in model.graph.input[1:]:
        dims = vi.type.tensor_type.shape.dim
        past[vi.name] = np.zeros((1, dims[1].dim_value, 0, dims[3].dim_value), np.float32)
    ids, tokens, logits = np.asarray(prompt, np.int64).reshape(1, -1), [], []
    for _ in range(steps + 1):
        out = run({"input_ids": ids, **past})
        last = out["logits"][0, -1]
        logits.append(last)
        tokens.append(int(np.argmax(last)))
        ids = np.array([[tokens[-1]]], np.int64)
        past = {name: out["present_" + name[len("past_"):]] for name in past}
    return tokens, logits


EXAMPLES = ("resnet18", "mobilenet_v2", "bert4", "conv_stack", "mlp")  # the names `example` builds


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
        raise KeyError(f"unknown model {name!r}; known: {', '.join(EXAMPLES)}")
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
