"""The PyTorch frontend (torch.export -> core ATen -> graph IR) and the torch.compile backend, compared with torch's
own output on fresh random inputs (max relative error 1e-4 of the output's scale).

Models are built in code with random weights (small widths and resolutions; full sizes are in
bench/torch_compile.py): torchvision-style ResNet-18, MobileNetV3, EfficientNet-B0 and ViT-B/16 from
ember.zoo_torch, and Hugging Face BERT and GPT-2 from a config. Skipped where torch is not installed."""

from __future__ import annotations

import importlib.metadata
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest

import ember

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch (pip install -e '.[torch]')")
zoo_torch = pytest.importorskip("ember.zoo_torch", reason="the model zoo in PyTorch needs torch")
from ember.dynamo import CompiledRegion, ember_backend  # noqa: E402
from ember.frontend.torch import UnsupportedOperatorError  # noqa: E402
from ember.runtime.model import input_specs  # noqa: E402

nn = torch.nn


def assert_close(ours, ref, rtol: float = 1e-4) -> None:
    """Max error relative to the reference's scale (long conv/attention chains in float32)."""
    ours, ref = np.asarray(ours), ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ours.dtype, ref.shape, ref.dtype)
    scale = max(float(np.abs(ref).max()), 1e-6)
    err = float(np.abs(ours.astype(np.float64) - ref).max()) / scale
    assert err <= rtol, f"max relative error {err:.2e} > {rtol:.0e}"


def randomize_batch_norm(m: nn.Module, seed: int = 1) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for bn in (b for b in m.modules() if isinstance(b, nn.BatchNorm2d)):
        bn.running_mean.copy_(torch.randn(bn.num_features, generator=g) * 0.1)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
        bn.weight.data.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
        bn.bias.data.copy_(torch.randn(bn.num_features, generator=g) * 0.1)
    return m.eval()


