"""Cross-compiled models and kernels: for aarch64, riscv64 and armhf, on c and llvm, a shared library of the
right ELF machine, vector code of the target's width, and a clear error (not a crash) when run in this process.
Skipped where the cross compiler is missing. Running them (under qemu, through the standalone runtime) is tested
with that runtime."""

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import te
from ember.codegen.toolchain import elf_machine
from ember.runtime.cross import CrossCompiledModel, CrossModule, ForeignTargetError
from ember.target import ARCHS, Target, host_triple

CROSS = {  # triple -> a CPU of it
    "aarch64-linux-gnu": "cortex-a72",
    "riscv64-linux-gnu": "sifive-u74",
    "arm-linux-gnueabihf": "cortex-a7",
}


def conv_matmul() -> onnx.ModelProto:
    """Conv (3 -> 8 channels, 3x3) + ReLU, flattened, then a MatMul to 10 classes."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    m = numpy_helper.from_array(rng.standard_normal((8 * 8 * 8, 10)).astype(np.float32), "m")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])
    graph = helper.make_graph(nodes, "conv_matmul", [x], [y], [w, m, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def target_for(kind: str, triple: str) -> Target:
    arch = ARCHS[triple]
    if triple == host_triple():
        pytest.skip(f"{triple} is this machine's triple")
    if shutil.which(f"{triple}-gcc") is None:
        pytest.skip(f"needs the cross compiler {triple}-gcc (apt-get install {arch.package})")
    return Target.parse(f"{kind} -mtriple={triple} -mcpu={CROSS[triple]}")


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return conv_matmul()


@pytest.mark.parametrize("kind", ["c", "llvm"])
@pytest.mark.parametrize("triple", list(CROSS))
def test_cross_compiled_model(model, kind, triple, tmp_path):
    target = target_for(kind, triple)
    m = ember.compile(model, target=target)
    assert isinstance(m, CrossCompiledModel)
    assert elf_machine(m.lib_path) == ARCHS[triple].elf_machine
    x = np.zeros((1, 3, 8, 8), np.float32)
    for run in (lambda: m(x), lambda: m.run({"x": x}), m.benchmark, m.profile):
        with pytest.raises(ForeignTargetError, match=f"compiled for {triple}.*{ARCHS[triple].qemu} -L /usr/{triple}"):
            run()
    saved = m.save(tmp_path / "m")
    assert elf_machine(saved / "model.so") == ARCHS[triple].elf_machine
    assert (saved / ("model.ll" if kind == "llvm" else "model.c")).read_text() == m.source
    back = ember.load(saved)
    assert isinstance(back, CrossCompiledModel) and back.plan.target == str(target)
    with pytest.raises(ForeignTargetError):
        back(x)


def test_aarch64_c_uses_4_lane_float_vectors_and_no_libmvec(model):
    m = ember.compile(model, target=target_for("c", "aarch64-linux-gnu"))
    assert "typedef float float32x4 __attribute__((vector_size(16)));" in m.source
    assert "float32x8" not in m.source and "float32x16" not in m.source
    assert "_ZGV" not in m.source


def test_aarch64_llvm_ir_uses_4_lane_float_vectors(model):
    m = ember.compile(model, target=target_for("llvm", "aarch64-linux-gnu"))
    assert "<4 x float>" in m.source
    assert "<8 x float>" not in m.source and "<16 x float>" not in m.source


def test_riscv64_code_is_scalar(model):
    m = ember.compile(model, target=target_for("c", "riscv64-linux-gnu"))
    assert "vector_size" not in m.source


def test_softmax_on_aarch64_computes_exp_in_arithmetic():
    """No libmvec off the host triple: a vector exp is the inline arithmetic helper, not _ZGV calls."""
    target = target_for("c", "aarch64-linux-gnu")
    x = te.placeholder((64,), "float32", name="x")
    y = te.compute((64,), lambda i: te.exp(x[i]), name="y")
    s = te.create_schedule(y)
    _, inner = s[y].split(y.op.axis[0], 4)
    s[y].vectorize(inner)
    f = ember.build(s, [x, y], target=target)
    assert "_ZGV" not in f.source and "ember_exp_float32x4" in f.source


@pytest.mark.parametrize("kind", ["c", "llvm"])
@pytest.mark.parametrize("triple", list(CROSS))
def test_cross_built_kernel(kind, triple):
    target = target_for(kind, triple)
    a = te.placeholder((32, 16), "float32", name="A")
    b = te.placeholder((16, 8), "float32", name="B")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((32, 8), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = te.create_schedule(c)
    f = ember.build(s, [a, b, c], target=target)
    assert isinstance(f, CrossModule)
    assert elf_machine(f.lib_path) == ARCHS[triple].elf_machine
    arrays = [np.zeros((32, 16), np.float32), np.zeros((16, 8), np.float32), np.zeros((32, 8), np.float32)]
    with pytest.raises(ForeignTargetError, match="cannot run in this process"):
        f(*arrays)


def test_cli_compiles_for_another_machine_and_refuses_to_run_it(model, tmp_path, capsys):
    from ember.cli import main

    target = target_for("c", "aarch64-linux-gnu")
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), "--target", str(target)]) == 0
    assert elf_machine(tmp_path / "out" / "model.so") == 183
    assert main(["run", str(tmp_path / "out")]) == 1
    assert "qemu-aarch64 -L /usr/aarch64-linux-gnu" in capsys.readouterr().err
    bad = ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "bad"), "--target", "c -mcpu=not-a-cpu"]
    assert main(bad) == 1
    assert "not a known" in capsys.readouterr().err