class LastHidden(nn.Module):
    """A Hugging Face model called with keyword arguments, returning its last hidden state."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


def hugging_face(arch: str, g: torch.Generator) -> tuple[nn.Module, tuple]:
    tf = pytest.importorskip("transformers", reason="the Hugging Face models need transformers")
    if arch == "bert":
        cfg = tf.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                            vocab_size=120, max_position_embeddings=32)  # fmt: skip
        model = tf.BertModel(cfg)
    else:
        cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=120, n_positions=32, bos_token_id=0,
                            eos_token_id=0)  # fmt: skip
        model = tf.GPT2Model(cfg)
    ids = torch.randint(0, 120, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.int64)
    mask[1, 9:] = 0  # a padded sequence: the mask matters
    return LastHidden(model.eval()).eval(), (ids, mask)


def make_model(name: str) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    image = lambda n=1, size=32: torch.randn(n, 3, size, size, generator=g)  # noqa: E731
    if name == "resnet18":
        return randomize_batch_norm(zoo_torch.ResNet18(10)), (image(2),)
    if name == "mobilenet_v3":
        return randomize_batch_norm(zoo_torch.MobileNetV3(10, width=0.25)), (image(1, 48),)
    if name == "efficientnet_b0":
        return randomize_batch_norm(zoo_torch.EfficientNetB0(10, width=0.25)), (image(1, 48),)
    if name == "vit_b16":  # ViT-B/16's structure, narrower and shallower, 16x16 patches of a 48x48 image
        return zoo_torch.ViT(10, image=48, patch=16, d=64, layers=2, heads=4, mlp=128).eval(), (image(2, 48),)
    return hugging_face(name, g)


MODELS = ["resnet18", "mobilenet_v3", "efficientnet_b0", "vit_b16", "bert", "gpt2"]


@pytest.mark.parametrize("name", MODELS)
def test_model(name):
    """Through ember.compile(module), on the example and on fresh inputs, then through torch.compile (in one test:
    the second compile finds the same kernels in the cache)."""
    module, args = make_model(name)
    m = ember.compile(module, example_inputs=args, target="c")
    fresh = tuple(torch.randn_like(a) if a.is_floating_point() else a for a in args)
    with torch.no_grad():
        ref, ref_fresh = module(*args), module(*fresh)
    assert_close(m(*[a.numpy() for a in args]), ref)
    assert_close(m(*[a.numpy() for a in fresh]), ref_fresh)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=ember_backend)
    with torch.no_grad():
        ours = compiled(*fresh)
    assert isinstance(ours, torch.Tensor)
    assert_close(ours, ref_fresh)


def test_exported_program_and_input_names():
    module, args = make_model("bert")
    ep = torch.export.export(module, args)
    m = ember.compile(ep)
    assert m.input_names == ["input_ids", "attention_mask"]
    with torch.no_grad():
        ref = module(*args)
    assert_close(m.run({"input_ids": args[0].numpy(), "attention_mask": args[1].numpy()})["output_0"], ref)


def test_example_inputs_required():
    with pytest.raises(TypeError, match="needs example inputs"):
        ember.compile(nn.Linear(3, 4))


# -- operators ---------------------------------------------------------------------------------------------
class Ops(nn.Module):
    """Many core ATen ops in one module: elementwise with scalars and promotion, indexing, pooling, norms."""

    def __init__(self):
        super().__init__()
        self.convt = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.dw = nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4)

    def forward(self, x, ids, mask):
        b, c, h, w = x.shape
        y = torch.where(x > 0.5, x * 2, -x) + torch.clamp(x, -0.3, 0.4) + nn.functional.hardtanh(x)
        y = y + nn.functional.leaky_relu(x, 0.2) + nn.functional.elu(x) + nn.functional.hardswish(x)
        y = y + nn.functional.hardsigmoid(x) + nn.functional.silu(x) + nn.functional.gelu(x, approximate="tanh")
        y = y.masked_fill(mask[:, None, :, None], -1.5) / 3 - torch.rsqrt(x.abs() + 1) ** 2
        y = self.gn(self.dw(y)) + nn.functional.pad(x, (1, 1, 0, 0))[..., 1:-1]
        pooled = nn.functional.adaptive_avg_pool2d(y, (3, 5)) + nn.functional.avg_pool2d(
            y, 3, 2, 1, ceil_mode=True, count_include_pad=False)[:, :, :3, :5]  # fmt: skip
        up = self.convt(y)
        a, b2 = torch.split(up, [1, 2], dim=1)
        t = y.flatten(2).transpose(1, 2)  # (b, h*w, c)
        att = nn.functional.scaled_dot_product_attention(t[:, None], t[:, None], t[:, None], is_causal=True)
        picked = t[torch.arange(b)[:, None], ids]  # advanced indexing: (b, k, c)
        stats = torch.cat([t.var(1), t.mean(1), t.amax(1), t.cumsum(1)[:, -1], picked.sum(1)], dim=1)
        cls = (ids // 2).float() + torch.argmax(t[:, :, 0], dim=1, keepdim=True) + (ids != 3) + ((ids & 6) ^ ~ids)
        return pooled, a * b2.sum(1, keepdim=True), att.squeeze(1).log_softmax(-1), stats, cls


def test_operator_table():
    torch.manual_seed(3)
    module = Ops().eval()
    x = torch.randn(2, 4, 10, 10)
    ids = torch.randint(0, 100, (2, 5))
    mask = torch.rand(2, 10) < 0.3
    m = ember.compile(module, (x, ids, mask))
    with torch.no_grad():
        refs = module(x, ids, mask)
    for ours, ref in zip(m(x.numpy(), ids.numpy(), mask.numpy()), refs):
        assert_close(ours, ref)


class Resampling(nn.Module):
    """Interpolation, repeats, flips, index_select, max/topk with indices, remainder and fmod."""

    def __init__(self):
        super().__init__()
        self.prelu = nn.PReLU(4)

    def forward(self, x):
        up = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        lin = nn.functional.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False)
        ac = nn.functional.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True)
        values, indices = x.max(dim=1)
        top = torch.topk(x.flatten(1), 3)
        mixed = torch.remainder(x, 0.7) + torch.fmod(x, 0.7) + torch.log1p(x.abs()) + torch.expm1(x) + x.max()
        picked = x.index_select(2, torch.tensor([0, 2])).flip(3).repeat(1, 2, 1, 1)
        freq = torch.arange(0, 2 * x.shape[-1], 2.0, dtype=torch.int64).float()  # a float step, int values (XLNet)
        picked = picked + freq[: picked.shape[-1]]
        return (up, lin, ac, values, indices, top.values, top.indices, mixed, picked, torch.roll(x, 1, 2),
                nn.functional.pixel_shuffle(self.prelu(x), 2), torch.tril(x[0, 0]))  # fmt: skip


def test_resampling_and_selection():
    torch.manual_seed(4)
    module = Resampling().eval()
    x = torch.randn(2, 4, 6, 6)
    m = ember.compile(module, (x,))
    with torch.no_grad():
        refs = module(x)
    for ours, ref in zip(m(x.numpy()), refs, strict=True):
        assert_close(ours, ref)


class Assignments(nn.Module):
    """In-place assignments, which functionalize to slice_scatter, select_scatter, index_put and copy, advanced
    indexing at any dims, as_strided views, and vector norms (weight norm's parametrization, F.normalize)."""

    def __init__(self):
        super().__init__()
        self.wn = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3, padding=1), dim=2)

    def forward(self, x, rows):
        y = x.clone()
        y[:, 1:3] = x[:, :2] * 2  # step 1: concatenation around the slice
        y[..., ::3] = -x[..., 1::3]  # step 3: a scatter
        y[:, 0] = x.sum(1)
        y = torch.select_scatter(y, x[:, :, 0] + 1, 2, -1)
        z = torch.zeros(5, x.shape[2])
        z[rows] = x[0, :3]  # index_put
        z[rows[:1]] += 1.0  # index_put with accumulate
        buf = torch.empty(2, x.shape[1], x.shape[2])
        buf.copy_(x[:1])  # copy with broadcasting
        r4, r2 = rows % 4, rows % 2
        picks = x[:, r4[:2, None], rows[None, :]]  # index tensors after a ':', adjacent: in place
        apart = x[r2[:2], :, rows[1:]]  # separated by a ':': their shape first
        w = x.clone()
        w[:, r4[1:], 1] = x[0, :2, :2].T  # index_put after a ':'
        w[w < -1] = 0.5  # through a boolean mask
        w[:, x[0, :, 0] > 0] = x[1, 0]  # a mask over a middle dim
        strided = torch.as_strided(x, (2, 3, 4), (32, 8, 3), 1)  # overlapping windows of the storage
        strided_t = x.transpose(1, 2).as_strided((8, 2), (1, 8), 2)  # a view of a view: x's storage, not the view's
        norms = [torch.linalg.vector_norm(x, p, dim=(1, 2)) for p in (2, 1, 3.5, float("inf"), float("-inf"), 0)]
        flat_arg = torch.argmax(x) + torch.argmin(x[0])  # over all elements
        return (y, z, buf, picks, apart, w, strided, strided_t, flat_arg, self.wn(x),
                nn.functional.normalize(x, dim=-1),
                torch.stack(norms, -1))


def test_in_place_assignments_and_norms():
    torch.manual_seed(5)
    module = Assignments().eval()
    x = torch.randn(2, 4, 8)
    x[0, 0, :2] = 0  # zeros for the 0-norm's count
    rows = torch.tensor([4, 0, 2])
    m = ember.compile(module, (x, rows))
    with torch.no_grad():
        refs = module(x, rows)
    for ours, ref in zip(m(x.numpy(), rows.numpy()), refs, strict=True):
        assert_close(ours, ref)


class BatchStatistics(nn.Module):
    """Batch norm by the batch's own statistics, without running ones: weight standardization (timm's
    ScaledStdConv2d, NFNets) over a (1, out, fan_in) view of the weight, and a 1-d and a 2-d activation."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 3, 3, 3) * 2 + 0.5)
        self.gain = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x, v):
        w = nn.functional.batch_norm(self.w.reshape(1, 8, -1), None, None, weight=self.gain, training=True,
                                     momentum=0.0, eps=1e-5).reshape_as(self.w)  # fmt: skip
        y = nn.functional.conv2d(x, w, padding=1)
        return nn.functional.batch_norm(y, None, None, training=True, eps=1e-3), \
            nn.functional.batch_norm(v, None, None, bias=torch.ones(5), training=True)  # fmt: skip


def test_batch_norm_by_batch_statistics():
    torch.manual_seed(7)
    module = BatchStatistics().eval()
    x, v = torch.randn(2, 3, 10, 10), torch.randn(6, 5) * 3 + 1
    m = ember.compile(module, (x, v))
    with torch.no_grad():
        refs = module(x, v)
    for ours, ref in zip(m(x.numpy(), v.numpy()), refs, strict=True):
        assert_close(ours, ref)


def test_batch_norm_in_training_mode_with_running_statistics_is_refused():
    class Train(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(3))
            self.register_buffer("var", torch.ones(3))

        def forward(self, x):
            return nn.functional.batch_norm(x, self.mean, self.var, training=True)

    with pytest.raises(ValueError, match="training mode"):  # a ModelError
        ember.compile(Train(), (torch.randn(2, 3, 4, 4),))


class GroupedQueryAttention(nn.Module):
    def forward(self, q, k, v, mask):
        causal = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        masked = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return causal, masked


def test_grouped_query_attention():
    """enable_gqa: 6 query heads over 2 key and value heads (MobileNetV4-hybrid's attention, Llama-style
    decoders), with a causal and a float mask."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    mask = torch.randn(5, 7)
    module = GroupedQueryAttention().eval()
    m = ember.compile(module, (q, k, v, mask))
    with torch.no_grad():
        refs = module(q, k, v, mask)
    for ours, ref in zip(m(q.numpy(), k.numpy(), v.numpy(), mask.numpy()), refs, strict=True):
        assert_close(ours, ref)


class Antialiased(nn.Module):
    def forward(self, x):
        f = nn.functional.interpolate
        return (f(x, size=(7, 5), mode="bicubic", antialias=True), f(x, size=(24, 30), mode="bicubic", antialias=True),
                f(x, size=(9, 20), mode="bilinear", antialias=True, align_corners=True),
                f(x, size=(5, 4), mode="bicubic", antialias=True, align_corners=True),
                f(x, scale_factor=(0.3, 1.7), mode="bicubic", antialias=True),
                f(x, scale_factor=0.35, mode="bilinear", antialias=True))  # fmt: skip


def test_antialiased_interpolate():
    """PIL's filters (torch's antialias=True; NaFlexViT resizes its position embeddings so): down and up, with
    sizes, aligned corners and scale factors (whose coordinates differ from the sizes' ratio)."""
    module = Antialiased().eval()
    x = torch.randn(1, 2, 16, 12)
    m = ember.compile(module, (x,))
    for ours, ref in zip(m(x.numpy()), module(x), strict=True):
        assert_close(ours, ref)


class SortUnfold(nn.Module):
    def forward(self, x, t):
        v, i = torch.sort(x, dim=1, descending=True)
        v2, i2 = torch.sort(t, stable=True)  # many ties: equal elements keep their order
        return v, i, v2, i2, x.unfold(2, 3, 2), x.unfold(0, 2, 1), t.unfold(-1, 4, 4)  # PatchTST's patches


def test_sort_and_unfold():
    torch.manual_seed(8)
    module = SortUnfold().eval()
    x, t = torch.randn(3, 5, 9), torch.randint(0, 4, (2, 10)).float()
    m = ember.compile(module, (x, t))
    for ours, ref in zip(m(x.numpy(), t.numpy()), module(x, t), strict=True):
        assert_close(ours, ref, rtol=0)


class Scatters(nn.Module):
    def forward(self, x, unique, idx, src):
        plain = (x.scatter(1, unique, src), x.scatter(1, unique, 2.5), x.scatter_add(0, idx, src))
        reduced = [x.scatter_reduce(1, idx, src, r, include_self=inc)
                   for r in ("sum", "prod", "amax", "amin", "mean") for inc in (True, False)]  # fmt: skip
        return (*plain, *reduced)


def test_scatter_family():
    """scatter of a tensor (larger than its index: only the covered part lands) and of a value, scatter_add, and
    scatter_reduce with every reduction, with and without the input's own elements (Reformer's LSH attention
    scatters; GNN message passing reduces)."""
    torch.manual_seed(9)
    x, src = torch.randn(4, 6), torch.randn(5, 7)
    unique = torch.argsort(torch.rand(3, 6), dim=1)[:, :4]  # no duplicates where the last write would win
    idx = torch.randint(0, 4, (3, 4))
    module = Scatters().eval()
    m = ember.compile(module, (x, unique, idx, src))
    for ours, ref in zip(m(x.numpy(), unique.numpy(), idx.numpy(), src.numpy()), module(x, unique, idx, src),
                         strict=True):  # fmt: skip
        assert_close(ours, ref)


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6, 6)
        self.tail = nn.Sequential(nn.ReLU(), Sorter())

    def forward(self, x):
        return self.tail(torch.special.bessel_j0(self.head(x)))


class Sorter(nn.Module):
    def forward(self, x):
        return torch.kthvalue(x, 2, dim=-1).values[:, None] + torch.special.bessel_j0(x)


def test_unsupported_ops_listed_in_one_error():
    with pytest.raises(UnsupportedOperatorError) as e:
        ember.compile(Unsupported(), (torch.randn(2, 6),))
    text = str(e.value)
    assert "2 unsupported operator(s)" in text
    assert "aten.kthvalue.default: used by 'tail.1 (Sorter)'" in text
    assert "aten.special_bessel_j0.default: used by '<root> (Unsupported)', 'tail.1 (Sorter)'" in text


# -- dynamic dims --------------------------------------------------------------------------------------------
def test_dynamic_dim_binds_to_example_or_given_size():
    module = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(module, (torch.randn(3, 8),), dynamic_shapes=({0: batch},))
    with pytest.warns(UserWarning, match="bound to 3"):  # specialized (by default its dims stay symbolic)
        m = ember.compile(ep, dynamic=False)
    assert [shape for _, _, shape in input_specs(m.plan)] == [(3, 8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m5 = ember.compile(ep, input_shapes={"input": (5, 8)})
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert_close(m5(x.numpy()), module(x))


# -- torch.compile: graph breaks, recompiles, no copies --------------------------------------------------------
class WithBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.bn = nn.Linear(8, 16), nn.Linear(16, 4), nn.BatchNorm1d(16)

    def forward(self, x):
        h = torch.relu(self.bn(self.a(x)))
        torch._dynamo.graph_break()
        return self.b(h).softmax(-1), h.sum()


def test_graph_break_and_new_shape():
    regions = []

    def backend(gm, example_inputs, **kw):
        regions.append(ember_backend(gm, example_inputs, **kw))
        return regions[-1]

    module = randomize_batch_norm(WithBreak())
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend)
    with torch.no_grad():
        for rows in (4, 4, 7, 3):
            x = torch.randn(rows, 8)
            (y, s), (ry, rs) = compiled(x), module(x)
            assert_close(y, ry)
            assert_close(s, rs)
    assert len(regions) >= 2, "the graph break splits the forward into two regions"
    assert all(isinstance(r, CompiledRegion) for r in regions)
    assert sum(len(r.models) for r in regions) >= 4, "a new input shape gets its own Ember model"
    assert all(len(r.weights) >= 2 for r in regions[:1]), "the module's weights are frozen as constants"


def test_inputs_and_outputs_share_memory():
    from ember.dynamo import numpy_view

    t = torch.randn(3, 4)
    view = numpy_view(t)
    assert np.shares_memory(view, t.numpy())
    region = ember_backend(torch.fx.symbolic_trace(lambda x: (torch.relu(x) * 2,)), [t])
    (out,) = region(t)
    assert isinstance(out, torch.Tensor)
    assert_close(out, torch.relu(t) * 2)


def test_entry_point_declared():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["torch_dynamo_backends"]["ember"] == "ember.dynamo:ember_backend"
    installed = [e for e in importlib.metadata.entry_points(group="torch_dynamo_backends") if e.name == "ember"]
    if not installed:
        pytest.skip("this environment's installed ember predates the entry point (pip install -e . registers it)")
    torch._dynamo.reset()
    compiled = torch.compile(nn.Linear(3, 2).eval(), backend="ember")
    x = torch.randn(2, 3)
    with torch.no_grad():
        assert_close(compiled(x), compiled._orig_mod(x))
